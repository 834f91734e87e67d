"""One Supervisor's watch over non-finite training: what it keeps, checks and does.

Runs in the trainer's main thread. :class:`NonfiniteWatch` holds the policy (``Supervisor(
on_nonfinite=...)``, else ``procsv launch --on-nonfinite``: resolved by its owner, which hands it
the launch's ``--max-skips`` and ``--skip-window`` too, and why a group's member cannot roll back in
place: ``group_refusal``), the
watched losses (:class:`~procsv.trainer.nonfinite.losses.LossWatch`), the rollback's course
(:class:`~procsv.trainer.nonfinite.retry.Retry`, which changes it only through its own transitions;
the watch holds it, its rollback and walk move it), and the checks a snapshot
passes through (:meth:`precheck` before its copy, :meth:`verify` on the copy); a refused snapshot
raises :class:`~procsv.common.errors.NonFiniteState`, which the checkpoint agent cleans
up after and the step boundary hands to :meth:`refused`: the policy's decision. With loss-spike
detection on (``--on-spike`` other than ``off``, resolved by its owner too: ``spike_policy``), the
precheck also judges the finite losses it read (:mod:`~procsv.trainer.nonfinite.spike`'s rule, the
history in ``spikes``) and hands the spikes found (none, mostly) to ``spiked``, its owner's (which
records them, and under ``rollback`` or ``stop`` refuses the snapshot with
:class:`~procsv.common.errors.LossSpiked`).
"""

from __future__ import annotations

import sys
from typing import Any, Callable, Optional, Sequence

import numpy as np

from procsv.trainer.checkpoint import graph_shape
from procsv.trainer.nonfinite import policy, scan
from procsv.common.errors import NonFiniteState, TrainingDiverged
from procsv.trainer.nonfinite.losses import LossWatch
from procsv.trainer.nonfinite.notices import Position
from procsv.trainer.nonfinite.policy import OnNonfinite, RestoreBound, SkipBudget
from procsv.trainer.nonfinite.retry import Retry
from procsv.trainer.nonfinite.spike import OnSpike, Spike, SpikeHistory, SpikeThresholds

DEFAULT = OnNonfinite.ROLLBACK  # issue 41: under procsv launch and in plain python


class NonfiniteWatch:
    """The policy, the kept losses, the rollback's course (``retry``), the rules of the last walk of
    the object graph (per plan), the refusals so far (``refusals``), and the first one (``first``)."""

    def __init__(self, on_nonfinite: Optional[str], tags: Sequence[str], ignore: Sequence[str],
                 max_skips: Optional[int] = None, skip_window: Optional[int] = None, *,
                 group_refusal: str = "", spike_policy: OnSpike = OnSpike.OFF,
                 spike_thresholds: SpikeThresholds = SpikeThresholds(),
                 spiked: Optional[Callable[[tuple[Spike, ...], int], None]] = None) -> None:
        if isinstance(tags, str) or isinstance(ignore, str):
            raise TypeError("nonfinite_tags and nonfinite_ignore take a tuple of strings, not one string")
        self.policy = policy.parse(on_nonfinite, DEFAULT)
        self.spike_policy = spike_policy
        # the losses judged for spikes, and the owner's action on one (None: no spike detection)
        self.spikes = SpikeHistory(spike_thresholds) if spike_policy != OnSpike.OFF and spiked is not None else None
        self._spiked = spiked
        self.losses = LossWatch(tuple(tags), sink=self.spikes.feed if self.spikes is not None else None)
        self.deferred_at: Optional[int] = None  # the step of the first check whose judgement waits (precheck)
        self.ignore = tuple(ignore)
        self.budget = SkipBudget(max_skips if max_skips is not None else policy.DEFAULT_MAX_SKIPS,
                                 skip_window if skip_window is not None else policy.DEFAULT_SKIP_WINDOW)
        self.restores = RestoreBound()
        self._rules: Optional[tuple[Any, scan.Rules]] = None
        self._rules_shape: Optional[graph_shape.Shape] = None  # the object graph's edges the rules were read from
        # rollback (procsv.trainer.nonfinite.rollback): the bad step being retried or skipped, the boundary
        # at which that is due, the steps retried once already, the bisect; changed by its own transitions
        self.retry = Retry()
        self.position: Optional[Position] = None  # a step's input position, where known (Keras fit's (epoch, batch))
        # a program whose loop cannot go back (Keras fit) replays the restored steps itself: why it
        # cannot ("" if it can), and what it does when a step is restored or skipped
        self.replay_unsupported = ""
        self.group_refusal = group_refusal  # why a member of a trainer group cannot roll back in place ("" if it can)
        self.on_restored: list[Callable[[int], None]] = []
        self.on_skipped: list[Callable[[int], None]] = []
        self.refusals = 0
        self.first: Optional[NonFiniteState] = None

    # ------------------------------------------------------------------ the checks of a snapshot
    def precheck(self, step: int, defer: bool = False) -> None:
        """Before the state of ``step`` is copied: the losses kept since the last check (one read);
        then, with spike detection on, the spikes among them (:meth:`judge_spikes`). ``defer`` (an
        in-memory snapshot's check): under ``--on-spike warn``, which never refuses a snapshot, only
        the NaN check runs here (one read of the losses' sum, as under ``off``) and the judgement is
        left to :meth:`judge_deferred` after the snapshot's boundary, so that it is no part of what
        the snapshot costs the loop (the in-memory tier's charge, which sets how often it snapshots:
        issue 68). ``rollback`` and ``stop`` judge here: a spiked state is never snapshotted."""
        deferring = defer and self.spike_policy == OnSpike.WARN and self.spikes is not None
        bad = self.losses.check(defer=deferring)
        if bad is not None:
            raise NonFiniteState(step, bad)
        if deferring:
            self.deferred_at = step if self.deferred_at is None else self.deferred_at
            return
        self.judge_spikes(step)

    def judge_deferred(self, step: int) -> None:
        """At a step boundary after ``step``'s checkpoint work: the judgement a check before an
        earlier boundary's snapshot deferred (:meth:`precheck`), if any."""
        if self.deferred_at is not None and self.deferred_at < step:
            self.judge_spikes(step)

    def judge_spikes(self, step: int) -> None:
        """The finite losses read since the last judgement (and those deferred checks left on the
        device, read now), judged for spikes (at the state of ``step``): the spikes found (none,
        mostly) go to the owner's ``spiked`` (which may raise, refusing the snapshot)."""
        if self.spikes is None or self._spiked is None:
            return
        self.deferred_at = None
        self.losses.drain()
        self._spiked(self.spikes.judge(), step)

    def verify(self, step: int, ckpt: Any, plan: Any, specs: Any, frames: Any, memory: Optional[np.ndarray]) -> None:
        """The copy of the state of ``step`` (in ``memory``, or ``frames``): poison refuses it."""
        if self._rules is None or self._rules[0] is not plan:
            shape = getattr(plan, "shape", None)
            if self._rules is not None and shape is not None and graph_shape.same(self._rules_shape, shape):
                self._rules = (plan, self._rules[1])  # a walk again of the same objects: the same rules
            else:
                self._rules = (plan, scan.rules(ckpt, self.ignore, getattr(plan, "named", None)))
            self._rules_shape = shape
        keys = scan.nonfinite_keys(specs, frames, memory, self._rules[1])
        if keys:
            raise NonFiniteState(step, None, keys)

    # ------------------------------------------------------------------ the policy
    @property
    def stops(self) -> bool:
        """A refusal that is not rolled back stops training (every policy but ``continue``)."""
        return self.policy != OnNonfinite.CONTINUE

    def refused(self, bad: NonFiniteState, last_committed: Optional[int], final: bool = False, why: str = "",
                raise_error: Optional[Callable[[str], None]] = None) -> None:
        """A snapshot of ``bad.step`` was refused; ``last_committed``: the newest committed step (-1:
        none; None: this trainer saves none, a group's member other than the chief, which does not know
        what the chief committed). ``stop`` raises :class:`TrainingDiverged` (``rollback`` where it gives up,
        with ``why``; ``raise_error``: the program's ``NanTensorHook(fail_on_nan_loss=True)`` watches the loss,
        and ``raise_error(line)`` raises its error instead, a :class:`TrainingDiverged` too); ``continue`` says so and
        trains on, and says again, at the 2nd, 4th, 8th ... refusal, why no checkpoint commits (a
        month-long run that went non-finite is not silent about it; the watchdog's stall rule knows it
        from the same refusal)."""
        self.refusals += 1
        if last_committed is None:  # the chief checks its own losses only: it may have committed past this step
            newest = (f"this member saves no checkpoint; the chief's of step {bad.first_step} or later, if any, hold "
                      "that step's update (the chief checks only its own losses)")
        elif last_committed >= 0:
            newest = f"the newest committed checkpoint (step {last_committed}) is the newest finite one"
        else:
            newest = "no checkpoint was committed before it"
        if self.policy == OnNonfinite.CONTINUE:
            if self.first is None or final:
                kept = "the final checkpoint is not" if final else "no checkpoint of this state is"
                print(f"procsv: non-finite training at step {bad.first_step}: {bad.describe()}; {kept} committed "
                      f"({newest}); --on-nonfinite continue: training on", file=sys.stderr, flush=True)
            elif self.refusals & (self.refusals - 1) == 0:  # a power of two
                print(f"procsv: no checkpoint commits: the snapshot of step {bad.step} was refused, the state is "
                      f"non-finite ({self.refusals} snapshots refused since step {self.first.first_step}; {newest}); "
                      "--on-nonfinite continue never commits a poisoned state", file=sys.stderr, flush=True)
            self.first = self.first or bad
            return
        self.first = self.first or bad
        if raise_error is not None:
            message = (f"procsv: non-finite training at step {bad.first_step}: {bad.describe()}; --on-nonfinite "
                       f"rollback gives up ({why}): the program's NanTensorHook(fail_on_nan_loss=True) raises "
                       "NanLossDuringTrainingError, as TensorFlow's (let escape, the trainer exits with code 4, "
                       f"diverging); no checkpoint of this state is committed: {newest}")
            print(message, file=sys.stderr, flush=True)
            raise_error(message.removeprefix("procsv: "))
        message = (f"procsv: non-finite training at step {bad.first_step}: {bad.describe()}; --on-nonfinite "
                   f"{self.policy.value}: stopping in order with exit code 4 (diverging), without a checkpoint of "
                   f"this state: {newest}")
        if self.policy == OnNonfinite.ROLLBACK:
            message += f" (no rollback: {why})"
        print(message, file=sys.stderr, flush=True)
        raise TrainingDiverged(message.removeprefix("procsv: "))
