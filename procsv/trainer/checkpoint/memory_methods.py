"""The checkpoint agent's in-memory tier (a mixin of :class:`~procsv.trainer.checkpoint.agent.CheckpointAgent`):
when an in-memory snapshot is due, taking it, charging what it cost the loop, and handing it to the
checkpoint service once its step's summaries are written.

Runs in the trainer's main thread, at step boundaries. What is decided here is decided by the pure
functions of :mod:`procsv.trainer.checkpoint.memory_tier`; this mixin keeps the agent's measurements
(the copy's cost, the walk's, the disk snapshots' share) and acts on the snapshot memory
(:class:`~procsv.trainer.checkpoint.snapshot_store.SnapshotStore`).
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from procsv.ipc.messages import SaveData, SaveReason, SnapshotHeld
from procsv.trainer.channels import TrainerChannels
from procsv.trainer.checkpoint import memory_tier
from procsv.trainer.checkpoint.snapshot_store import SnapshotStore
from procsv.common.errors import NonFiniteState

READ_EVERY = 0.01  # seconds between reads of the service's messages while an answer is awaited (see agent.py)
PLAN_MAX_AGE = 10.0  # seconds a snapshot may reuse the object-graph walk of an earlier one (if the graph's shape is the same)


class MemoryTierMethods:
    """The in-memory tier's half of the checkpoint agent; the agent's ``__init__`` sets every field."""

    store: SnapshotStore
    basename: str
    memory_budget: float
    memory_at: float
    memory_step: int
    memory_taken: int
    began: Optional[float]
    copy_cost: Optional[float]
    walk_cost: float
    prepare_snapshot: list[Callable[[], None]]
    _waiting: Optional[tuple[SaveData, list[Any]]]
    _uncharged: Optional[bool]
    _charge: Optional[memory_tier.Charge]
    _ack_reads: float
    _normal_from: Optional[tuple[float, int]]
    _disk_cost: Optional[float]
    _disk_gap: Optional[float]
    _disk_at: Optional[float]
    meta_graph: Optional[bytes]  # graph mode: the serialized MetaGraphDef (CheckpointAgent's)
    _meta_sent: Optional[bytes] = None  # the MetaGraphDef last sent with an in-memory snapshot
    _meta_held: Optional[bytes] = None  # ... once the service said it holds it (SnapshotHeld), until it says not

    def _answer_awaited(self, at: float) -> None:
        raise NotImplementedError  # CheckpointAgent's

    def memory_due(self, step: int, now: float) -> bool:
        """An in-memory snapshot of ``step`` may be taken now (call after :meth:`poll` said no disk one)."""
        return (step > self.memory_step and self._waiting is None and now >= self._memory_next()
                and self._memory_ready(now))

    def _memory_ready(self, now: float) -> bool:
        """Nothing but time keeps an in-memory snapshot back: the tier is on, its memory is ready, the
        last one was acknowledged and a slot is free."""
        store = self.store
        return (self.memory_budget > 0 and store.arena is not None and not store.arena.populating()
                and not store.slots.unacked_pending(now) and store.slots.free(now) is not None)

    def _memory_next(self) -> float:
        """When (on the clock) the next in-memory snapshot is due: the budget's interval, or Young's
        for the time trained since the restore, if longer (:func:`memory_tier.interval`)."""
        age = self.memory_at - self.began if self.began is not None else 0.0
        return self.memory_at + memory_tier.interval(self.copy_cost or 0.0, self.memory_budget,
                                                     walk_secs=self.walk_cost, walk_every=PLAN_MAX_AGE,
                                                     disk_share=memory_tier.disk_share(self._disk_cost, self._disk_gap),
                                                     age_secs=age)

    def memory_snapshot(self, ch: TrainerChannels, step: int, unwritten_from: Optional[int] = None) -> bool:
        """Copy the state of ``step`` into a free slot; hand it to the service to hold (not to
        persist) now or, if summaries of ``step`` or before are not written yet (``unwritten_from``,
        see :meth:`release_memory`), at a later step boundary. True if handed over now."""
        t0 = ch.clock()
        slot = self.store.slots.free(t0)
        if slot is None:
            return False
        for prepare in self.prepare_snapshot:
            prepare()
        reuse = self.store.plan_reusable(t0, PLAN_MAX_AGE)
        try:
            snap = self.store.take(step, slot, fresh=not reuse)
        except NonFiniteState:  # refused: the slot stays free; the next is due an interval later
            self.memory_at, self.memory_step = ch.clock(), step
            raise
        arena = self.store.ref_of(snap)
        self.memory_at, self.memory_step = ch.clock(), step
        self.memory_taken += 1
        # graph mode: the MetaGraphDef only until the service holds it (it adds it to the ones without)
        meta = self.meta_graph if self.meta_graph is not self._meta_held else None
        if meta is not None:
            self._meta_sent = meta
        self._waiting = (SaveData(step, SaveReason.MEMORY, self.basename, snap.specs, arena, slot, False,
                                  meta is not None), list(snap.frames) if meta is None else [*snap.frames, meta])
        self.store.slots.wait_to_send(slot, step)
        self._uncharged = reuse
        return self.release_memory(ch, unwritten_from)

    def charge_memory(self, step: int, start: float, end: float) -> None:
        """Charge the in-memory snapshots to the tier's budget; call at the end of every checkpoint
        boundary (``step``, from ``start`` to ``end`` on the clock).

        A snapshot taken at this boundary is charged what the loop pays for it
        (:func:`memory_tier.snapshot_cost`): the whole boundary, then, at the next boundary (which
        :meth:`next_work` makes ``step + 1``'s), the step after it beyond a typical step's time (the
        steps since the last snapshot's aftermath, on average), and the reads made for
        acknowledgments since the last charge. Measured from inside its own copy, a snapshot of the
        digits model cost 0.57 ms; the step it ran with took 0.87 ms longer than the others."""
        pending = self._charge
        if pending is not None:
            self._charge = None
            next_secs = start - pending.ended if step == pending.step + 1 else None
            cost = memory_tier.snapshot_cost(pending, next_secs, self._ack_reads)
            self._ack_reads = 0.0
            if pending.reused:
                self.copy_cost = memory_tier.smoothed_cost(self.copy_cost, cost)
            else:
                self.walk_cost = max(0.0, cost - (self.copy_cost or 0.0))
            self._normal_from = (end, step)
        if self._uncharged is not None:
            typical = None
            if self._normal_from is not None and step > self._normal_from[1]:
                typical = (start - self._normal_from[0]) / (step - self._normal_from[1])
            self._charge = memory_tier.Charge(step, end - start, end, self._uncharged, typical)
            self._uncharged = None

    def memory_held(self, msg: SnapshotHeld) -> None:
        """The service holds the in-memory snapshot of ``msg.step``; with our MetaGraphDef or not
        (a restarted service has none: the next snapshot carries it again)."""
        self.store.slots.acknowledged(msg.step)
        self._meta_held = self._meta_sent if msg.meta_graph else None

    def waiting(self) -> bool:
        """An in-memory snapshot is copied and waits for its summaries (see :meth:`release_memory`)."""
        return self._waiting is not None

    def release_memory(self, ch: TrainerChannels, unwritten_from: Optional[int]) -> bool:
        """Hand the waiting in-memory snapshot to the service once the summary service has written
        every summary of its step and before (``unwritten_from``: the lowest step with a summary
        not confirmed written, None if none); call at every step boundary. True if sent now.

        Until then the service holds the one before: a trainer killed meanwhile restarts from
        there and re-does the steps whose summaries died with it, instead of skipping them."""
        if self._waiting is None:
            return False
        msg, frames = self._waiting
        if unwritten_from is not None and unwritten_from <= msg.step:
            return False
        self._waiting = None
        sent = ch.send_snapshot(msg, frames)
        if sent:
            self.store.slots.sent_memory(msg.slot, msg.step, ch.clock())
            self._answer_awaited(max(ch.clock() + READ_EVERY, self._memory_next()))
        else:
            self.store.slots.drop_waiting()
        return sent

    def _disk_taken(self, secs: Optional[float], now: float) -> None:
        """A disk snapshot stopped the loop ``secs`` (None: it walked the object graph, which the
        walk's own rate pays for) and ended at ``now``: what the tier's budget leaves (memory_tier.disk_share)."""
        if self._disk_at is not None:
            self._disk_gap = memory_tier.smoothed_cost(self._disk_gap, now - self._disk_at)
        self._disk_at = now
        if secs is not None:
            self._disk_cost = memory_tier.smoothed_cost(self._disk_cost, secs)
