"""The trainer-side summary buffer: validation at the call site, batching, drop counting.

Runs in the trainer (any thread may log; the main thread sends at step boundaries). A bad tag or
value raises here, in the caller's frame, so the summary service never sees garbage. Logging only
validates and appends to a bounded buffer (:class:`SummaryBuffer`); :class:`SummarySender` hands
batches to the summary service at step boundaries without ever blocking, keeps what the service
has not yet acknowledged as written, and restates it when the service asks (after a restart);
see ``services/summary/sessions.py`` for the rules on the other side. Histograms, images and
text travel as raw values: the service builds their TensorBoard summaries.
"""

from __future__ import annotations

import json
import operator
import os
import threading
import time
import uuid
from array import array
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

from procsv.common.layout import RuntimeDir
from procsv.ipc.messages import Message, SummaryBatch, SummaryItem

BATCH_MAX = 4096  # rows per message
ITEMS_MAX = 64  # histograms/images/text/protos per message
FLUSH_EVERY = 0.1  # seconds: a partial batch is sent at least this often (at a step boundary)
BUFFER_MAX = 100_000  # rows kept while the summary service is slow; older ones are dropped
ITEM_BYTES_MAX = 64 << 20  # bytes of histogram/image/text/proto payloads kept, likewise
WINDOW = 50_000  # rows sent but not yet acknowledged; beyond that, rows wait in the buffer
SENDS_PER_BOUNDARY = 16  # batches one step boundary may send (a flood is spread over steps)
ACK_POLL_EVERY = 0.01  # seconds between reads of the service's ack file while rows are in flight
HEARTBEAT_EVERY = 1.0  # seconds: a (possibly empty) batch at least this often (step marks)
TAIL_MAX = 4 * BATCH_MAX  # acknowledged rows kept for a restatement of the current step

Row = tuple[str, int, float, float]  # tag, step, value, wall time


# ----------------------------------------------------------------------------- validation
def check_tag(tag: Any) -> str:
    if not isinstance(tag, str) or not tag.strip():
        raise ValueError(f"summary tag must be a non-empty string, got {tag!r}")
    return tag


try:
    import numpy as _np

    _REAL_SCALARS = frozenset(_np.dtype(c).type for c in "?bhilqBHILQefd")
except ImportError:  # pragma: no cover - numpy comes with TensorFlow
    _REAL_SCALARS = frozenset()


def as_float(tag: str, value: Any) -> float:
    """``value`` as a float; TypeError naming the tag for anything but one real number (NaN/inf are kept)."""
    check_tag(tag)
    return value if type(value) is float else _real(tag, value)


def _real(tag: str, value: Any) -> float:
    original = value
    to_numpy = getattr(value, "_numpy", None) or getattr(value, "numpy", None)  # an eager tensor's is cheapest
    if to_numpy is not None:
        try:
            value = to_numpy()
        except Exception:  # a symbolic tensor (inside tf.function), or a foreign object
            raise TypeError(f"summary {tag!r}: cannot read the value of {type(original).__name__} here; "
                            "log eager values, outside tf.function") from None
        if type(value) in _REAL_SCALARS:
            return float(value)  # the common case: a scalar tensor gives a NumPy scalar
    kind = getattr(getattr(value, "dtype", None), "kind", "f")
    shape = getattr(value, "shape", ())
    try:
        if isinstance(value, (str, bytes, bytearray, complex)) or kind not in "biuf" or shape not in ((), (1,)):
            raise TypeError
        return float(value[0] if shape == (1,) else value)
    except (TypeError, ValueError):
        raise TypeError(f"summary {tag!r}: value must be a real number, got {type(original).__name__} "
                        f"{original!r:.60}") from None


def as_step(step: Any) -> int:
    """An explicit ``step=``: an integer (Python, NumPy or a scalar integer tensor)."""
    if hasattr(step, "numpy"):
        step = step.numpy()
    try:
        return operator.index(step)
    except TypeError:
        raise TypeError(f"summary step must be an integer, got {type(step).__name__} {step!r:.40}") from None


def _numeric_array(tag: str, what: str, data: Any) -> Any:
    import numpy as np

    if hasattr(data, "numpy"):
        data = data.numpy()
    try:
        arr = np.asarray(data)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{what} {tag!r}: expected an array of real numbers: {exc}") from None
    if arr.dtype == np.bool_ or arr.dtype.kind not in "iuf":
        raise TypeError(f"{what} {tag!r}: expected real numbers, got dtype {arr.dtype}")
    return arr


def histogram_values(tag: str, values: Any) -> Any:
    """``values`` as a contiguous float64 copy; raise for a non-numeric or non-finite input."""
    import numpy as np

    check_tag(tag)
    arr = np.array(_numeric_array(tag, "histogram", values), dtype=np.float64, copy=True).ravel()
    if not np.isfinite(arr).all():
        raise ValueError(f"histogram {tag!r}: {int((~np.isfinite(arr)).sum())} values are NaN or infinite")
    return arr


def image_pixels(tag: str, images: Any, max_outputs: int) -> Any:
    """``[k, h, w, c]`` pixels (uint8, or float32 in [0, 1]); one ``[h, w, c]`` image is accepted too."""
    import numpy as np

    check_tag(tag)
    if not isinstance(max_outputs, int) or isinstance(max_outputs, bool) or max_outputs < 1:
        raise ValueError(f"image {tag!r}: max_outputs must be a positive integer, got {max_outputs!r}")
    arr = _numeric_array(tag, "image", images)
    if arr.ndim == 3:
        arr = arr[None]
    if arr.ndim != 4 or arr.shape[-1] not in (1, 2, 3, 4) or 0 in arr.shape[1:3]:
        raise ValueError(f"image {tag!r}: shape {list(np.shape(images))} is not [k, h, w, c] or [h, w, c] "
                         "with c = 1, 2, 3 or 4 channels and h, w > 0")
    arr = arr[:max_outputs]
    if arr.dtype == np.uint8:
        return np.ascontiguousarray(arr).copy()
    if arr.dtype.kind == "f":
        return np.array(arr, dtype=np.float32, copy=True)
    raise TypeError(f"image {tag!r}: pixels must be uint8 (0..255) or floating point (0..1), got {arr.dtype}")


def text_strings(tag: str, text: Any) -> tuple[list[str], list[int]]:
    """``text`` (a string, or an array/list of strings) flattened, and its shape."""
    import numpy as np

    check_tag(tag)
    if hasattr(text, "numpy"):
        text = text.numpy()
    arr = np.asarray(text, dtype=object) if not isinstance(text, (str, bytes)) else np.asarray(text, dtype=object)
    flat: list[str] = []
    for s in arr.ravel().tolist():
        if isinstance(s, bytes):
            try:
                s = s.decode()
            except UnicodeDecodeError:
                raise ValueError(f"text {tag!r}: bytes that are not UTF-8") from None
        if not isinstance(s, str):
            raise TypeError(f"text {tag!r}: expected strings, got {type(s).__name__} {s!r:.40}")
        flat.append(s)
    return flat, list(arr.shape)


# ----------------------------------------------------------------------------- buffer
@dataclass
class Chunk:
    """Summaries taken from the buffer together: what one batch carries."""

    rows: list[Row] = field(default_factory=list)
    protos: list[tuple[int, float, bytes]] = field(default_factory=list)
    items: list[tuple[SummaryItem, bytes]] = field(default_factory=list)
    dropped: int = 0

    def __len__(self) -> int:
        return len(self.rows) + len(self.protos) + len(self.items)

    def steps(self) -> Iterable[int]:
        yield from (r[1] for r in self.rows)
        yield from (p[0] for p in self.protos)
        yield from (i.step for i, _ in self.items)

    def since(self, step: int) -> "Chunk":
        """The part of this chunk at ``step`` or later."""
        return Chunk([r for r in self.rows if r[1] >= step], [p for p in self.protos if p[0] >= step],
                     [i for i in self.items if i[0].step >= step])


class SummaryBuffer:
    """Validated summaries waiting for the hand-off; bounded (the oldest are dropped and counted)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rows: deque[Row] = deque()
        self._protos: deque[tuple[int, float, bytes]] = deque()
        self._items: deque[tuple[SummaryItem, bytes]] = deque()
        self._payload_bytes = 0
        self._dropped = 0  # since the last take
        self.dropped_total = 0
        self._last_flush = time.monotonic()
        self._ok_tags: set[str] = set()

    def __len__(self) -> int:
        return len(self._rows) + len(self._protos) + len(self._items)

    # ---- logging (any thread)
    def scalar(self, tag: str, value: Any, step: Any, wall: float) -> None:
        v = as_float(tag, value)
        step = step if type(step) is int else as_step(step)
        with self._lock:
            self._append_row((tag, step, v, wall))

    def scalars(self, values: Mapping[str, Any], step: Any, wall: float) -> None:
        """Several scalars of one step; all are validated before any is kept."""
        if not isinstance(values, Mapping):
            raise TypeError(f"expected a mapping of summary tags to values, got {type(values).__name__}")
        step = step if type(step) is int else as_step(step)
        rows = []
        ok = self._ok_tags
        for tag, value in values.items():
            if tag not in ok:
                check_tag(tag)
                ok.add(tag)
            if type(value) is not float:
                value = _real(tag, value)
            rows.append((tag, step, value, wall))
        with self._lock:
            for row in rows:
                self._append_row(row)

    def _append_row(self, row: Row) -> None:
        if len(self._rows) >= BUFFER_MAX:
            self._rows.popleft()
            self._dropped += 1
            self.dropped_total += 1
        self._rows.append(row)

    def proto(self, summary: Any, step: Any, wall: float) -> None:
        step = as_step(step)
        if isinstance(summary, (bytes, bytearray)):
            data = bytes(summary)
        elif hasattr(summary, "SerializeToString"):
            data = summary.SerializeToString()
        else:
            raise TypeError(f"summary must be a Summary proto, its bytes, or a mapping of tags to scalars, "
                            f"got {type(summary).__name__}")
        with self._lock:
            self._protos.append((step, wall, data))
            self._payload_bytes += len(data)
            self._trim_payloads()

    def histogram(self, tag: str, values: Any, step: Any, wall: float, buckets: Optional[int] = None,
                  description: str = "") -> None:
        if buckets is not None and (not isinstance(buckets, int) or isinstance(buckets, bool) or buckets < 1):
            raise ValueError(f"histogram {tag!r}: buckets must be a positive integer, got {buckets!r}")
        data = histogram_values(tag, values)
        self.item(SummaryItem("histogram", tag, as_step(step), wall, data.dtype.name, list(data.shape),
                              buckets=buckets or 0, description=str(description)), data.tobytes())

    def image(self, tag: str, images: Any, step: Any, wall: float, max_outputs: int = 3,
              description: str = "") -> None:
        data = image_pixels(tag, images, max_outputs)
        self.item(SummaryItem("image", tag, as_step(step), wall, data.dtype.name, list(data.shape),
                              description=str(description)), data.tobytes())

    def text(self, tag: str, text: Any, step: Any, wall: float, description: str = "") -> None:
        strings, shape = text_strings(tag, text)
        self.item(SummaryItem("text", tag, as_step(step), wall, "json", shape, description=str(description)),
                  json.dumps(strings).encode())

    def item(self, item: SummaryItem, data: bytes) -> None:
        """Keep one validated histogram/image/text item and its frame."""
        with self._lock:
            self._items.append((item, data))
            self._payload_bytes += len(data)
            self._trim_payloads()

    def _trim_payloads(self) -> None:
        while self._payload_bytes > ITEM_BYTES_MAX and (self._protos or self._items):
            if self._protos and (not self._items or self._protos[0][1] <= self._items[0][0].wall_time):
                self._payload_bytes -= len(self._protos.popleft()[2])
            else:
                self._payload_bytes -= len(self._items.popleft()[1])
            self._dropped += 1
            self.dropped_total += 1

    def count_dropped(self, n: int) -> None:
        with self._lock:
            self._dropped += n
            self.dropped_total += n

    # ---- hand-off (main thread)
    def due(self, now: float) -> bool:
        n = len(self._rows)
        m = len(self._protos) + len(self._items)
        return n >= BATCH_MAX or m >= ITEMS_MAX or (n + m > 0 and now - self._last_flush >= FLUSH_EVERY)

    def take(self, limit: Optional[int] = None, items: Optional[int] = None) -> Chunk:
        """Up to ``limit`` rows and ``items`` payloads (BATCH_MAX, ITEMS_MAX), oldest first, with the drops so far."""
        limit = BATCH_MAX if limit is None else limit
        n_items = ITEMS_MAX if items is None else items
        with self._lock:
            rows, protos, items = self._rows, self._protos, self._items
            if len(rows) <= limit:
                taken = list(rows)
                rows.clear()
            else:
                taken = [rows.popleft() for _ in range(limit)]
            chunk = Chunk(taken, [protos.popleft() for _ in range(min(n_items, len(protos)))],
                          [items.popleft() for _ in range(min(n_items, len(items)))], self._dropped)
            self._payload_bytes -= sum(len(p[2]) for p in chunk.protos) + sum(len(i[1]) for i in chunk.items)
            self._dropped = 0
            self._last_flush = time.monotonic()
        return chunk

    def put_back(self, chunk: Chunk) -> None:
        """Return a chunk (not sent, or to be restated) to the front, within the bounds."""
        with self._lock:
            self._rows.extendleft(reversed(chunk.rows))
            self._protos.extendleft(reversed(chunk.protos))
            self._items.extendleft(reversed(chunk.items))
            self._payload_bytes += sum(len(p[2]) for p in chunk.protos) + sum(len(i[1]) for i in chunk.items)
            self._dropped += chunk.dropped
            over = len(self._rows) - BUFFER_MAX
            for _ in range(max(0, over)):
                self._rows.popleft()
            if over > 0:
                self._dropped += over
                self.dropped_total += over
            self._trim_payloads()

    def sender(self, send: Callable[[Message, Sequence[Any]], bool], runtime_dir: str,
               step_rate_secs: Optional[float], start_step: int) -> "SummarySender":
        """The :class:`SummarySender` that hands this buffer to the summary service of ``runtime_dir``;
        ``start_step`` is the first step of this trainer process (the restored step + 1)."""
        return SummarySender(self, send, RuntimeDir(runtime_dir).summary_ack, step_rate_secs, start_step)

    def take_batch(self, force: bool) -> Optional[tuple[SummaryBatch, list[bytes]]]:
        """Everything buffered as one JSON-row batch, or None if it is not time yet (or nothing is buffered).

        The simple wire format (the service accepts it); :class:`SummarySender` sends binary columns.
        """
        with self._lock:
            n = len(self)
            if n == 0 or (not force and n < BATCH_MAX and time.monotonic() - self._last_flush < FLUSH_EVERY):
                return None
        chunk = self.take(limit=max(n, 1), items=max(n, 1))
        batch = SummaryBatch([list(r) for r in chunk.rows], [[s, w] for s, w, _ in chunk.protos], chunk.dropped)
        return batch, [data for _, _, data in chunk.protos]


def encode_chunk(chunk: Chunk, **header: Any) -> tuple[SummaryBatch, list[Any]]:
    """A :class:`SummaryBatch` with the chunk's scalars as binary columns, and its frames."""
    frames: list[Any] = [data for _, _, data in chunk.protos]
    table: dict[str, int] = {}
    if chunk.rows:
        tags, steps, values, walls = zip(*chunk.rows)
        index = array("I", [table.setdefault(t, len(table)) for t in tags])
        names = json.dumps(list(table)).encode()
        pad = b"\0" * (-(4 + len(names)) % 8)
        frames.append(b"".join((len(names).to_bytes(4, "little"), names, pad, array("d", walls).tobytes(),
                                array("d", values).tobytes(), array("q", steps).tobytes(), index.tobytes())))
    frames += [data for _, data in chunk.items]
    batch = SummaryBatch([], [[s, w] for s, w, _ in chunk.protos], chunk.dropped, columns=len(chunk.rows),
                         items=[i for i, _ in chunk.items], **header)
    return batch, frames


# ----------------------------------------------------------------------------- hand-off
@dataclass
class _Sent:
    seq: int
    chunk: Chunk
    min_step: int
    max_step: int


def _read_ack(path: str) -> Optional[dict[str, Any]]:
    try:
        with open(path, "rb") as fh:
            data = json.loads(fh.read())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


class SummarySender:
    """Hands the buffer's batches to the summary service at step boundaries; never blocks.

    ``send(msg, frames)`` is a non-blocking push that returns False when the queue is full (the
    chunk then goes back to the buffer). Sent batches are kept until the service's ack file
    (``ack_file``) says they are written; when it asks for a restatement (it was restarted, or
    batches were lost with it), everything kept at steps >= P is put back in front of the buffer
    and the next batch carries ``resync_from=P``.
    """

    EXIT_WAIT_SECS = 10.0  # at stop, how long to wait for the service to confirm the last summaries

    def __init__(self, buffer: SummaryBuffer, send: Callable[[Message, Sequence[Any]], bool], ack_file: str,
                 step_rate_secs: Optional[float] = None, start_step: Optional[int] = None,
                 session: Optional[str] = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.buffer = buffer
        self._send = send
        self.ack_file = ack_file
        self.step_rate_secs = step_rate_secs
        self.session = session or f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.clock = clock
        self.inflight: deque[_Sent] = deque()
        self.tail: deque[_Sent] = deque()  # acknowledged, kept while they hold rows of the current step
        self._inflight_rows = 0
        self._next_seq = 1
        self._resync_pending = True  # the session's first batch restates (registers) it, from its start step
        self._resync_floor: Optional[int] = start_step
        self._last_resync_seq = 0
        self._max_acked_step = -1
        self._ack_key: Any = None
        now = clock()
        self._next_poll = now
        self._next_heartbeat = now
        self._wake = now  # before this, a boundary has nothing to do unless a batch is full or urgent
        self.restatements = 0

    # ---- step boundary
    def at_boundary(self, step: int, urgent: bool = False) -> None:
        """Poll acks (rate-limited) and send what is due, within the window; cheap when idle."""
        now = self.clock()
        buf = self.buffer
        if now < self._wake and not urgent and len(buf._rows) < BATCH_MAX:
            return
        if self.inflight and now >= self._next_poll:
            self._next_poll = now + ACK_POLL_EVERY
            self._poll_acks(step)
        for _ in range(SENDS_PER_BOUNDARY):
            if self._inflight_rows >= WINDOW or not (buf.due(now) or (urgent and len(buf)) or now >= self._next_heartbeat):
                break
            if not self._send_next(step, now):
                break
        wake = min(buf._last_flush + FLUSH_EVERY, self._next_heartbeat)
        self._wake = min(wake, self._next_poll) if self.inflight else wake

    def _send_next(self, step: int, now: float) -> bool:
        chunk = self.buffer.take()
        steps = list(chunk.steps())
        header: dict[str, Any] = {}
        if self._resync_pending:
            floor = self._resync_floor
            header["resync_from"] = floor if floor is not None else (min(steps) if steps else step + 1)
        seq = self._next_seq
        msg, frames = encode_chunk(chunk, session=self.session, seq=seq, step=step, mono=now, wall_time=time.time(),
                                   step_rate_secs=self.step_rate_secs, dropped_total=self.buffer.dropped_total,
                                   **header)
        if not self._send(msg, frames):
            self.buffer.put_back(chunk)
            return False
        self._next_seq += 1
        self._next_heartbeat = now + HEARTBEAT_EVERY
        if self._resync_pending:
            self._resync_pending, self._resync_floor, self._last_resync_seq = False, None, seq
        lo, hi = (min(steps), max(steps)) if steps else (step + 1, -1)
        self.inflight.append(_Sent(seq, chunk, lo, hi))
        self._inflight_rows += len(chunk)
        return True

    # ---- acks
    def _poll_acks(self, step: int) -> None:
        try:
            st = os.stat(self.ack_file)
        except OSError:
            return
        key = (st.st_ino, st.st_mtime_ns, st.st_size)
        if key == self._ack_key:
            return
        self._ack_key = key
        ack = _read_ack(self.ack_file)
        mine = (ack or {}).get("sessions", {}).get(self.session) if ack else None
        if not isinstance(mine, dict):
            return
        self._acknowledge(int(mine.get("written", 0)), step)
        if int(mine.get("resync_after", 0)) > self._last_resync_seq and not self._resync_pending:
            self._restate(step)

    def _acknowledge(self, written: int, step: int) -> None:
        while self.inflight and self.inflight[0].seq <= written:
            sent = self.inflight.popleft()
            self._inflight_rows -= len(sent.chunk)
            self._max_acked_step = max(self._max_acked_step, sent.max_step)
            if sent.max_step >= 0:
                self.tail.append(sent)
        floor = min([step] + [s.min_step for s in self.inflight])
        while self.tail and (self.tail[0].max_step < floor or sum(len(s.chunk) for s in self.tail) > TAIL_MAX):
            self.tail.popleft()

    def _restate(self, step: int) -> None:
        """Put back everything that may be missing from the event files; the next batch restates from P."""
        self.restatements += 1
        if self.inflight:
            floor = min(s.min_step for s in self.inflight)
        else:
            floor = max(step, self._max_acked_step) + 1
        chunk = Chunk()
        for sent in list(self.tail) + list(self.inflight):
            part = sent.chunk.since(floor)
            chunk.rows += part.rows
            chunk.protos += part.protos
            chunk.items += part.items
        self.tail.clear()
        self.inflight.clear()
        self._inflight_rows = 0
        self.buffer.put_back(chunk)
        self._resync_pending, self._resync_floor = True, floor

    # ---- end
    def close(self, step: int, timeout: float) -> int:
        """Send everything and wait up to ``timeout`` s until it is written; return what was not confirmed."""
        deadline = self.clock() + timeout
        while True:
            now = self.clock()
            while len(self.buffer) or self._resync_pending:
                if not self._send_next(step, now):
                    break
            self._poll_acks(step)
            if not self.inflight and not len(self.buffer) and not self._resync_pending:
                return 0
            if now >= deadline:
                return self._inflight_rows + len(self.buffer)
            time.sleep(0.01)

    def unconfirmed(self) -> int:
        return self._inflight_rows + len(self.buffer)

