"""Histogram, image and text summaries: raw values in, TensorBoard ``Summary`` bytes out.

Runs in the summary service process, so the trainer only validates and copies the values. The
output is what TensorFlow 2's ``tf.summary.histogram`` / ``image`` / ``text`` write: a tensor
summary with the plugin's metadata (TensorBoard's own modules, which need no TensorFlow).

* text: TensorBoard's own ``text_pb``.
* histogram: the buckets are computed here, with TensorBoard's rule (equal-width buckets from min
  to max, the max in the last one; tests/test_summary_records.py checks the bytes against
  ``histogram_pb``). ``histogram_pb`` itself counts with an ``[n, buckets]`` one-hot matrix where
  ``bincount`` does, which the summary service's one thread would pay between writes. Measured
  with ``scripts/bench_render.py`` (30 buckets, TensorBoard 2.21, a busy 2-core machine; the
  range of the per-call medians of 6 sessions): 1,000 values 38-104 us here vs 93-195 us
  (1.6-2.9x); 100,000 values 0.37-0.63 ms vs 9.5-28 ms (20-50x); 1,000,000 values 7-13 ms vs
  59-119 ms, with a peak of 16 MB vs 70 MB of temporaries.
* image: PNGs are encoded here with ``zlib`` (TensorBoard's image summaries need TensorFlow to
  encode); the tests decode them with Pillow.
"""

from __future__ import annotations

import json
import struct
import zlib
from typing import Any

import numpy as np

from procsv.ipc.messages import SummaryItem

from tensorboard.compat.proto import summary_pb2
from tensorboard.plugins.histogram import metadata as histogram_metadata
from tensorboard.plugins.image import metadata as image_metadata
from tensorboard.plugins.text.summary_v2 import text_pb
from tensorboard.util import tensor_util

DEFAULT_BUCKETS = 30  # tf.summary.histogram's default


class RenderError(ValueError):
    """An item's frame does not match its description (a sender bug; the item is dropped)."""


def buckets(data: np.ndarray, count: int) -> np.ndarray:
    """``[count, 3]`` rows of (left edge, right edge, count), as TensorBoard's ``histogram_pb``."""
    data = data.ravel()
    if count == 0 or data.size == 0:
        return np.zeros((count, 3))
    lo, hi = float(data.min()), float(data.max())
    if hi == lo:
        counts = np.zeros(count)
        counts[-1] = data.size
        return np.stack([np.full(count, lo), np.full(count, lo), counts], axis=1)
    width = (hi - lo) / count
    index = np.minimum(np.floor((data - lo) / width).astype(np.int64), count - 1)
    counts = np.bincount(index, minlength=count).astype(np.float64)
    edges = np.linspace(lo, hi, count + 1)
    return np.stack([edges[:-1], edges[1:], counts], axis=1)


def png(image: np.ndarray) -> bytes:
    """A PNG of an ``[h, w, c]`` uint8 image (c = 1, 2, 3 or 4)."""
    h, w, c = image.shape
    color = {1: 0, 2: 4, 3: 2, 4: 6}[c]
    rows = np.concatenate([np.zeros((h, 1), np.uint8), image.reshape(h, w * c)], axis=1)

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", w, h, 8, color, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows.tobytes(), 6)) + \
        chunk(b"IEND", b"")


def to_uint8(pixels: np.ndarray) -> np.ndarray:
    """``tf.image.convert_image_dtype(x, tf.uint8, saturate=True)`` for float input in [0, 1]."""
    if pixels.dtype == np.uint8:
        return pixels
    return np.clip(pixels.astype(np.float64) * 255.5, 0, 255).astype(np.uint8)


def _array(item: SummaryItem, frame: Any) -> np.ndarray:
    data = frame.buffer if hasattr(frame, "buffer") else frame
    try:
        dtype = np.dtype(item.dtype).newbyteorder("<")
        arr = np.frombuffer(data, dtype=dtype)
        return arr.reshape(item.shape)
    except (TypeError, ValueError) as exc:
        raise RenderError(f"{item.kind} {item.tag!r}: frame does not hold {item.dtype}{item.shape}: {exc}") from None


MAX_BUCKETS = 1 << 16  # a histogram's bucket count comes from another process: bound what it allocates


def render(item: SummaryItem, frame: Any) -> bytes:
    """The serialized ``Summary`` for one item; :class:`RenderError` for anything that does not fit.

    The item comes from another process, so whatever goes wrong while rendering it (a value
    TensorBoard's helpers refuse with their own exception type, say) is a :class:`RenderError`:
    the item is dropped and counted, the service goes on.
    """
    try:
        return _render(item, frame)
    except RenderError:
        raise
    except Exception as exc:  # noqa: BLE001 -- see the docstring
        raise RenderError(f"{item.kind} {item.tag!r}: cannot be rendered: {type(exc).__name__}: {exc}"[:300]) from None


def _render(item: SummaryItem, frame: Any) -> bytes:
    if not 0 <= item.buckets <= MAX_BUCKETS:
        raise RenderError(f"{item.kind} {item.tag!r:.80}: {item.buckets} buckets, not 0 to {MAX_BUCKETS}")
    if item.kind == "histogram":
        values = _array(item, frame).astype(np.float64)
        tensor = tensor_util.make_tensor_proto(buckets(values, item.buckets or DEFAULT_BUCKETS), dtype=np.float64)
        meta = histogram_metadata.create_summary_metadata(display_name=None, description=item.description)
    elif item.kind == "image":
        pixels = _array(item, frame)
        if pixels.ndim != 4 or pixels.shape[-1] not in (1, 2, 3, 4):
            raise RenderError(f"image {item.tag!r}: shape {list(pixels.shape)} is not [k, h, w, 1|2|3|4]")
        images = to_uint8(pixels)
        k, h, w, _ = images.shape
        data = [str(w).encode(), str(h).encode()] + [png(images[i]) for i in range(k)]
        tensor = tensor_util.make_tensor_proto(np.array(data, dtype=object), dtype=np.object_)
        meta = image_metadata.create_summary_metadata(display_name=None, description=item.description)
    elif item.kind == "text":
        raw = frame.bytes if hasattr(frame, "bytes") else bytes(frame)
        try:
            strings = json.loads(raw)
            array = np.array(strings, dtype=object).reshape(item.shape)
        except (ValueError, UnicodeDecodeError) as exc:
            raise RenderError(f"text {item.tag!r}: bad payload: {exc}") from None
        return bytes(text_pb(item.tag, array, description=item.description).SerializeToString())
    else:
        raise RenderError(f"unknown summary kind {item.kind!r}")
    summary = summary_pb2.Summary()
    summary.value.add(tag=item.tag, metadata=meta, tensor=tensor)
    return bytes(summary.SerializeToString())
