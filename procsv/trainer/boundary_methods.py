"""The Supervisor's step boundary (a mixin): what ``session.run(step_fn)`` does before and after the step,
and the commit of a checkpoint on demand (``commit_checkpoint``: at the stop, or when asked).

Runs in the trainer's main thread, the one that prepared the session. The work: the checkpoint
work of the completed step (:func:`step_boundary.checkpoint_work`), before the next step runs;
the advance of ``global_step`` right after a step; the progress report, the periodic
``summary_fn`` and the hand-off of logged summaries.

Most boundaries have none of it to do, and even looking costs (see
:mod:`procsv.trainer.step_boundary`). So each of the two halves (checkpoint work; progress and
summaries) computes, when it does its work, the first step and time at which it may have work
again, and :class:`~procsv.trainer.step_boundary.StepState` holds them for each step to read: a
boundary before them costs a clock read and two comparisons. The progress-and-summaries half also
runs right after a step when that step must not wait for the next one: a session's first step
(reported at once) and, while a checkpoint is in flight, every step (its summaries must leave the
process before a crash could make a restart skip them). Whoever changes a trigger from outside
opens its half: a save requested by a callback (:meth:`_save_requested`), a summary batch filled
by a logging thread (:meth:`_batch_waiting`).
"""

from __future__ import annotations

import os
import time
from typing import Any, Optional

from procsv.ipc.messages import Busy, Progress, SaveReason
from procsv.common.errors import TrainingStopped
from procsv.common.errors import NonFiniteState
from procsv.trainer.nonfinite.methods import NonfiniteMethods
from procsv.trainer.step_boundary import NEVER, ProgressReporter, StepCounter, checkpoint_work
from procsv.trainer.summaries.sender import COALESCE  # (time-driven work due this soon goes with a boundary that runs)
from procsv.trainer.summary_methods import SummaryMethods


class BoundaryMethods(SummaryMethods, NonfiniteMethods):
    """The step boundary's work around each step (:meth:`ManagedSession.run` runs the step): each
    half's work, and its bounds."""

    _counter: StepCounter
    _progress: ProgressReporter
    _unsaved: bool
    _standard_started: bool  # False: the program has not called start_standard_services() yet
    coord: Any

    def _start_bounds(self) -> None:
        """A new session: the checkpoint half at its first boundary, the other after its first step."""
        self._state.open_checkpoint()
        self._state.set_end(0, NEVER)

    def _open_halves(self) -> None:
        """``start_standard_services()`` in a live session: both halves at the next boundary, the
        periodic summaries one interval from now."""
        if self._channels is not None:
            self._next_summary = self._clock() + (self.save_summaries_secs or 0)
            self._state.open_checkpoint()
            self._state.open_end()

    def _save_requested(self) -> None:
        """A save was requested outside the boundary (the checkpoint agent calls it)."""
        self._state.open_checkpoint()

    def _batch_waiting(self) -> None:
        """A whole summary batch is waiting (the buffer calls it, from the logging thread)."""
        self._state.open_end()

    def _boundary(self, step: int) -> None:
        """Before a step: the halves whose bounds have passed, then their new bounds (the end
        half's step bound is checked after the step, in :meth:`ManagedSession.run`)."""
        state = self._state
        if self._nonfinite_work():
            return  # rolled back or skipped: the step count moved (ManagedSession.run reads it again)
        now = self._clock()
        after = now >= state.end_at  # (the timer's bound; its step bound is checked after the step)
        if after:
            self._after_boundary(now, slack=COALESCE)
        # a boundary the other half's timer brought also does the reads and heartbeat due soon: the
        # halves keep one rhythm (each ~10 times a second, else apart: 20 boundaries a second, not 10)
        if step >= state.ckpt_step or now >= state.ckpt_at or (after and now + COALESCE >= state.ckpt_at):
            self._checkpoint_boundary(step, ahead=COALESCE if after else 0.0)
            self._nonfinite_work()  # a rollback there may have work due at once

    def _after_step(self) -> None:
        """After a step that must not wait for the next boundary: the progress-and-summaries half."""
        self._after_boundary(self._clock())

    def _checkpoint_boundary(self, step: int, ahead: float = 0.0) -> None:
        agent = self._ckpt
        if agent is None or self._channels is None or not self.is_chief or not self._standard_started:
            self._state.set_checkpoint(NEVER, NEVER)  # no checkpoint work in this session
            return
        # the state is still that of ``step``; its summaries are handed off first
        start = self._clock()
        try:
            checkpoint_work(agent, self._channels, step, start,
                            lambda: self._flush_summaries(force=False, urgent=True), self._summaries_unwritten_from,
                            ahead)
        except NonFiniteState as bad:  # the snapshot was refused: the policy decides (stop raises)
            self._nonfinite_refused(bad, False)
        agent.charge_memory(step, start, self._clock())  # what an in-memory snapshot cost the loop
        if agent.failure is not None:  # checkpoints keep failing: stop, the TF way
            self.coord.request_stop(agent.failure)
            raise TrainingStopped(str(agent.failure))
        self._state.set_checkpoint(*agent.next_work(step, self._clock()))
        self._bound_nonfinite()  # a rollback's next work (procsv.trainer.nonfinite.methods)
        if agent.in_flight is not None:
            self._state.set_end(step + 1, self._state.end_at)  # summaries go right after every step now

    def _after_boundary(self, now: float, slack: float = 0.0) -> None:
        """The progress-and-summaries half; a progress report due within ``slack`` s goes now."""
        ch = self._channels
        assert ch is not None
        self._progress.after_step(ch, self._state.step, now, slack)
        periodic = self.save_summaries_secs and self._standard_started
        if periodic and now >= self._next_summary:
            self._periodic_summaries(now)
        self._flush_summaries(force=False)
        at = self._progress.next_at()
        if periodic:
            at = min(at, self._next_summary)
        if self.is_chief:  # a worker only discards what it logged: at its progress reports
            sender = getattr(self, "_summary_sender", None)
            at = min(at, sender.wake_at) if sender is not None else float("-inf")
        urgent = self._ckpt is not None and self._ckpt.in_flight is not None
        self._state.set_end(self._state.step + 1 if urgent else NEVER, at)

    def _report_busy(self, busy: Busy) -> None:
        """Tell the watchdog the step reached and what the trainer is busy with on purpose (``Busy.NONE``:
        nothing); the watchdog judges hangs by it (:mod:`procsv.watchdog.rules.hang`). No-op before a session."""
        if self._channels is not None:
            self._channels.to_watchdog(Progress(os.getpid(), self._state.step, time.time(), busy))

    def commit_checkpoint(self, deadline: Optional[float] = None) -> bool:
        """Commit a checkpoint of the last completed step now, waiting up to ``stop_grace_secs``
        (``preempted`` after SIGTERM/SIGINT, else ``final``); True if that step is committed.
        ``stop()`` calls it; so does ``procsv.train``'s CheckpointSaverHook at ``end()``."""
        if self._ckpt is None or self._channels is None or not self.is_chief:
            return False  # only the chief saves
        self._report_busy(Busy.FINAL_CHECKPOINT)
        self._flush_summaries(force=False, urgent=True)  # hand off before the commit, as at a step
        reason = SaveReason.PREEMPTED if self.coord.stop_signal is not None else SaveReason.FINAL
        grace = self.stop_grace_secs if deadline is None else max(0.0, deadline - self._clock())
        self._ckpt.final(self._channels, self._state.step, reason, grace)
        self._unsaved = self._ckpt.last_committed < self._state.step and not self._ckpt.refused_final
        return not self._unsaved
