"""Garbage on every socket of a live run: nothing crashes, no step is lost, every refusal is counted.

The pure tests check the codec against arbitrary input (hypothesis: any frames, any JSON header,
valid messages with one field replaced) -- :func:`decode` returns a message or raises
:class:`ProtocolError`, nothing else -- and check :class:`Garbage`, the seeded generator the live
test uses: every message it makes is one the receiving socket refuses, and together they cover
every reason. The slow test sends 10,000 of them to each of the run's three sockets
(``watchdog.sock``, ``checkpoint.sock``, ``summary.sock``), plus frames above each socket's
``MAXMSGSIZE`` on a connection of their own, and then checks: the same processes (pids) live,
each counted exactly what it was sent (the stats files, ``procsv status --json``), said a schema
mismatch once, the steps went on and the next checkpoint commits and restores with
``tf.train.Checkpoint``.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import os
import random
import signal
import time
import types
import typing
from typing import Any, Optional

import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import committed_steps, finish, launch, quiet_env, raw_status, runtime_dir, status_json, wait_for
from procsv.ipc import messages as m
from procsv.ipc.codec import ProtocolError, RejectReason, decode, encode
from procsv.ipc.transport import CHECKPOINT_FRAME_MAX, CONTROL_FRAME_MAX, SUMMARY_FRAME_MAX, Endpoints
from procsv.services.checkpoint.service import ACCEPT as CHECKPOINT_ACCEPT
from procsv.services.summary.service import ACCEPT as SUMMARY_ACCEPT
from procsv.watchdog.launcher import ACCEPT as WATCHDOG_ACCEPT
from test_codec import SAMPLES

SEED = int(os.environ.get("PROCSV_TEST_SEED", "20261122"))
PER_SOCKET = 10_000

# ----------------------------------------------------------------------------- the generator


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)  # resolved in the module that defines the message


def _wrong_values(tp: Any) -> list[Any]:
    """Values of the wrong JSON type for a field annotated ``tp`` (may include a right one by
    accident for unions; the generator keeps only what the codec refuses)."""
    universal = [{"\x00bad": [1]}, [[None]], "\udcff-lone-surrogate"]
    if tp is int:
        return [*universal, "7", 7.5, True, None, 2 ** 70 * 1.0]
    if tp is float:
        return [*universal, "1.5", False, None, [1.0]]
    if tp is bool:
        return [*universal, 1, 0, "true", None]
    if tp is str:
        return [*universal, 7, None, 3.5]
    return [*universal, 12345, "x", None, True]


class Garbage:
    """Seeded malformed messages for a receiver that takes ``accept``: each one is refused by the
    codec (checked here, so a receiver's count must equal the number sent)."""

    def __init__(self, accept: frozenset[type[m.Message]], seed: int, big_frame: int) -> None:
        self.accept = accept
        self.rng = random.Random(seed)
        self.big_frame = big_frame  # bytes of the largest frame it makes (below the socket's limit)
        self.mine = [(msg, payload) for _, msg, payload in SAMPLES if type(msg) in accept]
        self.others = [(msg, payload) for _, msg, payload in SAMPLES if type(msg) not in accept]
        self.makers = [
            (5, self.empty), (10, self.binary), (8, self.non_utf8), (12, self.truncated), (8, self.newer_version),
            (10, self.wrong_kind), (6, self.unknown_kind), (14, self.wrong_type), (6, self.missing_field),
            (6, self.unknown_field), (8, self.frames), (5, self.not_object), (1, self.deep), (1, self.huge_number),
            (0.05, self.big),
        ]
        self.weights = [w for w, _ in self.makers]

    def __iter__(self) -> "Garbage":
        return self

    def __next__(self) -> list[bytes]:
        while True:
            (make,) = self.rng.choices([f for _, f in self.makers], self.weights)
            frames = make()
            try:
                decode(frames, self.accept)
            except ProtocolError:
                return frames
            # accidentally valid (a union took the wrong value): make another

    # -- helpers
    def _valid(self) -> tuple[m.Message, list[bytes]]:
        msg, payload = self.rng.choice(self.mine)
        return msg, [bytes(p) for p in payload]

    def _obj(self, msg: m.Message) -> dict[str, Any]:
        return json.loads(encode(msg)[0])

    def _frames(self, obj: Any, payload: list[bytes]) -> list[bytes]:
        return [json.dumps(obj).encode(), *payload]

    # -- makers
    def empty(self) -> list[bytes]:
        return [b""] + [b""] * self.rng.randrange(3)

    def binary(self) -> list[bytes]:
        return [b"\xff" + self.rng.randbytes(self.rng.randrange(0, 300))] + \
            [self.rng.randbytes(self.rng.randrange(50)) for _ in range(self.rng.randrange(3))]

    def non_utf8(self) -> list[bytes]:
        msg, payload = self._valid()
        head = encode(msg)[0]
        cut = self.rng.randrange(1, len(head))
        return [head[:cut] + b"\xc3\x28\xa0\xa1" + head[cut:], *payload]

    def truncated(self) -> list[bytes]:
        msg, payload = self._valid()
        head = encode(msg)[0]
        return [head[: self.rng.randrange(1, len(head))], *payload]

    def newer_version(self) -> list[bytes]:
        msg, payload = self._valid()
        obj = self._obj(msg)
        obj["v"] = m.SCHEMA_VERSION + 1
        return self._frames(obj, payload)

    def wrong_kind(self) -> list[bytes]:
        msg, payload = self.rng.choice(self.others)
        return [bytes(f) for f in encode(msg, payload)]

    def unknown_kind(self) -> list[bytes]:
        msg, payload = self._valid()
        obj = self._obj(msg)
        obj["kind"] = self.rng.choice(["", "Hello", "save-data", "x" * 500, 7, None, ["hello"]])
        return self._frames(obj, payload)

    def wrong_type(self) -> list[bytes]:
        msg, payload = self._valid()
        obj = self._obj(msg)
        fields = dataclasses.fields(msg)
        f = self.rng.choice(fields)
        tp = _hints(type(msg))[f.name]
        if typing.get_origin(tp) in (typing.Union, types.UnionType):
            tp = next(a for a in typing.get_args(tp) if a is not type(None))
        obj["body"][f.name] = self.rng.choice(_wrong_values(tp))
        return self._frames(obj, payload)

    def missing_field(self) -> list[bytes]:
        msg, payload = self._valid()
        obj = self._obj(msg)
        required = [f.name for f in dataclasses.fields(msg)
                    if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
        if not required:
            return self.unknown_field()
        del obj["body"][self.rng.choice(required)]
        return self._frames(obj, payload)

    def unknown_field(self) -> list[bytes]:
        msg, payload = self._valid()
        obj = self._obj(msg)
        obj["body"][self.rng.choice(["extra", "__class__", "KIND", "pid2"])] = self.rng.choice([1, "x", None, {}])
        return self._frames(obj, payload)

    def frames(self) -> list[bytes]:
        msg, payload = self._valid()
        head = encode(msg)[0]
        if payload and self.rng.random() < 0.6:
            del payload[self.rng.randrange(len(payload))]  # a missing frame
        else:
            payload.insert(self.rng.randrange(len(payload) + 1), self.rng.randbytes(self.rng.randrange(64)))
        return [head, *payload]

    def not_object(self) -> list[bytes]:
        msg, payload = self._valid()
        obj = self._obj(msg)
        choice = self.rng.randrange(4)
        if choice == 0:
            obj["body"] = self.rng.choice([[], "body", 1, None])
            return self._frames(obj, payload)
        if choice == 1:
            del obj["body"]
            return self._frames(obj, payload)
        return [json.dumps(self.rng.choice([[obj], "text", 42, None, True, [], 1.5])).encode(), *payload]

    def deep(self) -> list[bytes]:
        n = self.rng.choice([1000, 100_000])
        return [b"[" * n + b"]" * n]

    def huge_number(self) -> list[bytes]:
        return [b'{"v": ' + b"9" * self.rng.choice([5000, 50_000]) + b', "kind": "hello", "body": {}}']

    def big(self) -> list[bytes]:
        return [b"\xfe" + self.rng.randbytes(self.big_frame - 1)]


SOCKETS = {  # endpoint attribute -> (what its receiver takes, the largest frame to make: below its limit)
    "watchdog": (WATCHDOG_ACCEPT, CONTROL_FRAME_MAX // 2),
    "checkpoint": (CHECKPOINT_ACCEPT, min(8 << 20, CHECKPOINT_FRAME_MAX // 2)),
    "summary": (SUMMARY_ACCEPT, 8 << 20),
}


# ----------------------------------------------------------------------------- pure


def _reason(frames: list[bytes], accept: Any) -> str:
    try:
        decode(frames, accept)
    except ProtocolError as exc:
        return exc.reason.value
    raise AssertionError("a generated message decoded")


@pytest.mark.parametrize("name", sorted(SOCKETS))
def test_every_generated_message_is_refused_and_every_reason_is_covered(name):
    accept, _ = SOCKETS[name]
    gen = Garbage(accept, SEED, big_frame=1 << 16)
    reasons = {_reason(next(gen), accept) for _ in range(3000)}
    assert reasons >= {r.value for r in RejectReason} - {RejectReason.NO_IDENTITY.value}


def test_a_deep_header_runs_no_finalizer_out_of_stack(monkeypatch):
    """A header nested past the recursion limit is refused, and a collection its parse would set off down there
    (CI's run D: pytest's unraisable hook failed formatting a finalizer's RecursionError) waits until after."""
    import sys

    failed: list[str] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: failed.append(repr(u.exc_value)))
    ran: list[int] = []

    class Cycle:
        def __del__(self) -> None:
            def down(n: int) -> int:
                return down(n - 1) if n else 0
            ran.append(down(40))

    old = gc.get_threshold()
    gc.freeze()  # (the worker's heap out of the collections: a full one costs 0.5 s in a worker holding TensorFlow)
    try:
        for threshold in range(900, 1000, 4):  # the collection falls at depths 900..1000 of the parse
            gc.collect()
            gc.set_threshold(threshold)
            c = Cycle()
            c.me = c  # type: ignore[attr-defined]
            del c
            with pytest.raises(ProtocolError) as refused:
                decode([b"[" * 2000 + b"]" * 2000])
            assert refused.value.reason == RejectReason.NOT_JSON
    finally:
        gc.set_threshold(*old)
        gc.collect()
        gc.unfreeze()
    assert failed == [] and len(ran) == 25


@given(st.lists(st.binary(max_size=200), max_size=4))
@settings(max_examples=400, deadline=None)
def test_decode_of_arbitrary_frames_only_ever_raises_protocol_error(frames):
    try:
        decode(frames)
    except ProtocolError:
        pass


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                    max_leaves=20)


@given(st.sampled_from([s[1] for s in SAMPLES]), st.data())
@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@pytest.mark.slow
def test_a_sample_with_any_field_replaced_decodes_or_is_a_protocol_error(msg, data):
    obj = json.loads(encode(msg)[0])
    body = obj["body"]
    name = data.draw(st.sampled_from(sorted(body)))
    body[name] = data.draw(JSON)
    try:
        decoded, _ = decode([json.dumps(obj).encode()] + [b"x"] * data.draw(st.integers(0, 6)))
    except ProtocolError:
        return
    assert type(decoded) is type(msg)


@given(st.fixed_dictionaries({"v": JSON, "kind": st.sampled_from([c.KIND for c in m.ALL_MESSAGES]) | JSON,
                              "body": JSON}))
@settings(max_examples=400, deadline=None)
@pytest.mark.slow
def test_any_json_header_decodes_or_is_a_protocol_error(obj):
    try:
        decode([json.dumps(obj).encode()])
    except ProtocolError:
        pass


# ----------------------------------------------------------------------------- live


def _stats(logdir: str, name: str) -> Optional[dict[str, Any]]:
    try:
        with open(os.path.join(logdir, ".procsv", name)) as fh:
            return json.load(fh)
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def _rejected(logdir: str) -> dict[str, int]:
    """Each receiver's rejection total, from the file it writes."""
    st_ = raw_status(logdir) or {}
    ck = _stats(logdir, "checkpoint_stats.json") or {}
    su = _stats(logdir, "summary_stats.json") or {}
    return {"watchdog": (st_.get("rejected") or {}).get("total", -1),
            "checkpoint": (ck.get("rejected") or {}).get("total", -1),
            "summary": (su.get("rejected") or {}).get("total", -1)}


def _pids(logdir: str) -> dict[str, int]:
    return {p["role"]: p["pid"] for p in (raw_status(logdir) or {}).get("processes", [])}


def _runtime_dir(pid: int) -> str:
    return runtime_dir(pid)


def _restore(path: str) -> int:
    import tensorflow as tf

    from procsv.examples.digits import build_model

    model, optimizer, _ = build_model()
    step = tf.Variable(0, dtype=tf.int64)
    tf.train.Checkpoint(model=model, optimizer=optimizer, global_step=step).restore(path).assert_consumed()
    return int(step.numpy())


@pytest.mark.slow
def test_ten_thousand_malformed_messages_per_socket_crash_nothing_and_are_all_counted(logdir):
    # (steps at 0.02 s: the trainer steps, reports and commits through the fuzz; at 0.002 its steps were
    # ~5 CPU-s of the test's 14 and made the fuzz twice as long)
    proc = launch(logdir, "--steps", "1000000", "--step-delay", "0.02", "--save-model-secs", "2",
                  opts=("--quiet", "--standby", "fork"), env=quiet_env(TMPDIR="/tmp"))  # (nothing restarts: no standby)
    try:
        wait_for(lambda: (raw_status(logdir) or {}).get("step", 0) > 0, 90, what="the first step")
        wait_for(lambda: min(_rejected(logdir).values()) >= 0, 30, what="every stats file")
        before_pids = _pids(logdir)
        assert set(before_pids) == {"watchdog", "trainer", "checkpoint", "summary"}
        before = _rejected(logdir)
        step_before = raw_status(logdir)["step"]
        endpoints = Endpoints(_runtime_dir(before_pids["checkpoint"]))

        ctx = zmq.Context()
        sent: dict[str, int] = {}
        t0 = time.monotonic()
        try:
            for i, (name, (accept, big)) in enumerate(sorted(SOCKETS.items())):
                kind = zmq.PUSH if name == "watchdog" else zmq.DEALER
                sock = ctx.socket(kind)
                sock.setsockopt(zmq.SNDTIMEO, 20_000)
                sock.setsockopt(zmq.LINGER, 5000)
                sock.connect(getattr(endpoints, name))
                gen = Garbage(accept, SEED + i, big)
                for _ in range(PER_SOCKET):
                    sock.send_multipart(next(gen))
                sent[name] = PER_SOCKET
                # frames above the socket's MAXMSGSIZE, on a connection of their own: ZeroMQ drops
                # that connection before allocating the frame; the receiver never sees them
                limit = {"watchdog": CONTROL_FRAME_MAX, "summary": SUMMARY_FRAME_MAX,
                         "checkpoint": None}[name]
                if limit is not None:
                    over = ctx.socket(kind)
                    over.setsockopt(zmq.LINGER, 2000)
                    over.connect(getattr(endpoints, name))
                    over.send_multipart([b"\xff" * (limit + 1)])
                    over.close()
                sock.close()
        finally:
            ctx.destroy(linger=0)  # closes a socket an exception left open (term() would wait on it forever)
        fuzz_secs = time.monotonic() - t0

        want = {name: before[name] + sent[name] for name in sent}
        wait_for(lambda: _rejected(logdir) == want, 60, interval=0.2,
                 what=f"the rejection counts {want} (now {_rejected(logdir)})")

        # nothing crashed or restarted: the same processes, alive, first attempts
        assert _pids(logdir) == before_pids
        status = status_json(logdir)
        assert status is not None and status["state"] == "running" and status["restarts"] == 0
        assert all(p["alive"] for p in status["processes"]), status["processes"]
        assert {r: (v or {}).get("total") for r, v in status["rejected"].items()} == want
        assert status["rejected"]["summary"]["by_reason"].get("schema_version", 0) > 0
        print(f"rejected, by process and reason: {status['rejected']}")

        # training went on, and the next checkpoint commits and restores with plain TensorFlow
        step_after_fuzz = raw_status(logdir)["step"]
        assert step_after_fuzz > step_before
        wait_for(lambda: any(s > step_after_fuzz for s in committed_steps(logdir)), 60,
                 what="a checkpoint committed after the fuzz")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
        code, out, err = finish(proc, timeout=120)
    assert code == 128 + signal.SIGTERM, err[-3000:]
    import tensorflow as tf

    latest = tf.train.latest_checkpoint(logdir)  # the run's final checkpoint, after the fuzz
    assert latest is not None and _restore(latest) == max(committed_steps(logdir)) > step_after_fuzz

    # a schema mismatch is said once per process, however many arrived
    for role in ("checkpoint", "summary"):
        with open(os.path.join(logdir, "logs", f"{role}.1.log")) as fh:
            log = fh.read()
        assert log.count("refusing messages with schema version") == 1, log[-3000:]
        assert log.count("refused a malformed message") <= len(RejectReason), log[-3000:]
    assert err.count("refusing messages with schema version") == 1, err[-3000:]
    print(f"fuzz: sent {sent} malformed messages in {fuzz_secs:.1f} s; rejection counts went from {before} to {want}")


# ----------------------------------------------------------------------------- well-formed, odd values


class OddValues:
    """Seeded messages of the kinds a service takes, well-formed (the codec accepts them) but with
    values no trainer sends: extreme integers, infinities, odd strings, shapes and dtypes that do
    not fit their frames, arena references to files that are not the trainer's memory."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def int(self) -> int:
        return self.rng.choice([0, 1, -1, (1 << 63) - 1, -(1 << 63), self.rng.randrange(-100, 100)])

    def float(self) -> float:
        return self.rng.choice([0.0, -1.0, float("inf"), -float("inf"), 1e308, self.rng.random()])

    def str(self) -> str:
        return self.rng.choice(["", "x", "a/b", "../x", "../../x", "\x00", "model.ckpt", "é" * 50, "x" * 5000,
                                "float32", "uint8", "json", "float64", "string", "variant", "int64", "bfloat16"])

    def frames(self, n: int) -> list[bytes]:
        return [self.rng.randbytes(self.rng.choice([0, 1, 7, 8, 28, 64, 1000])) for _ in range(n)]

    def summary(self) -> tuple[m.Message, list[bytes]]:
        r = self.rng
        if r.random() < 0.2:
            return m.SessionLogEvent(r.choice(list(m.SessionStatus)), self.int(), self.str()), []
        items = [m.SummaryItem(r.choice(list(m.ItemKind)), self.str(), self.int(), self.float(), self.str(),
                               [self.int() for _ in range(r.randrange(5))], self.int(), self.str())
                 for _ in range(r.randrange(3))]
        protos = [m.ProtoRef(self.int(), self.float()) for _ in range(r.randrange(3))]
        columns = r.choice([0, 0, 1, 3, 1 << 40])
        msg = m.SummaryBatch(protos, self.int(), r.choice(["", "s1", "s2"]), self.int(),
                             r.choice([None, self.int()]), columns, items, self.int(), self.float(), self.float(),
                             r.choice([None, self.float()]), self.int())
        return msg, self.frames(len(protos) + (1 if columns else 0) + len(items))

    def checkpoint(self, pid: int) -> tuple[m.Message, list[bytes]]:
        r = self.rng
        arena = r.choice([None, m.ArenaRef(r.choice(["/proc/self/fd/0", "/etc/passwd", "/nonexistent", "",
                                                     f"/proc/{pid}/fd/1"]), self.int(), self.int())])
        if r.random() < 0.5:
            return m.CheckpointSetup(self.int(), self.str(), r.choice([None, self.float()]), self.int(),
                                     r.choice([None, self.float()]), self.int(), arena,
                                     r.choice([None, self.int()])), []
        tensors = [m.TensorSpec(self.str(), self.str(), [self.int() for _ in range(r.randrange(3))],
                                r.choice([None, [self.int() for _ in range(r.randrange(3))]]),
                                None if arena is None else r.choice([None, self.int()]))
                   for _ in range(r.randrange(4))]
        msg = m.SaveData(self.int(), r.choice(list(m.SaveReason)), self.str(), tensors, arena)
        return msg, self.frames(sum(1 for t in tensors if t.offset is None))


@pytest.mark.slow
@pytest.mark.parametrize("role,count", [("summary", 3000), ("checkpoint", 500)])
def test_well_formed_messages_with_odd_values_never_stop_a_service(tmp_path, role, count):
    from procsv.common import spawn
    from procsv.common.layout import Layout
    from procsv.ipc.transport import make_socket, send

    logdir, runtime = str(tmp_path / "run"), str(tmp_path / "rt")
    Layout(logdir).create()
    os.makedirs(runtime, mode=0o700)
    env = spawn.child_env(role=role, attempt=1, logdir=logdir, runtime_dir=runtime, supervised=False)
    service = spawn.spawn(spawn.service_argv(role), env, os.path.join(logdir, "logs", f"{role}.1.log"))
    ctx = zmq.Context()
    try:
        wait_for(lambda: _stats(logdir, f"{role}_stats.json"), 60, what="the service to be up")
        sock = make_socket(ctx, zmq.DEALER, sndhwm=100_000, linger_ms=2000, identity=b"trainer-1")
        sock.setsockopt(zmq.SNDTIMEO, 20_000)
        sock.connect(getattr(Endpoints(runtime), role))
        gen = OddValues(SEED)
        for _ in range(count):
            msg, frames = gen.summary() if role == "summary" else gen.checkpoint(os.getpid())
            decode(encode(msg, frames))  # well-formed: the codec takes it
            assert send(sock, msg, frames, block=True)
        sock.send_multipart([b"\xffthe last one"])  # refused and counted once everything before it is handled
        wait_for(lambda: ((_stats(logdir, f"{role}_stats.json") or {}).get("rejected") or {}).get("total") == 1,
                 120, interval=0.2, what="the service to get through it all")
        assert service.poll() is None
        sock.close()
        service.send_signal(signal.SIGTERM)
        assert service.wait(timeout=60) == 0
    finally:
        ctx.destroy(linger=0)  # closes a socket an exception left open (term() would wait on it forever)
        if service.poll() is None:
            service.kill()
            service.wait()
    with open(os.path.join(logdir, "logs", f"{role}.1.log")) as fh:
        assert "Traceback" not in fh.read()
    outside = [p for p in os.listdir(tmp_path) if p not in ("run", "rt")]
    assert not outside  # no file was written outside the logdir (a basename like ../../x)
