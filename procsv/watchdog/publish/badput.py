"""The live launch's goodput breakdown (:mod:`procsv.goodput`), from the watchdog's own view.

Runs in the watchdog: ``status.json``, the Prometheus snapshot, procsv's TensorBoard scalars, the
live line and ``logs/report.json`` take it from here. Pure: the view and ``now`` (the watchdog's
monotonic clock, which the view's times are on) are passed in. Each round of the watchdog's loop
makes one :class:`Shared` and hands it to the four that are throttled on their own, so the
breakdown (one pass over the attempts) is computed at most once a round, and only in a round where
one of them is due. It reads only what the watchdog already keeps
of each trainer attempt (its spawn, restore, first and last completed step, its snapshot busy
spans, its end): nothing new is asked of the trainer.
"""

from __future__ import annotations

from typing import Optional

from procsv.goodput import Attempt, Breakdown, Launch, breakdown
from procsv.watchdog.rules.state import ChildView, RunView


def attempt(c: ChildView, now: float) -> Attempt:
    """``c`` as :func:`procsv.goodput.breakdown` sees it; a live attempt is stepping up to ``now``
    (or blocked by a snapshot since its busy span began)."""
    ended: Optional[float] = c.ended_at
    if c.signalled_at is not None:
        ended = c.signalled_at if ended is None else min(ended, c.signalled_at)
    last = c.last_work_at if c.first_step_at is not None else None
    if ended is None and c.first_step_at is not None and c.busy_since is None:
        last = now
    return Attempt(spawned=c.started, ready=c.ready_at, restore_secs=c.restore_secs, restored_step=c.restored_step,
                   first_step=c.first_step_at, first_step_no=c.first_step_no, last_at=last, last_step=c.work_step,
                   ended=ended, hung=bool(c.hang.cause), busy_secs=c.busy_secs, busy_from=c.busy_since,
                   rolled_steps=c.rolled_steps, rollback_secs=c.rollback_secs)


def of_launch(view: RunView, now: float) -> Breakdown:
    """Where this launch's time went, from its start to ``now``."""
    start = view.launch_start if view.process_start is None else min(view.launch_start, view.process_start)
    return breakdown(Launch(start, now, view.stop_signal is not None,
                            tuple(attempt(c, now) for c in view.attempts)))


class Shared:
    """The launch's breakdown at ``now`` (:func:`of_launch`), computed by the first caller, then the
    same object for every later one: one round's, shared by its consumers. The view must not change
    between the calls (the round's outputs only read it)."""

    __slots__ = ("view", "now", "_spent")

    def __init__(self, view: RunView, now: float) -> None:
        self.view = view
        self.now = now
        self._spent: Optional[Breakdown] = None

    def __call__(self) -> Breakdown:
        if self._spent is None:
            self._spent = of_launch(self.view, self.now)
        return self._spent


def goodput(view: RunView, spent: Breakdown) -> Optional[float]:
    """The launch's goodput so far (the ``productive`` share of ``spent``, :func:`of_launch`); None
    before the first completed step."""
    return spent.goodput if any(a.first_step_at is not None for a in view.attempts) else None
