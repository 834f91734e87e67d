"""procsv.trainer.summaries: call-site validation, batching and drop counting of the trainer's summaries,
and the sender's acks, restatements and heartbeats against a fake service (a fake clock, no sockets)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from procsv.ipc.codec import decode, encode
from procsv.ipc.columns import decode_columns
from procsv.ipc.messages import ProtoRef, SummaryAck, SummaryBatch
from procsv.trainer.summaries import (BATCH_MAX, BUFFER_MAX, FLUSH_EVERY, ITEMS_MAX, SummaryBuffer, SummarySender,
                                      as_float, encode_chunk)
from procsv.trainer.summaries import sender as sender_mod

WALL = 1_700_000_000.25
TICK = FLUSH_EVERY * 1.01  # a step boundary per flush interval (and no float rounding at the boundary)
ACK_READ = FLUSH_EVERY * 1.01  # acks are read with each hand-off (every ACK_POLL_EVERY only while awaited)


class FakeClock:
    """A monotonic clock that only moves when told."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, secs: float) -> None:
        self.now += secs


@pytest.fixture
def clock():
    return FakeClock()


class EagerLike:
    """Stands in for an eager tensor: anything with ``.numpy()``."""

    def __init__(self, value):
        self._value = value

    def numpy(self):
        return self._value

    def __repr__(self) -> str:  # stable: test ids must not differ between pytest-xdist workers
        return f"EagerLike({self._value!r})"


class FakeProto:
    def __init__(self, data: bytes):
        self.data = data

    def SerializeToString(self) -> bytes:
        return self.data


# ----------------------------------------------------------------------------- as_float


@pytest.mark.parametrize("tag", ["", " ", "\t\n", None, 3, b"loss", ["loss"]], ids=repr)
def test_bad_tag_raises_value_error(tag):
    with pytest.raises(ValueError, match="tag"):
        as_float(tag, 1.0)


@pytest.mark.parametrize(
    "value,expected",
    [
        (3, 3.0),
        (-2, -2.0),
        (0.25, 0.25),
        (np.float32(0.5), 0.5),
        (np.float64(1.5), 1.5),
        (np.float16(2.0), 2.0),
        (np.int64(7), 7.0),
        (np.int32(-4), -4.0),
        (np.uint8(255), 255.0),
        (np.array(1.25), 1.25),
        (np.array(9, dtype=np.int16), 9.0),
        (EagerLike(np.float32(0.75)), 0.75),
    ],
    ids=repr,
)
def test_real_numbers_are_accepted(value, expected):
    out = as_float("loss", value)
    assert type(out) is float
    assert out == expected


@pytest.mark.parametrize(
    "value",
    ["abc", "1.5", "nan", b"2", None, object(), {"a": 1}, complex(1, 2), [1.0, 2.0], [1.0], (3.0,),
     np.array([1.0, 2.0]), np.zeros((2, 2)), np.array(["x", "y"]), EagerLike(np.ones(3))],
    ids=lambda v: type(v).__name__ + ":" + repr(v)[:20],
)
def test_non_numeric_values_raise_type_error(value):
    with pytest.raises(TypeError, match="loss"):
        as_float("loss", value)


def test_bad_value_is_not_buffered():
    buf = SummaryBuffer()
    with pytest.raises(TypeError):
        buf.scalar("loss", [1.0, 2.0], step=1, wall=WALL)
    with pytest.raises(ValueError):
        buf.scalar("", 1.0, step=1, wall=WALL)
    assert len(buf) == 0 and len(buf.take()) == 0


def test_real_tensors_are_read_at_the_call_and_everything_else_is_refused_there():
    """An eager scalar tensor and a variable are read into floats at the call (a variable may change
    after it); a tensor that is not one real number is refused at the call, and nothing of that
    call is kept."""
    tf = pytest.importorskip("tensorflow")
    buf = SummaryBuffer()
    var = tf.Variable(2.5)
    buf.scalars({"loss": tf.constant(0.75), "one": tf.constant([3], dtype=tf.int64), "flag": tf.constant(True),
                 "var": var, "half": tf.constant(0.1, dtype=tf.float16)}, step=4, wall=WALL)
    buf.scalar("single", tf.constant(-1.5, dtype=tf.float64), step=5, wall=WALL)
    var.assign(99.0)  # after the call: the logged value is the one at the call
    for bad in (tf.constant([1.0, 2.0]), tf.constant("x"), tf.constant(1 + 2j), tf.zeros((1, 1))):
        with pytest.raises(TypeError, match="bad"):
            buf.scalars({"fine": tf.constant(1.0), "bad": bad}, step=6, wall=WALL)
        with pytest.raises(TypeError, match="bad"):
            buf.scalar("bad", bad, step=6, wall=WALL)
    rows = buf.take().rows
    assert [(tag, step, value) for tag, step, value, _ in rows] == [
        ("loss", 4, 0.75), ("one", 4, 3.0), ("flag", 4, 1.0), ("var", 4, 2.5),
        ("half", 4, float(np.float16(0.1))), ("single", 5, -1.5)]
    assert all(type(value) is float for _, _, value, _ in rows)


@pytest.mark.slow
def test_a_first_call_from_inside_tf_function_is_a_clear_error_and_eager_logging_still_works(monkeypatch):
    """A symbolic tensor logged inside a tf.function -- a scalar (the first call of the process),
    a histogram, an image, a text -- gets the TypeError naming the tag, and nothing is kept; the
    eager tensor type is learned outside any graph, so an eager bfloat16 logged afterwards is
    still read."""
    tf = pytest.importorskip("tensorflow")
    from procsv.trainer.summaries import values

    monkeypatch.setattr(values, "_eager", None)
    buf = SummaryBuffer()
    errors: list[BaseException] = []

    @tf.function
    def inside(x: Any) -> Any:
        calls = (lambda: buf.scalars({"in_graph": x * 2}, step=1, wall=WALL),
                 lambda: buf.histogram("in_graph", x * 2, step=1, wall=WALL),
                 lambda: buf.image("in_graph", tf.zeros([1, 2, 2, 1]), step=1, wall=WALL),
                 lambda: buf.text("in_graph", tf.constant("a"), step=1, wall=WALL))
        for call in calls:
            try:
                call()
            except TypeError as exc:
                errors.append(exc)
        return x

    inside(tf.constant(1.0))
    assert len(errors) == 4 and all("'in_graph'" in str(e) and "outside tf.function" in str(e) for e in errors)
    assert len(buf) == 0
    buf.scalars({"bf16": tf.constant(1.5, dtype=tf.bfloat16), "f32": tf.constant(0.25)}, step=2, wall=WALL)
    assert [(tag, step, value) for tag, step, value, _ in buf.take().rows] == [("bf16", 2, 1.5), ("f32", 2, 0.25)]


# ----------------------------------------------------------------------------- batching (on the injected clock)


def test_an_empty_buffer_is_never_due(clock):
    buf = SummaryBuffer(clock)
    clock.advance(3600)
    assert not buf.due(clock())
    assert len(buf.take()) == 0


def test_a_partial_batch_is_due_once_the_flush_interval_has_passed_on_the_buffers_clock(clock):
    buf = SummaryBuffer(clock)
    buf.scalar("loss", 0.5, step=1, wall=WALL)
    assert not buf.due(clock())
    clock.advance(FLUSH_EVERY / 2)
    assert not buf.due(clock())
    assert buf.next_flush() == pytest.approx(clock() + FLUSH_EVERY / 2)
    clock.advance(FLUSH_EVERY * 0.51)
    assert buf.due(clock())
    buf.take()  # restarts the interval at the buffer's clock
    buf.scalar("loss", 0.4, step=2, wall=WALL)
    assert not buf.due(clock())
    clock.advance(TICK)
    assert buf.due(clock())


def test_a_full_batch_is_due_without_waiting(clock):
    buf = SummaryBuffer(clock)
    for i in range(BATCH_MAX - 1):
        buf.scalar("loss", float(i), step=i, wall=WALL)
    assert not buf.due(clock()) and not buf.full()
    buf.scalar("loss", 1.0, step=BATCH_MAX, wall=WALL)
    assert buf.due(clock()) and buf.full()
    assert len(buf.take().rows) == BATCH_MAX


def test_items_max_payloads_make_a_batch_due(clock):
    buf = SummaryBuffer(clock)
    for i in range(ITEMS_MAX - 1):
        buf.proto(b"proto", step=i, wall=WALL)
    assert not buf.due(clock())
    buf.histogram("h", [1.0], step=1, wall=WALL)
    assert buf.due(clock())


def test_take_empties_the_buffer_up_to_its_limits():
    buf = SummaryBuffer()
    buf.scalar("loss", 0.5, step=1, wall=WALL)
    buf.proto(b"p", step=1, wall=WALL)
    chunk = buf.take()
    assert len(chunk) == 2 and len(buf) == 0
    assert len(buf.take()) == 0
    for i in range(BATCH_MAX + 5):
        buf.scalar("loss", 0.0, step=i, wall=WALL)
    assert len(buf.take().rows) == BATCH_MAX and len(buf) == 5


def decoded_rows(chunk_batch: tuple[SummaryBatch, list[Any]]) -> list[tuple[str, int, float, float]]:
    batch, frames = decode(encode(*chunk_batch))
    n_protos = len(batch.protos)
    cols = decode_columns(frames[n_protos], batch.columns)
    return [(cols.tags[i], s, v, w) for i, s, v, w in
            zip(cols.index.tolist(), cols.steps.tolist(), cols.values.tolist(), cols.walls.tolist())]


def test_scalar_rows_keep_order_and_fields_through_the_columns_frame():
    buf = SummaryBuffer()
    buf.scalar("loss", np.float32(0.5), step=10, wall=WALL)
    buf.scalar("accuracy", 1, step=11, wall=WALL + 1)
    rows = decoded_rows(encode_chunk(buf.take()))
    assert rows == [("loss", 10, 0.5, WALL), ("accuracy", 11, 1.0, WALL + 1)]
    assert all(type(row[2]) is float for row in rows)


def test_nan_and_inf_are_kept():
    buf = SummaryBuffer()
    buf.scalar("loss", float("nan"), step=1, wall=WALL)
    buf.scalar("loss", np.float32("inf"), step=2, wall=WALL)
    rows = decoded_rows(encode_chunk(buf.take()))
    assert math.isnan(rows[0][2])
    assert rows[1][2] == math.inf


def test_a_batch_round_trips_through_the_codec():
    buf = SummaryBuffer()
    buf.scalar("loss", 0.693, step=10, wall=WALL)
    buf.scalar("lr", np.float64(1e-3), step=10, wall=WALL)
    buf.proto(b"\n\x0b\n\x04loss\x15\x00\x00\x80?", step=10, wall=WALL)
    buf.proto(FakeProto(b"\n\x03\n\x01x"), step=11, wall=WALL + 1)
    buf.histogram("h", [1.0, 2.0], step=12, wall=WALL + 2)
    buf.count_dropped(2)
    batch, frames = encode_chunk(buf.take(), session="s", seq=1)
    decoded, payload = decode(encode(batch, frames))
    assert isinstance(decoded, SummaryBatch)
    assert decoded == batch
    assert payload == frames
    assert decoded.dropped == 2 and decoded.columns == 2 and len(decoded.items) == 1
    assert decoded.protos == [ProtoRef(10, WALL), ProtoRef(11, WALL + 1)]
    assert len(payload) == 2 + 1 + 1  # protos, the columns frame, the item


# ----------------------------------------------------------------------------- drops


def test_dropped_count_is_carried_once_then_reset():
    buf = SummaryBuffer()
    buf.count_dropped(3)
    buf.count_dropped(4)
    buf.scalar("loss", 0.5, step=1, wall=WALL)
    assert buf.take().dropped == 7
    buf.scalar("loss", 0.4, step=2, wall=WALL)
    assert buf.take().dropped == 0
    assert buf.dropped_total == 7


@pytest.mark.slow
def test_overflowing_the_buffer_drops_the_oldest_scalars_and_counts_them():
    buf = SummaryBuffer()
    for i in range(BUFFER_MAX + 2):
        buf.scalar("loss", 0.0, step=i, wall=WALL)
    chunk = buf.take(limit=BUFFER_MAX)
    assert len(chunk.rows) == BUFFER_MAX
    assert chunk.rows[0][1] == 2
    assert chunk.rows[-1][1] == BUFFER_MAX + 1
    assert chunk.dropped == 2


# ----------------------------------------------------------------------------- protos


@pytest.mark.parametrize(
    "summary,expected",
    [(b"\x0a\x01x", b"\x0a\x01x"), (bytearray(b"\x0a\x01y"), b"\x0a\x01y"), (FakeProto(b"\x0a\x01z"), b"\x0a\x01z")],
    ids=["bytes", "bytearray", "proto-object"],
)
def test_proto_accepts_bytes_or_serializable_objects(summary, expected):
    buf = SummaryBuffer()
    buf.proto(summary, step=5, wall=WALL)
    batch, frames = encode_chunk(buf.take())
    assert batch.protos == [ProtoRef(5, WALL)]
    assert frames == [expected]
    assert type(frames[0]) is bytes


def test_proto_refs_line_up_with_their_frames():
    buf = SummaryBuffer()
    for step in range(3):
        buf.proto(f"proto-{step}".encode(), step=step, wall=WALL + step)
    batch, frames = encode_chunk(buf.take())
    assert batch.protos == [ProtoRef(0, WALL), ProtoRef(1, WALL + 1), ProtoRef(2, WALL + 2)]
    assert frames == [b"proto-0", b"proto-1", b"proto-2"]


@pytest.mark.parametrize("summary", ["a string", 42, None, {"loss": 0.5}, [b"x"]], ids=repr)
def test_proto_rejects_anything_else(summary):
    buf = SummaryBuffer()
    with pytest.raises(TypeError):
        buf.proto(summary, step=1, wall=WALL)
    assert len(buf) == 0


# ----------------------------------------------------------------------------- the sender, against a fake service


class FakeService:
    """Plays the summary service's side: takes batches (or refuses them, queue full), answers with acks."""

    def __init__(self) -> None:
        self.batches: list[SummaryBatch] = []
        self.acks: list[SummaryAck] = []
        self.accepting = True
        self.waits: list[float] = []

    def send(self, msg: Any, frames: Any) -> bool:
        if not self.accepting:
            return False
        decoded, _ = decode(encode(msg, frames))  # what the wire would carry
        self.batches.append(decoded)
        return True

    def read_acks(self, timeout: float) -> list[SummaryAck]:
        self.waits.append(timeout)
        out, self.acks = self.acks, []
        return out

    def ack(self, session: str, written: int, resync_after: int = 0) -> None:
        self.acks.append(SummaryAck(session, written, resync_after))


def make_sender(clock: FakeClock, start_step: int = 1) -> tuple[SummaryBuffer, SummarySender, FakeService]:
    buf = SummaryBuffer(clock)
    svc = FakeService()
    return buf, SummarySender(buf, svc.send, svc.read_acks, start_step=start_step, session="S"), svc


def test_the_sender_runs_on_the_buffers_clock(clock):
    buf, sender, svc = make_sender(clock)
    assert sender.clock is buf.clock is clock
    buf.scalar("loss", 1.0, step=1, wall=WALL)
    sender.at_boundary(1)  # the first batch registers the session at once
    assert len(svc.batches) == 1 and svc.batches[0].resync_from == 1 and svc.batches[0].columns == 1
    buf.scalar("loss", 2.0, step=2, wall=WALL)
    sender.at_boundary(2)
    assert len(svc.batches) == 1  # not due yet: nothing moves without the clock
    clock.advance(TICK)
    sender.at_boundary(2)
    assert len(svc.batches) == 2 and svc.batches[1].seq == 2 and svc.batches[1].resync_from is None


def test_unwritten_from_is_the_lowest_step_not_confirmed_written(clock):
    buf, sender, svc = make_sender(clock)
    assert sender.unwritten_from() is None  # nothing logged
    buf.scalar("loss", 1.0, step=1, wall=WALL)
    assert sender.unwritten_from() == 1  # still in the buffer
    sender.at_boundary(1, urgent=True)
    buf.scalar("loss", 2.0, step=2, wall=WALL)
    assert sender.unwritten_from() == 1  # step 1 in flight, step 2 in the buffer
    svc.ack("S", written=1)
    clock.advance(TICK)
    sender.at_boundary(2, urgent=True)  # reads the ack of step 1, sends step 2
    assert sender.unwritten_from() == 2
    svc.ack("S", written=2)
    clock.advance(TICK)
    sender.at_boundary(2)
    assert sender.unwritten_from() is None  # every row written (an empty heartbeat batch holds no step)


def test_acks_release_what_was_sent_and_reads_never_wait_at_a_boundary(clock):
    buf, sender, svc = make_sender(clock)
    for step in range(1, 4):
        buf.scalar("loss", float(step), step=step, wall=WALL)
        sender.at_boundary(step)
        clock.advance(TICK)
    assert sender.unconfirmed() == 3
    svc.ack("other-session", 99)  # someone else's: ignored
    svc.ack("S", 2)
    clock.advance(ACK_READ)
    sender.at_boundary(3)
    assert sender.unconfirmed() == 1
    assert svc.waits and set(svc.waits) == {0.0}


def test_acks_are_read_with_each_hand_off_and_every_10_ms_only_for_a_caller_waiting_for_them(clock):
    buf, sender, svc = make_sender(clock)
    buf.scalar("loss", 1.0, step=1, wall=WALL)
    sender.at_boundary(1)
    assert len(svc.batches) == 1 and sender.unconfirmed() == 1
    svc.ack("S", 1)
    reads = len(svc.waits)
    clock.advance(sender_mod.ACK_POLL_EVERY * 1.01)
    sender.at_boundary(1)  # a boundary between two hand-offs reads nothing
    assert len(svc.waits) == reads and sender.unconfirmed() == 1 and sender.unwritten_from() == 1
    sender.poll_acks(1)  # an in-memory snapshot waits for this step's rows: read now
    assert len(svc.waits) == reads + 1 and sender.unconfirmed() == 0 and sender.unwritten_from() is None
    sender.poll_acks(1)  # and at most every ACK_POLL_EVERY
    assert len(svc.waits) == reads + 1
    buf.scalar("loss", 2.0, step=2, wall=WALL)
    clock.advance(TICK)
    sender.at_boundary(2)  # sends step 2
    svc.ack("S", 2)
    clock.advance(sender_mod.ACK_POLL_EVERY * 1.01)
    sender.at_boundary(2, urgent=True)  # a checkpoint in flight: its boundaries read every ACK_POLL_EVERY
    assert sender.unconfirmed() == 0


def test_boundaries_at_every_step_of_a_checkpoint_in_flight_read_acks_only_every_10_ms(clock):
    buf, sender, svc = make_sender(clock)
    for step in range(1, 101):  # 100 steps of 0.5 ms, each logging a row, a checkpoint in flight
        buf.scalar("loss", float(step), step=step, wall=WALL)
        sender.at_boundary(step, urgent=True)
        clock.advance(0.0005)
    assert len(svc.batches) == 100  # every step's rows leave at once
    assert 4 <= len(svc.waits) <= 6  # 50 ms: acks read every ACK_POLL_EVERY, not at every step


def test_a_restatement_request_puts_back_what_was_not_written(clock):
    buf, sender, svc = make_sender(clock)
    for step in range(1, 6):
        buf.scalar("loss", float(step), step=step, wall=WALL)
        sender.at_boundary(step)
        clock.advance(TICK)
    svc.ack("S", 2)  # batches 1, 2 written
    clock.advance(ACK_READ)
    sender.at_boundary(5)
    svc.ack("S", 0, resync_after=4)  # a restarted service saw batch 4 first
    clock.advance(ACK_READ)
    sender.at_boundary(5)
    assert sender.restatements == 1
    restated = svc.batches[-1]
    assert restated.resync_from == 3 and restated.columns == 3  # steps 3..5, under one START at 3
    svc.ack("S", 0, resync_after=5)  # a late complaint about a batch sent before the restatement
    clock.advance(TICK)
    sender.at_boundary(5)
    assert sender.restatements == 1


def test_a_heartbeat_goes_out_every_second_even_when_the_window_is_full(clock, monkeypatch):
    """A restarted service learns of the trainer only from its next batch: one must come."""
    monkeypatch.setattr(sender_mod, "WINDOW", 10)
    buf, sender, svc = make_sender(clock)
    for step in range(1, 30):
        buf.scalars({f"t{i}": 1.0 for i in range(5)}, step=step, wall=WALL)
        sender.at_boundary(step)
        clock.advance(TICK)
    sent = len(svc.batches)
    assert sender.unconfirmed() > 10  # the window is full: the rest waits in the buffer
    clock.advance(sender_mod.HEARTBEAT_EVERY)
    sender.at_boundary(30)
    assert len(svc.batches) == sent + 1
    heartbeat = svc.batches[-1]
    assert heartbeat.columns == 0 and not heartbeat.protos and not heartbeat.items and heartbeat.step == 30
    svc.ack("S", 0, resync_after=heartbeat.seq)  # the restarted service asks for everything
    clock.advance(ACK_READ)
    sender.at_boundary(30)
    assert sender.restatements == 1 and svc.batches[-1].resync_from == 1


def test_nothing_is_lost_while_the_queue_is_full(clock):
    buf, sender, svc = make_sender(clock)
    svc.accepting = False
    for step in range(1, 20):
        buf.scalar("loss", float(step), step=step, wall=WALL)
        sender.at_boundary(step)
        clock.advance(TICK)
    assert not svc.batches and len(buf) == 19
    svc.accepting = True
    sender.at_boundary(20)
    assert svc.batches[0].resync_from == 1 and svc.batches[0].columns == 19


def test_close_waits_for_the_acks_on_the_clock_and_reports_what_was_not_confirmed(clock):
    buf, sender, svc = make_sender(clock)
    buf.scalar("loss", 1.0, step=1, wall=WALL)

    def never(timeout: float) -> list[SummaryAck]:
        clock.advance(timeout)
        return []

    sender._read_acks = never
    assert sender.close(1, timeout=0.5) == 1
    assert len(svc.batches) >= 1

    buf2, sender2, svc2 = make_sender(clock)
    buf2.scalar("loss", 1.0, step=1, wall=WALL)

    def answer(timeout: float) -> list[SummaryAck]:
        return [SummaryAck("S", svc2.batches[-1].seq)]

    sender2._read_acks = answer
    assert sender2.close(1, timeout=5.0) == 0

