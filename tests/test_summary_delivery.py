"""Trainer-side hand-off against a real summary service process: acks, restarts, garbage.

No TensorFlow here: the test process plays the trainer with the real :class:`SummarySender` and
a real ZeroMQ DEALER socket (acks come back on it); the summary service is a real child process that the tests SIGKILL,
SIGSTOP and restart (as the watchdog would). Event files are read back with TensorBoard's
``EventAccumulator``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import statistics
import time
from typing import Any

import numpy as np
import pytest
import zmq
from tensorboard.backend.event_processing import event_accumulator as ea

from conftest import wait_for
from procsv.ipc.codec import encode
from procsv.ipc.columns import encode_columns
from procsv.ipc.messages import SCHEMA_VERSION, ItemKind, ProtoRef, SummaryAck, SummaryBatch, SummaryItem
from procsv.ipc.transport import Endpoints, make_socket, send
from procsv.common import spawn
from procsv.common.layout import Layout, read_json
from procsv.trainer.channels import read_summary_acks
from procsv.trainer.summaries import BUFFER_MAX, SummaryBuffer, SummarySender

SIZES = {ea.SCALARS: 0, ea.TENSORS: 0, ea.HISTOGRAMS: 0, ea.IMAGES: 0}


class Run:
    """A logdir, a runtime dir, the summary service process and a trainer-side sender."""

    def __init__(self, tmp_path: Any, logdir: str) -> None:
        self.logdir = logdir
        Layout(logdir).create()
        self.runtime = str(tmp_path / "rt")
        os.makedirs(self.runtime, mode=0o700)
        self.endpoints = Endpoints(self.runtime)
        self.attempt = 0
        self.service: subprocess.Popen | None = None
        self.start_service()
        self.zctx = zmq.Context()
        self.push = make_socket(self.zctx, zmq.DEALER, sndhwm=256, linger_ms=3000)  # as TrainerChannels
        self.push.connect(self.endpoints.summary)
        self.acks: list[SummaryAck] = []  # every ack the sender read, in order
        self.buffer = SummaryBuffer()
        self.sender = SummarySender(self.buffer, lambda m, f: send(self.push, m, f), self.read_acks,
                                    step_rate_secs=0.5)

    def read_acks(self, timeout: float) -> list[SummaryAck]:
        got = read_summary_acks(self.push, timeout)
        self.acks += got
        return got

    def start_service(self) -> None:
        self.attempt += 1
        env = spawn.child_env(role="summary", attempt=self.attempt, logdir=self.logdir, runtime_dir=self.runtime,
                              supervised=False)
        self.service = spawn.spawn(spawn.service_argv("summary"), env,
                                   os.path.join(self.logdir, "logs", f"summary.{self.attempt}.log"))
        pid = self.service.pid
        # the service writes its stats file (with its pid) once its socket is bound
        wait_for(lambda: (read_json(Layout(self.logdir).summary_stats) or {}).get("pid") == pid, 30,
                 what="the service to be up")

    def stop_service(self) -> int:
        assert self.service is not None
        self.service.send_signal(signal.SIGTERM)
        return self.service.wait(timeout=30)

    def close(self) -> None:
        self.push.close()
        self.zctx.term()
        if self.service is not None and self.service.poll() is None:
            os.kill(self.service.pid, signal.SIGCONT)  # a test that failed while it was SIGSTOPped
            self.stop_service()

    def service_log(self) -> str:
        with open(os.path.join(self.logdir, "logs", f"summary.{self.attempt}.log")) as fh:
            return fh.read()


@pytest.fixture
def run(tmp_path, logdir):
    r = Run(tmp_path, logdir)
    yield r
    r.close()


def scalars(logdir: str) -> dict[str, list[tuple[int, float]]]:
    acc = ea.EventAccumulator(logdir, size_guidance=SIZES)
    acc.Reload()
    return {t: [(e.step, e.value) for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]}


# The outage in these tests lasts until the test ends it; scheduling noise on a shared 2-core
# machine has stalled one boundary for a quarter of a second (seen in CI), so 50 ms was a timing
# test, not a check of "never waits". 1 s is far below any outage here and far above noise.
NOT_WAITING = 1.0


def train(run: Run, first: int, last: int, per_step: float = 0.0) -> float:
    """Log loss=step and acc=-step for each step, with a boundary per step; return the slowest boundary (s)."""
    worst = 0.0
    for step in range(first, last + 1):
        run.buffer.scalars({"loss": float(step), "acc": -float(step)}, step, time.time())
        t0 = time.perf_counter()
        run.sender.at_boundary(step)
        worst = max(worst, time.perf_counter() - t0)
        if per_step:
            time.sleep(per_step)
    return worst


def assert_every_step_once(logdir: str, first: int, last: int) -> None:
    got = scalars(logdir)
    assert got["loss"] == [(s, float(s)) for s in range(first, last + 1)]
    assert got["acc"] == [(s, -float(s)) for s in range(first, last + 1)]


@pytest.mark.slow
def test_everything_logged_is_written_once_and_acknowledged(run):
    train(run, 1, 2000)
    assert run.sender.close(2000, timeout=30) == 0
    assert_every_step_once(run.logdir, 1, 2000)
    # the acks came back as messages, for this session only, and confirm every batch it sent
    assert run.acks and {a.session for a in run.acks} == {run.sender.session}
    written = [a.written for a in run.acks]
    assert written == sorted(written) and written[-1] == run.sender._next_seq - 1
    assert all(a.resync_after == 0 for a in run.acks)
    assert run.stop_service() == 0
    stats = read_json(Layout(run.logdir).summary_stats)
    assert stats["written"] == 4000 and stats["dropped"] == 0


@pytest.mark.slow
def test_a_killed_service_loses_nothing_once_restarted(run):
    train(run, 1, 300, per_step=0.001)
    os.kill(run.service.pid, signal.SIGKILL)  # mid-run, with batches in flight
    run.service.wait()
    worst = train(run, 301, 600, per_step=0.001)  # the service is down: logging goes on
    # a hand-off that waited for the service would wait for the whole outage (it does not end during
    # this loop); any bound far below that shows it never waits. Per-call cost is bench_summary's job.
    assert worst < NOT_WAITING, f"a step boundary took {worst * 1000:.1f} ms while the service was down"
    run.start_service()
    train(run, 601, 900, per_step=0.001)
    assert run.sender.close(900, timeout=30) == 0
    assert run.sender.restatements >= 1
    assert any(a.resync_after > 0 for a in run.acks)  # the restarted service asked, by message
    assert_every_step_once(run.logdir, 1, 900)
    files = sorted(f for f in os.listdir(run.logdir) if f.startswith("events.out.tfevents."))
    assert len(files) == 2


@pytest.mark.slow
def test_a_service_killed_twice_while_hung_loses_nothing(run):
    train(run, 1, 200)
    os.kill(run.service.pid, signal.SIGSTOP)  # hung: the socket still takes data, nothing is written
    worst = train(run, 201, 1200, per_step=0.0005)
    assert worst < NOT_WAITING, f"a step boundary took {worst * 1000:.1f} ms while the service hung"
    os.kill(run.service.pid, signal.SIGKILL)
    run.service.wait()
    run.start_service()
    train(run, 1201, 1300)
    os.kill(run.service.pid, signal.SIGKILL)  # again, possibly in the middle of the restatement
    run.service.wait()
    run.start_service()
    train(run, 1301, 1400)
    assert run.sender.close(1400, timeout=30) == 0
    assert_every_step_once(run.logdir, 1, 1400)


@pytest.mark.slow
def test_global_step_per_sec_is_written_by_the_service(run):
    began = time.monotonic()
    train(run, 1, 400, per_step=0.005)  # about 2 s at step_rate_secs=0.5
    mean = 400 / (time.monotonic() - began)  # the rate the loop ran at (at load 21: 23-50, not ~150)
    assert run.sender.close(400, timeout=30) == 0
    rate = scalars(run.logdir)["global_step/sec"]
    assert len(rate) >= 2
    steps = [s for s, _ in rate]
    assert steps == sorted(set(steps))
    assert all(0 < v < 250 for _, v in rate), rate  # never faster than 1 / (5 ms + work)
    assert mean / 3 < statistics.median(v for _, v in rate) < mean * 3, (rate, mean)


def test_histograms_images_text_and_protos_arrive(run):
    from tensorboard.compat.proto import summary_pb2
    from tensorboard.util import tensor_util

    run.buffer.histogram("weights", np.arange(100.0), 1, time.time(), buckets=10)
    run.buffer.image("digits", np.zeros((4, 8, 8, 1), np.float32) + 0.5, 1, time.time(), max_outputs=2)
    run.buffer.text("note", ["hello", "wörld"], 2, time.time())
    proto = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag="legacy", simple_value=4.0)])
    run.buffer.proto(proto, 3, time.time())
    run.sender.at_boundary(3)
    assert run.sender.close(3, timeout=30) == 0
    acc = ea.EventAccumulator(run.logdir, size_guidance=SIZES)
    acc.Reload()
    hist = tensor_util.make_ndarray(acc.Tensors("weights")[0].tensor_proto)
    assert hist.shape == (10, 3) and hist[:, 2].sum() == 100
    img = tensor_util.make_ndarray(acc.Tensors("digits")[0].tensor_proto)
    assert img[0] == b"8" and img[1] == b"8" and len(img) == 4  # max_outputs=2
    assert tensor_util.make_ndarray(acc.Tensors("note")[0].tensor_proto).tolist() == [b"hello", "wörld".encode()]
    assert [(e.step, e.value) for e in acc.Scalars("legacy")] == [(3, 4.0)]


def columns(table: bytes, index: list[int]) -> bytes:
    """A columns frame (see procsv.ipc.columns) with the given tag table and tag indices, built by hand."""
    n = len(index)
    pad = b"\0" * (-(4 + len(table)) % 8)
    return (len(table).to_bytes(4, "little") + table + pad + np.zeros(n).tobytes() + np.zeros(n).tobytes()
            + np.zeros(n, "<i8").tobytes() + np.array(index, "<u4").tobytes())


def header(kind: str, body: dict[str, Any]) -> bytes:
    return json.dumps({"v": SCHEMA_VERSION, "kind": kind, "body": body}).encode()


def test_garbage_never_stops_the_service(run):
    raw = make_socket(run.zctx, zmq.DEALER, linger_ms=1000)
    raw.connect(run.endpoints.summary)
    bad_item = SummaryItem(ItemKind.IMAGE, "x", 1, 1.0, "uint8", [3, 3])  # not [k, h, w, c]
    garbage = [
        [b"not json"],
        [b'{"v": 1, "kind": "nope", "body": {}}'],
        encode(SummaryBatch(columns=3), [columns(b'["a"]', [0, 0])]),  # 2 rows, not 3
        encode(SummaryBatch(columns=1), [columns(b'["a"]', [5])]),  # tag index out of range
        encode(SummaryBatch(columns=1), [columns(b'{"a": 1}', [0])]),  # the tag table is no list
        encode(SummaryBatch(columns=1), [b"\x01"]),  # a truncated frame
        encode(SummaryBatch(columns=1)),  # no frame at all
        [header("summary_batch", {"protos": [[1, 1.0]]}), b"\n\x00"],  # an untyped proto row
        encode(SummaryBatch([ProtoRef(1, 1.0)]), [b"\xff\xff\xff"]),  # not a Summary proto
        encode(SummaryBatch(items=[bad_item]), [bytes(9)]),
        [header("session_log", {"status": "exploded", "step": 3})],  # an unknown status
    ]
    for frames in garbage:
        raw.send_multipart(frames)
    raw.send_multipart(encode(SummaryBatch(columns=1), [encode_columns(["after"], [5], [1.5], [1.0])]))
    wait_for(lambda: "after" in scalars(run.logdir), 30, what="the valid batch after the garbage")
    assert run.service.poll() is None
    raw.close()
    assert run.stop_service() == 0
    log = run.service_log()
    # refused by the codec (not JSON, schema version 1, a missing frame, an untyped proto row, an
    # unknown status): counted, one line per reason; the rest is dropped by the service, one line each
    refused = read_json(os.path.join(run.logdir, ".procsv", "summary_stats.json"))["rejected"]
    assert refused == {"total": 5, "by_reason": {"bad_field": 2, "frames": 1, "not_json": 1, "schema_version": 1}}
    assert "Traceback" not in log and log.count("procsv summary: refus") == 4
    assert log.count("procsv summary: dropped") >= len(garbage) - refused["total"]


@pytest.mark.slow
def test_the_buffer_is_bounded_while_the_service_is_down(run, monkeypatch):
    from procsv.trainer import summaries
    from procsv.trainer.summaries import buffer, sender

    monkeypatch.setattr(buffer, "BUFFER_MAX", 5000)
    monkeypatch.setattr(sender, "WINDOW", 2000)
    os.kill(run.service.pid, signal.SIGKILL)
    run.service.wait()
    train(run, 1, 20_000)  # 40,000 rows, far more than the buffer and the window hold
    held = run.sender.unconfirmed()
    assert held <= 5000 + 2000 + summaries.BATCH_MAX
    dropped = run.buffer.dropped_total
    assert dropped >= 40_000 - held
    run.start_service()
    assert run.sender.close(20_000, timeout=60) == 0
    assert run.stop_service() == 0  # the end of the run: the final count is written
    got = scalars(run.logdir)
    written = len(got["loss"]) + len(got["acc"])
    assert written + dropped == 40_000  # every row is either written or counted
    assert [s for s, _ in got["loss"]] == sorted({s for s, _ in got["loss"]})
    wait_for(lambda: (read_json(Layout(run.logdir).summary_stats) or {}).get("dropped") == dropped, 10,
             what="the drop count in summary_stats.json")
    assert got["procsv/summaries_dropped"][-1][1] == dropped


@pytest.mark.slow
def test_random_service_kills_lose_no_acknowledged_point(run):
    """Many batches, the service SIGKILLed and restarted at random moments (sometimes again during
    the restatement, sometimes while a step cut across several batches is in flight): every point
    the sender saw acknowledged -- and, nothing being dropped, every point logged -- is read back by
    TensorBoard's EventAccumulator (purge on) exactly once."""
    import random

    seed = int(os.environ.get("PROCSV_TEST_SEED", "927744210"))  # fixed, so a failure reproduces
    rng = random.Random(seed)
    acked: set[tuple[str, int]] = set()
    real_ack = run.sender._acknowledge

    def acknowledge(written: int, step: int) -> None:  # note what the sender takes as written
        for sent in run.sender.inflight:
            if sent.seq <= written:
                acked.update((r[0], r[1]) for r in sent.chunk.rows)
        real_ack(written, step)

    run.sender._acknowledge = acknowledge
    tags = [f"m/{i}" for i in range(20)]
    wide = [f"wide/{i}" for i in range(12_000)]  # one step cut across batches (less than the tail keeps)
    logged: dict[str, list[tuple[int, float]]] = {}
    kills = 0
    down_until: int | None = None
    next_kill = rng.randrange(100, 1000)
    last = 6000
    for step in range(1, last + 1):
        # like bench_summary (b): while the service is slow or down the loop waits instead of letting
        # the bounded buffer drop (a drop is not a loss of an acknowledged point; this test is about those)
        # (a quarter: a restatement puts the unacknowledged window and the kept tail back on top of it)
        if len(run.buffer) > BUFFER_MAX // 4 and down_until is not None:
            run.start_service()  # an outage that long would overflow: end it now
            down_until = None
            next_kill = step + rng.randrange(100, 1000)
        deadline = time.monotonic() + 60
        while len(run.buffer) > BUFFER_MAX // 4 and time.monotonic() < deadline:
            run.sender.at_boundary(step - 1)
            time.sleep(0.005)
        values = {t: step + i / 8 for i, t in enumerate(wide if step % 1700 == 0 else tags)}
        run.buffer.scalars(values, step, time.time())
        for t, v in values.items():
            logged.setdefault(t, []).append((step, v))
        run.sender.at_boundary(step)
        if down_until is not None and step >= down_until:
            run.start_service()
            down_until = None
            # soon again (likely mid-restatement) or after a while
            next_kill = step + (rng.randrange(1, 20) if rng.random() < 0.3 else rng.randrange(100, 1000))
        elif down_until is None and step >= next_kill:
            os.kill(run.service.pid, signal.SIGKILL)
            run.service.wait()
            kills += 1
            down_until = step + (0 if rng.random() < 0.4 else rng.randrange(1, 300))
        if step % 20 == 0:
            time.sleep(0.001)
    if down_until is not None:
        run.start_service()
    assert run.sender.close(last, timeout=60) == 0, f"seed {seed}"
    assert run.buffer.dropped_total == 0, f"seed {seed}"
    assert kills >= 3 and run.sender.restatements >= 1, f"seed {seed}: {kills} kills"
    got = scalars(run.logdir)
    for t, pts in logged.items():
        expected = [(s, float(np.float32(v))) for s, v in pts]
        shown = set(got.get(t, []))
        lost = [p for p in expected if p not in shown and (t, p[0]) in acked]
        assert not lost, f"seed {seed}: {t}: {len(lost)} acknowledged points not read back, e.g. {lost[:3]}"
        # each logged point exactly once, in step order
        assert sorted(got.get(t, [])) == expected, \
            f"seed {seed}: {t}: {len(got.get(t, []))} points read back, {len(expected)} logged"
        assert got.get(t, []) == expected, f"seed {seed}: {t}: read back out of step order"
