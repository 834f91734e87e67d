"""The rollback's step-by-step decisions at a step boundary, as pure functions of the watch's data.

Pure: no process runs it, no TensorFlow, no clock, no read of a tensor. The trainer's main thread
(:mod:`.boundary_work`) asks it, at the boundary after each step, what is due next
(:func:`next_due`) and what to do there (:func:`at_boundary`, then, once it has read the losses
kept since the last check, :func:`judge`), and performs the answer: a skip, a kept state, a check
of the weights, a rollback. :class:`Plan` is the data the decisions read: the bad step being
retried or skipped (``target``), whether it is skipped, whether the weights are checked after each
replayed step (``bisecting``), the retried step whose state before it was kept (``kept_for``),
the steps skipped so far, and the detection steps of the loss spikes being replayed (``spike_checks``).
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Optional, Sequence


@dataclasses.dataclass(frozen=True)
class Plan:
    """What the rollback is doing: see the module."""

    target: Optional[int] = None
    skipping: bool = False
    bisecting: bool = False
    kept_for: Optional[int] = None
    skipped: tuple[int, ...] = ()
    spike_checks: tuple[int, ...] = ()


class Action(str, enum.Enum):
    """What the boundary after a step does (:func:`at_boundary` and :func:`judge`).

    ``NOTHING``: no work here. ``SKIP_AGAIN``: the next step was skipped before; skip it again.
    ``KEEP``: the retry of the bad step runs next; keep the state before it. ``CHECK_WEIGHTS``:
    bisecting, a replayed step ran; read the weights (poisoned: that step is skipped; finite:
    ``BISECT_ON`` before the step before the bad one, else the judgement follows). ``JUDGE``: read the
    losses kept since the last check and ask :func:`judge`. ``ROLL_BACK``: a kept loss is non-finite;
    roll back for it. ``FINITE``: the retried step was finite; train on. ``SKIP_OR_BISECT``: the bad
    step is skipped if the weights before it are finite, else the weights are checked after each
    replayed step of one more replay. ``JUDGE_SPIKES``: no bad step is being retried and the replay
after a loss spike's rollback has passed its detection step: read the losses kept since the last
check and judge them for spikes (the replay's losses of the spike's steps against the first ones)."""

    NOTHING = "nothing"
    SKIP_AGAIN = "skip_again"
    KEEP = "keep"
    CHECK_WEIGHTS = "check_weights"
    BISECT_ON = "bisect_on"
    JUDGE = "judge"
    ROLL_BACK = "roll_back"
    FINITE = "finite"
    SKIP_OR_BISECT = "skip_or_bisect"
    JUDGE_SPIKES = "judge_spikes"


def skipped_before(step: int, skipped: Sequence[int], target: Optional[int]) -> bool:
    """``step`` is a step skipped before that the loop meets before the bad step (if any)."""
    return step in skipped and (target is None or step < target)


def next_due(step: int, plan: Plan) -> Optional[int]:
    """The next boundary at or after ``step`` with rollback work: a step skipped before, which the
    replay (or a resumed session) skips again, or the bad step's skip or retry, the boundary before
    the retry (whose state is kept there), and, while bisecting, every boundary; with no bad step
    being retried, the boundary after a replayed spike's detection step (now, if the loop is past it)."""
    target = plan.target
    due = [s - 1 for s in plan.skipped if s - 1 >= step and skipped_before(s, plan.skipped, target)]
    if target is None:
        due.extend(max(s, step) for s in plan.spike_checks)
    else:
        due.append(target - 1 if plan.skipping else target)
        if not plan.skipping and plan.kept_for != target and target - 1 >= step:
            due.append(target - 1)
        if plan.bisecting:
            due.append(step)
    return min(due) if due else None


def at_boundary(step: int, plan: Plan) -> Action:
    """What the boundary after ``step`` (the plan's due) does before any read."""
    target = plan.target
    if skipped_before(step + 1, plan.skipped, target):
        return Action.SKIP_AGAIN
    if target is None:
        return Action.JUDGE_SPIKES if any(s <= step for s in plan.spike_checks) else Action.NOTHING
    if not plan.skipping and step == target - 1 and plan.kept_for != target:
        return Action.KEEP
    if plan.bisecting and step < target:
        return Action.CHECK_WEIGHTS
    return Action.JUDGE


def after_finite_weights(step: int, plan: Plan) -> Action:
    """Bisecting, the weights after replayed ``step`` are finite: check on after the next one, or
    (``step`` is the one before the bad step) judge as planned."""
    return Action.BISECT_ON if plan.target is not None and step < plan.target - 1 else Action.JUDGE


def judge(bad: Optional[int], plan: Plan) -> Action:
    """At the bad step's boundary, the kept losses read: ``bad`` is the first non-finite one's step
    (None: all finite). A non-finite loss before the bad step, or of the retried step, rolls back;
    a retry that was finite trains on; else the bad step is skipped (or, weights permitting, bisected)."""
    target = plan.target
    if bad is not None and target is not None and (bad < target or not plan.skipping):
        return Action.ROLL_BACK
    if not plan.skipping:
        return Action.FINITE
    return Action.SKIP_OR_BISECT


def first_replayed(restored: int, bad: int) -> range:
    """The step whose first-run loss a replay from the state of ``restored`` must give again, bit for bit, before
    the bad step ``bad`` (a NaN's retried step, a spike's onset): the first one replayed (none if that is
    ``bad``). Its loss is the restored state's forward pass on its batch alone (no update of the replay's in
    it: the nondeterministic kernels of a gradient, a GPU's atomics, do not change it), so only another batch,
    or a random op whose state no checkpoint holds, makes it differ."""
    return range(restored + 1, min(restored + 2, bad))


def input_differs(first: dict[int, float], replayed: dict[int, float]) -> tuple[int, float, float] | None:
    """The first step of ``first`` (the first run's losses of steps a rollback's replay trains again
    before the bad step, or a spike's onset) whose ``replayed`` loss differs from it, bit for bit: the
    step, its first loss and the replay's; None if every one replayed so far is equal (a step not
    replayed, or not read, yet is not compared). A difference means the program's input did not come
    back with the restored state (its batch is no function of the step: a counter or an iterator of its
    own; or a random op whose state no checkpoint holds): the replay trained other batches, and says
    nothing of the bad step."""
    for s in sorted(first):
        if s in replayed and replayed[s] != first[s]:
            return s, first[s], replayed[s]
    return None


def input_lost(differs: tuple[int, float, float], last: int) -> str:
    """What :func:`input_differs` found (``differs``: the first replayed step, its first loss and the
    replay's), in words, and what it cost: the first run's batches of that step .. ``last`` (the retried
    step, a spike's detection) were not trained again. The run trains on: an exact replay cannot be had
    there, and losing the run would cost more than those batches."""
    step, first, then = differs
    return (f"gave other losses than the first run (step {step}: {first:.6g}, then {then:.6g}): the program's input "
            "does not come back with the restored step (a counter or iterator of its own, or random numbers no "
            f"checkpoint holds): the batches of steps {step}-{last} were not trained again; feed the batch of sv.step "
            "for an exact replay")
