"""The trainer's summary buffer: validated summaries waiting for the hand-off, bounded, drops counted.

Runs in the trainer: any thread may log (each call validates with
:mod:`procsv.trainer.summaries.values` and appends under a lock); the main thread takes chunks
at step boundaries for :class:`procsv.trainer.summaries.sender.SummarySender`. When the summary
service lags, the oldest summaries are dropped and counted exactly. The flush timer runs on the
injected monotonic ``clock``, the one the sender uses too.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any, Callable, Iterable, Mapping, Optional

from procsv.ipc.columns import Row
from procsv.ipc.messages import ItemKind, SummaryItem
from procsv.trainer.summaries.graph_rings import PROCESS_RINGS, GraphRings
from procsv.trainer.summaries.scalar_columns import ScalarColumns
from procsv.trainer.summaries.values import (as_step, check_tag, eager_kinds, histogram_values,
                                             image_pixels, read_floats, text_strings)

BATCH_MAX = 4096  # rows per message
ITEMS_MAX = 64  # histograms/images/text/protos per message
FLUSH_EVERY = 0.1  # seconds: a partial batch is sent at least this often (at a step boundary)
BUFFER_MAX = 100_000  # rows kept while the summary service is slow; older ones are dropped
# rows beyond BUFFER_MAX are dropped (and counted) at once, but removed from the columns only once
# this many were dropped (a removal moves every row: ~0.3 ms at BUFFER_MAX), or by the next reader
TRIM_SLACK = 1024
ITEM_BYTES_MAX = 64 << 20  # bytes of histogram/image/text/proto payloads kept, likewise
SUMMARY_BYTES_MAX = 16 << 20  # one histogram/image/text/proto larger than this is refused at the call

Proto = tuple[int, float, bytes]  # step, wall time, serialized Summary
Item = tuple[SummaryItem, bytes]  # a histogram/image/text and its frame


@dataclass
class Chunk:
    """Summaries taken from the buffer together: what one batch carries."""

    scalars: ScalarColumns = field(default_factory=ScalarColumns)
    protos: list[Proto] = field(default_factory=list)
    items: list[Item] = field(default_factory=list)
    dropped: int = 0

    def __len__(self) -> int:
        return len(self.scalars) + len(self.protos) + len(self.items)

    @property
    def rows(self) -> list[Row]:
        """The scalars as (tag, step, value, wall time) tuples."""
        return self.scalars.rows

    def step_span(self) -> Optional[tuple[int, int]]:
        """The lowest and highest step of the chunk's summaries (None if it is empty)."""
        steps = [p[0] for p in self.protos] + [i.step for i, _ in self.items]
        span = self.scalars.span()
        if span:
            steps += span
        return (min(steps), max(steps)) if steps else None

    def since(self, step: int) -> Chunk:
        """The part of this chunk at ``step`` or later."""
        return Chunk(self.scalars.since(step), [p for p in self.protos if p[0] >= step],
                     [i for i in self.items if i[0].step >= step])


class SummaryBuffer:
    """Validated summaries waiting for the hand-off; bounded (the oldest are dropped and counted)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, graph: GraphRings = PROCESS_RINGS) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._cols = ScalarColumns()  # the scalars, oldest first; the first _skip of them already dropped
        self._skip = 0
        self._protos: deque[Proto] = deque()
        self._items: deque[Item] = deque()
        self._payload_bytes = 0
        self._dropped = 0  # since the last take
        self.dropped_total = 0
        self._last_flush = clock()
        self._ok_tags: set[str] = set()
        self._eager: Optional[tuple[Any, frozenset[int]]] = None  # TF's eager tensor type, once TF is imported
        self.graph = graph  # scalars logged inside tf.function (the process's rings), until collect_graph() reads them
        self._graph_next = clock()  # when collect_graph(force=False) next reads the rings
        # called (from the logging thread) when a whole batch is waiting: the Supervisor opens its
        # step boundary's gate, so the batch goes at the next boundary instead of at the flush timer
        self.on_batch: Callable[[], None] = _nothing

    def __len__(self) -> int:
        return len(self._cols) - self._skip + len(self._protos) + len(self._items)

    def discard(self) -> None:
        """Forget everything buffered (a worker replica: only the chief writes summaries)."""
        self.collect_graph(force=False)
        with self._lock:
            self._cols = ScalarColumns()
            self._skip = 0
            self._protos.clear()
            self._items.clear()
            self._payload_bytes = 0

    # ---- logging (any thread)
    def scalar(self, tag: str, value: Any, step: Any, wall: float) -> None:
        self.scalars({tag: value}, step, wall)

    def scalars(self, values: Mapping[str, Any], step: Any, wall: float) -> None:
        """Several scalars of one step; all are validated (and read) before any is kept."""
        if type(values) is not dict and not isinstance(values, Mapping):
            raise TypeError(f"expected a mapping of summary tags to values, got {type(values).__name__}")
        if type(step) is not int:
            step = as_step(step)
        tags = list(values)
        if not self._ok_tags.issuperset(tags):
            self._check_tags(tags)
        eager = self._eager
        if eager is None and "tensorflow" in sys.modules:
            eager = self._eager = eager_kinds()
        floats = read_floats(tags, list(values.values()), eager)
        n = len(tags)
        self._append(tags, repeat(step, n), floats, repeat(wall, n))
        if len(self._cols) - self._skip >= BATCH_MAX:
            self.on_batch()

    def collect_graph(self, force: bool) -> None:
        """Move the rows that traced functions wrote into their rings (:mod:`.graph_rings`) into the
        buffer, with the wall time of now; rows overwritten unread count as dropped. Main thread.
        Unless ``force``, at most every FLUSH_EVERY (each ring costs an eager read)."""
        if not self.graph:
            return
        now = self.clock()
        if not force and now < self._graph_next:
            return
        self._graph_next = now + FLUSH_EVERY
        rows = self.graph.drain(now)
        if not rows.steps and not rows.lost:
            return
        self._append(rows.tags, rows.steps, rows.values, repeat(time.time(), len(rows.steps)), rows.lost)

    def _append(self, tags: list[str], steps: Iterable[int], values: list[float], walls: Iterable[float],
                lost: int = 0) -> None:
        """Append validated rows (and count ``lost`` rows as dropped); beyond BUFFER_MAX the oldest are dropped."""
        with self._lock:
            cols = self._cols
            cols.tags += tags
            cols.steps.extend(steps)
            cols.values += values
            cols.walls.extend(walls)
            self._dropped += lost
            self.dropped_total += lost
            if len(cols) - self._skip > BUFFER_MAX:
                self._drop(remove=False)

    def _check_tags(self, tags: list[str]) -> None:
        """ValueError for the first bad tag; the good ones are remembered (checked once per tag)."""
        ok = self._ok_tags
        for tag in tags:
            if tag not in ok:
                check_tag(tag)
                ok.add(tag)

    def _drop(self, remove: bool) -> None:
        """Under the lock: the oldest scalars beyond BUFFER_MAX are dropped and counted; the dropped
        ones are removed from the lists now if ``remove``, else once TRIM_SLACK of them wait."""
        over = len(self._cols) - self._skip - BUFFER_MAX
        if over > 0:
            self._skip += over
            self._dropped += over
            self.dropped_total += over
        if self._skip and (remove or self._skip >= TRIM_SLACK):
            self._cols.drop_front(self._skip)
            self._skip = 0

    def _trim(self) -> None:
        """Under the lock, before reading the lists: no dropped row is left in them."""
        self._drop(remove=True)

    def proto(self, summary: Any, step: Any, wall: float) -> None:
        step = as_step(step)
        if isinstance(summary, (bytes, bytearray)):
            data = bytes(summary)
        elif hasattr(summary, "SerializeToString"):
            data = summary.SerializeToString()
        else:
            raise TypeError(f"summary must be a Summary proto, its bytes, or a mapping of tags to scalars, "
                            f"got {type(summary).__name__}")
        _check_size("Summary proto", "", len(data))
        with self._lock:
            self._protos.append((step, wall, data))
            self._payload_bytes += len(data)
            self._trim_payloads()
        if len(self._protos) + len(self._items) >= ITEMS_MAX:
            self.on_batch()

    def histogram(self, tag: str, values: Any, step: Any, wall: float, buckets: Optional[int] = None,
                  description: str = "") -> None:
        if buckets is not None and (not isinstance(buckets, int) or isinstance(buckets, bool) or buckets < 1):
            raise ValueError(f"histogram {tag!r}: buckets must be a positive integer, got {buckets!r}")
        data = histogram_values(tag, values)
        self.item(SummaryItem(ItemKind.HISTOGRAM, tag, as_step(step), wall, data.dtype.name, list(data.shape),
                              buckets=buckets or 0, description=str(description)), data.tobytes())

    def image(self, tag: str, images: Any, step: Any, wall: float, max_outputs: int = 3,
              description: str = "") -> None:
        data = image_pixels(tag, images, max_outputs)
        self.item(SummaryItem(ItemKind.IMAGE, tag, as_step(step), wall, data.dtype.name, list(data.shape),
                              description=str(description)), data.tobytes())

    def text(self, tag: str, text: Any, step: Any, wall: float, description: str = "") -> None:
        strings, shape = text_strings(tag, text)
        self.item(SummaryItem(ItemKind.TEXT, tag, as_step(step), wall, "json", shape, description=str(description)),
                  json.dumps(strings).encode())

    def item(self, item: SummaryItem, data: bytes) -> None:
        """Keep one validated histogram/image/text item and its frame (ValueError if it is too large)."""
        _check_size(item.kind.value, item.tag, len(data))
        with self._lock:
            self._items.append((item, data))
            self._payload_bytes += len(data)
            self._trim_payloads()
        if len(self._protos) + len(self._items) >= ITEMS_MAX:
            self.on_batch()

    def _trim_payloads(self) -> None:
        while self._payload_bytes > ITEM_BYTES_MAX and (self._protos or self._items):
            self._payload_bytes -= _pop_oldest(self._protos, self._items)
            self._dropped += 1
            self.dropped_total += 1

    def count_dropped(self, n: int) -> None:
        with self._lock:
            self._dropped += n
            self.dropped_total += n

    # ---- hand-off (main thread)
    def full(self) -> bool:
        """A whole batch of scalars is waiting."""
        return len(self._cols) - self._skip >= BATCH_MAX

    def due(self, now: float) -> bool:
        """A batch should go at ``now`` (of :attr:`clock`): one is full, or a partial one waited FLUSH_EVERY."""
        n = len(self._cols) - self._skip
        m = len(self._protos) + len(self._items)
        return n >= BATCH_MAX or m >= ITEMS_MAX or (n + m > 0 and now - self._last_flush >= FLUSH_EVERY)

    def next_flush(self) -> float:
        """When (on :attr:`clock`) a partial batch becomes due."""
        return self._last_flush + FLUSH_EVERY

    def room(self) -> int:
        """Scalar rows that :meth:`put_back` can take now without dropping any."""
        return max(0, BUFFER_MAX - (len(self._cols) - self._skip))

    def oldest_step(self) -> Optional[int]:
        """The step of the oldest summary still waiting (None if nothing waits)."""
        with self._lock:
            self._trim()
            firsts = []
            if self._cols:
                firsts.append(self._cols.steps[0])
            if self._protos:
                firsts.append(self._protos[0][0])
            if self._items:
                firsts.append(self._items[0][0].step)
        return min(firsts) if firsts else None

    def take(self, limit: Optional[int] = None, items: Optional[int] = None) -> Chunk:
        """Up to ``limit`` rows and ``items`` payloads (BATCH_MAX, ITEMS_MAX), oldest first, with the drops so far."""
        limit = BATCH_MAX if limit is None else limit
        n_items = ITEMS_MAX if items is None else items
        with self._lock:
            self._trim()
            cols, protos, queued = self._cols, self._protos, self._items
            if len(cols) <= limit:
                taken = cols.take_all()
            else:
                taken = cols.head(limit)
                cols.drop_front(limit)
            chunk = Chunk(taken, [protos.popleft() for _ in range(min(n_items, len(protos)))],
                          [queued.popleft() for _ in range(min(n_items, len(queued)))], self._dropped)
            self._payload_bytes -= sum(len(p[2]) for p in chunk.protos) + sum(len(i[1]) for i in chunk.items)
            self._dropped = 0
            self._last_flush = self.clock()
        return chunk

    def put_back(self, chunk: Chunk) -> None:
        """Return a chunk (not sent, or to be restated) to the front, within the bounds."""
        with self._lock:
            self._trim()
            self._cols.prepend(chunk.scalars)
            self._protos.extendleft(reversed(chunk.protos))
            self._items.extendleft(reversed(chunk.items))
            self._payload_bytes += sum(len(p[2]) for p in chunk.protos) + sum(len(i[1]) for i in chunk.items)
            self._dropped += chunk.dropped
            self._trim()  # beyond the bound, the oldest go: the front of what was put back first
            self._trim_payloads()

    def restate(self, acked: Chunk, unacked: Chunk) -> None:
        """Put a restatement back in front, in the order it was first sent: the acknowledged rows
        (sent earlier) before the unacknowledged ones, so that steps stay in order. Beyond the
        bounds the unacknowledged rows and payloads go first, oldest first (counted): an
        acknowledged one is dropped only if the acknowledged part alone does not fit."""
        with self._lock:
            self._trim()
            over = len(self._cols) + len(acked.scalars) + len(unacked.scalars) - BUFFER_MAX
            cut = min(max(0, over), len(unacked.scalars))
            scalars = ScalarColumns()
            scalars.extend(acked.scalars)
            scalars.extend(unacked.scalars.tail_from(cut))
            payload = self._payload_bytes + sum(len(p[2]) for p in acked.protos + unacked.protos) + \
                sum(len(i[1]) for i in acked.items + unacked.items)
            protos, items = deque(unacked.protos), deque(unacked.items)
            while payload > ITEM_BYTES_MAX and (protos or items):
                payload -= _pop_oldest(protos, items)
                cut += 1
            self._dropped += cut
            self.dropped_total += cut
        self.put_back(Chunk(scalars, acked.protos + list(protos), acked.items + list(items)))


def _pop_oldest(protos: deque[Proto], items: deque[Item]) -> int:
    """Remove the older (by wall time) of the first proto and the first item; return its payload bytes."""
    if protos and (not items or protos[0][1] <= items[0][0].wall_time):
        return len(protos.popleft()[2])
    return len(items.popleft()[1])


def _nothing() -> None:
    pass


def _check_size(what: str, tag: str, size: int) -> None:
    """ValueError at the call for one summary larger than :data:`SUMMARY_BYTES_MAX`."""
    if size > SUMMARY_BYTES_MAX:
        name = f"{what} {tag!r}" if tag else what
        raise ValueError(f"{name}: {size / (1 << 20):.1f} MiB is more than the {SUMMARY_BYTES_MAX >> 20} MiB one "
                         "summary may take; log it smaller (downscale the image, fewer outputs or values)")
