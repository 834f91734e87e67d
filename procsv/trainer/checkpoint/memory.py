"""The checkpoint agent's in-memory tier: when an in-memory snapshot is due, taking it, charging
what it cost the loop, and handing it to the checkpoint service once its step's summaries are written.

Runs in the trainer's main thread, at step boundaries: :class:`MemoryTier` is a collaborator the
:class:`~procsv.trainer.checkpoint.agent.CheckpointAgent` owns and calls. What is decided here is
decided by the pure functions of :mod:`procsv.trainer.checkpoint.memory_tier`; this module keeps
the tier's measurements (the copy's cost: the median of the last few; the walk's) and acts on the snapshot memory (:class:`~procsv.trainer.checkpoint.snapshot_store.SnapshotStore`), which it shares
with the agent's disk snapshots.
"""

from __future__ import annotations

import sys
from collections import deque
from typing import Any, Callable, Optional

from procsv.ipc.messages import GroupCopyRefused, SaveData, SaveReason, SnapshotHeld, TensorSpec
from procsv.trainer.channels import TrainerChannels
from procsv.trainer.checkpoint import memory_tier, peer_copy
from procsv.trainer.checkpoint.boundary_plan import READ_EVERY  # (while an answer is awaited)
from procsv.trainer.checkpoint.snapshot_store import SnapshotStore
from procsv.common.errors import NonFiniteState

PLAN_MAX_AGE = 10.0  # seconds a snapshot may reuse the object-graph walk of an earlier one (if the graph's shape is the same)


class MemoryTier:
    """The in-memory snapshot tier of one checkpoint agent.

    Owns its budget (0: off), its schedule (when and of which step the last snapshot of either tier
    was taken, when the trainer's state was restored or initialized, how many in-memory snapshots
    it took), what an in-memory snapshot costs the loop (the copy, the walk of the object graph, and
    the charge still being measured), the in-memory
    snapshot copied but waiting for its step's summaries, and which MetaGraphDef it last sent and
    the service holds. It is given the agent's snapshot memory (``store``, shared with the disk
    snapshots), the checkpoint's ``basename``, ``prepare`` (the agent's preparations before every
    snapshot of either tier, run in order) and ``answer_awaited`` (a snapshot was handed to the
    service: the agent reads its acknowledgment by the time passed). It reads no clock of its own:
    times are passed in, or read from the channels of the call (``ch.clock``).
    """

    def __init__(self, store: SnapshotStore, budget: float, basename: str, prepare: list[Callable[[], None]],
                 answer_awaited: Callable[[float], None]) -> None:
        self.store = store
        self.budget = budget  # the share of the loop's time the tier may take (memory_tier.BUDGET); 0: off
        self.basename = basename
        self.numbered = True  # False: a graph without a global step's (SaveData.numbered)
        self._prepare = prepare
        self._answer_awaited = answer_awaited
        self.copy_cost: Optional[float] = None  # seconds an in-memory snapshot reusing a walk stops the loop (median)
        self._costs: deque[float] = deque(maxlen=memory_tier.COST_SAMPLES)  # ... the last ones, as charged
        self.walk_cost = 0.0  # seconds the last walk of the object graph added to its snapshot
        # what the in-memory snapshots cost the loop (see charge)
        self._uncharged: Optional[bool] = None  # one was taken at this boundary: did it reuse a walk?
        self._charge: Optional[memory_tier.Charge] = None  # one whose next step is not measured yet
        self._ack_reads = 0.0  # seconds of reads of the service made while only an in-memory ack was awaited
        self._normal_from: Optional[tuple[float, int]] = None  # (time, step) after which steps ran undisturbed
        self.at = float("-inf")  # when the last snapshot (either tier) was taken
        self.step = -1  # ... and of which step
        self.began: Optional[float] = None  # when the state was restored (or initialized): the trainer's age counts
        self.taken = 0  # in-memory snapshots taken by this process
        self.memory_at: Optional[float] = None  # when the last in-memory snapshot was taken or refused (None: none yet)
        # an in-memory snapshot copied but not handed to the service until its step's summaries
        # are written (its SaveData and frames): see release
        self._waiting: Optional[tuple[SaveData, list[Any]]] = None
        self._meta_sent: Optional[bytes] = None  # the MetaGraphDef last sent with an in-memory snapshot
        self._meta_held: Optional[bytes] = None  # ... once the service said it holds it (SnapshotHeld), until it says not
        # a trainer group's member (procsv.services.checkpoint.group): its rank, its attempt, and K (0: alone):
        # every member snapshots at the steps that are multiples of K, so that all hold the same ones
        self.member, self.attempt, self.every_steps = -1, 0, 0
        self.remote = False  # a member of host 1..M-1: its copies go to node 0 as uncopied frames (peer_copy)
        self._sends = peer_copy.Sends()  # ... and the slots ZeroMQ may still read
        # ... and the copy waiting, then the last one handed over, as taken (its specs with their offsets in
        # the snapshot memory, and its frames), to hand it again to a restarted service (followed); for the
        # one handed over, also which service of node 0 it went to (TrainerChannels.followed then)
        self._source: Optional[tuple[list[TensorSpec], list[Any]]] = None
        self._last_sent: Optional[tuple[int, SaveData, tuple[list[TensorSpec], list[Any]]]] = None
        self.refused_by_peer = False  # node 0 refused a copy (GroupCopyRefused): no more are taken

    # ------------------------------------------------------------------ the schedule
    def start(self, step: int, now: float) -> None:
        """The state of ``step`` was restored (or initialized) at ``now``: it is on disk or rebuilt,
        so the first in-memory snapshot is of a step trained after it; the trainer's age counts
        from ``now``."""
        self.step, self.at = step, now
        self.began = now

    def skipped(self, step: int, now: float) -> None:
        """A snapshot of ``step`` (either tier) was refused at ``now`` (its state is not finite): the
        next in-memory one is due an interval later."""
        self.at, self.step = now, step

    def disk_taken(self, step: int, now: float) -> None:
        """A disk snapshot of ``step`` ended at ``now``: the service holds it as its newest from now
        on, so the next in-memory one is due an interval later. It takes none of the tier's budget
        (:func:`memory_tier.interval`): the user asked for it, and pays for it with the tier off too."""
        self.at, self.step = now, step

    def due(self, step: int, now: float) -> bool:
        """An in-memory snapshot of ``step`` may be taken now (ask after the agent's poll said no disk one);
        a group member's at every K-th step (:meth:`next_step`), on no clock: every member takes the same."""
        if self.every_steps:
            if self.refused_by_peer:  # node 0 would refuse every copy of this state (as large)
                return False
            return step % self.every_steps == 0 and step > self.step and self._waiting is None and self.ready(now)
        return step > self.step and self._waiting is None and now >= self.next_due() and self.ready(now)

    def next_step(self, step: int) -> int:
        """A group member: the next step after ``step`` whose in-memory snapshot is due."""
        return (step // self.every_steps + 1) * self.every_steps

    def ready(self, now: float) -> bool:
        """Nothing but time keeps an in-memory snapshot back: the tier is on, its memory is ready, the
        last one was acknowledged and a slot is free."""
        if self.budget <= 0:  # (off: no copy was ever sent, none to reap)
            return False
        store = self.store
        self.reap_sends()
        return (store.arena is not None and not store.arena.populating()
                and not store.slots.unacked_pending(now) and store.slots.free(now) is not None)

    def next_due(self) -> float:
        """When (on the clock) the next in-memory snapshot is due: the budget's interval, or Young's
        for the time trained since the restore, if longer (:func:`memory_tier.interval`), after the last
        snapshot of either tier, and no later than :data:`memory_tier.MAX_INTERVAL` (or the interval)
        after the last in-memory one (:func:`memory_tier.due_at`)."""
        age = self.at - self.began if self.began is not None else 0.0
        every = memory_tier.interval(self.copy_cost or 0.0, self.budget, walk_secs=self.walk_cost,
                                     walk_every=PLAN_MAX_AGE, age_secs=age)
        return memory_tier.due_at(self.at, self.memory_at, every)

    def measuring(self) -> bool:
        """The step after an in-memory snapshot is still to be measured (see :meth:`charge`): the
        next boundary has work."""
        return self._charge is not None

    # ------------------------------------------------------------------ the snapshots
    def snapshot(self, ch: TrainerChannels, step: int, meta_graph: Optional[bytes],
                 unwritten_from: Optional[int] = None) -> bool:
        """Copy the state of ``step`` into a free slot; hand it to the service to hold (not to
        persist) now or, if summaries of ``step`` or before are not written yet (``unwritten_from``,
        see :meth:`release`), at a later step boundary. ``meta_graph``: graph mode's serialized
        MetaGraphDef, sent until the service holds it. True if handed over now."""
        t0 = ch.clock()
        self.reap_sends()
        slot = self.store.slots.free(t0)
        if slot is None:
            return False
        for prepare in self._prepare:
            prepare()
        reuse = self.store.plan_reusable(t0, PLAN_MAX_AGE)
        try:
            snap = self.store.take(step, slot, fresh=not reuse, in_memory=True)
        except NonFiniteState:  # refused: the slot stays free; the next is due an interval later
            self.skipped(step, ch.clock())
            self.memory_at = self.at
            raise
        if snap.step is not None:  # named by the global step stored in it
            step = snap.step
        arena = self.store.ref_of(snap)
        self.at, self.step = ch.clock(), step
        self.memory_at = self.at
        self.taken += 1
        # graph mode: the MetaGraphDef only until the service holds it (it adds it to the ones without)
        meta = meta_graph if meta_graph is not self._meta_held else None
        if meta is not None:
            self._meta_sent = meta
        specs, frames = snap.specs, list(snap.frames) if meta is None else [*snap.frames, meta]
        self._source = None
        if self.remote and arena is not None and self.store.arena is not None:  # node 0 cannot map our memory
            self._source = (list(specs), list(frames))
            specs, frames = peer_copy.frames(specs, frames, self.store.arena.array)
            arena = None
        self._waiting = (SaveData(step, SaveReason.MEMORY, self.basename, specs, arena, slot, False,
                                  meta is not None, self.numbered, member=self.member, attempt=self.attempt), frames)
        self.store.slots.wait_to_send(slot, step)
        self._uncharged = reuse
        return self.release(ch, unwritten_from)

    def reap_sends(self) -> None:
        """Free (of their send) the slots whose uncopied frames ZeroMQ let go of (a remote member's)."""
        for slot in self._sends.done():
            self.store.slots.send_done(slot)

    def waiting(self) -> bool:
        """An in-memory snapshot is copied and waits for its summaries (see :meth:`release`)."""
        return self._waiting is not None

    def waiting_step(self) -> Optional[int]:
        """The step of the in-memory snapshot copied and waiting for its summaries (None: none waits)."""
        return self._waiting[0].step if self._waiting is not None else None

    def release(self, ch: TrainerChannels, unwritten_from: Optional[int]) -> bool:
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
            if self.remote:
                self._sends.started(msg.slot, frames)
                self.store.slots.send_started(msg.slot)
                if self._source is not None:
                    self._last_sent = (getattr(ch, "followed", 0), msg, self._source)
            self._answer_awaited(max(ch.clock() + READ_EVERY, self.next_due()))
        else:
            self.store.slots.drop_waiting()
        return sent

    def followed(self, ch: TrainerChannels, now: float) -> bool:
        """A member of another host: ``ch`` just followed node 0's restarted checkpoint service
        (:attr:`TrainerChannels.followed` moved). The copy awaiting the dead service's acknowledgment
        is never acknowledged by it, so it no longer keeps newer copies back (its slot is free once
        ZeroMQ let go of its frames). If it is still whole in its slot (not rewritten since, nor
        written over by a copy that was then refused: ``store.copies``), it is handed to the new
        service right away, its frames made again over the same bytes: the
        dead service lost it (it held at most the copies before it, which node 1's holder hands
        back), and before, the member re-did up to an interval more at a kill after the restart.
        A copy handed to the new service already (the follow came with a hand-over) is left
        awaiting its acknowledgment. True if a copy was handed over again."""
        slots, last = self.store.slots, self._last_sent
        if slots.unacked is None:
            return False
        slot, step = slots.unacked[0], slots.unacked[1]
        if last is not None and last[0] == getattr(ch, "followed", 0) and (last[1].slot, last[1].step) == (slot, step):
            return False  # sent to the new service: its acknowledgment will come
        slots.refused(step)  # the dead service acknowledges nothing
        # whole: the slot's last copy completed is of that step (a copy over it that failed, refused as
        # non-finite after it was written, leaves Slots.steps naming the step before: store.copies not)
        whole = self.store.copies.get(slot)
        if last is None or (last[1].slot, last[1].step) != (slot, step) or whole is None or whole.step != step \
                or self.store.arena is None:
            return False
        msg, (specs, payload) = last[1], last[2]
        _, frames = peer_copy.frames(specs, payload, self.store.arena.array)
        if not ch.send_snapshot(msg, frames):
            return False
        slots.sent_memory(slot, step, now)
        self._sends.started(slot, frames)
        slots.send_started(slot)
        self._last_sent = (getattr(ch, "followed", 0), msg, last[2])
        self._answer_awaited(now + READ_EVERY)
        print(f"procsv: member {self.member}'s copy of step {step} went to node 0's checkpoint service before it "
              "was restarted, unacknowledged: handed to the restarted one", file=sys.stderr, flush=True)
        return True

    def superseded(self) -> None:
        """A disk snapshot of a later step was taken: the one waiting, older, is never sent."""
        if self._waiting is not None:
            self._waiting = None
            self.store.slots.drop_waiting()

    def held(self, msg: SnapshotHeld) -> None:
        """The service holds the in-memory snapshot of ``msg.step``; with our MetaGraphDef or not
        (a restarted service has none: the next snapshot carries it again)."""
        self.store.slots.acknowledged(msg.step)
        self._meta_held = self._meta_sent if msg.meta_graph else None

    def refused(self, msg: GroupCopyRefused) -> None:
        """Node 0's service refused this member's copy of ``msg.step`` (too large to hold): it waits
        for no acknowledgment of it, and takes no more in-memory snapshots (every copy of the same
        state is as large: before, each was still copied, sent over CURVE and received whole by
        node 0, every K steps, for nothing); said in one line, the first time."""
        self.store.slots.refused(msg.step)
        if not self.refused_by_peer:
            self.refused_by_peer = True
            print(f"procsv: node 0's checkpoint service refused member {msg.rank}'s copy of step {msg.step}: "
                  f"{msg.size} bytes, beyond the {msg.limit} it holds for one member; this member takes no more "
                  "in-memory snapshots, and a group restarted restores it from disk", file=sys.stderr, flush=True)

    # ------------------------------------------------------------------ the cost
    def poll_for_ack(self, ch: TrainerChannels) -> list[Any]:
        """The checkpoint service's messages, read (without waiting) by the agent with no snapshot in
        flight to disk: if an in-memory snapshot's acknowledgment is awaited, the read is made for it
        and is part of its cost."""
        if self.store.slots.unacked is None:
            return ch.poll_checkpoint()
        t0 = ch.clock()
        messages = ch.poll_checkpoint()
        self._ack_reads += ch.clock() - t0
        return messages

    def read_wait(self, now: float, idle: float) -> float:
        """Seconds until the agent, with no snapshot in flight to disk, next reads the service:
        ``idle``, or sooner while an acknowledgment is awaited (it matters only to the next
        in-memory snapshot, so not much before that is due)."""
        if self.store.slots.unacked is None:
            return idle
        return min(idle, max(READ_EVERY, self.next_due() - now))

    def charge(self, step: int, start: float, end: float) -> None:
        """Charge the in-memory snapshots to the tier's budget; call at the end of every checkpoint
        boundary (``step``, from ``start`` to ``end`` on the clock).

        A snapshot taken at this boundary is charged what the loop pays for it
        (:func:`memory_tier.snapshot_cost`): the whole boundary, then, at the next boundary (which
        the agent's ``next_work`` makes ``step + 1``'s), the step after it beyond a typical step's
        time (the steps since the last snapshot's aftermath, on average), and the reads made for
        acknowledgments since the last charge. Measured from inside its own copy, a snapshot of the
        digits model cost 0.57 ms; the step it ran with took 0.87 ms longer than the others."""
        pending = self._charge
        if pending is not None:
            self._charge = None
            next_secs = start - pending.ended if step == pending.step + 1 else None
            cost = memory_tier.snapshot_cost(pending, next_secs, self._ack_reads)
            self._ack_reads = 0.0
            if pending.reused:
                self._costs.append(cost)
                self.copy_cost = memory_tier.typical_cost(self._costs)
            else:
                self.walk_cost = max(0.0, cost - (self.copy_cost or 0.0))
            self._normal_from = (end, step)
        if self._uncharged is not None:
            typical = None
            if self._normal_from is not None and step > self._normal_from[1]:
                typical = (start - self._normal_from[0]) / (step - self._normal_from[1])
            self._charge = memory_tier.Charge(step, end - start, end, self._uncharged, typical)
            self._uncharged = None
