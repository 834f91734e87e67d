"""The Supervisor's non-finite collaborator: the watch's wiring, the policy's decision on a refused
snapshot, and ``rollback``'s course of restore, replay, retry and skip. Its parts are its
collaborators: the restore in place (:mod:`.restore`), the walk through the replay, the retry and
the skip at each boundary (:mod:`.boundary_work`, which performs what the pure :mod:`.plan`
decides), the settle at the loop's end (:mod:`.loop_end`), a group's ask for its rollback
(:mod:`.group_ask`) and a loss spike's response (:mod:`.spike_response`).

Runs in the trainer's main thread, at step boundaries only (the step boundary,
:mod:`procsv.trainer.boundary`, calls it). ``rollback`` when a watched loss of step B was found
non-finite: the newest finite state R before B (no snapshot of a poisoned state is ever taken or
committed) is restored in place: the newest snapshot in the trainer's own snapshot memory when it
is at least as new as the newest committed checkpoint and verifies
(:mod:`procsv.trainer.checkpoint.memory_restore`), else the newest committed checkpoint, from disk
(once the snapshot in flight, if any, is committed). The program's loop then replays R+1 .. B-1
(the step numbers it reads come back with the restore) and runs B once more, whose loss is read
right after it. If it is non-finite again, the state of B-1 (kept at the boundary before the retry
ran B, :mod:`.retry_state`) is put back, with no second replay, and B is skipped: its step function is not called, its input is consumed (the next element of each
``tf.data`` iterator the checkpoint tracks is taken and discarded, :mod:`.inputs`; with the input a
function of the step there is nothing to take), no variable changes, and the step count advances
past it. If, when the replay reaches B-1 for the skip, the trainable variables are non-finite
already (every loss before B finite: a replayed step S's gradient was non-finite, its loss not, and
B only showed it), R is restored once more and the weights are checked after each replayed step
(one read each); the first step after which they are non-finite is S, which is skipped instead of
B. Steps skipped before (this session's, or an earlier trainer's of the run: :meth:`NonfiniteRollback.resume`)
are skipped again wherever the loop meets them. A non-finite loss still unchecked when the loop
ends is rolled back the same way before the final checkpoint (:meth:`NonfiniteRollback.settle_at_end`). More than ``max_skips`` skips within ``skip_window`` steps, a poisoned state without a
known bad step (only the weights were non-finite), or no finite state before B stop training with
exit code 4 instead.

In a trainer group (``procsv launch --nproc N``, MultiWorkerMirroredStrategy: each member holds its
own copy of the variables and every step is a collective) no member restores in place alone (a member
that restored and replayed alone would train out of lock with the others): at the group's K-th steps the
members' findings are exchanged and, where the verdict is uniform, every member rolls back in place at once
(:class:`~.group_ask.GroupInPlace`, the checkpoint agent's ``hooks.group_check``); otherwise every member
checks its losses at the group's snapshot steps, whether or not it takes its snapshot there
(:meth:`~procsv.trainer.checkpoint.agent.CheckpointAgent.check_group_step`; the chief at its every
``save_checkpoint_steps``-th step too, checkpoint or not, and at its final checkpoint: a step after the
group's last snapshot), and the one that finds step B
non-finite asks for the group's rollback (:meth:`~.group_ask.GroupAsk.ask`): it exits with code 5
(:class:`~procsv.common.errors.GroupRollback`) after its ``NonfiniteDetected`` of B; the watchdog
records B as skipped and restarts the group, whose members all restore the same state before B
(the group's in-memory snapshot or the newest checkpoint) and skip B when their replay reaches it
(:meth:`NonfiniteRollback.resume`, from ``PROCSV_SKIP_STEPS``). Past ``--max-skips`` it stops in
order with exit code 4, as a single trainer does.

A loss spike (``--on-spike``, issue 68) refuses a snapshot the same way; its response
(:mod:`.spike_response`) uses the same restore in place, and in a group the same ask for the group's
rollback (:meth:`~.group_ask.GroupAsk.ask_spike`: the onset .. the detection skipped).

One concern: a Supervisor's response to non-finite training and loss spikes, from the refused snapshot to the skip.
"""

from __future__ import annotations

import sys
from typing import Any, Callable, Optional, Sequence

from procsv.common import bootstrap
from procsv.common.bootstrap import ChildConfig
from procsv.common.errors import GroupRolledBack, LossSpiked, NonFiniteState, UsageError
from procsv.ipc.messages import Message, RestoreSource
from procsv.trainer.channels import TrainerChannels
from procsv.trainer.checkpoint.agent import CheckpointAgent
from procsv.trainer.checkpoint.keeper import CheckpointKeeper
from procsv.trainer.nonfinite import notices, policy, spike
from procsv.trainer.nonfinite.boundary_work import BoundaryWork
from procsv.trainer.nonfinite.group_ask import (GroupAsk, GroupInPlace, group_members, group_refusal as _group_refusal,
                                                ps_tasks as _ps_tasks)
from procsv.trainer.nonfinite.loop_end import LoopEnd
from procsv.trainer.nonfinite.plan import first_replayed
from procsv.trainer.nonfinite.policy import OnNonfinite
from procsv.trainer.nonfinite.restore import StateRestore
from procsv.trainer.nonfinite.spike import OnSpike, Spike, SpikeThresholds
from procsv.trainer.nonfinite.spike_response import SpikeResponse
from procsv.trainer.nonfinite.watch import NonfiniteWatch
from procsv.trainer.settings import Settings
from procsv.trainer.step_boundary import StepCounter, StepState


class NonfiniteRollback:
    """The non-finite watch of one Supervisor (``watch``) and what a refused snapshot makes it do.

    Owns the watch (its policy, the losses kept, the skips and retries so far). Given: the step
    state (it moves the step on a restore or a skip, and bounds the checkpoint half's next boundary
    by the rollback's next work), the step counter, the checkpoints (their agent holds the snapshot
    memory and the newest committed step), the saved state (``checkpoint``, restored in place) and
    ``flush_summaries`` (everything logged is handed off before a restore or a stop) and the
    Supervisor's settings (the ``stop_grace_secs`` a wait for the snapshot in flight takes at most);
    ``config``: the launch's (``--on-nonfinite`` under the program's ``on_nonfinite``, ``--on-spike``
    under its ``on_spike``, ``--max-skips``, ``--skip-window``, ``PROCSV_NONFINITE_CHECK``) and this
    trainer's place in its group; ``graph_input``: a TF1 graph program's, how it reads its input inside its
    graph (:func:`procsv.trainer.graph.replayable.input_inside`; "": it does not), which refuses ``--on-spike
    rollback``. Its
    :class:`~procsv.trainer.nonfinite.boundary_work.BoundaryWork` (``_walk``) walks the loop through
    each rollback at the step boundaries after the restore, and owns the state kept before a retry.
    Raises :class:`~procsv.common.errors.UsageError` for an ``--on-spike rollback`` it cannot follow."""

    def __init__(self, state: StepState, counter: StepCounter, keeper: Optional[CheckpointKeeper], checkpoint: Any,
                 flush_summaries: Callable[[], None], clock: Callable[[], float], settings: Settings,
                 on_nonfinite: Optional[str], tags: Sequence[str], ignore: Sequence[str], *,
                 config: ChildConfig = ChildConfig(), on_spike: Optional[str] = None,
                 spike_thresholds: Optional[SpikeThresholds] = None,
                 graph_input: Optional[Callable[[], str]] = None) -> None:
        self._state = state
        self._counter = counter
        self._keeper = keeper
        self._flush_summaries = flush_summaries
        self._clock = clock
        self._settings = settings  # stop_grace_secs: read live
        self._channels: Optional[TrainerChannels] = None
        group_refusal = _group_refusal(config)
        on_spike_now = spike.parse(bootstrap.resolve(on_spike, config.launch.on_spike, None))
        reads_inside = graph_input() if graph_input is not None and on_spike_now == OnSpike.ROLLBACK else ""
        refusal = spike.refusal(on_spike_now, _ps_tasks(config) > 0, reads_inside)
        if refusal:
            raise UsageError(refusal)
        # a group's spikes are judged by its chief alone (its loss is the group's; one finding, one record)
        judges = config.launch.nonfinite_check and (not group_refusal or config.place.rank == 0)
        self.watch = NonfiniteWatch(bootstrap.resolve(on_nonfinite, config.launch.on_nonfinite, None), tags, ignore,
                                    config.launch.max_skips, config.launch.skip_window,
                                    group_refusal=group_refusal, spike_policy=on_spike_now,
                                    spike_thresholds=spike_thresholds or SpikeThresholds(),
                                    spiked=self._spiked if judges else None)
        self._walk = BoundaryWork(self.watch, state, counter, checkpoint, keeper, self._tell, self._roll_back,
                                  self.stop_diverged, self.refused)
        self._program_stopped = ""  # how the program's NanTensorHook ended the training on a NaN ("": it did not)
        self._restore = StateRestore(self.watch, state, counter, checkpoint, flush_summaries, clock, settings)
        self._group = GroupAsk(self.watch, self._tell, self._hand_off)
        # the program's NanTensorHook(fail_on_nan_loss=True) watches the loss: raises its error (None: none does)
        self._program_fails: Optional[Callable[[str], None]] = None
        self._spikes = SpikeResponse(self.watch, self._walk, self._tell, self._restore_for, self._undone_at,
                                     self._wind_down, self.watch.budget.refusal, self._group.ask_spike)
        self._end = LoopEnd(self.watch, self._walk, state, self._restore, self._spikes, self._tell, self._roll_back,
                            self.stop_diverged)
        # a group's rollback in place, on the group's verdict at its K-th steps (PROCSV_GROUP_ROLLBACK=restart: never)
        rolls_back = self.watch.policy == OnNonfinite.ROLLBACK or self.watch.spike_policy == OnSpike.ROLLBACK
        self._in_place = GroupInPlace(self.watch, config.place.rank, group_members(config), lambda: self._agent,
                                      lambda: self._channels, self._tell, self._restore, self._walk,
                                      self._spikes.settled, self._group) \
            if group_refusal and config.launch.group_in_place and rolls_back else None
        # (off: no detection at all, no loss kept, no snapshot scanned; what it costs: scripts/bench_nonfinite.py)
        self.detecting = config.launch.nonfinite_check
        if not self.detecting:
            return
        state.losses = self.watch.losses
        if keeper is not None:  # every checkpoint agent, this session's and later ones', checks its snapshots
            keeper.configure(self._watch_agent)

    def program_stopped_on_nonfinite(self) -> None:
        """The program's ``NanTensorHook(fail_on_nan_loss=False)`` stopped the training on a NaN loss, as it
        asked: the final checkpoint of that state is not committed, and that is no failure (:meth:`refused`)."""
        self._program_stopped = "NanTensorHook(fail_on_nan_loss=False) stopped the training"

    def program_fails_on_nan(self, raise_error: Callable[[str], None]) -> None:
        """The program's own ``NanTensorHook(fail_on_nan_loss=True)`` watches this session's loss (procsv
        rolls its NaNs back): where the rollback gives a non-finite loss up (the skip bound, nothing to roll
        back to, diverging), ``raise_error(line)`` raises the hook's error, as TF's hook at a NaN loss, instead
        of procsv's exit 4 (:meth:`stop_diverged`); not in a trainer group (its members stop together: exit 4)."""
        self._program_fails = raise_error

    @property
    def checks_losses(self) -> bool:
        """Whether the losses kept are ever checked here: detection is on and this trainer checks its
        snapshots (a chief with a logdir and something to save, or a group's member). Without (no logdir,
        ``checkpoint=None``, a replica's worker) a loss kept is never looked at."""
        agent = self._keeper.agent if self._keeper is not None else None
        return self.detecting and agent is not None and (agent.saving or bool(self.watch.group_refusal))

    def _watch_agent(self, agent: CheckpointAgent) -> None:
        if not agent.saving and not self.watch.group_refusal:  # a replica's worker: the chief looks
            return  # (a group's members all look: whichever finds it first asks for the group's rollback)
        agent.store.watch = self.watch
        agent.hooks.refused.append(self.refused)
        if self._in_place is not None:  # its checks at the K-th steps: the group's verdict
            agent.hooks.group_check = self._in_place.check

    def member_checks_at_end(self, on_its_own: bool) -> bool:
        """Whether this trainer, a group's member other than the chief, checks the losses it kept
        since its last check at its session's end (``on_its_own``: no signal, no error ended it):
        :func:`~procsv.trainer.nonfinite.policy.member_checks_at_end`."""
        return self.detecting and bool(self.watch.group_refusal) and policy.member_checks_at_end(self.watch.policy,
                                                                                                 on_its_own)

    def attach(self, channels: TrainerChannels) -> None:
        """A session is prepared: its notices go through ``channels``."""
        self._channels = channels
        self._program_stopped, self._program_fails = "", None
        self._restore.new_session()

    def detach(self) -> None:
        self._channels = None

    def _tell(self, msg: Message) -> None:
        notices.tell(self._channels, msg)

    # ------------------------------------------------------------------ the walk's, at step boundaries
    def work(self) -> bool:
        """The rollback's work due at the current step, as often as it moves the step; True if it did."""
        return self._walk.work()

    def bound(self) -> None:
        """The checkpoint half's boundary comes no later than the rollback's next work."""
        self._walk.bound()

    def judge_deferred(self, step: int) -> None:
        """At the checkpoint boundary after ``step``, once an in-memory snapshot's cost is charged: the
        spike judgement its check deferred under ``--on-spike warn``
        (:meth:`~procsv.trainer.nonfinite.watch.NonfiniteWatch.precheck`), if an earlier boundary's."""
        if self.detecting:
            self.watch.judge_deferred(step)

    def abandon(self, step: int, why: str) -> None:
        """The bad step cannot be retried from the state restored at ``step`` (see
        :meth:`BoundaryWork.abandon`); ``why`` says what the program does instead."""
        self._walk.abandon(step, why)

    def resume(self, step: int, told: Sequence[int] = ()) -> None:
        """A session begins at ``step`` (restored or initialized): under ``rollback``, every step this
        run skipped before, as the watchdog ``told`` it (``ChildConfig.resume``: an earlier trainer's and
        an earlier launch's in this logdir, from its spawn's environment or its promotion) stays skipped:
        one after ``step`` is skipped again when the loop reaches it, and each counts against
        ``--max-skips``. Keras ``fit`` too: its ``on_skipped`` hook has fit's loop draw such a step's batch
        and train none (:meth:`procsv.trainer.keras.rollback.FitRollback.skipped`)."""
        watch = self.watch
        if self._in_place is not None:
            self._in_place.begin(step)
        rolls_back = watch.policy == OnNonfinite.ROLLBACK or watch.spike_policy == OnSpike.ROLLBACK
        if not self.detecting or not rolls_back:
            return
        for s in sorted(set(told)):
            if s not in watch.budget.skipped:
                watch.budget.skip(s)
        watch.budget.skipped.sort()
        if watch.retry.target is None:
            self._walk.plan_next(step)

    @property
    def _agent(self) -> Optional[CheckpointAgent]:
        return self._keeper.agent if self._keeper is not None else None

    # ------------------------------------------------------------------ the policy
    def refused(self, bad: NonFiniteState, final: bool) -> None:
        """A snapshot of a poisoned state was refused (``final``: the final checkpoint): the policy (a
        group member's final checkpoint with a non-finite loss asks for the group's rollback too; a
        loss spike's refusal goes to its response, :mod:`.spike_response`)."""
        if isinstance(bad, GroupRolledBack):  # the group rolled back in place at that check: nothing more to do
            return
        if isinstance(bad, LossSpiked):
            self._spikes.refused(bad, final)
            return
        watch = self.watch
        if final and self._program_stopped and not watch.group_refusal:  # the program's own clean stop on it
            print(f"procsv: non-finite training at step {bad.first_step}: {bad.describe()}; the program's "
                  f"{self._program_stopped}: the final checkpoint is not committed "
                  "(the newest committed one is finite)", file=sys.stderr, flush=True)
            return
        snapshot_only = not final and bad.bad_step is None and not watch.group_refusal
        rolling_back = watch.policy == OnNonfinite.ROLLBACK
        if rolling_back and snapshot_only and watch.retry.bisecting and self._walk.poisoned_by(bad.step):
            return  # bisecting, every replayed step before it checked finite: this step poisoned the weights
        notices.tell(self._channels, notices.detected(bad.first_step, bad.describe(), watch.position))
        why = ""
        if rolling_back:
            if final and watch.group_refusal and bad.bad_step is not None:
                # a group's loss after its last snapshot, found at the chief's final checkpoint: the group
                # rolls back as at a snapshot (its restart replays past the loop's end), within --max-skips
                why = self._group.ask(bad.bad_step, bad.describe())
            elif snapshot_only:
                why = self._bisect_snapshot(bad)
            else:
                why = "the final checkpoint's state" if final else self._roll_back(bad.bad_step, bad.describe())
            if not why:
                return
        self.stop_diverged(bad, why, final)

    def stop_diverged(self, bad: NonFiniteState, why: str, final: bool) -> None:
        """Stop on ``bad``, ``why`` it is not rolled back: :meth:`NonfiniteWatch.refused` (exit 4), or, for a
        non-finite loss the program's ``NanTensorHook(fail_on_nan_loss=True)`` watches under ``rollback``, its
        error (:meth:`program_fails_on_nan`); a program that catches it and ends its session block cleanly
        gets no final checkpoint of a non-finite state (a refusal then is said in one line, :meth:`refused`)."""
        agent = self._agent
        if self.watch.stops:
            self._wind_down(bad.step)
        member = agent is not None and not agent.saving and bool(self.watch.group_refusal)  # (a group's, not the chief)
        hook = self._program_fails if (self.watch.policy == OnNonfinite.ROLLBACK and bad.bad_step is not None
                                       and not isinstance(bad, LossSpiked) and not self.watch.group_refusal) else None
        if hook is not None:
            self._program_stopped = "NanTensorHook(fail_on_nan_loss=True) raised NanLossDuringTrainingError"
        self.watch.refused(bad, None if member else agent.last_committed if agent is not None else -1, final, why,
                           raise_error=hook)

    def _spiked(self, found: tuple[Spike, ...], step: int) -> None:
        """The watch's hand-off of the losses it judged for spikes (see :meth:`SpikeResponse.judged`)."""
        self._spikes.judged(found, step)

    def _wind_down(self, step: int) -> int:
        """Before a stop in order at the state of ``step``: what was logged, and the snapshot in flight
        (it passed the checks), are kept. Returns the newest committed step (-1: none, or no checkpoints)."""
        agent, ch = self._agent, self._channels
        if ch is not None:
            self._flush_summaries()
            if agent is not None and agent.in_flight is not None:
                agent.wait_in_flight(ch, step, self._clock() + self._settings.stop_grace_secs)
        return agent.last_committed if agent is not None else -1

    def _restore_for(self, step: int) -> tuple[int, str, RestoreSource, str, float] | str:
        """:meth:`StateRestore.before` ``step``, where this trainer has checkpoints and a session (else why not)."""
        agent, ch = self._agent, self._channels
        if agent is None or ch is None:
            return "no checkpoint to roll back to (checkpoint=None)"
        if self.watch.replay_unsupported:
            return self.watch.replay_unsupported
        return self._restore.before(agent, ch, step)

    def _undone_at(self, restored: int) -> None:
        if self._channels is not None:
            self._restore.undone(self._channels, restored, spike=True)

    # ------------------------------------------------------------------ rollback
    def _bisect_snapshot(self, bad: NonFiniteState) -> str:
        """The snapshot of step ``bad.step`` has non-finite weights and every loss up to it was finite:
        a step up to it poisoned them through its gradient (a NaN in its batch whose loss term was
        finite), the snapshot saw it before the next step's loss could. Found the way a bad step's
        non-finite weights are: restore the newest finite snapshot before step ``bad.step + 1``, check
        the weights after each replayed step, and skip the step that poisons them. Returns "" if rolled
        back, else why not (as :meth:`_roll_back`)."""
        print(f"procsv: the weights of the snapshot of step {bad.step} are non-finite, every loss up to it finite: "
              f"a step's gradient was not; restoring and checking the weights after each replayed step",
              file=sys.stderr, flush=True)
        return self._roll_back(bad.step + 1, f"the weights of the snapshot of step {bad.step} are non-finite",
                               bisect=True)

    def _roll_back(self, bad_step: Optional[int], what: str, bisect: bool = False) -> str:
        """Restore the newest finite snapshot before ``bad_step`` in place and arrange its retry (or,
        retried once already, its skip; ``bisect``: and check the weights after each replayed step). Returns "" if rolled back, else why it cannot be (the
        skip bound, or the snapshot bound of :class:`~procsv.trainer.nonfinite.policy.RestoreBound`)."""
        watch, agent, ch = self.watch, self._agent, self._channels
        if bad_step is None:
            return "only the weights were found non-finite, at a snapshot: the step that made them so is not known"
        if watch.group_refusal:
            return self._group.ask(bad_step, what)
        if agent is None or ch is None:
            return "no checkpoint to roll back to (checkpoint=None)"
        if watch.replay_unsupported:
            return watch.replay_unsupported
        skip = watch.retry.was_retried(bad_step)
        if skip and not watch.budget.allows(bad_step):
            return watch.budget.refusal(bad_step)
        diverging = watch.restores.exceeded(bad_step)
        if diverging:
            return diverging
        began = self._clock()
        kept = self._walk.take_kept(retry=not skip)  # a retry: its state before is kept when the replay reaches it
        restored, source, path = self._restore.put_back(kept, bad_step) if skip and not watch.retry.bisecting else (-1, "", "")
        again = restored >= 0  # the state before the retry, kept: the snapshot restored last is still the one
        kind, secs = RestoreSource.MEMORY, self._clock() - began
        if not again:
            done = self._restore.before(agent, ch, bad_step)
            if isinstance(done, str):
                return done
            restored, source, kind, path, secs = done
        # a retry: the first run's loss its replay gives again, if the program's input comes back with the restore
        # (the values a deferred check left unread handed to the spike history first: the restore's forget() drains
        # them too, but after this; before, a NaN found by such a check, no check between, compared nothing)
        watch.losses.drain()
        self._walk.expect_replay(watch.spikes.losses_at(first_replayed(restored, bad_step))
                                 if not skip and watch.spikes is not None and not watch.on_restored else {})
        self._restore.undone(ch, restored)
        watch.retry.aim(bad_step, skip, True if bisect else None)  # one more rollback
        watch.retry.schedule(self._walk.next_due(restored))
        if not again:
            watch.restores.restored(restored)
        self._walk.restored()
        for hook in watch.on_restored:
            hook(restored)
        self._walk.bound()
        notices.tell(ch, notices.rolled_back(bad_step, restored, kind, path, skip, secs, watch.position))
        then = f"skipping step {bad_step} (non-finite again when retried)" if skip else f"retrying step {bad_step} once"
        abandoned = self._walk.abandoned
        if abandoned:  # a hook gave the retry up (Keras fit: the batches to replay are not all kept)
            then = f"{abandoned}; step {bad_step} is not retried"
        print(f"procsv: non-finite training at step {bad_step}: {what}; --on-nonfinite rollback: restored step "
              f"{restored} from {source}, " + ("" if abandoned else f"replaying to step {bad_step - 1}, ")
              + f"then {then}", file=sys.stderr, flush=True)
        return ""

    def _hand_off(self, step: int) -> None:
        """Before a group's exit at ``step``: what was logged is handed off, the snapshot in flight committed."""
        agent, ch = self._agent, self._channels
        self._flush_summaries()
        if agent is not None and ch is not None and agent.in_flight is not None:
            agent.wait_in_flight(ch, step, self._clock() + self._settings.stop_grace_secs)

    # ------------------------------------------------------------------ the loop's end
    def spikes_refused(self, step: int) -> bool:
        """The finite losses read since the last judgement judged for spikes now (at the state of ``step``):
        :meth:`LoopEnd.spikes_refused`; True if one was refused."""
        return self._end.spikes_refused(step)

    def settle_at_end(self, replay: Optional[Callable[[], bool]]) -> None:
        """The loop ended on its own at the current step, before the final checkpoint: under ``rollback``,
        the training is finished as if the loop had run on (:meth:`LoopEnd.settle`; ``replay`` None: nothing
        is replayed or checked here). Nothing where the program's ``NanTensorHook(fail_on_nan_loss=False)``
        stopped the loop on the NaN, as it asked: no rollback."""
        if self._program_stopped:
            return
        self._end.settle(replay if self.detecting else None)
