"""The trainer's snapshot memory, and the copy of the training state into one of its slots.

Runs in the trainer's main thread, owned by :class:`procsv.trainer.checkpoint.agent.CheckpointAgent`,
which decides when a snapshot is taken and where it goes; this module only takes it. The memory is
a shared arena (:class:`~procsv.trainer.checkpoint.snapshot.SnapshotArena`) set up once, right after the
restore, and pre-faulted by a low-priority thread; it is made again, bigger, when the state
outgrows it (new variables), and where no memfd can be made snapshots travel as ZeroMQ frames
instead. A slot's header says ``writing`` while the copy runs, then ``complete``.
"""

from __future__ import annotations

import sys
import time
from typing import Any, Callable, Optional, Protocol, Sequence

from procsv.common import faults
from procsv.common.snapshot_memory import SLOT_COMPLETE, SLOT_WRITING
from procsv.ipc.messages import ArenaRef
from procsv.trainer.checkpoint.memory_tier import Slots
from procsv.trainer.checkpoint import graph_shape
from procsv.trainer.checkpoint.memory_restore import Copy
from procsv.trainer.checkpoint.snapshot import Plan, Snapshot, SnapshotArena, plan, take


class SnapshotCheck(Protocol):
    """What checks each snapshot before it may be kept (procsv.trainer.nonfinite's watch): raises
    :class:`~procsv.common.errors.NonFiniteState` for a poisoned state."""

    def precheck(self, step: int, defer: bool = False) -> None:
        """Before the copy: the watched losses up to ``step`` (``defer``: an in-memory snapshot's
        check, whose judgements that cannot refuse it may wait until after its boundary)."""

    def verify(self, step: int, ckpt: Any, plan: Optional[Plan], specs: Sequence[Any], frames: Sequence[Any],
               memory: Any) -> None:
        """After the copy, before the slot is marked complete: the copied tensors."""


def stuck_here(name: str, detail: str = "") -> None:
    """Hang here for good if ``PROCSV_FAULT`` is ``trainer:<name>[:<n>]`` (tests only: a snapshot
    copy stuck on a page fault of dead storage looks like this; a kill meanwhile leaves a copy half
    done)."""
    if faults.fires("trainer", name):
        print(f"procsv: fault injected: stuck at {name}{detail} (PROCSV_FAULT)", file=sys.stderr, flush=True)
        while True:
            time.sleep(3600)


class SnapshotStore:
    """Where snapshots of the training state are copied to.

    Owns the shared arena (None before the first snapshot and where no memfd can be made), the
    bookkeeping of its slots (:class:`Slots`, made afresh with a new arena), and the last walk of
    the checkpoint's object graph (:class:`Plan`) with the time it was made (``clock``), which an
    in-memory snapshot may reuse.
    """

    def __init__(self, checkpoint: Any, slots: int, clock: Callable[[], float]) -> None:
        self.checkpoint = checkpoint
        self.clock = clock
        self.arena: Optional[SnapshotArena] = None
        self.slots = Slots(slots)
        self.plan: Optional[Plan] = None  # the last object-graph walk (snapshot.Plan) and when it was made
        self.plan_at = float("-inf")
        self.watch: Optional[SnapshotCheck] = None  # checks each snapshot (procsv.trainer.nonfinite)
        self.copies: dict[int, Copy] = {}  # slot -> the snapshot copied into it (a rollback may restore it)

    def arena_for(self, nbytes: int, background: bool = False) -> Optional[SnapshotArena]:
        """The snapshot memory, (re)created when the state has outgrown it (new variables)."""
        if self.arena is not None and self.arena.slot_size >= nbytes:
            return self.arena
        if self.arena is not None:
            self.close()  # nothing in flight to disk when we get here; the service keeps its own mapping of a held snapshot
        try:
            self.arena = SnapshotArena(nbytes, self.slots.n)
        except OSError as exc:  # no memfd here: snapshots travel as ZeroMQ frames instead
            print(f"procsv: no shared snapshot memory ({exc}); checkpoints copy through ZeroMQ",
                  file=sys.stderr, flush=True)
            return None
        self.arena.populate(background)
        return self.arena

    def close(self) -> None:
        """Let go of the snapshot memory (its session ended): the next snapshot makes a new arena. The
        checkpoint service keeps its own mapping of a snapshot it holds (as when a trainer exits)."""
        if self.arena is not None:
            self.arena.close()
            self.arena = None
            self.slots = Slots(self.slots.n)
            self.copies = {}

    def plan_reusable(self, now: float, max_age: float) -> bool:
        """The last walk of the object graph may be reused at ``now``: made under ``max_age`` s ago,
        and the graph still has the same objects in the same places (:mod:`procsv.trainer.checkpoint.graph_shape`)."""
        if self.plan is None or not self.plan.reusable or now - self.plan_at >= max_age:
            return False
        if self.plan.marks is not None:  # the walk's marks: no second listing of the edges
            return graph_shape.unchanged(self.plan.marks)
        return graph_shape.same(self.plan.shape, graph_shape.shape(self.checkpoint))

    def take(self, step: int, slot: int, fresh: bool = True, in_memory: bool = False) -> Snapshot:
        """Copy the state into ``slot`` (its header says writing, then complete) and gather the rest
        (the snapshot's ``step`` is the global step stored in it when the checkpoint knows it, and
        then replaces ``step`` from the copy on: a checkpoint is named by the step it holds);
        walk the object graph again unless not ``fresh`` (then :attr:`plan` is reused). With a
        :attr:`watch`, a poisoned state raises :class:`NonFiniteState` (before the copy if a watched
        loss was non-finite, else after it, before the slot is marked complete); an in-memory
        snapshot's (``in_memory``) check may defer what cannot refuse it (:meth:`SnapshotCheck.precheck`)."""
        if self.watch is not None:
            self.watch.precheck(step, defer=in_memory)
        if fresh or self.plan is None:
            self.plan, self.plan_at = plan(self.checkpoint), self.clock()
        def place(nbytes: int) -> Optional[tuple[SnapshotArena, int]]:
            arena = self.arena_for(nbytes)
            if arena is None:
                return None
            self.copies.pop(slot, None)
            arena.mark(slot, SLOT_WRITING, step)
            return arena, arena.base(slot)

        snap = take(self.checkpoint, place, self.plan)
        if snap.step is not None:  # the global step stored in it names it (another thread may have moved it)
            step = snap.step
        if self.watch is not None:
            memory = self.arena.array if self.arena is not None and snap.arena_bytes else None
            self.watch.verify(step, self.checkpoint, self.plan, snap.specs, snap.frames, memory)
        if self.arena is not None and snap.arena_bytes:
            stuck_here("slot_complete", f" of step {step} in slot {slot}")
            self.arena.mark(slot, SLOT_COMPLETE, step)
            self.slots.written(slot, step)
            self.copies[slot] = Copy(slot, step, tuple(snap.specs), tuple(snap.frames))
        return snap

    def ref_of(self, snap: Snapshot) -> Optional[ArenaRef]:
        """The arena reference a message about ``snap`` carries (None: its tensors are frames)."""
        return self.arena.ref() if self.arena is not None and snap.arena_bytes else None
