"""The in-memory snapshot tier's decisions: when the next in-memory snapshot is due, and which
slot of the snapshot memory it may be copied into.

Runs in the trainer (called by :class:`procsv.trainer.checkpoint.agent.CheckpointAgent` at step
boundaries). Pure: plain data and a ``now`` passed in; nothing here reads a clock or touches memory.

The snapshot memory has :data:`SLOTS` slots when the tier is on (one when it is off). The
checkpoint service holds the newest snapshot it received (in-memory or bound for disk) and writes
it to disk if the trainer dies. A slot may be written only if it holds none of:

- the snapshot in flight to disk (until its :class:`~procsv.ipc.messages.SaveResult`);
- the snapshot the service last said it holds (:class:`~procsv.ipc.messages.SnapshotHeld`, or a
  ``SaveResult``): the one a crash right now would be recovered from;
- the in-memory snapshot sent but not yet acknowledged (the service may hold it by now), for at
  most :data:`UNACKED_GRACE` seconds (after that it counts as lost: a restarted service never
  answers it);
- the in-memory snapshot copied but not yet handed to the service (``waiting``): it is handed over
  only once the summary service has confirmed every summary of its step and before, so that a
  restart from it never skips summaries only the dead trainer held;
- a group member of another host's snapshot whose frames ZeroMQ may still read (``sending``): it
  sends them from the slot itself, uncopied (:mod:`procsv.trainer.checkpoint.peer_copy`), so the
  slot is spoken for until the send's trackers say ZeroMQ let go of them, however long after the
  acknowledgment's grace (a link to node 0 that stalls keeps it; a slot rewritten under a send
  would hand node 0 a copy torn across two steps).

With three slots a disk snapshot always finds one, and an in-memory snapshot waits only while the
service is busy committing. The rule keeps a held snapshot intact; should it ever be broken (a
late acknowledgment after the grace), the slot header the trainer writes before and after each
copy (:mod:`procsv.trainer.checkpoint.snapshot`) lets the service see the tear and refuse that snapshot.

How often: each in-memory snapshot stops the loop, so the next is due when ``cost / budget``
seconds have passed (:func:`interval`), which keeps the tier under ``budget`` (1 %) of the loop's
time whatever the model's size and the step's length. The disk snapshots the user asked for take
none of the budget: each restarts the interval (the service holds it as its newest), so frequent
saves make in-memory snapshots rarer, never the interval longer; one is still due at the latest
:data:`MAX_INTERVAL` after the last in-memory one (:func:`due_at`), so that the cost that sets the
interval is measured again however often the user saves. (They used to take their share
first, :func:`disk_share`, and left the tier one snapshot per 10 s once they took the whole 1 %:
``bench_recovery``'s save every 2 s did at load 8 on two cores, each charged 20-90 ms, most of it
the non-finite check of the losses kept since the last snapshot, a stack whose kernel TF built
anew for each count of them (:mod:`procsv.trainer.nonfinite.losses`), so a kill re-did as many
steps, ~300, as with no tier at all: issue 54.) A snapshot's cost is what the loop pays for
it (:func:`snapshot_cost`): the whole step boundary that took it (the copy, the hand-off and that
boundary's other work), the reads of the service made for its acknowledgment, and how much the step
after it ran slower than a typical one, not only the copy (measured on the digits model: a copy
of 0.57 ms, a step boundary 0.87 ms longer than the others, and 0.1 ms more spread over the
three steps after it; in a later round, part by part at load 4-6: the shape check before reusing
a walk 0.38 ms, the non-finite check of the kept losses 0.26, the copy 0.31, the check of the copy
0.12, the hand-off 0.22, the step counter's sync 0.11, the boundary 1.7 ms, the step after it 0.7
more: 2.7 ms charged. The shape check, 0.5-0.6 ms before, and the losses' check, 0.35-0.45 ms,
lost their TensorFlow Python wrappers' cost: :mod:`procsv.trainer.checkpoint.graph_shape`,
:mod:`procsv.trainer.nonfinite.losses`. Then the check of the copy looks at a finite copy in one NumPy
pass per dtype, 0.11 -> 0.05 ms (:mod:`procsv.trainer.nonfinite.scan`), and the hand-off reuses the
encoding of the tensor specs that did not change, the header's encoding 31 -> 8 us, lost in the
hand-off's 0.2 ms of ZeroMQ at load 12 (:mod:`procsv.trainer.checkpoint.layout`); one ``tf.function``
reading all 14 variables cost more than a raw read each, 78-88 us against 72, and TF's C fast
path 60: the variable reads stay as they are). Then the shape check compares each object's own
list of children by identity instead of listing them (:func:`~procsv.trainer.checkpoint.graph_shape.unchanged`,
0.38 -> 0.10 ms), and the losses' check sums them, one op before its read where it ran four (0.24
-> 0.13 ms): charged 2.4 -> 1.45 ms, medians of 3 runs side by side at load 3-6. Loss-spike
detection (issue 68) then read every kept loss and judged them inside that check under the default
``--on-spike warn``: the check 0.94 ms, charged 5.5 ms at load 3-7, 44.5 steps re-done per kill in
``bench_recovery``'s hot series against 29 with ``off``; ``warn`` never refuses a snapshot, so its
check there reads the sum only and the judgement runs at the boundary after the snapshot's, outside
its charge (:meth:`~procsv.trainer.nonfinite.watch.NonfiniteWatch.precheck`): 0.29 ms, charged 2.7,
29.5 re-done per kill. It is measured on snapshots that reuse an earlier walk of the
object graph; a walk (ten times a small model's copy, redone every 10 s) is charged at its own
rate, so one slow walk never stretches the interval after it.

The cost is the median of the last :data:`COST_SAMPLES` snapshots' (:func:`typical_cost`), not a
moving average: on a busy machine one snapshot in a few is charged a descheduling of tens of ms
(measured at load 20 on two cores: single charges of 33, 65 and 74 ms among ones of 2 ms), and a
moving average let each such outlier stretch the interval ten-fold for the dozen snapshots after it.

The budget bounds how often; how long the trainer has run without a failure may make it rarer.
Each snapshot costs ``C`` and a failure loses on average half an interval, so with failures ``M``
seconds apart the loop loses least at Young's interval ``sqrt(2 C M)`` (J. W. Young, "A first
order approximation to the optimum checkpoint interval", CACM 17(9), 1974). The trainer stands in
the time it has trained since its own start or restore beyond :data:`CALM_AFTER` for ``M``
(:func:`interval`'s ``age_secs``): a trainer younger than that, a fresh run or one that replaced a
trainer killed minutes ago, snapshots as often as the budget allows, so a kill every 30 s re-does
one budget's interval, not Young's (with the trainer's whole age as ``M``, a trainer 30 s old with
2 ms snapshots stretched to 0.35 s, 150 steps of the digits benchmark's 2.3 ms step: issue 54).
One that has trained for an hour without a failure snapshots every few seconds (3 ms copies: every
4.5 s, 0.07 % of the loop), from about five hours on every :data:`MAX_INTERVAL` (10 s: the most a
kill can then cost, for 0.03 % of the loop). A long run with no failure pays a small fraction of
the budget instead of all of it, and a run that keeps failing keeps its snapshots close.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Optional, Sequence

SLOTS = 3
BUDGET = 0.01  # the share of the loop's wall time in-memory snapshots may take
MIN_INTERVAL = 0.02  # seconds: never more often than this, however cheap the copy
UNACKED_GRACE = 5.0  # seconds an unacknowledged in-memory snapshot keeps its slot
MAX_INTERVAL = 10.0  # seconds: the longest Young's interval may stretch the time between two (not the budget's)
CALM_AFTER = 300.0  # seconds a trainer trains without a failure before Young's interval may stretch the budget's
COST_SAMPLES = 9  # the last snapshots whose median cost sets the interval
SETTLED = 3  # samples before the median is trusted (before: the cheapest)


def interval(cost_secs: float, budget: float = BUDGET, floor: float = MIN_INTERVAL, walk_secs: float = 0.0,
             walk_every: float = 10.0, age_secs: float = 0.0) -> float:
    """Seconds between in-memory snapshots whose copy stops the loop ``cost_secs``, when the walk
    of the object graph they reuse costs ``walk_secs`` and is redone every ``walk_every`` seconds:
    the walks take their share of the budget, the in-memory copies the rest (none left: one
    in-memory snapshot per walk). The disk snapshots the user asked for take none of it: they are
    paid for with the tier off too, and each restarts the interval (:class:`MemoryTier`'s
    schedule), so frequent user saves make the in-memory ones rarer, never the interval longer.
    Longer if the trainer has trained ``age_secs`` without a failure, more than
    :data:`CALM_AFTER`: Young's interval for failures ``age_secs - CALM_AFTER`` apart
    (:func:`young`), up to :data:`MAX_INTERVAL`."""
    spare = budget - walk_secs / walk_every
    by_budget = max(floor, walk_every) if spare <= 0 else max(floor, cost_secs / spare)
    return max(by_budget, min(MAX_INTERVAL, young(cost_secs, age_secs - CALM_AFTER)))


def due_at(last_any: float, last_memory: Optional[float], every: float) -> float:
    """When the next in-memory snapshot is due: ``every`` seconds (:func:`interval`) after the last
    snapshot of either tier (``last_any``: a disk save restarts the interval), but no later than
    ``every`` or :data:`MAX_INTERVAL`, the longer, after the last in-memory one (``last_memory``;
    None: none taken yet). Only in-memory snapshots are charged a cost, so disk saves more frequent
    than the interval would otherwise keep the cost that set it from ever being measured again: a
    trainer's first snapshot charged 35 ms of one-offs at load (3.5 s) beside saves every 2 s kept
    the tier off for the rest of the run (issue 54). Never more often than ``every``: the budget holds."""
    due = last_any + every
    if last_memory is None:
        return due
    return min(due, last_memory + max(every, MAX_INTERVAL))


def young(cost_secs: float, mtbf_secs: float) -> float:
    """Young's optimum checkpoint interval ``sqrt(2 C M)`` for a snapshot cost ``C`` and failures
    ``M`` seconds apart on average (0 if either is unknown)."""
    if cost_secs <= 0 or mtbf_secs <= 0:
        return 0.0
    return math.sqrt(2.0 * cost_secs * mtbf_secs)


def typical_cost(samples: Sequence[float]) -> Optional[float]:
    """The cost :func:`interval` is given: the median of the last :data:`COST_SAMPLES` snapshots'
    (None before the first), so a snapshot charged a descheduling of the trainer (tens of ms on a
    busy machine) moves it no more than any other, and a lasting change moves it within a few.
    With fewer than :data:`SETTLED` the cheapest: a trainer's first snapshots pay one-offs (a
    median of two, 7 and 35 ms at load, set a 2 s interval that the disk saves every 2 s then
    kept restarting, so no snapshot came to bring it down: issue 54); a cost set too low is
    corrected within a few snapshots, one set too high may never be."""
    recent = list(samples)[-COST_SAMPLES:]
    if not recent:
        return None
    return statistics.median(recent) if len(recent) >= SETTLED else min(recent)


@dataclass
class Charge:
    """An in-memory snapshot whose cost is not fully known yet: the boundary that took it is measured
    (``spent``), the step after it not yet (it runs slower: caches refilled, the service handling the
    snapshot on the other core)."""

    step: int  # the boundary that took it
    spent: float  # seconds that boundary stopped the loop
    ended: float  # when (on the clock) it ended
    reused: bool  # the snapshot reused a walk of the object graph (else its cost is the walk's)
    typical: Optional[float]  # seconds a step took before it, with no snapshot near (None: not known)


def snapshot_cost(charge: Charge, next_step_secs: Optional[float], ack_reads: float) -> float:
    """What one in-memory snapshot cost the loop: the boundary that took it, the reads of the service
    made for acknowledgments since the last one, and how much longer than a typical step the step
    after it took (when both are known; never negative)."""
    extra = 0.0
    if next_step_secs is not None and charge.typical is not None:
        extra = max(0.0, next_step_secs - charge.typical)
    return charge.spent + ack_reads + extra


@dataclass
class Slots:
    """Which step each slot of the snapshot memory holds, and which slots are spoken for."""

    n: int
    steps: list[Optional[int]] = field(default_factory=list)
    disk: Optional[int] = None  # the slot of the snapshot in flight to disk
    held: Optional[int] = None  # the step the service last said it holds
    held_slot: Optional[int] = None  # the slot of that snapshot, when known (a step rewritten is in two slots)
    unacked: Optional[tuple[int, int, float]] = None  # (slot, step, sent at) of an in-memory snapshot
    waiting: Optional[tuple[int, int]] = None  # (slot, step) of an in-memory snapshot copied, not yet sent
    sending: set[int] = field(default_factory=set)  # slots ZeroMQ may still read (a remote member's uncopied send)

    def __post_init__(self) -> None:
        if not self.steps:
            self.steps = [None] * self.n

    def busy(self, now: float) -> set[int]:
        out = set() if self.disk is None else {self.disk}
        if self.n > 1 and self.held is not None:
            out |= {self.held_slot} if self.held_slot is not None else {i for i, s in enumerate(self.steps) if s == self.held}
        if self.unacked is not None and now - self.unacked[2] < UNACKED_GRACE:
            out.add(self.unacked[0])
        if self.waiting is not None:
            out.add(self.waiting[0])
        return out | self.sending

    def free(self, now: float) -> Optional[int]:
        """A slot that may be written now (the one holding the oldest step first), or None."""
        busy = self.busy(now)
        free = [i for i in range(self.n) if i not in busy]
        if not free:
            return None
        return min(free, key=self._age)

    def _age(self, slot: int) -> int:
        step = self.steps[slot]
        return -1 if step is None else step

    def unacked_pending(self, now: float) -> bool:
        """An in-memory snapshot is still awaiting its acknowledgment (within the grace)."""
        return self.unacked is not None and now - self.unacked[2] < UNACKED_GRACE

    def written(self, slot: int, step: int) -> None:
        self.steps[slot] = step

    def wait_to_send(self, slot: int, step: int) -> None:
        self.waiting = (slot, step)

    def sent_memory(self, slot: int, step: int, now: float) -> None:
        self.unacked = (slot, step, now)
        if self.waiting is not None and self.waiting[0] == slot:
            self.waiting = None

    def send_started(self, slot: int) -> None:
        """ZeroMQ was handed ``slot``'s bytes uncopied: the slot is spoken for until :meth:`send_done`."""
        self.sending.add(slot)

    def send_done(self, slot: int) -> None:
        """ZeroMQ let go of ``slot``'s bytes (its send's trackers are done)."""
        self.sending.discard(slot)

    def drop_waiting(self) -> None:
        """The waiting in-memory snapshot will never be sent (a newer snapshot supersedes it)."""
        self.waiting = None

    def sent_disk(self, slot: int) -> None:
        self.disk = slot

    def refused(self, step: int) -> None:
        """The service will never hold the in-memory snapshot of ``step`` (it refused it): no
        acknowledgment is awaited; its slot is free once ZeroMQ let go of it (``sending``)."""
        if self.unacked is not None and self.unacked[1] == step:
            self.unacked = None

    def acknowledged(self, step: int, slot: Optional[int] = None) -> None:
        """The service holds the snapshot of ``step`` (its newest; what it held before is released),
        from ``slot`` (None: the in-memory one awaiting this acknowledgment's, if it is of ``step``)."""
        if slot is None and self.unacked is not None and self.unacked[1] == step:
            slot = self.unacked[0]
        self.held, self.held_slot = step, slot
        if self.unacked is not None and self.unacked[1] <= step:
            self.unacked = None

    def disk_done(self) -> None:
        self.disk = None
