"""What the Supervisor does at a step boundary, around each ``session.run(step_fn)``.

Runs in the trainer's main thread, on the thread that prepared the session, never from another
thread. Before a step, the checkpoint work of the step just completed
(:meth:`~procsv.trainer.checkpoint.agent.CheckpointAgent.work`), while the state is still that step's; after it, the advance of ``global_step``
(:class:`StepCounter`) and the progress report to the watchdog (:class:`ProgressReporter`). The
boundary's work itself is :class:`procsv.trainer.boundary.StepBoundary`'s.

Most boundaries have nothing to do, and even looking costs: beside a sub-millisecond step, the
boundary's own Python runs with the caches the step emptied (13 us a step, measured in a digits
loop, for checks that take 2 us in isolation). So the boundary sits behind the bounds of
:class:`StepState`: the first step and the first time (on the Supervisor's clock) at which it may
have work, computed when it last did its work (:mod:`procsv.trainer.boundary`); in
between, a clock read and a few comparisons on one small object.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable, Optional

from procsv.ipc.messages import Busy, Progress
from procsv.trainer.channels import TrainerChannels
from procsv.trainer.once import warn_once

NEVER = float("inf")
PROGRESS_EVERY = 0.1  # seconds between Progress messages to the watchdog
DETECT_EVERY = 100  # after its first 3 steps, a check every this many steps that the program does not count itself


def _nothing_before(step: int) -> None:
    """The boundary work of a step state no step boundary has claimed yet."""


def _nothing_after() -> None:
    """The after-step (or between-steps) work of a step state no step boundary has claimed yet."""


class StepState:
    """What :meth:`procsv.trainer.managed.ManagedSession.run` reads at every step, in one object.

    Owns the steps completed (``step``: the Supervisor's step; the one being run, inside a step) and
    the two halves' bounds: the checkpoint half's ``ckpt_step`` / ``ckpt_at``, the
    progress-and-summaries half's ``end_step`` / ``end_at`` (:class:`procsv.trainer.boundary.StepBoundary`
    computes them), and their earliest time ``at``. Holds what a step calls: the Supervisor's
    ``clock``, ``coord``, :class:`StepCounter`, the watched losses (``losses``), and its boundary work (``boundary(step)`` before a
    step whose bound has passed, ``after_step()`` after one that must not wait, ``between_steps()`` after a
    graph program's run that is no step, from time ``between_at``: the periodic summaries and their hand-off). ``changed``: a run
    changed the program's variables without advancing the step since the last snapshot was taken (a
    graph program's ``minimize(loss)`` without ``global_step=``; the graph session sets it, the
    checkpoint agent clears it): the committed checkpoint of ``step`` is then older than the state.

    Why one slotted object: beside a sub-millisecond step, the check that a boundary has nothing
    to do runs with the caches the step emptied, and each object, dict and Python frame it touches
    costs misses. Read from the Supervisor's own attributes (a 39-key dict) through one more
    frame, the supervised step cost 3-4 us more than a bare call of a trivial ``tf.function``;
    about 2-3 us so.
    """

    __slots__ = ("step", "ckpt_step", "ckpt_at", "end_step", "end_at", "at", "clock", "coord", "counter",
                 "boundary", "after_step", "between_at", "between_steps", "losses", "changed")

    def __init__(self, clock: Callable[[], float], coord: Any, counter: "StepCounter",
                 boundary: Callable[[int], None] = _nothing_before,
                 after_step: Callable[[], None] = _nothing_after) -> None:
        self.step = 0
        self.clock = clock
        self.coord = coord
        self.counter = counter
        # the boundary work (procsv.trainer.boundary.StepBoundary installs its own when it is made)
        self.boundary = boundary
        self.after_step = after_step
        self.between_steps: Callable[[], None] = _nothing_after  # after a graph run that is no step, from between_at
        self.between_at = NEVER  # when a run that is no step next has summaries work (graph mode)
        self.losses: Optional[Any] = None  # the LossWatch each step's returned loss goes to (procsv.trainer.nonfinite)
        self.ckpt_step: float = 0  # NEVER (inf) when no step-count trigger is pending
        self.ckpt_at = self.end_at = self.at = float("-inf")
        self.end_step: float = 0
        self.changed = False

    def claim(self, boundary: Callable[[int], None], after_step: Callable[[], None],
              between_steps: Callable[[], None]) -> None:
        """A step boundary's work: before a step whose bound has passed, after one that must not wait, after a
        graph run that is no step (:class:`procsv.trainer.boundary.StepBoundary` claims the state when made)."""
        self.boundary, self.after_step, self.between_steps = boundary, after_step, between_steps

    def set_between(self, at: float) -> None:
        """A run that is no step has nothing to do before time ``at`` (the periodic summaries, the hand-off)."""
        self.between_at = at

    def open_checkpoint(self) -> None:
        """The checkpoint half does its work at the next boundary (a save was requested)."""
        self.set_checkpoint(0, float("-inf"))

    def open_end(self) -> None:
        """The progress-and-summaries half does its work at the next boundary (a batch is waiting)."""
        self.set_end(self.end_step, float("-inf"))

    def set_checkpoint(self, step: float, at: float) -> None:
        """The checkpoint half has nothing to do before boundary ``step`` or time ``at``."""
        self.ckpt_step, self.ckpt_at = step, at
        self.at = min(at, self.end_at)

    def set_end(self, step: float, at: float) -> None:
        """The progress-and-summaries half has nothing to do before step ``step`` is completed or
        before time ``at``."""
        self.end_step, self.end_at = step, at
        self.at = min(self.ckpt_at, at)


class StepCounter:
    """Advances ``global_step`` by one after each step, unless the program advances it itself.

    Owns the choice (``increment``: True or False forces it; None detects it), whether the program
    was found counting itself (then it is read, never advanced: never count twice), the number of
    steps this process completed, and the increment as a tensor made once (a ``tf.Variable``'s
    ``assign_add`` takes it without a conversion).

    A variable procsv created itself (``private``) is held by no one else until the program asks the
    Supervisor for it, so no step function can read it: its advance is then counted in Python
    (``pending``) and applied in one op by :meth:`sync` before anything reads it (each snapshot, the
    stop). An eager op after every step costs far more than the count (tens of microseconds beside a
    sub-millisecond step). :meth:`expose`, called when the variable is handed out, syncs and ends
    that for good: from then on every step advances the variable at once.
    """

    __slots__ = ("global_step", "increment", "program_counts", "completed", "private", "pending", "_raw", "_one")

    def __init__(self, global_step: Any, increment: Optional[bool], private: bool = False) -> None:
        import tensorflow as tf

        self.global_step = global_step
        self.increment = increment
        self.program_counts = increment is False  # the program advances global_step itself
        self.completed = 0  # steps completed by this process
        self.private = private and increment is not False and isinstance(global_step, tf.Variable)
        self.pending = 0  # advances counted, not applied to the variable yet (only while private)
        self._raw = tf.raw_ops.AssignAddVariableOp  # the op alone: half the cost of Variable.assign_add
        self._one = tf.constant(1, dtype=global_step.dtype) if isinstance(global_step, tf.Variable) else None

    def advance(self, before: int) -> Optional[int]:
        """After a step that began at ``before``: advance ``global_step``, or, when the program counts
        itself (a value other than ``before``, e.g. ``optimizer.iterations``), return the step it says."""
        self.completed += 1
        if self.private:  # nobody else holds the variable: nobody else can advance or read it
            self.pending += 1
            return None
        # reading the variable is an eager op (tens of microseconds, as much as a small model's
        # step): checked at the first steps, where a program that counts itself shows it, then
        # every DETECT_EVERY steps
        n = self.completed - 1
        if not self.program_counts and self.increment is None and (n < 3 or n % DETECT_EVERY == 0):
            if int(self.global_step.numpy()) != before:
                self.program_counts = True
                warn_once("Supervisor.global_step", "the program advances global_step itself: procsv reads it "
                                                    "and no longer increments it")
        if self.program_counts:
            return int(self.global_step.numpy())
        if self._one is not None:
            self._raw(resource=self.global_step.handle, value=self._one)
        else:
            self.global_step.assign_add(1)
        return None

    def sync(self) -> None:
        """Apply the advances counted in Python (one op), so the variable holds the step."""
        if self.pending:
            pending, self.pending = self.pending, 0
            if self._one is not None:  # the op alone (Variable.assign_add: 0.15 ms of each snapshot's charge)
                import tensorflow as tf

                self._raw(resource=self.global_step.handle, value=tf.constant(pending, dtype=self._one.dtype))
            else:
                self.global_step.assign_add(pending, read_value=False)

    def expose(self) -> Any:
        """The variable, for someone else to hold: synced, and advanced at every step from now on."""
        self.sync()
        self.private = False
        return self.global_step


class ProgressReporter:
    """Tells the watchdog the step reached: after a session's first step at once, then at most every
    :data:`PROGRESS_EVERY` s. Owns whether the first was reported and when the last was sent."""

    def __init__(self) -> None:
        self.first_done = False
        self.last = 0.0
        self.waiting_at: Optional[int] = None  # the step of the WAITING report sent last, no other report since

    def busy(self, ch: TrainerChannels, step: int, busy: Busy) -> None:
        """Tell the watchdog what the trainer is busy with on purpose at ``step``. A marked wait again at the
        step of the last report, itself a marked wait's, sends nothing: the watchdog keeps the first one's
        clock for the same wait (``observe._progress``), and a program polling in a loop of ``sv.waiting()``
        blocks sent one message per turn (thousands a second) before."""
        if busy == Busy.WAITING and self.waiting_at == step:
            return
        self.waiting_at = step if busy == Busy.WAITING else None
        ch.to_watchdog(Progress(os.getpid(), step, time.time(), busy, self.first_done))

    def next_at(self) -> float:
        """When the next report is due (at once before the first)."""
        return self.last + PROGRESS_EVERY if self.first_done else float("-inf")

    def after_step(self, ch: TrainerChannels, step: int, now: float, slack: float = 0.0) -> None:
        """``step`` steps are completed at ``now`` (the Supervisor's clock). A report due within
        ``slack`` seconds goes now: a boundary that a timer of the summaries' hand-off brought
        passes half a period, so that the two keep one rhythm instead of making two boundaries a period."""
        if not self.first_done or now + slack - self.last >= PROGRESS_EVERY:
            self.first_done = True
            self.last = now
            self.waiting_at = None
            ch.to_watchdog(Progress(os.getpid(), step, time.time(), stepped=True))
