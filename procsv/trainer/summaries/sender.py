"""The trainer's hand-off of buffered summaries to the summary service; never blocks the loop.

Runs in the trainer's main thread, at step boundaries (:meth:`SummarySender.at_boundary`) and at
the end (:meth:`SummarySender.close`). Batches go out as non-blocking sends on the trainer's
DEALER to the summary service's ROUTER; the service answers each write with a
:class:`~procsv.ipc.messages.SummaryAck` on the same connection, which the sender reads with a
zero-timeout receive: with each hand-off, and every :data:`ACK_POLL_EVERY` while something waits
for them (a checkpoint in flight, :meth:`SummarySender.poll_acks`). Sent batches are kept until
acknowledged as written; when the service asks for a restatement (it was restarted and never
saw this session, or batches were lost with it) everything not acknowledged, and every
acknowledged point at a step >= P, goes back in front of the buffer and the next batch carries
``resync_from=P`` (the service's ``SessionLog START`` at P makes TensorBoard forget steps >= P).
P is chosen so that it never purges an acknowledged point this sender cannot send again: see
:meth:`SummarySender._restate`, and ``services/summary/sessions.py`` for the rules on the other
side.

A restarted service only learns this trainer's connection from the next batch: a batch -- empty
if nothing is due or the window is full -- goes out at least every :data:`HEARTBEAT_EVERY`, so
the request to restate comes within about a second of the restart.
"""

from __future__ import annotations

import os
import time
import uuid
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional, Sequence

from procsv.common.clock.watched import stopped_since
from procsv.ipc.columns import encode_columns
from procsv.ipc.messages import Message, ProtoRef, SummaryAck, SummaryBatch, SummaryOverdue
from procsv.trainer.summaries.buffer import BATCH_MAX, FLUSH_EVERY, Chunk, SummaryBuffer

WINDOW = 50_000  # rows sent but not yet acknowledged; beyond that, rows wait in the buffer
SENDS_PER_BOUNDARY = 16  # batches one step boundary may send (a flood is spread over steps)
ACK_POLL_EVERY = 0.01  # seconds between reads of the service's acks while something waits for them
# work due within this many seconds is done at a boundary that runs anyway: the hand-off, the
# progress report and the reads of acks then keep one rhythm (else each half of a period apart
# makes a boundary of its own: on the digits example the after-step half ran 20-35 times a second
# instead of 10, 50-300 us each right after a step; acks were read on a 10 ms timer of their own)
COALESCE = FLUSH_EVERY / 2
HEARTBEAT_EVERY = 1.0  # seconds: a (possibly empty) batch at least this often (step marks, acks)
TAIL_MAX = 4 * BATCH_MAX  # acknowledged rows kept for a restatement of the current step
CLOSE_WAIT_STEP = 0.01  # seconds: at close, how long one wait for acks may take
# seconds the summary service may confirm none of the batches waiting for it before it counts as
# stuck (a live service answers within a heartbeat; this leaves room for a slow disk's fsync)
SUMMARY_DEADLINE = 30.0

Send = Callable[[Message, Sequence[Any]], bool]
"""Non-blocking send of a message and its frames; False if the queue is full."""
ReadAcks = Callable[[float], Iterable[SummaryAck]]
"""The acks that have arrived, after waiting up to this many seconds for the first (0: none)."""


def encode_chunk(chunk: Chunk, **header: Any) -> tuple[SummaryBatch, list[Any]]:
    """A :class:`SummaryBatch` with the chunk's scalars as binary columns (``header``: its other fields), and its frames."""
    frames: list[Any] = [data for _, _, data in chunk.protos]
    scalars = chunk.scalars
    if scalars:
        frames.append(encode_columns(scalars.tags, scalars.steps, scalars.values, scalars.walls))
    frames += [data for _, data in chunk.items]
    batch = SummaryBatch([ProtoRef(s, w) for s, w, _ in chunk.protos], chunk.dropped, columns=len(scalars),
                         items=[i for i, _ in chunk.items], **header)
    return batch, frames


def _extend(into: Chunk, part: Chunk) -> None:
    into.scalars.extend(part.scalars)
    into.protos += part.protos
    into.items += part.items


@dataclass
class _Sent:
    """One chunk handed to the summary service and not yet acknowledged: its number and step range."""

    seq: int
    chunk: Chunk
    min_step: int
    max_step: int
    sent_at: float  # on the sender's clock


class SummarySender:
    """Hands the buffer's batches to the summary service at step boundaries; never blocks.

    ``send(msg, frames)`` is a non-blocking send that returns False when the queue is full (the
    chunk then goes back to the buffer); ``read_acks(timeout)`` returns the acks received (see
    :data:`ReadAcks`). Timers run on the buffer's clock.
    """

    EXIT_WAIT_SECS = 10.0  # at stop, how long to wait for the service to confirm the last summaries

    def __init__(self, buffer: SummaryBuffer, send: Send, read_acks: ReadAcks,
                 step_rate_secs: Optional[float] = None, start_step: Optional[int] = None,
                 session: Optional[str] = None, deadline: float = SUMMARY_DEADLINE, purge_first: bool = True) -> None:
        self.buffer = buffer
        self.deadline = deadline
        self._overdue_at = 0.0  # before this, no batch is judged overdue (the wait after one was)
        self._last_advance = float("-inf")  # when an ack last confirmed a batch (a lagging service still does)
        # the oldest batch passed its deadline: what the caller tells the watchdog (then sets None)
        self.overdue: Optional[SummaryOverdue] = None
        self._send = send
        self._read_acks = read_acks
        self.step_rate_secs = step_rate_secs
        self.session = session or f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.clock = buffer.clock
        self.inflight: deque[_Sent] = deque()
        self.tail: deque[_Sent] = deque()  # acknowledged, kept while they hold rows of the current step
        self._inflight_rows = 0
        self._next_seq = 1
        self._resync_pending = True  # the session's first batch restates (registers) it, from its start step
        self._resync_floor: Optional[int] = start_step
        self._purge_first = purge_first  # False: the first batch registers the session without a START
        self._last_resync_seq = 0
        self._max_acked_step = -1
        self._released_step = -1  # the highest step of an acknowledged row no longer held (in the tail)
        now = self.clock()
        self._next_poll = now
        self._last_read = float("-inf")  # when the acks were last read
        self._next_heartbeat = now
        self._wake = now  # before this, a boundary has nothing to do unless a batch is full or urgent
        self.restatements = 0

    # ---- step boundary
    @property
    def wake_at(self) -> float:
        """Before this time (on :attr:`clock`) a boundary has nothing to do, unless a batch is full or urgent."""
        return self._wake

    def at_boundary(self, step: int, urgent: bool = False) -> None:
        """Read acks (with each hand-off; every ACK_POLL_EVERY if ``urgent``) and send what is due,
        within the window; cheap when idle. What is due within :data:`COALESCE` is done now."""
        now = self.clock()
        due_by = now + COALESCE
        buf = self.buffer
        if due_by < self._wake and not urgent and not buf.full():
            return
        every = ACK_POLL_EVERY if urgent else FLUSH_EVERY
        # (urgent: at every step's boundary, so every ACK_POLL_EVERY exactly; the slack is for the rhythm)
        if self.inflight and (now >= self._last_read + every if urgent else due_by >= self._next_poll):
            self._next_poll = now + every
            self._read(step, now)
        if self.inflight and now >= max(self._overdue_at, self._silent_since() + self.deadline):
            self._judge_overdue(step, now)
        for _ in range(SENDS_PER_BOUNDARY):
            heartbeat = due_by >= self._next_heartbeat
            if self._inflight_rows >= WINDOW:
                if heartbeat:  # an empty batch: a restarted service learns of us and can ask for a restatement
                    self._send_next(step, now, empty=True)
                break
            if not (buf.due(due_by) or (urgent and len(buf)) or heartbeat):
                break
            if not self._send_next(step, now):
                break
        if self.inflight and self._next_poll <= now:  # the first batch in flight: its ack is read a period on
            self._next_poll = now + every
        # an empty buffer has no partial batch to time: a row logged later waits at most FLUSH_EVERY
        # from now (else every idle boundary would find a stale flush time and do the full check)
        wake = min(buf.next_flush() if len(buf) else now + FLUSH_EVERY, self._next_heartbeat)
        self._wake = min(wake, self._next_poll) if self.inflight else wake

    def poll_acks(self, step: int) -> None:
        """Read the acks that arrived, at most every :data:`ACK_POLL_EVERY`: for a caller waiting for
        rows to be written (an in-memory snapshot is held until its step's summaries are)."""
        now = self.clock()
        if self.inflight and now >= self._last_read + ACK_POLL_EVERY:
            self._read(step, now)

    def _silent_since(self) -> float:
        """Since when the service has confirmed nothing while a batch waits: the oldest batch's
        send, or the last ack that confirmed one if later (a service that lags behind a flood but
        keeps writing is not stuck, however old its queue's head)."""
        return max(self.inflight[0].sent_at, self._last_advance)

    def _judge_overdue(self, step: int, now: float) -> None:
        """The service may have confirmed nothing for the deadline while batches wait: read the
        acks that came (a long step may have kept them unread), and if it still has not, set
        :attr:`overdue`. The next is judged when the wait has tripled (the service's replacement
        takes time)."""
        self._read(step, now)
        if not self.inflight:
            return
        oldest = self.inflight[0]
        waited = now - self._silent_since()
        if waited < self.deadline:
            return
        self._overdue_at = now + 2 * waited
        self.overdue = SummaryOverdue(os.getpid(), oldest.min_step if oldest.max_step >= 0 else step, waited,
                                      self.deadline, stopped_since(self.clock, self._silent_since()))

    def _read(self, step: int, now: float) -> None:
        self._last_read = now
        self._take_acks(step, 0.0)

    def _send_next(self, step: int, now: float, empty: bool = False) -> bool:
        chunk = Chunk() if empty else self.buffer.take()
        span = chunk.step_span()
        header: dict[str, Any] = {}
        if self._resync_pending:
            floor = self._resync_floor
            header["resync_from"] = floor if floor is not None else (span[0] if span else step + 1)
            if not self._purge_first:
                header["purge"] = False
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
            self._purge_first = True  # a later restatement purges what it restates
        lo, hi = span or (step + 1, -1)
        self.inflight.append(_Sent(seq, chunk, lo, hi, now))
        self._inflight_rows += len(chunk)
        return True

    def unwritten_from(self) -> Optional[int]:
        """The lowest step of a row the summary service has not confirmed written (in flight or
        still in the buffer), or None if every row handed to this sender is written. An in-memory
        snapshot of step S is handed to the checkpoint service only once this is None or above S:
        a restart from it must not skip summaries that the dead trainer alone held."""
        oldest = self.buffer.oldest_step()
        lows = [s.min_step for s in self.inflight if s.max_step >= 0] + ([] if oldest is None else [oldest])
        return min(lows) if lows else None

    # ---- acks
    def _take_acks(self, step: int, timeout: float) -> None:
        """Apply the acks that arrived (waiting up to ``timeout`` s for the first), oldest first."""
        for ack in self._read_acks(timeout):
            if ack.session != self.session:
                continue
            self._acknowledge(ack.written, step)
            if ack.resync_after > self._last_resync_seq and not self._resync_pending:
                self._restate(step)

    def _acknowledge(self, written: int, step: int) -> None:
        if self.inflight and self.inflight[0].seq <= written:
            self._last_advance = self.clock()
        while self.inflight and self.inflight[0].seq <= written:
            sent = self.inflight.popleft()
            self._inflight_rows -= len(sent.chunk)
            self._max_acked_step = max(self._max_acked_step, sent.max_step)
            if sent.max_step >= 0:
                self.tail.append(sent)
        # a later restatement starts at the lowest step not yet acknowledged: what is still waiting
        # in the buffer counts too (the rest of a step a full batch cut in two)
        oldest = self.buffer.oldest_step()
        floor = min([step] + ([] if oldest is None else [oldest]) + [s.min_step for s in self.inflight])
        held = sum(len(s.chunk) for s in self.tail)
        while self.tail and (self.tail[0].max_step < floor or held > TAIL_MAX):
            gone = self.tail.popleft()
            held -= len(gone.chunk)
            self._released_step = max(self._released_step, gone.max_step)

    def _restate(self, step: int) -> None:
        """Put back everything that may be missing from the event files; the next batch restates from P.

        The ``SessionLog START`` at P makes TensorBoard forget every point at a step >= P, so every
        acknowledged point at such a step must be sent again. P is the lowest step not acknowledged,
        raised where needed so that it never purges an acknowledged point that this sender no longer
        holds (released from the bounded tail) or that a full buffer would drop: acknowledged means
        written, and stays so. Everything not acknowledged goes back, whatever its step (a point
        below P that the dead service had written anyway then appears twice, which is rare: it takes
        a step larger than the tail, or steps logged out of order).
        """
        self.restatements += 1
        self._overdue_at = 0.0  # a service that asks is alive: a new one is judged by the deadline alone
        if self.inflight:
            floor = min(s.min_step for s in self.inflight)
        else:
            floor = max(step, self._max_acked_step) + 1
        floor = max(floor, self._released_step + 1)
        unacked = Chunk()
        for sent in self.inflight:
            _extend(unacked, sent.chunk)
        while True:
            acked = Chunk()
            for sent in self.tail:
                _extend(acked, sent.chunk.since(floor))
            # beyond the buffer's bound the unacknowledged rows are dropped first: acknowledged rows
            # are lost only beyond the room that is left
            lost = len(acked.scalars) - self.buffer.room()
            if lost <= 0:
                break
            floor = max(acked.scalars.steps[:lost]) + 1  # START above the acknowledged rows it cannot restate
        self.tail.clear()
        self.inflight.clear()
        self._inflight_rows = 0
        # in the order first sent (the tail before what is in flight): the acknowledged rows at the
        # floor's step come from a batch before the one that holds the rest of that step, and a
        # stream out of step order would show a point after its successor and, once its later
        # steps are released from the tail, raise a next restatement's floor above it (seen: a
        # point read back twice)
        self.buffer.restate(acked, unacked)
        self._resync_pending, self._resync_floor = True, floor

    # ---- end
    def close(self, step: int, timeout: float) -> int:
        """Send everything and wait up to ``timeout`` s until it is written; return what was not confirmed.
        The stop's batches ask for no ``global_step/sec``: TF's step counter thread writes none at the stop
        (its loop ends at the stop's request), and a rate of the stop's own wait would say the training stalled."""
        deadline = self.clock() + timeout
        self.step_rate_secs = None
        while True:
            now = self.clock()
            while len(self.buffer) or self._resync_pending:
                if not self._send_next(step, now):
                    break
            if self.inflight and now >= self._next_heartbeat:
                self._send_next(step, now, empty=True)  # in case the service restarted and lost the rest
            if not self.inflight and not len(self.buffer) and not self._resync_pending:
                return 0
            if now >= deadline:
                return self._inflight_rows + len(self.buffer)
            self._take_acks(step, min(CLOSE_WAIT_STEP, deadline - now))

    def unconfirmed(self) -> int:
        return self._inflight_rows + len(self.buffer)
