"""The Supervisor's step boundary (a mixin): what ``session.run(step_fn)`` does before and after the step.

Runs in the trainer's main thread, the one that prepared the session. Before a step: the stop
check, then the checkpoint work of the completed step (:func:`step_boundary.checkpoint_work`);
after it: the advance of ``global_step``, the progress report, the periodic ``summary_fn`` and the
hand-off of logged summaries. Each half runs its full work only when its :class:`Gate` has
passed (see :mod:`procsv.trainer.step_boundary`); this module owns both gates and when they are
computed and opened.
"""

from __future__ import annotations

from typing import Any

from procsv.common.errors import TrainingStopped
from procsv.trainer.step_boundary import NEVER, Gate, ProgressReporter, StepCounter, checkpoint_work
from procsv.trainer.summary_methods import SummaryMethods


class BoundaryMethods(SummaryMethods):
    """``_begin_step``/``_end_step`` around each step, behind the gates ``_ckpt_gate`` and ``_end_gate``."""

    _counter: StepCounter
    _progress: ProgressReporter
    coord: Any
    _ckpt_gate: Gate
    _end_gate: Gate

    def _open_gates(self) -> None:
        """Every trigger may have changed (a new session, a new checkpoint agent): look at the next boundary."""
        self._ckpt_gate.open()
        self._end_gate.open()

    def _begin_step(self) -> int:
        """Before a step: checkpoint work of the completed step; return that step's number."""
        if self.coord.should_stop():
            raise TrainingStopped("a stop was requested; the training loop should end")
        before = self._step
        gate = self._ckpt_gate
        if before >= gate.step or self._clock() >= gate.at:
            self._checkpoint_boundary(before)
        self._step = before + 1
        return before

    def _checkpoint_boundary(self, step: int) -> None:
        agent = self._ckpt
        if agent is None or self._channels is None or not self.is_chief:
            self._ckpt_gate.shut(NEVER, NEVER)  # no checkpoint work in this session
            return
        # the state is still that of ``step``; its summaries are handed off first
        checkpoint_work(agent, self._channels, step, self._clock(),
                        lambda: self._flush_summaries(force=False, urgent=True), self._summaries_unwritten_from)
        if agent.failure is not None:  # checkpoints keep failing: stop, the TF way
            self.coord.request_stop(agent.failure)
            raise TrainingStopped(str(agent.failure))
        self._ckpt_gate.shut(*agent.next_work(step, self._clock()))
        if agent.in_flight is not None:
            self._end_gate.open()  # while a commit is in flight, summaries go at every boundary

    def _end_step(self, before: int) -> None:
        """After a step: advance global_step (unless the program did: :class:`StepCounter`), then
        report progress and hand off summaries when their gate has passed."""
        counted = self._counter.advance(before)
        if counted is not None:
            self._step = counted
        gate = self._end_gate
        if self._step >= gate.step:
            self._after_boundary(self._clock())
        else:
            now = self._clock()
            if now >= gate.at:
                self._after_boundary(now)

    def _after_boundary(self, now: float) -> None:
        ch = self._channels
        assert ch is not None
        self._progress.after_step(ch, self._step, now)
        if self.save_summaries_secs and now >= self._next_summary:
            self._periodic_summaries(now)
        self._flush_summaries(force=False)
        if self._ckpt is not None and self._ckpt.in_flight is not None:
            self._end_gate.shut(self._step + 1, now)  # urgent hand-offs: at every boundary
            return
        at = self._progress.next_at()
        if self.save_summaries_secs:
            at = min(at, self._next_summary)
        if self.is_chief:  # a worker only discards what it logged: at its progress reports
            sender = getattr(self, "_summary_sender", None)
            at = min(at, sender.wake_at) if sender is not None else float("-inf")
        self._end_gate.shut(NEVER, at)
