"""procsv.ipc.columns: the scalar-columns frame round-trips; every malformed frame is refused."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from procsv.ipc.codec import ProtocolError
from procsv.ipc.columns import ROW_BYTES, BadColumns, Columns, decode_columns, encode_columns

ROWS = [
    ("loss", 10, 0.693, 1_700_000_000.5),
    ("accuracy/train", 10, 0.5, 1_700_000_000.6),
    ("loss", 11, float("nan"), 1_700_000_001.0),
    ("ünïcode tag", -3, math.inf, 0.0),
    ("loss", 2**62, -1e300, 1.25),
]


def encode_rows(rows: list[tuple[str, int, float, float]]) -> bytes:
    """encode_columns of rows given as tuples (tag, step, value, wall time)."""
    tags, steps, values, walls = zip(*rows)
    return encode_columns(tags, steps, values, walls)


def rows_of(cols: Columns) -> list[tuple[str, int, float, float]]:
    return [(cols.tags[i], s, v, w) for i, s, v, w in
            zip(cols.index.tolist(), cols.steps.tolist(), cols.values.tolist(), cols.walls.tolist())]


def frame(table: bytes, index: list[int], extra: bytes = b"") -> bytes:
    """A columns frame built by hand (see the module's layout), with zero values."""
    n = len(index)
    pad = b"\0" * (-(4 + len(table)) % 8)
    return (len(table).to_bytes(4, "little") + table + pad + np.zeros(n).tobytes() + np.zeros(n).tobytes()
            + np.zeros(n, "<i8").tobytes() + np.array(index, "<u4").tobytes() + extra)


def test_rows_round_trip_in_order_with_their_types():
    cols = decode_columns(encode_rows(ROWS), len(ROWS))
    got = rows_of(cols)
    assert len(cols) == len(ROWS)
    for (tag, step, value, wall), (gtag, gstep, gvalue, gwall) in zip(ROWS, got):
        assert (gtag, gstep, gwall) == (tag, step, wall)
        assert gvalue == value or (math.isnan(value) and math.isnan(gvalue))
        assert type(gstep) is int and type(gvalue) is float
    assert cols.tags == ["loss", "accuracy/train", "ünïcode tag"]  # each tag once, in first-seen order
    assert cols.index.dtype == np.int64 and cols.steps.dtype == np.int64


@pytest.mark.parametrize("n", [1, 2, 3, 7, 4096])
def test_every_row_count_round_trips(n):
    rows = [(f"t{i % 5}", i, float(i) / 3, 1e9 + i) for i in range(n)]
    assert rows_of(decode_columns(encode_rows(rows), n)) == rows


def test_decode_accepts_bytes_memoryviews_and_zmq_frames():
    zmq = pytest.importorskip("zmq")
    data = encode_rows(ROWS[:2])
    for f in (data, memoryview(data), bytearray(data), zmq.Frame(data)):
        assert rows_of(decode_columns(f, 2)) == ROWS[:2]


def test_a_hand_built_frame_decodes():
    cols = decode_columns(frame(b'["a", "b"]', [1, 0, 1]), 3)
    assert [cols.tags[i] for i in cols.index.tolist()] == ["b", "a", "b"]


def test_zero_rows_decode_to_nothing():
    cols = decode_columns(frame(b"[]", []), 0)
    assert len(cols) == 0 and cols.tags == []
    assert len(Columns.empty()) == 0


def test_below_keeps_the_rows_at_lower_steps():
    cols = decode_columns(encode_rows([("a", 1, 1.0, 0.0), ("a", 5, 2.0, 0.0), ("b", 3, 3.0, 0.0)]), 3)
    assert rows_of(cols.below(4)) == [("a", 1, 1.0, 0.0), ("b", 3, 3.0, 0.0)]


@pytest.mark.parametrize(
    "data,n,match",
    [
        (b"", 1, "too short"),
        (b"\x01", 1, "too short"),
        (b"\x05\x00\x00", 0, "too short"),
        (frame(b'["a"]', [0, 0]), 3, "bytes"),  # 2 rows, not 3
        (frame(b'["a"]', [0, 0]), 1, "bytes"),  # 2 rows, not 1
        (frame(b'["a"]', [0], extra=b"x"), 1, "bytes"),  # trailing garbage
        (b"\xff\xff\xff\x7f" + bytes(8), 0, "bytes"),  # a tag table longer than the frame
        (frame(b'["a"]', [5]), 1, "outside"),  # tag index out of range
        (frame(b"[]", [0]), 1, "outside"),
        (frame(b'{"a": 1}', [0]), 1, "list"),  # the tag table is no list
        (frame(b'["a", 3]', [0]), 1, "list"),
        (frame(b'["a", ""]', [0]), 1, "list"),  # an empty tag
        (frame(b'["a"', [0]), 1, "JSON"),
        (frame(b'\xff\xfe', [0]), 1, "JSON"),
        (frame(b"[" * 5000, [0]), 1, "JSON"),
        (frame(b'["a"]', [0]), -1, "negative"),
    ],
    ids=["empty", "one-byte", "three-bytes", "fewer-rows", "more-rows", "trailing", "long-table", "index-out",
         "index-in-empty-table", "dict-table", "int-tag", "empty-tag", "truncated-json", "not-utf8", "deep-json",
         "negative-count"],
)
def test_malformed_frames_are_refused(data, n, match):
    with pytest.raises(BadColumns, match=match):
        decode_columns(data, n)


def test_bad_columns_is_a_protocol_error():
    assert issubclass(BadColumns, ProtocolError)


def test_layout_is_the_documented_one():
    data = encode_rows([("a", 7, 2.5, 9.0)])
    length = int.from_bytes(data[:4], "little")
    assert json.loads(data[4:4 + length]) == ["a"]
    start = 4 + length + (-(4 + length) % 8)
    assert start % 8 == 0 and len(data) == start + ROW_BYTES
    assert np.frombuffer(data, "<f8", 1, start)[0] == 9.0
    assert np.frombuffer(data, "<f8", 1, start + 8)[0] == 2.5
    assert np.frombuffer(data, "<i8", 1, start + 16)[0] == 7
    assert np.frombuffer(data, "<u4", 1, start + 24)[0] == 0
