"""The Supervisor's step boundary (a mixin): what ``session.run(step_fn)`` does before and after the step.

Runs in the trainer's main thread, the one that prepared the session. The work: the checkpoint
work of the completed step (:func:`step_boundary.checkpoint_work`), before the next step runs;
the advance of ``global_step`` right after a step; the progress report, the periodic
``summary_fn`` and the hand-off of logged summaries.

Most boundaries have none of it to do, and even looking costs (see
:mod:`procsv.trainer.step_boundary`). So each of the two halves (checkpoint work; progress and
summaries) computes, when it does its work, the first step and time at which it may have work
again, and one :class:`Gate` holds the earlier of the two: a boundary before it costs a clock
read and two comparisons. The progress-and-summaries half also runs right after a step when that
step must not wait for the next one: a session's first step (reported at once) and, while a
checkpoint is in flight, every step (its summaries must leave the process before a crash could
make a restart skip them). Whoever changes a trigger from outside opens the gate and its half: a
save requested by a callback (:meth:`_save_requested`), a summary batch filled by a logging thread
(:meth:`_batch_waiting`).
"""

from __future__ import annotations

from typing import Any

from procsv.common.errors import TrainingStopped
from procsv.trainer.step_boundary import NEVER, Gate, ProgressReporter, StepCounter, checkpoint_work
from procsv.trainer.summary_methods import SummaryMethods

Bounds = tuple[float, float]  # (first step, first time) at which a half may have work


class BoundaryMethods(SummaryMethods):
    """``_run_step``: one step and the boundary around it; owns the gate and each half's bounds."""

    _counter: StepCounter
    _progress: ProgressReporter
    coord: Any
    _gate: Gate
    _ckpt_due: Bounds
    _end_due: Bounds

    def _open_gates(self) -> None:
        """A new session: the checkpoint half at its first boundary, the other after its first step."""
        self._ckpt_due, self._end_due = (0, float("-inf")), (0, NEVER)
        self._gate.open()

    def _save_requested(self) -> None:
        """A save was requested outside the boundary (the checkpoint agent calls it)."""
        self._ckpt_due = (0, float("-inf"))
        self._gate.open()

    def _batch_waiting(self) -> None:
        """A whole summary batch is waiting (the buffer calls it, from the logging thread)."""
        self._end_due = (self._end_due[0], float("-inf"))
        self._gate.open()

    def _run_step(self, step_fn: Any, args: Any, kwargs: Any) -> Any:
        """One step and its boundary, in one frame (beside a sub-millisecond step, each frame of
        the boundary's Python runs with cold caches and shows in the loop's time): the stop check;
        the boundary's work if its gate has passed (the completed step's checkpoint work before the
        next step runs); ``step_fn(*args, **kwargs)``; the advance of ``global_step`` (unless the
        program did: :class:`StepCounter`); the progress-and-summaries half at once if this step
        must not wait (see the module). Returns what ``step_fn`` returned."""
        if self.coord.asked and self.coord.should_stop():
            raise TrainingStopped("a stop was requested; the training loop should end")
        before = self._step
        gate = self._gate
        if before >= gate.step or self._clock() >= gate.at:
            self._boundary(before)
        self._step = before + 1
        try:
            out = step_fn(*args, **kwargs)
        except BaseException:
            self._step = before
            raise
        counted = self._counter.advance(before)
        if counted is not None:
            self._step = counted
        if self._step >= self._end_due[0]:
            self._after_boundary(self._clock())
            self._shut_gate()
        return out

    def _boundary(self, step: int) -> None:
        """The halves whose bounds have passed, then the gate again (the end half's step bound is
        checked after the step, in :meth:`_run_step`)."""
        now = self._clock()
        if now >= self._end_due[1]:
            self._after_boundary(now)
        if step >= self._ckpt_due[0] or now >= self._ckpt_due[1]:
            self._checkpoint_boundary(step)
        self._shut_gate()

    def _shut_gate(self) -> None:
        self._gate.shut(self._ckpt_due[0], min(self._ckpt_due[1], self._end_due[1]))

    def _checkpoint_boundary(self, step: int) -> None:
        agent = self._ckpt
        if agent is None or self._channels is None or not self.is_chief:
            self._ckpt_due = (NEVER, NEVER)  # no checkpoint work in this session
            return
        # the state is still that of ``step``; its summaries are handed off first
        start = self._clock()
        checkpoint_work(agent, self._channels, step, start,
                        lambda: self._flush_summaries(force=False, urgent=True), self._summaries_unwritten_from)
        agent.charge_memory(step, start, self._clock())  # what an in-memory snapshot cost the loop
        if agent.failure is not None:  # checkpoints keep failing: stop, the TF way
            self.coord.request_stop(agent.failure)
            raise TrainingStopped(str(agent.failure))
        self._ckpt_due = agent.next_work(step, self._clock())
        if agent.in_flight is not None:
            self._end_due = (step + 1, self._end_due[1])  # summaries go right after every step now

    def _after_boundary(self, now: float) -> None:
        ch = self._channels
        assert ch is not None
        self._progress.after_step(ch, self._step, now)
        if self.save_summaries_secs and now >= self._next_summary:
            self._periodic_summaries(now)
        self._flush_summaries(force=False)
        at = self._progress.next_at()
        if self.save_summaries_secs:
            at = min(at, self._next_summary)
        if self.is_chief:  # a worker only discards what it logged: at its progress reports
            sender = getattr(self, "_summary_sender", None)
            at = min(at, sender.wake_at) if sender is not None else float("-inf")
        urgent = self._ckpt is not None and self._ckpt.in_flight is not None
        self._end_due = (self._step + 1 if urgent else NEVER, at)
