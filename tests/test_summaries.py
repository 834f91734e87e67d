"""procsv.trainer.summaries: call-site validation, batching and drop counting of the trainer's summaries."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest

from procsv.ipc.codec import decode, encode
from procsv.ipc.messages import SummaryBatch
from procsv.trainer import summaries
from procsv.trainer.summaries import BATCH_MAX, BUFFER_MAX, FLUSH_EVERY, SummaryBuffer, as_float
from conftest import wait_for as _wait_for

WALL = 1_700_000_000.25



def wait_for(condition, timeout=5.0):
    return _wait_for(condition, timeout, interval=0.01)


@pytest.fixture
def slow_flush(monkeypatch):
    """Make the partial-batch timer long enough that only force or BATCH_MAX can flush."""
    monkeypatch.setattr(summaries, "FLUSH_EVERY", 3600.0)


class EagerLike:
    """Stands in for an eager tensor: anything with ``.numpy()``."""

    def __init__(self, value):
        self._value = value

    def numpy(self):
        return self._value


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
    assert buf.take_batch(force=True) is None


# ----------------------------------------------------------------------------- batching


def test_empty_buffer_has_no_batch_even_when_forced():
    assert SummaryBuffer().take_batch(force=True) is None


def test_partial_batch_waits_for_flush_interval(slow_flush):
    buf = SummaryBuffer()
    buf.scalar("loss", 0.5, step=1, wall=WALL)
    assert buf.take_batch(force=False) is None


def test_force_flushes_a_partial_batch(slow_flush):
    buf = SummaryBuffer()
    buf.scalar("loss", 0.5, step=1, wall=WALL)
    got = buf.take_batch(force=True)
    assert got is not None
    batch, frames = got
    assert batch.scalars == [["loss", 1, 0.5, WALL]]
    assert frames == []


def test_partial_batch_is_sent_once_flush_interval_has_passed():
    t0 = time.monotonic()
    buf = SummaryBuffer()
    buf.scalar("loss", 0.5, step=1, wall=WALL)
    batch, _ = wait_for(lambda: buf.take_batch(force=False))
    assert time.monotonic() - t0 >= FLUSH_EVERY
    assert batch.scalars == [["loss", 1, 0.5, WALL]]


def test_full_batch_is_sent_without_waiting(slow_flush):
    buf = SummaryBuffer()
    for i in range(BATCH_MAX - 1):
        buf.scalar("loss", float(i), step=i, wall=WALL)
    assert buf.take_batch(force=False) is None
    buf.scalar("loss", 1.0, step=BATCH_MAX, wall=WALL)
    got = buf.take_batch(force=False)
    assert got is not None
    assert len(got[0].scalars) == BATCH_MAX


def test_protos_count_towards_a_full_batch(slow_flush):
    buf = SummaryBuffer()
    for i in range(BATCH_MAX - 1):
        buf.scalar("loss", float(i), step=i, wall=WALL)
    buf.proto(b"proto", step=1, wall=WALL)
    got = buf.take_batch(force=False)
    assert got is not None
    assert len(got[0].scalars) == BATCH_MAX - 1 and len(got[0].protos) == 1


def test_take_batch_empties_the_buffer(slow_flush):
    buf = SummaryBuffer()
    buf.scalar("loss", 0.5, step=1, wall=WALL)
    buf.proto(b"p", step=1, wall=WALL)
    assert buf.take_batch(force=True) is not None
    assert buf.take_batch(force=True) is None


def test_scalar_rows_keep_order_and_fields():
    buf = SummaryBuffer()
    buf.scalar("loss", np.float32(0.5), step=10, wall=WALL)
    buf.scalar("accuracy", 1, step=11, wall=WALL + 1)
    batch, _ = buf.take_batch(force=True)
    assert batch.scalars == [["loss", 10, 0.5, WALL], ["accuracy", 11, 1.0, WALL + 1]]
    assert all(type(row[2]) is float for row in batch.scalars)


def test_nan_and_inf_are_kept():
    buf = SummaryBuffer()
    buf.scalar("loss", float("nan"), step=1, wall=WALL)
    buf.scalar("loss", np.float32("inf"), step=2, wall=WALL)
    batch, _ = buf.take_batch(force=True)
    assert math.isnan(batch.scalars[0][2])
    assert batch.scalars[1][2] == math.inf


def test_batch_round_trips_through_the_codec():
    buf = SummaryBuffer()
    buf.scalar("loss", 0.693, step=10, wall=WALL)
    buf.scalar("lr", np.float64(1e-3), step=10, wall=WALL)
    buf.proto(b"\n\x0b\n\x04loss\x15\x00\x00\x80?", step=10, wall=WALL)
    buf.proto(FakeProto(b"\n\x03\n\x01x"), step=11, wall=WALL + 1)
    buf.count_dropped(2)
    batch, frames = buf.take_batch(force=True)
    decoded, payload = decode(encode(batch, frames))
    assert isinstance(decoded, SummaryBatch)
    assert decoded == batch
    assert payload == frames
    assert decoded.dropped == 2


# ----------------------------------------------------------------------------- drops


def test_dropped_count_is_carried_once_then_reset():
    buf = SummaryBuffer()
    buf.count_dropped(3)
    buf.count_dropped(4)
    buf.scalar("loss", 0.5, step=1, wall=WALL)
    first, _ = buf.take_batch(force=True)
    assert first.dropped == 7
    buf.scalar("loss", 0.4, step=2, wall=WALL)
    second, _ = buf.take_batch(force=True)
    assert second.dropped == 0


def test_overflowing_the_buffer_drops_the_oldest_scalars_and_counts_them(slow_flush):
    buf = SummaryBuffer()
    for i in range(BUFFER_MAX + 2):
        buf.scalar("loss", 0.0, step=i, wall=WALL)
    batch, _ = buf.take_batch(force=True)
    assert len(batch.scalars) == BUFFER_MAX
    assert batch.scalars[0][1] == 2
    assert batch.scalars[-1][1] == BUFFER_MAX + 1
    assert batch.dropped == 2


# ----------------------------------------------------------------------------- protos


@pytest.mark.parametrize(
    "summary,expected",
    [(b"\x0a\x01x", b"\x0a\x01x"), (bytearray(b"\x0a\x01y"), b"\x0a\x01y"), (FakeProto(b"\x0a\x01z"), b"\x0a\x01z")],
    ids=["bytes", "bytearray", "proto-object"],
)
def test_proto_accepts_bytes_or_serializable_objects(summary, expected):
    buf = SummaryBuffer()
    buf.proto(summary, step=5, wall=WALL)
    batch, frames = buf.take_batch(force=True)
    assert batch.protos == [[5, WALL]]
    assert frames == [expected]
    assert type(frames[0]) is bytes


def test_proto_rows_line_up_with_their_frames():
    buf = SummaryBuffer()
    for step in range(3):
        buf.proto(f"proto-{step}".encode(), step=step, wall=WALL + step)
    batch, frames = buf.take_batch(force=True)
    assert batch.protos == [[0, WALL], [1, WALL + 1], [2, WALL + 2]]
    assert frames == [b"proto-0", b"proto-1", b"proto-2"]


@pytest.mark.parametrize("summary", ["a string", 42, None, {"loss": 0.5}, [b"x"]], ids=repr)
def test_proto_rejects_anything_else(summary):
    buf = SummaryBuffer()
    with pytest.raises(TypeError):
        buf.proto(summary, step=1, wall=WALL)
    assert buf.take_batch(force=True) is None
