"""The rollback's work at step boundaries: what :mod:`.plan` decides there, performed.

Runs in the trainer's main thread, at step boundaries only (the step boundary,
:mod:`procsv.trainer.boundary`, calls :meth:`BoundaryWork.work` and :meth:`BoundaryWork.bound`
through :class:`~procsv.trainer.nonfinite.rollback.NonfiniteRollback`, which keeps one).
:class:`BoundaryWork` walks the loop through a rollback after its restore: a step skipped before is
skipped again, the state before the retry is kept (:mod:`.retry_state`), the replayed steps' losses
are checked, the weights are checked after each replayed step while bisecting, the bad step is
skipped; the replay after a loss spike's rollback is judged as soon as it passes the spike's
detection step (not at the next snapshot, which may come only after the loop's end). The
decisions are :mod:`.plan`'s (pure); the restore itself is the rollback's, given to this walk as
``roll_back`` (and ``stop_diverged``, where a restore cannot be; ``refused``, what a refused
snapshot gets, for the losses a replayed spike's check reads), which takes the kept state back
from it (:meth:`BoundaryWork.take_kept`).
"""

from __future__ import annotations

import sys
from typing import Any, Callable, Optional, Sequence

from procsv.common.errors import NonFiniteState
from procsv.ipc.messages import Message
from procsv.trainer.checkpoint.agent import CheckpointAgent
from procsv.trainer.checkpoint.keeper import CheckpointKeeper
from procsv.trainer.checkpoint.name_based import NameBasedCheckpoint
from procsv.trainer.nonfinite import inputs, notices, retry_state, scan
from procsv.trainer.nonfinite.plan import (Action, Plan, after_finite_weights, at_boundary, input_differs, input_lost,
                                           judge, next_due)
from procsv.trainer.nonfinite.watch import NonfiniteWatch
from procsv.trainer.step_boundary import StepCounter, StepState


class BoundaryWork:
    """A Supervisor's rollback at the step boundaries after its restore (see the module). Owns the
    steps it said it skips again (``_again``), the detection steps of the loss spikes being replayed
    (``_spike_checks``), the trainable variables a bisect checks (``_weights``,
    walked once), the state kept before the retried step (``_kept``), which retried step that was
    for (``_kept_for``) and what the program does instead of a retry it gave up (``abandoned``).
    Given: the watch (whose rollback course, ``watch.retry``, it moves on through that object's
    transitions), the step state and counter (it moves the step on a
    skip, and bounds the checkpoint half's next boundary), the saved state (``checkpoint``), the
    keeper (its agent's snapshot preparations and saved state, for the kept state and the weights),
    ``tell`` (a notice to the watchdog), and the rollback's ``roll_back`` (restore before a bad step:
    "" if done, else why not), ``stop_diverged`` (stop where it cannot) and ``refused`` (the policy
    on a refused snapshot's finding, :class:`~procsv.common.errors.LossSpiked` included)."""

    def __init__(self, watch: NonfiniteWatch, state: StepState, counter: StepCounter, checkpoint: Any,
                 keeper: Optional[CheckpointKeeper], tell: Callable[[Message], None],
                 roll_back: Callable[[Optional[int], str], str],
                 stop_diverged: Callable[[NonFiniteState, str, bool], None],
                 refused: Callable[[NonFiniteState, bool], None]) -> None:
        self.watch = watch
        self._retry = watch.retry
        self._state = state
        self._counter = counter
        self._checkpoint = checkpoint
        self._keeper = keeper
        self._tell = tell
        self._roll_back = roll_back
        self._stop_diverged = stop_diverged
        self._refused = refused
        self._spike_checks: set[int] = set()  # detection steps of the spikes being replayed
        self._again: set[int] = set()  # steps skipped before this session that it said it skips again
        self._weights: Optional[list[Any]] = None
        self._kept: Optional[retry_state.KeptState] = None
        self._kept_for: Optional[int] = None
        self.abandoned = ""  # what the program does instead of the retry it gave up (:meth:`abandon`)
        self._first: dict[int, float] = {}  # the first run's losses of the steps the retry's replay trains again

    def expect_replay(self, first: dict[int, float]) -> None:
        """A retry's restore: ``first`` holds the first run's losses of the steps its replay trains again
        (those the spike history kept), which the replay must give again, bit for bit, for the retry
        to say anything of the bad step (:func:`~.plan.input_differs`)."""
        self._first = first

    @property
    def _agent(self) -> Optional[CheckpointAgent]:
        return self._keeper.agent if self._keeper is not None else None

    def take_kept(self, retry: bool) -> Optional[retry_state.KeptState]:
        """A restore begins: the state kept before the retry, handed over once (None from then on);
        for a ``retry`` (not a skip) which step it was kept for is forgotten too: the state before
        the retry is kept again when the replay reaches it."""
        kept, self._kept = self._kept, None
        if retry:
            self._kept_for = None
        return kept

    def skip_quietly(self, steps: Sequence[int]) -> None:
        """``steps`` are skipped when the loop meets them (a loss spike's rollback put them among the
        steps skipped so far) without a line each: the rollback said so once."""
        self._again.update(steps)

    def check_spike_at(self, detected: int) -> None:
        """A loss spike detected at step ``detected`` was rolled back to be replayed: the replay is
        judged at the first boundary at or after ``detected`` (:meth:`_judge_spikes`)."""
        self._spike_checks.add(detected)

    def drop_spike_check(self, detected: int) -> None:
        """The replay of the spike detected at ``detected`` will not come (its batches are not all kept): no
        verdict is judged for it."""
        self._spike_checks.discard(detected)

    def restored(self) -> None:
        """A restore was done: no retry is given up (yet; a restore's hook may give it up: :meth:`abandon`)."""
        self.abandoned = ""

    def abandon(self, step: int, why: str) -> None:
        """The bad step cannot be retried from the state restored at ``step``: the program cannot
        replay the steps up to it (Keras fit: their batches were not kept); ``why`` says what it
        does instead. No retry or skip is due; the steps skipped before still are."""
        self._retry.give_up()
        self._kept, self._kept_for = None, None
        self.abandoned = why
        self.plan_next(step)

    def plan(self) -> Plan:
        """The data the decisions read (:class:`~procsv.trainer.nonfinite.plan.Plan`): the rollback's
        course, the retried step whose state before it was kept, the steps skipped so far."""
        return self._retry.plan(self._kept_for, self.watch.budget.skipped, self._spike_checks)

    def next_due(self, step: int) -> Optional[int]:
        """The first step at or after ``step`` at whose boundary there is work (None: none)."""
        return next_due(step, self.plan())

    def plan_next(self, step: int) -> None:
        """The next work is due at or after ``step``; the checkpoint half's boundary no later."""
        self._retry.schedule(self.next_due(step))
        self.bound()

    def bound(self) -> None:
        """The checkpoint half's boundary comes no later than the rollback's next work."""
        due = self._retry.due
        if due is not None and due < self._state.ckpt_step:
            self._state.set_checkpoint(due, self._state.ckpt_at)

    def work(self) -> bool:
        """The rollback's work due at the current step, as often as it moves the step; True if it did."""
        moved = False
        while True:
            due, step = self._retry.due, self._state.step
            if due is None or step < due or not self._due(step):
                return moved
            moved = True

    def _due(self, step: int) -> bool:
        """At the boundary after ``step`` (the rollback's ``due``): skip a step skipped before, keep
        the state before the retry, check the weights or the replayed steps' losses (one read each),
        then skip the bad step or judge its retry. True if the step count moved."""
        watch, retry = self.watch, self._retry
        target = retry.target
        retry.reached()
        action = at_boundary(step, self.plan())
        if action == Action.SKIP_AGAIN:
            self._skip(step + 1, step)
            if target is None and step + 1 not in self._again:  # met in a resumed session, not in a replay
                self._again.add(step + 1)
                print(f"procsv: skipping step {step + 1} again (this run skipped it before); training on from "
                      f"step {step + 2}", file=sys.stderr, flush=True)
            self.plan_next(step + 1)
            return True
        if action == Action.JUDGE_SPIKES:
            return self._judge_spikes(step)
        if action == Action.NOTHING or target is None:
            return False
        if action == Action.KEEP:  # the retry runs next
            self._kept_for = target
            self._keep(step)
            self.plan_next(step)
            return False
        if action == Action.CHECK_WEIGHTS:
            if self.poisoned_by(step):
                return True
            if after_finite_weights(step, self.plan()) == Action.BISECT_ON:
                self.plan_next(step + 1)
                return False
            retry.stop_bisecting()  # no replayed step poisoned them this time: the bad step is skipped as planned
        bad = watch.losses.check()
        verdict = judge(bad, self.plan())
        if verdict == Action.ROLL_BACK and bad is not None:
            if bad == target:
                retry.retried_again(target)
            self._tell(notices.detected(bad, f"the loss of step {bad} is NaN or infinite", watch.position))
            why = self._roll_back(bad, f"the loss of step {bad} is NaN or infinite"
                                  + (" again when retried" if bad == target else ""))
            if why:
                self._stop_diverged(NonFiniteState(step, bad), why, False)
            return True
        if verdict == Action.FINITE:
            history, first, self._first = watch.spikes, self._first, {}
            differs = input_differs(first, history.losses_at(range(min(first), target))) if history is not None and first else None
            # the replay trained other batches, the retry another: it says nothing of the NaN, and trains on (said)
            lost = f"; the retry's replay {input_lost(differs, target)}" if differs is not None else ""
            self._kept = None
            print(f"procsv: step {target} was finite when retried{lost}; training on", file=sys.stderr, flush=True)
            retry.finite()
            self.plan_next(step)
            return False
        if not retry.bisecting and not scan.all_finite(self._trainable()):
            # the state before the bad step is non-finite already, its losses finite: a replayed
            # step's gradient was non-finite (its loss not), and the bad step only showed it
            retry.start_bisecting()
            print(f"procsv: the weights before step {target} are non-finite after the replay, every loss before it "
                  f"finite: a replayed step's gradient was not; restoring again and checking the weights after each "
                  f"replayed step", file=sys.stderr, flush=True)
            why = self._roll_back(target, f"the weights before step {target} are non-finite")
            if why:
                self._stop_diverged(NonFiniteState(step, target), why, False)
            return True
        watch.budget.skip(target)
        watch.restores.skipped(target)  # the skip budget's now, not a finding of the snapshot restored
        self._tell(notices.skipped(target, len(watch.budget.skipped), watch.position))
        self._skip(target, step)  # its input and the step count move past it; no other variable changes
        retry.skipped()
        self.plan_next(target)  # a later step skipped before (a resumed session's)
        why = ("its gradient turned the weights non-finite, its loss finite" if retry.poisoned_by_gradient(target)
               else "its loss was NaN or infinite twice")
        print(f"procsv: skipped step {target} ({why}); training on from step {target + 1}", file=sys.stderr, flush=True)
        return True

    def _judge_spikes(self, step: int) -> bool:
        """At the boundary after ``step``, the replay after a spike's rollback past its detection: the
        losses kept since the last check (one read) and their spikes judged, as before a snapshot
        (:meth:`~procsv.trainer.nonfinite.watch.NonfiniteWatch.precheck`: the spike's replayed losses
        against the first ones); a finding goes to the policy as a refused snapshot's does. True if the
        step count moved (a rollback)."""
        self._spike_checks.difference_update([s for s in self._spike_checks if s <= step])
        try:
            self.watch.precheck(step)
        except NonFiniteState as bad:
            self._refused(bad, False)
            if self._state.step != step:
                return True
        self.plan_next(step)
        return self._retry.due == step  # (a step skipped again, due at this same boundary: the walk goes on)

    def _skip(self, step: int, at: int) -> None:
        """Skip ``step`` at the boundary after ``at``: its input is consumed (a program's own hooks,
        Keras fit's iteration counter and position, move past it too), and the global step moves
        past it: procsv's count, or, where the program counts itself (a graph program's optimizer),
        its variable, assigned."""
        inputs.consume(self._checkpoint)
        for hook in self.watch.on_skipped:
            hook(step)
        counted = self._counter.advance(at)
        if counted is not None and counted != at + 1:
            self._counter.global_step.assign(at + 1)
        self._state.step = step

    def _keep(self, step: int) -> None:
        """Keep the state of ``step``, the boundary before the retry (its snapshot preparations first:
        the step counted in Python and a program's own position are written into the state)."""
        agent = self._agent
        if agent is None or isinstance(agent.store.checkpoint, NameBasedCheckpoint):  # restored from disk only
            return
        for prepare in agent.hooks.prepare:
            prepare()
        self._kept = retry_state.keep(self._checkpoint, step)

    def _trainable(self) -> list[Any]:
        """The state's trainable variables (walked once)."""
        if self._weights is None:
            agent = self._agent
            self._weights = scan.trainable(agent.store.checkpoint if agent is not None else None)
        return self._weights

    def poisoned_by(self, step: int) -> bool:
        """At the boundary after replayed ``step``, while bisecting (here, or at its snapshot, which
        found them first): if the weights are non-finite now (one read), ``step`` poisoned them (its gradient, not its loss): restore again, replay to
        the step before it and skip it, instead of the bad step that showed it; True if so."""
        watch = self.watch
        target = self._retry.target
        if scan.all_finite(self._trainable()):
            return False
        print(f"procsv: the weights turned non-finite at step {step}, whose loss was finite (a non-finite gradient): "
              f"skipping step {step}, not step {target}", file=sys.stderr, flush=True)
        self._tell(notices.detected(step, f"the weights turned non-finite at step {step} (its loss was finite)",
                                    watch.position))
        self._retry.found_poisoner(step)
        if target is not None:
            watch.restores.shown_by(target, step)  # one poisoning, not two findings of the restored snapshot
        why = self._roll_back(step, f"the weights turned non-finite at step {step}")
        if why:
            self._stop_diverged(NonFiniteState(step, step), why, False)
        return True
