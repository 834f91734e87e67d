"""procsv.ipc.codec: every message round-trips; every malformed input is refused with ProtocolError."""

from __future__ import annotations

import dataclasses
import json

import pytest

from procsv.ipc import messages as m
from procsv.ipc.codec import ProtocolError, decode, encode

# ----------------------------------------------------------------------------- samples

SAMPLES: list[tuple[str, m.Message, list]] = [
    ("hello-trainer", m.Hello(role="trainer", pid=4242, attempt=1), []),
    ("hello-checkpoint", m.Hello(role="checkpoint", pid=17, attempt=3), []),
    ("hello-ps", m.Hello(role="ps", pid=18, attempt=2, slot="ps0"), []),
    ("service-loading", m.ServiceLoading(role="checkpoint", pid=17, attempt=1, what="TensorFlow"), []),
    ("service-loaded", m.ServiceLoading(role="checkpoint", pid=17, attempt=1, what="TensorFlow", done=True, secs=8.5),
     []),
    ("ready-fresh", m.TrainerReady(pid=4242, attempt=1, step=0, restored_from=None, restore_secs=0.0), []),
    (
        "ready-restored",
        m.TrainerReady(
            pid=4243,
            attempt=2,
            step=1200,
            restored_from="/runs/a/model.ckpt-1200",
            restore_secs=1.75,
            skipped=["model.ckpt-1300", "model.ckpt-1250"],
            save_secs=600.0,
            save_steps=500,
            prepared_at=1795730277.876794,
            warm_secs=1.847,
        ),
        [],
    ),
    ("progress", m.Progress(pid=4242, step=981, wall_time=1_700_000_123.456), []),
    ("progress-busy", m.Progress(pid=4242, step=981, wall_time=1_700_000_123.456, busy=m.Busy.FINAL_CHECKPOINT), []),
    ("progress-stepped", m.Progress(pid=4242, step=982, wall_time=1_700_000_123.5, stepped=True), []),
    (
        "setup-timed",
        m.CheckpointSetup(
            pid=4242, basename="model.ckpt", save_model_secs=600.0, max_to_keep=5,
            keep_checkpoint_every_n_hours=2.5, step=0,
        ),
        [],
    ),
    (
        "setup-untimed",
        m.CheckpointSetup(
            pid=4242, basename="model.ckpt", save_model_secs=None, max_to_keep=0,
            keep_checkpoint_every_n_hours=None, step=77,
        ),
        [],
    ),
    ("save-request", m.SaveRequest(reason=m.SaveReason.PERIODIC), []),
    ("save-data-meta-graph", m.SaveData(step=3, reason=m.SaveReason.STEPS, basename="model.ckpt",
                                        tensors=[m.TensorSpec(key="w", dtype="float32", shape=[2])], meta_graph=True),
     [b"\x00\x00\x80?\x00\x00\x00@", b"meta-graph-def"]),
    (
        "save-data",
        m.SaveData(
            step=1500,
            reason=m.SaveReason.PERIODIC,
            basename="model.ckpt",
            tensors=[
                m.TensorSpec(key="global_step/.ATTRIBUTES/VARIABLE_VALUE", dtype="int64", shape=[]),
                m.TensorSpec(key="model/dense/kernel/.ATTRIBUTES/VARIABLE_VALUE", dtype="float32", shape=[64, 10]),
                m.TensorSpec(key="vocab/.ATTRIBUTES/VARIABLE_VALUE", dtype="string", shape=[3], lengths=[3, 0, 5]),
            ],
        ),
        [b"\x00" * 8, bytes(range(256)) * 10, b"abchello"],
    ),
    ("save-data-empty", m.SaveData(step=0, reason=m.SaveReason.FINAL, basename="model.ckpt", tensors=[]), []),
    (
        "save-result-ok",
        m.SaveResult(step=1500, reason=m.SaveReason.STEPS, ok=True, path="/runs/a/model.ckpt-1500", error=None,
                     persist_secs=0.42),
        [],
    ),
    (
        "save-result-failed",
        m.SaveResult(step=1500, reason=m.SaveReason.FINAL, ok=False, path=None, error="OSError: [Errno 28] No space left",
                     persist_secs=0.0),
        [],
    ),
    ("save-overdue", m.SaveOverdue(pid=4242, step=1500, waited_secs=31.5, deadline_secs=30.0, stopped_secs=12.1), []),
    ("summary-overdue", m.SummaryOverdue(pid=4242, step=1500, waited_secs=31.5, deadline_secs=30.0), []),
    (
        "save-data-memory",
        m.SaveData(step=1501, reason=m.SaveReason.PERIODIC, basename="model.ckpt",
                   tensors=[m.TensorSpec(key="w", dtype="float32", shape=[4], offset=8192)],
                   arena=m.ArenaRef(path="/proc/4242/fd/9", ino=77, size=3 * 8192), slot=1, persist=False),
        [],
    ),
    ("save-data-member", m.SaveData(step=1550, reason=m.SaveReason.MEMORY, basename="model.ckpt", tensors=[],
                                    slot=2, persist=False, member=1, attempt=3), []),
    ("commit-loading", m.CommitLoading(step=1501, what="TensorFlow"), []),
    ("snapshot-held", m.SnapshotHeld(step=1501, meta_graph=True), []),
    ("standby-ready", m.StandbyReady(pid=4244, attempt=3, prepare_secs=0.61), []),
    ("audit-result", m.AuditResult(pid=4250, attempt=2, start=100, end=200, differ=["dense/kernel"], digest="9f0c",
                                   host="vm", error=""), []),
    ("promotion", m.Promotion(attempt=3, skip_steps=[40, 70], rollback_before=70), []),
    ("nonfinite-detected", m.NonfiniteDetected(pid=4242, step=25, wall_time=1_700_000_000.5,
                                               what="the loss of step 25 is NaN or infinite"), []),
    ("nonfinite-detected-keras", m.NonfiniteDetected(pid=4242, step=25, wall_time=1.0, what="x", epoch=2, batch=7), []),
    ("rolled-back", m.RolledBack(pid=4242, step=25, restored_step=20, source=m.RestoreSource.DISK,
                                 path="/runs/a/model.ckpt-20", skip=True, restore_secs=0.012, wall_time=1.5), []),
    ("rolled-back-keras", m.RolledBack(pid=4242, step=25, restored_step=20, source=m.RestoreSource.MEMORY,
                                       path="/proc/1/fd/9#slot1", skip=False, restore_secs=0.01, wall_time=1.5,
                                       epoch=2, batch=7), []),
    ("step-skipped", m.StepSkipped(pid=4242, step=25, wall_time=1.5, skipped=1, epoch=None, batch=None), []),
    ("spike-detected", m.SpikeDetected(pid=4242, step=150, onset=149, loss=51.25, threshold=3.5, median=1.0,
                                       action="rollback", wall_time=1.5), []),
    ("spike-replayed", m.SpikeReplayed(pid=4242, step=150, onset=149, reproduced=False, loss=51.25, replay_loss=1.5,
                                       host="node-3", wall_time=1.5), []),
    ("spike-replayed-unreached", m.SpikeReplayed(pid=4242, step=150, onset=149, reproduced=False, loss=51.25,
                                                 replay_loss=None, host="h", wall_time=1.5), []),
    ("recover-query", m.RecoverQuery(pid=4243), []),
    ("group-query", m.GroupQuery(pid=4243, nproc=2, after=1500), []),
    ("group-held", m.GroupHeld(step=1550, attempt=2, note=""), []),
    ("group-fetch", m.GroupFetch(pid=4244, rank=1, step=1550, attempt=2), []),
    ("group-copy-held", m.GroupCopyHeld(rank=1, attempt=2, step=1550), []),
    ("group-copy-refused", m.GroupCopyRefused(rank=1, attempt=2, step=1550, size=1 << 29, limit=1 << 20), []),
    ("group-copy", m.GroupCopy(step=1550, tensors=[m.TensorSpec("w/.ATTRIBUTES/VARIABLE_VALUE", "float32", [2])],
                               crc=0xE3069283, note=""), [b"\x00" * 8]),
    ("replica-hello", m.ReplicaHello(node=1, pid=4245, held=6), []),
    ("replica-copy", m.ReplicaCopy(rank=0, attempt=2, step=1550,
                                   tensors=[m.TensorSpec("w/.ATTRIBUTES/VARIABLE_VALUE", "float32", [2])],
                                   crc=0xE3069283), [b"\x00" * 8]),
    ("recover-reply", m.RecoverReply(step=1501, path="/runs/a/model.ckpt-1501", note=""), []),
    ("delete-checkpoints", m.DeleteCheckpoints(pid=4243), []),
    ("audit-hold", m.AuditHold(steps=[100, 200]), []),
    ("audit-quarantine", m.AuditQuarantine(after=200, attempt=1, steps=[971, 1165],
                                           reason="audit: host h computed steps 200-971 wrongly"), []),
    ("checkpoints-deleted", m.CheckpointsDeleted(deleted=3, error=None), []),
    ("checkpoints-deleted-failed", m.CheckpointsDeleted(deleted=0, error="OSError: [Errno 5] Input/output error"), []),
    ("recover-reply-none", m.RecoverReply(step=-1, path=None, note="no in-memory snapshot is held"), []),
    (
        "summary-batch",
        m.SummaryBatch(
            protos=[m.ProtoRef(10, 1_700_000_000.7), m.ProtoRef(11, 1_700_000_001.0)],
            dropped=3,
            session="4242-abcd",
            seq=7,
            resync_from=10,
            columns=2,
            items=[m.SummaryItem(kind=m.ItemKind.HISTOGRAM, tag="w", step=10, wall_time=1_700_000_000.8,
                                 dtype="float64", shape=[3], buckets=30)],
            step=11,
            mono=12.5,
            wall_time=1_700_000_001.5,
            step_rate_secs=120.0,
            dropped_total=5,
        ),
        [b"\n\x0b\n\x04loss\x15\x00\x00\x80?", b"\n\x03\n\x01x", b"columns", b"histogram"],
    ),
    ("summary-batch-empty", m.SummaryBatch(), []),
    ("summary-ack", m.SummaryAck(session="4242-abcd", written=7, resync_after=9), []),
    ("session-log-start", m.SessionLogEvent(status=m.SessionStatus.START, step=0), []),
    ("session-log-checkpoint", m.SessionLogEvent(status=m.SessionStatus.CHECKPOINT, step=1500,
                                                 checkpoint_path="/runs/a/model.ckpt-1500"), []),
    ("graph-event", m.GraphEvent(step=0, wall_time=1_700_000_000.25), [b"\n\x0b\n\x01x\x12\x06Const"]),
    ("meta-graph-event", m.GraphEvent(step=12, wall_time=1_700_000_000.5, meta=True), [b""]),
    ("run-scalars", m.RunScalars(step=1201, wall_time=1_700_000_123.5, tags=["procsv/restarts", "procsv/goodput"],
                                 values=[2.0, 0.875]), []),
    ("run-scalars-empty", m.RunScalars(step=0, wall_time=0.0, tags=[], values=[]), []),
    ("zygote-ready", m.ZygoteReady(pid=7, import_secs=4.2), []),
    ("zygote-start", m.ZygoteStart(env={"PROCSV_ZYGOTE_FDS": "3,4,5"}, log_path="/r/logs/zygote.1.log", cwd="/r"), []),
    ("service-start", m.ServiceStart(env={"PROCSV_ROLE": "checkpoint"}, log_path="/r/logs/checkpoint.1.log",
                                     cwd="/r"), []),
    ("fork-request", m.ForkRequest(attempt=2, argv=["python", "-m", "procsv.trainer", "x"],
                                   env={"PROCSV_ATTEMPT": "2", "PATH": "/usr/bin"}, log_path="/r/logs/trainer.2.log",
                                   cwd="/r"), []),
    ("fork-reply-ok", m.ForkReply(attempt=2, pid=1234), []),
    ("fork-reply-error", m.ForkReply(attempt=2, pid=0, error="OSError: fork failed"), []),
    ("node-hello", m.NodeHello(node=1, nproc=2, host="h1", pid=77, addresses=["10.0.0.2:4000", "10.0.0.2:4001"],
                               live=["worker2.1"], probe="10.0.0.2:4100"), []),
    ("master-beat", m.MasterBeat(job="j1", node_timeout=15.0), []),
    ("start-members", m.StartMembers(attempt=2, ranks=[2, 3], cluster=["a:1", "a:2", "b:1", "b:2"],
                                     env={"PROCSV_GROUP_PIN": "/l/.procsv/group/j1.2.json"}), []),
    ("start-standby-members", m.StartMembers(attempt=3, ranks=[2, 3], cluster=["a:5", "a:6", "b:5", "b:6"],
                                             env={"PROCSV_STANDBY": "1"}, standby=True), []),
    ("promote-member", m.PromoteMember(slot="standby2", attempt=3, skip_steps=[70], rollback_before=71,
                                       launch_start_step=0), []),
    ("signal-member", m.SignalMember(slot="worker2", attempt=2, sig=15), []),
    ("kill-member", m.SignalMember(slot="worker2", attempt=2, sig=9, kill=True), []),
    ("node-stop", m.NodeStop(exit_code=0), []),
    ("node-refused", m.NodeRefused(node=1, reason="node 1 is held by another agent in this launch", node_timeout=2.5), []),
    ("member-started", m.MemberStarted(slot="worker3", attempt=1, pid=99), []),
    ("member-ended", m.MemberEnded(slot="worker3", attempt=1, pid=99, code=-9, signalled=False), []),
    ("member-looked", m.MemberLooked(slot="worker1", attempt=2, cpu=1.5, io=4096, woke=17, state="S",
                                     syscall="futex", kids_cpu=0.25, kids_io=0), []),
    ("relayed", m.Relayed(slot="worker3", frames=1), [b'{"v":2,"kind":"progress","body":{}}']),
    ("stacks-asked", m.StacksAsked(ask=3, slots=["worker1"], native=False, timeout=9.5), []),
    ("stacks-taken", m.StacksTaken(ask=3, of=2, stacks=m.ProcessStacks(
        "worker1", 77, [m.ThreadStack(77, "MainThread", True, False, [m.Frame("step", "/a/train.py", 12, False),
                                                                      m.Frame("futex_wait", "libc.so.6", 0, True)],
                                      "futex")], stopped=True, host="10.0.0.2")), []),
    ("stacks-taken-none", m.StacksTaken(ask=4, of=0), []),
]


def _body(msg: m.Message) -> dict:
    return json.loads(encode(msg)[0])["body"]


def _header(kind, body, v=m.SCHEMA_VERSION) -> bytes:
    return json.dumps({"v": v, "kind": kind, "body": body}).encode()


# ----------------------------------------------------------------------------- round trips


def test_samples_cover_every_message_class():
    assert {type(msg) for _, msg, _ in SAMPLES} == set(m.ALL_MESSAGES)


@pytest.mark.parametrize("msg,payload", [(s[1], s[2]) for s in SAMPLES], ids=[s[0] for s in SAMPLES])
def test_message_round_trips(msg, payload):
    frames = encode(msg, payload)
    assert isinstance(frames[0], bytes)
    assert len(frames) == 1 + len(payload)
    decoded, got_payload = decode(frames)
    assert type(decoded) is type(msg)
    assert decoded == msg
    assert got_payload == payload


def test_payload_frames_are_passed_through_not_copied():
    payload = [bytearray(b"tensor-bytes"), memoryview(b"proto-bytes")]
    frames = encode(m.SaveData(step=1, reason=m.SaveReason.PERIODIC, basename="model.ckpt",
                               tensors=[m.TensorSpec("a", "uint8", [12]), m.TensorSpec("b", "uint8", [11])]), payload)
    assert frames[1] is payload[0] and frames[2] is payload[1]
    _, got = decode(frames)
    assert got[0] is payload[0] and got[1] is payload[1]


def test_nested_tensor_specs_decode_as_tensor_spec_objects():
    _, msg, payload = next(s for s in SAMPLES if s[0] == "save-data")
    decoded, _ = decode(encode(msg, payload))
    assert all(isinstance(t, m.TensorSpec) for t in decoded.tensors)
    assert decoded.tensors[2].lengths == [3, 0, 5]
    assert decoded.tensors[0].lengths is None


def test_a_save_data_encodes_each_tensor_spec_object_once_and_decodes_as_before(monkeypatch):
    # the trainer's in-memory snapshots hand the same spec objects over while their tensors keep
    # their shapes and offsets: encoding them again was most of the hand-off's header (issue 54)
    from procsv.ipc import codec

    specs = [m.TensorSpec(f"v{i}", "float32", [i, 3], offset=64 * i) for i in range(6)]
    specs.append(m.TensorSpec("_CHECKPOINTABLE_OBJECT_GRAPH", "string", [], [7]))
    first = m.SaveData(5, m.SaveReason.MEMORY, "model.ckpt", specs, m.ArenaRef("/proc/1/fd/3", 9, 4096), 1, False)
    assert decode(encode(first, [b"graph!!"]))[0] == first
    seen: list[object] = []
    inner = codec._to_json

    def counted(value: object) -> object:
        seen.append(value)
        return inner(value)

    monkeypatch.setattr(codec, "_to_json", counted)
    again = dataclasses.replace(first, step=6, slot=2, tensors=list(specs))
    head = encode(again, [b"graph!!"])[0]
    assert not any(isinstance(v, m.TensorSpec) for v in seen)  # none encoded again
    assert decode([head, b"graph!!"])[0] == again
    moved = m.TensorSpec("v2", "float32", [4, 3], offset=128)  # a new shape: a new object, encoded
    changed = dataclasses.replace(again, tensors=[*specs[:2], moved, *specs[3:]])
    assert decode([encode(changed, [b"graph!!"])[0], b"graph!!"])[0] == changed
    assert [v for v in seen if isinstance(v, m.TensorSpec)] == [moved]
    assert json.loads(head)["body"]["tensors"][2] == {"key": "v2", "dtype": "float32", "shape": [2, 3],
                                                      "lengths": None, "offset": 128}


def test_header_is_a_json_object_with_version_kind_and_body():
    header = json.loads(encode(m.SaveRequest(reason=m.SaveReason.PERIODIC))[0])
    assert header == {"v": m.SCHEMA_VERSION, "kind": "save_request", "body": {"reason": "periodic"}}


def test_decode_accepts_zmq_frames_and_memoryviews():
    zmq = pytest.importorskip("zmq")
    msg = m.Progress(pid=1, step=2, wall_time=3.5)
    head, *_ = encode(msg)
    assert decode([zmq.Frame(head)])[0] == msg
    batch = m.SummaryBatch(protos=[m.ProtoRef(1, 2.0)])
    assert decode([zmq.Frame(encode(batch)[0]), zmq.Frame(b"x")])[0] == batch
    assert decode([memoryview(head)])[0] == msg
    assert decode([bytearray(head)])[0] == msg


def test_float_field_accepts_json_integer_and_yields_float():
    decoded, _ = decode([_header("progress", {"pid": 1, "step": 2, "wall_time": 5})])
    assert decoded.wall_time == 5.0 and type(decoded.wall_time) is float


@pytest.mark.parametrize(
    "kind,body,field,default",
    [
        ("trainer_ready", {"pid": 1, "attempt": 1, "step": 0, "restored_from": None, "restore_secs": 0.0},
         "skipped", []),
        ("summary_batch", {"protos": []}, "dropped", 0),
        ("summary_batch", {}, "protos", []),
        ("progress", {"pid": 1, "step": 2, "wall_time": 3.0}, "busy", m.Busy.NONE),
        ("progress", {"pid": 1, "step": 2, "wall_time": 3.0}, "stepped", False),
        ("session_log", {"status": "stop", "step": 9}, "checkpoint_path", ""),
    ],
)
def test_fields_with_defaults_may_be_omitted(kind, body, field, default):
    decoded, _ = decode([_header(kind, body)])
    assert getattr(decoded, field) == default


# ----------------------------------------------------------------------------- malformed frames


@pytest.mark.parametrize("frames", [[], ()], ids=["list", "tuple"])
def test_empty_frame_list_is_refused(frames):
    with pytest.raises(ProtocolError):
        decode(frames)


@pytest.mark.parametrize(
    "head",
    [b"not json", b"{", b"", b"\xff\xfe\x00garbage", b'{"v": 1, "kind": "hello",', b"[" * 100_000],
    ids=["text", "open-brace", "empty", "binary", "truncated", "deeply-nested"],
)
def test_non_json_header_is_refused(head):
    with pytest.raises(ProtocolError):
        decode([head])


@pytest.mark.parametrize("head", [b"[]", b"1", b'"hello"', b"null", b"true"])
def test_json_header_that_is_not_an_object_is_refused(head):
    with pytest.raises(ProtocolError, match="not an object"):
        decode([head])


@pytest.mark.parametrize("v", [0, m.SCHEMA_VERSION - 1, m.SCHEMA_VERSION + 1, str(m.SCHEMA_VERSION), None,
                               [m.SCHEMA_VERSION], True], ids=repr)
def test_wrong_schema_version_is_refused(v):
    with pytest.raises(ProtocolError, match="version"):
        decode([_header("save_request", {"reason": "periodic"}, v=v)])


def test_missing_schema_version_is_refused():
    with pytest.raises(ProtocolError, match="version"):
        decode([json.dumps({"kind": "save_request", "body": {"reason": "periodic"}}).encode()])


@pytest.mark.parametrize("kind", ["nope", "", "Hello", "HELLO", None, 7, ["hello"], {"k": "hello"}], ids=repr)
def test_unknown_kind_is_refused(kind):
    with pytest.raises(ProtocolError, match="kind"):
        decode([_header(kind, {})])


def test_missing_kind_is_refused():
    with pytest.raises(ProtocolError, match="kind"):
        decode([json.dumps({"v": m.SCHEMA_VERSION, "body": {}}).encode()])


@pytest.mark.parametrize("body", [None, [], "reason=periodic", 5])
def test_body_that_is_not_an_object_is_refused(body):
    with pytest.raises(ProtocolError, match="body"):
        decode([_header("save_request", body)])


def test_missing_body_is_refused():
    with pytest.raises(ProtocolError, match="body"):
        decode([json.dumps({"v": m.SCHEMA_VERSION, "kind": "save_request"}).encode()])


_REQUIRED = [
    (name, msg, f.name)
    for name, msg, _ in SAMPLES
    for f in dataclasses.fields(msg)
    if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
]


@pytest.mark.parametrize("msg,field", [(r[1], r[2]) for r in _REQUIRED], ids=[f"{r[0]}-{r[2]}" for r in _REQUIRED])
def test_missing_required_field_is_refused(msg, field):
    body = _body(msg)
    del body[field]
    with pytest.raises(ProtocolError, match=f"missing field '{field}'"):
        decode([_header(msg.KIND, body)])


@pytest.mark.parametrize("msg", [s[1] for s in SAMPLES], ids=[s[0] for s in SAMPLES])
def test_unknown_extra_field_is_refused(msg):
    body = _body(msg)
    body["surprise"] = 1
    with pytest.raises(ProtocolError, match="surprise"):
        decode([_header(msg.KIND, body)])


def test_unknown_extra_field_in_nested_tensor_spec_is_refused():
    body = {"step": 1, "reason": "periodic", "basename": "model.ckpt",
            "tensors": [{"key": "a", "dtype": "float32", "shape": [2], "lengths": None, "order": "F"}]}
    with pytest.raises(ProtocolError, match="order"):
        decode([_header("save_data", body)])


_GOOD_SPEC = {"key": "w", "dtype": "float32", "shape": [2, 3], "lengths": None}


def _save_data(*tensors) -> dict:
    return {"step": 5, "reason": "periodic", "basename": "model.ckpt", "tensors": list(tensors)}


@pytest.mark.parametrize(
    "kind,body",
    [
        # string where an int is expected
        ("hello", {"role": "trainer", "pid": "4242", "attempt": 1}),
        ("progress", {"pid": 1, "step": "10", "wall_time": 1.0}),
        # bool where an int is expected
        ("hello", {"role": "trainer", "pid": True, "attempt": 1}),
        ("checkpoint_setup", {"pid": 1, "basename": "m", "save_model_secs": None, "max_to_keep": False,
                              "keep_checkpoint_every_n_hours": None, "step": 0}),
        # float where an int is expected
        ("progress", {"pid": 1, "step": 10.5, "wall_time": 1.0}),
        ("summary_batch", {"protos": [], "dropped": 1.0}),
        # None for a non-optional field
        ("summary_batch", {"protos": [], "dropped": None}),
        ("session_log", {"status": "stop", "step": 1, "checkpoint_path": None}),
        # wrong types for float fields (string, bool)
        ("progress", {"pid": 1, "step": 10, "wall_time": "now"}),
        ("progress", {"pid": 1, "step": 10, "wall_time": True}),
        ("checkpoint_setup", {"pid": 1, "basename": "m", "save_model_secs": "600", "max_to_keep": 5,
                              "keep_checkpoint_every_n_hours": None, "step": 0}),
        # wrong types for str and bool fields
        ("hello", {"role": 1, "pid": 1, "attempt": 1}),
        ("save_result", {"step": 1, "reason": "periodic", "ok": 1, "path": None, "error": None, "persist_secs": 0.1}),
        ("save_result", {"step": 1, "reason": "periodic", "ok": "true", "path": None, "error": None,
                         "persist_secs": 0.1}),
        ("save_result", {"step": 1, "reason": "periodic", "ok": True, "path": 5, "error": None, "persist_secs": 0.1}),
        # lists: not a list, or items of the wrong type
        ("trainer_ready", {"pid": 1, "attempt": 1, "step": 0, "restored_from": None, "restore_secs": 0.0,
                           "skipped": "model.ckpt-5"}),
        ("trainer_ready", {"pid": 1, "attempt": 1, "step": 0, "restored_from": None, "restore_secs": 0.0,
                           "skipped": [1, 2]}),
        ("summary_batch", {"protos": [10, 2.0]}),
        ("summary_batch", {"protos": {"step": 10, "wall_time": 2.0}}),
        ("summary_batch", {"protos": [[10, 2.0]]}),
        ("summary_batch", {"protos": [{"step": 10, "wall_time": 2.0}, {"step": "10", "wall_time": 2.0}]}),
        ("summary_batch", {"protos": [{"step": 10}]}),
        ("summary_batch", {"items": [{"kind": "histogram", "tag": "w", "step": 1, "wall_time": 1.0,
                                      "dtype": "float64", "shape": [3], "buckets": 1.5}]}),
        ("save_data", {"step": 5, "reason": "periodic", "basename": "model.ckpt", "tensors": {}}),
        ("save_data", _save_data("w")),
        ("save_data", _save_data(_GOOD_SPEC, ["w", "float32", [2, 3]])),
        # nested TensorSpec with a bad field
        ("save_data", _save_data({**_GOOD_SPEC, "shape": ["2", "3"]})),
        ("save_data", _save_data({**_GOOD_SPEC, "shape": [2, True]})),
        ("save_data", _save_data({**_GOOD_SPEC, "shape": 6})),
        ("save_data", _save_data({**_GOOD_SPEC, "key": 7})),
        ("save_data", _save_data({**_GOOD_SPEC, "dtype": None})),
        ("save_data", _save_data({**_GOOD_SPEC, "lengths": ["3"]})),
        ("save_data", _save_data({k: v for k, v in _GOOD_SPEC.items() if k != "dtype"})),
    ],
    ids=[
        "str-for-int-pid", "str-for-int-step", "bool-for-int-pid", "bool-for-int-max_to_keep",
        "float-for-int-step", "float-for-int-dropped", "none-for-int-dropped", "none-for-str-checkpoint_path",
        "str-for-float", "bool-for-float", "str-for-optional-float", "int-for-str", "int-for-bool",
        "str-for-bool", "int-for-optional-str", "str-for-list", "int-items-in-str-list", "flat-proto-ref",
        "dict-for-proto-list", "list-for-proto-ref", "str-step-in-second-proto-ref", "proto-ref-missing-wall",
        "float-buckets-in-item", "dict-for-tensor-list", "str-for-tensor-spec", "list-for-tensor-spec",
        "spec-str-shape-items", "spec-bool-shape-item", "spec-int-shape", "spec-int-key", "spec-none-dtype",
        "spec-str-lengths", "spec-missing-dtype",
    ],
)
def test_wrong_field_type_is_refused(kind, body):
    with pytest.raises(ProtocolError):
        decode([_header(kind, body)])


def test_wrong_field_type_error_names_the_field():
    with pytest.raises(ProtocolError, match=r"Hello\.pid"):
        decode([_header("hello", {"role": "trainer", "pid": "4242", "attempt": 1})])


def test_a_dict_field_with_a_non_string_value_is_refused():
    body = _body(m.ForkRequest(attempt=1, argv=["a"], env={"A": "1"}, log_path="l", cwd="c"))
    body["env"] = {"A": 1}
    with pytest.raises(ProtocolError):
        decode([_header("fork_request", body)])
    body["env"] = ["A=1"]
    with pytest.raises(ProtocolError):
        decode([_header("fork_request", body)])


def test_a_list_element_error_names_its_index():
    with pytest.raises(ProtocolError, match=r"SummaryBatch\.protos\[1\]"):
        decode([_header("summary_batch", {"protos": [{"step": 1, "wall_time": 2.0}, [1, 2.0]]})])


# ----------------------------------------------------------------------------- enums

_ENUM_FIELDS = [
    ("hello", {"pid": 1, "attempt": 1}, "role", m.Role),
    ("save_request", {}, "reason", m.SaveReason),
    ("save_result", {"step": 1, "ok": True, "path": None, "error": None, "persist_secs": 0.1}, "reason",
     m.SaveReason),
    ("save_data", {"step": 1, "basename": "model.ckpt", "tensors": []}, "reason", m.SaveReason),
    ("progress", {"pid": 1, "step": 2, "wall_time": 3.0}, "busy", m.Busy),
    ("session_log", {"step": 1}, "status", m.SessionStatus),
]


@pytest.mark.parametrize("kind,body,field,enum", _ENUM_FIELDS, ids=[f"{k}.{f}" for k, _, f, _ in _ENUM_FIELDS])
def test_enum_fields_decode_every_member_as_the_enum(kind, body, field, enum):
    for member in enum:
        decoded, _ = decode([_header(kind, {**body, field: member.value})])
        value = getattr(decoded, field)
        assert value is member and type(value) is enum


@pytest.mark.parametrize("kind,body,field,enum", _ENUM_FIELDS, ids=[f"{k}.{f}" for k, _, f, _ in _ENUM_FIELDS])
@pytest.mark.parametrize("bad", ["exploded", "START", " start", 1, None, True, ["start"]], ids=repr)
def test_enum_fields_refuse_unknown_values(kind, body, field, enum, bad):
    with pytest.raises(ProtocolError, match=field):
        decode([_header(kind, {**body, field: bad})])


def test_summary_item_kind_is_validated_in_a_nested_item():
    item = {"kind": "histogram", "tag": "w", "step": 1, "wall_time": 1.0, "dtype": "float64", "shape": [3]}
    decoded, _ = decode([_header("summary_batch", {"items": [item]}), b"frame"])
    assert decoded.items[0].kind is m.ItemKind.HISTOGRAM
    with pytest.raises(ProtocolError, match="kind"):
        decode([_header("summary_batch", {"items": [{**item, "kind": "audio"}]})])


def test_wire_values_of_the_enums_are_the_old_strings():
    assert [r.value for r in m.Role] == ["trainer", "checkpoint", "summary", "ps", "server"]  # (ps, server: --ps tasks)
    assert {r.value for r in m.SaveReason} == {"periodic", "steps", "final", "preempted", "lost", "memory"}
    assert [b.value for b in m.Busy] == ["", "snapshot", "final_checkpoint", "input", "waiting"]
    assert [s.value for s in m.SessionStatus] == ["start", "stop", "checkpoint"]
    assert [k.value for k in m.ItemKind] == ["histogram", "image", "text"]
    assert _body(m.Progress(1, 2, 3.0, m.Busy.SNAPSHOT))["busy"] == "snapshot"
    assert _body(m.Hello(m.Role.SUMMARY, 1, 1))["role"] == "summary"


def test_enum_members_compare_and_print_as_their_strings():
    """The watchdog compares these fields to plain strings and formats them into messages."""
    assert m.Role.TRAINER == "trainer" and {"trainer": 1}[m.Role.TRAINER] == 1
    assert f"{m.SaveReason.PREEMPTED} checkpoint" == "preempted checkpoint"
    assert str(m.SessionStatus.STOP) == "stop"
    assert json.dumps({"reason": m.SaveReason.LOST}) == '{"reason": "lost"}'


def test_progress_is_not_busy_by_default_and_busy_when_busy():
    assert not bool(m.Progress(pid=1, step=2, wall_time=3.0).busy)
    assert not m.Busy.NONE and m.Progress(1, 2, 3.0).busy == ""
    decoded, _ = decode(encode(m.Progress(pid=1, step=2, wall_time=3.0)))
    assert not bool(decoded.busy)
    for busy in (m.Busy.SNAPSHOT, m.Busy.FINAL_CHECKPOINT):
        decoded, _ = decode(encode(m.Progress(pid=1, step=2, wall_time=3.0, busy=busy)))
        assert bool(decoded.busy) and decoded.busy == busy


def test_every_field_of_every_message_has_a_type_the_codec_checks():
    """No bare ``list``/``Any``: the codec validates every field, element by element."""
    import typing

    from procsv.ipc.codec import _hints

    def check(tp, where):
        origin = typing.get_origin(tp)
        if origin in (list, dict) or origin is typing.Union or str(origin) == "<class 'types.UnionType'>":
            args = typing.get_args(tp)
            assert args, f"{where}: {tp!r} has no element type"
            for a in args:
                check(a, where)
            return
        assert tp is not typing.Any and tp is not list and tp is not dict, f"{where}: untyped {tp!r}"
        if dataclasses.is_dataclass(tp):
            for f in dataclasses.fields(tp):
                check(_hints(tp)[f.name], f"{where}.{f.name}")

    for cls in m.ALL_MESSAGES:
        check(cls, cls.__name__)


# ----------------------------------------------------------------------------- values no sender means


@pytest.mark.parametrize("body", [
    {"pid": 1, "step": 1 << 63, "wall_time": 1.0},  # above int64
    {"pid": -(1 << 63) - 1, "step": 1, "wall_time": 1.0},  # below int64
])
def test_an_integer_outside_int64_is_refused(body):
    with pytest.raises(ProtocolError, match="outside int64"):
        decode([_header("progress", body)])


def test_nan_is_refused_and_infinity_is_a_number():
    with pytest.raises(ProtocolError, match="NaN"):
        decode([b'{"v": %d, "kind": "progress", "body": {"pid": 1, "step": 1, "wall_time": NaN}}' % m.SCHEMA_VERSION])
    decoded, _ = decode([_header("progress", {"pid": 1, "step": 1, "wall_time": float("inf")})])
    assert decoded.wall_time == float("inf")


def test_a_lone_surrogate_in_a_string_is_refused():
    with pytest.raises(ProtocolError, match="surrogate"):
        decode([_header("session_log", {"status": "checkpoint", "step": 1, "checkpoint_path": "\udcff"})])


def test_every_refusal_has_a_reason():
    from procsv.ipc.codec import RejectReason, SchemaMismatch

    cases = {
        RejectReason.EMPTY: [b""],
        RejectReason.NOT_JSON: [b"\xff"],
        RejectReason.NOT_OBJECT: [b"[]"],
        RejectReason.SCHEMA_VERSION: [_header("save_request", {"reason": "periodic"}, v=m.SCHEMA_VERSION + 1)],
        RejectReason.UNKNOWN_KIND: [_header("nope", {})],
        RejectReason.BAD_FIELD: [_header("save_request", {"reason": "sometimes"})],
        RejectReason.FRAMES: [_header("save_request", {"reason": "periodic"}), b"extra"],
    }
    for reason, frames in cases.items():
        with pytest.raises(ProtocolError) as info:
            decode(frames)
        assert info.value.reason is reason
    with pytest.raises(SchemaMismatch) as mismatch:
        decode(cases[RejectReason.SCHEMA_VERSION])
    assert mismatch.value.version == m.SCHEMA_VERSION + 1
    with pytest.raises(ProtocolError) as unexpected:
        decode([_header("save_request", {"reason": "periodic"})], accept={m.Progress})
    assert unexpected.value.reason is RejectReason.UNEXPECTED_KIND


def test_a_huge_stack_fits_one_stacks_taken_under_the_links_frame_limit_keeping_the_innermost_frames():
    """Issue 69, an attack: a member of another host with 31 threads 900 frames deep (a recursion) gave a
    StacksTaken of ~1.8 MB, over the link's 1 MiB frame limit: ZeroMQ dropped it with the connection, and the
    hang's file said the host "did not answer". Its agent now sends it fitted: every frame of the message under
    the limit, each thread's innermost frames kept, the cut named."""
    from procsv.ipc.stack_messages import Frame, ProcessStacks, StacksTaken, ThreadStack, fitted
    from procsv.ipc.transport import CONTROL_FRAME_MAX

    def thread(tid: int, depth: int) -> ThreadStack:
        frames = [Frame("Lock.acquire" if i == 0 else "rec", "/home/user/project/src/model/att_group.py", i, False)
                  for i in range(depth)]
        return ThreadStack(tid, f"Thread-{tid}", True, False, frames, "futex")

    for n, depth in ((31, 900), (3000, 6)):  # deep threads; then more threads than fit at all
        huge = ProcessStacks("worker1", 7, [thread(7, depth)] + [thread(100 + i, depth) for i in range(n - 1)], host="h1")
        assert max(len(f) for f in encode(StacksTaken(1, 1, huge))) > CONTROL_FRAME_MAX  # (as it was sent)
        fit = fitted(huge)
        frames = encode(StacksTaken(1, 1, fit))
        assert max(len(f) for f in frames) < CONTROL_FRAME_MAX, [len(f) for f in frames]
        assert fit.main is not None and fit.main.frames[0].name == "Lock.acquire" and fit.host == "h1"
        if n == 31:
            assert any("frames left out" in f.name for t in fit.threads for f in t.frames)
        else:
            assert fit.threads[-1].name.endswith("more threads left out (the answer's size)"), fit.threads[-1]
    small = ProcessStacks("worker1", 7, [thread(7, 30)])
    assert fitted(small) is small
