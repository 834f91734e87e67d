"""Where a non-finite rollback stands between its restore and the bad step's retry or skip.

Runs in the trainer's main thread, at step boundaries only. :class:`Retry` owns the rollback's
course: the bad step being retried or skipped (``target``), whether it is skipped, whether the
weights are checked after each replayed step (``bisecting``), the boundary at which the next work
is due (``due``), the steps retried once already, the steps found poisoning the weights through
their gradient, and the rollbacks so far. It changes them only through its named transitions: the
restore (:meth:`Retry.aim`, by :class:`~procsv.trainer.nonfinite.rollback.NonfiniteRollback`) and
the walk's steps after it (:class:`~procsv.trainer.nonfinite.boundary_work.BoundaryWork`: the next
work planned, a retry found non-finite again or finite, a bisect begun or ended, the bad step
skipped, the poisoning step found, the retry given up). What the pure decisions read of it is
:meth:`Retry.plan` (:class:`~procsv.trainer.nonfinite.plan.Plan`). The state kept before a retried
step, to put back for its skip, is :mod:`.retry_state`'s, held by the walk.
"""

from __future__ import annotations

from typing import Iterable, Optional, Sequence

from procsv.trainer.nonfinite.plan import Plan


class Retry:
    """The rollback's course (see the module); held by the watch
    (:class:`~procsv.trainer.nonfinite.watch.NonfiniteWatch`, ``watch.retry``)."""

    def __init__(self) -> None:
        self._target: Optional[int] = None
        self._skipping = False
        self._bisecting = False
        self._due: Optional[int] = None
        self._retried: set[int] = set()
        self._gradient_poisoned: set[int] = set()
        self._rollbacks = 0

    # ------------------------------------------------------------------ what others read
    @property
    def target(self) -> Optional[int]:
        """The bad step being retried or skipped (None: none)."""
        return self._target

    @property
    def skipping(self) -> bool:
        """The bad step is skipped when the replay reaches it (else retried once)."""
        return self._skipping

    @property
    def bisecting(self) -> bool:
        """The state before the bad step was found non-finite, its losses finite: the weights are
        checked after each replayed step."""
        return self._bisecting

    @property
    def due(self) -> Optional[int]:
        """The step at whose boundary the next work is due (None: none)."""
        return self._due

    @property
    def rollbacks(self) -> int:
        """The restores done for a non-finite step so far."""
        return self._rollbacks

    def was_retried(self, step: int) -> bool:
        """``step`` was retried once already (its next rollback skips it)."""
        return step in self._retried

    def poisoned_by_gradient(self, step: int) -> bool:
        """The bisect found ``step`` turning the weights non-finite, its loss finite."""
        return step in self._gradient_poisoned

    def plan(self, kept_for: Optional[int], skipped: Sequence[int], spike_checks: Iterable[int] = ()) -> Plan:
        """What the decisions read (:mod:`.plan`), with the walk's ``kept_for`` (the retried step
        whose state before it was kept), the steps skipped so far and the walk's ``spike_checks``
        (the detection steps of the loss spikes being replayed)."""
        return Plan(self._target, self._skipping, self._bisecting, kept_for, tuple(skipped), tuple(sorted(spike_checks)))

    # ------------------------------------------------------------------ the transitions
    def aim(self, target: int, skipping: bool, bisecting: Optional[bool] = None) -> None:
        """A rollback restored the state before ``target`` (one more rollback): the walk replays up
        to it, then retries it (``skipping``: skips it); ``bisecting`` (None: as it was): the weights
        are checked after each replayed step."""
        self._target, self._skipping = target, skipping
        if bisecting is not None:
            self._bisecting = bisecting
        self._rollbacks += 1

    def schedule(self, due: Optional[int]) -> None:
        """The next work is due at the boundary after step ``due`` (None: none is)."""
        self._due = due

    def reached(self) -> None:
        """The boundary due is reached: nothing more is due until the next work is scheduled."""
        self._due = None

    def retried_again(self, step: int) -> None:
        """``step``'s loss was non-finite again when retried: its next rollback skips it."""
        self._retried.add(step)

    def finite(self) -> None:
        """The retried bad step was finite: no step is retried or skipped any more."""
        self._target = None

    def start_bisecting(self) -> None:
        """The weights before the bad step are non-finite after the replay, every loss before it
        finite: the next replay checks them after each step."""
        self._bisecting = True

    def stop_bisecting(self) -> None:
        """No replayed step poisoned the weights this time: the bad step is skipped as planned."""
        self._bisecting = False

    def skipped(self) -> None:
        """The bad step was skipped: no step is retried or skipped any more."""
        self._target, self._bisecting = None, False

    def found_poisoner(self, step: int) -> None:
        """Bisecting, the weights turned non-finite at replayed ``step`` (its gradient, its loss
        finite): it, not the bad step, is rolled back for and skipped next."""
        self._bisecting = False
        self._retried.add(step)
        self._gradient_poisoned.add(step)
        self._target = None

    def give_up(self) -> None:
        """The bad step cannot be retried (its replay cannot be): no retry or skip is due."""
        self._target, self._skipping, self._bisecting = None, False, False
