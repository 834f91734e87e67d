"""The Supervisor's non-finite collaborator: the watch's wiring, the policy's decision on a refused
snapshot, and ``rollback``'s restore, replay, retry and skip (this module: the restore; the walk
through the replay, the retry and the skip at each boundary: its collaborator :mod:`.boundary_work`,
which performs what the pure :mod:`.plan` decides).

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
own copy of the variables and every step is a collective) ``rollback`` does not restore in place
(a member that restored and replayed alone would train out of lock with the others): every member
checks its losses at the group's snapshot steps, whether or not it takes its snapshot there
(:meth:`~procsv.trainer.checkpoint.agent.CheckpointAgent.check_group_step`; the chief at its
final checkpoint too: a step after the group's last snapshot), and the one that finds step B
non-finite asks for the group's rollback (:meth:`NonfiniteRollback._ask_group`): it exits with code 5
(:class:`~procsv.common.errors.GroupRollback`) after its ``NonfiniteDetected`` of B; the watchdog
records B as skipped and restarts the group, whose members all restore the same state before B
(the group's in-memory snapshot or the newest checkpoint) and skip B when their replay reaches it
(:meth:`NonfiniteRollback.resume`, from ``PROCSV_SKIP_STEPS``). Past ``--max-skips`` it stops in
order with exit code 4, as a single trainer does.

A loss spike (``--on-spike``, issue 68) refuses a snapshot the same way; its response
(:mod:`.spike_response`) uses this module's restore in place, and in a group its ask for the group's
rollback (:meth:`NonfiniteRollback._ask_group_spike`: the onset .. the detection skipped).

One concern: the Supervisor's non-finite collaborator: its wiring, its policy on a refused snapshot,
and the restore in place that its rollbacks (a non-finite step's, a loss spike's) share.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Callable, Optional, Sequence

from procsv import cluster
from procsv.common import bootstrap
from procsv.common.bootstrap import ChildConfig
from procsv.common.errors import (CorruptCheckpoint, GroupRollback, LossSpiked, NonFiniteState,
                                  UnreadableCheckpoint, UsageError)
from procsv.common.manifests import Manifest, read_in_place
from procsv.ipc.messages import Message, RestoreSource, SessionLogEvent, SessionStatus
from procsv.trainer.channels import TrainerChannels
from procsv.trainer.checkpoint import memory_restore
from procsv.trainer.checkpoint.agent import CheckpointAgent
from procsv.trainer.checkpoint.keeper import CheckpointKeeper
from procsv.trainer.checkpoint.name_based import NameBasedCheckpoint
from procsv.trainer.nonfinite import notices, policy, retry_state, scan, spike
from procsv.trainer.nonfinite.boundary_work import BoundaryWork
from procsv.trainer.nonfinite.policy import OnNonfinite
from procsv.trainer.nonfinite.spike import OnSpike, Spike, SpikeThresholds
from procsv.trainer.nonfinite.spike_response import SpikeResponse
from procsv.trainer.nonfinite.watch import NonfiniteWatch
from procsv.trainer.settings import Settings
from procsv.trainer.step_boundary import StepCounter, StepState


def _group_refusal(config: ChildConfig) -> str:
    """Why this trainer cannot roll back in place ("" if it can): a member of a group (see the module)."""
    spec = cluster.tf_config().get("cluster")
    spec = spec if isinstance(spec, dict) else {}
    members = max(config.place.nproc, len(spec.get("worker") or ()) + len(spec.get("chief") or ()))
    return policy.in_place_refusal(members, _ps_tasks(config))


def _ps_tasks(config: ChildConfig) -> int:
    """The parameter-server tasks of this trainer's job (0: none)."""
    spec = cluster.tf_config().get("cluster")
    return config.place.ps + len((spec if isinstance(spec, dict) else {}).get("ps") or ())


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
    trainer's place in its group; ``graph``: a TF1 graph program's (no ``--on-spike rollback``). Its
    :class:`~procsv.trainer.nonfinite.boundary_work.BoundaryWork` (``_walk``) walks the loop through
    each rollback at the step boundaries after the restore, and owns the state kept before a retry.
    Raises :class:`~procsv.common.errors.UsageError` for an ``--on-spike rollback`` it cannot follow."""

    def __init__(self, state: StepState, counter: StepCounter, keeper: Optional[CheckpointKeeper], checkpoint: Any,
                 flush_summaries: Callable[[], None], clock: Callable[[], float], settings: Settings,
                 on_nonfinite: Optional[str], tags: Sequence[str], ignore: Sequence[str], *,
                 config: ChildConfig = ChildConfig(), on_spike: Optional[str] = None,
                 spike_thresholds: Optional[SpikeThresholds] = None, graph: bool = False) -> None:
        self._state = state
        self._counter = counter
        self._keeper = keeper
        self._checkpoint = checkpoint
        self._flush_summaries = flush_summaries
        self._clock = clock
        self._settings = settings  # stop_grace_secs: read live
        self._channels: Optional[TrainerChannels] = None
        group_refusal = _group_refusal(config)
        on_spike_now = spike.parse(bootstrap.resolve(on_spike, config.launch.on_spike, None))
        refusal = spike.refusal(on_spike_now, graph, _ps_tasks(config) > 0)
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
        self._reached = -1  # the furthest step a restore of this session undid: the loop had trained to it
        # the program's NanTensorHook(fail_on_nan_loss=True) watches the loss: raises its error (None: none does)
        self._program_fails: Optional[Callable[[str], None]] = None
        self._spikes = SpikeResponse(self.watch, self._walk, self._tell, self._restore_for, self._undone_at,
                                     self._wind_down, self._over_budget, self._ask_group_spike)
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
        self._reached = -1

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
                why = self._ask_group(bad.bad_step, bad.describe())
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
        """:meth:`_restore_before` ``step``, where this trainer has checkpoints and a session (else why not)."""
        agent, ch = self._agent, self._channels
        if agent is None or ch is None:
            return "no checkpoint to roll back to (checkpoint=None)"
        if self.watch.replay_unsupported:
            return self.watch.replay_unsupported
        return self._restore_before(agent, ch, step)

    def _undone_at(self, restored: int) -> None:
        if self._channels is not None:
            self._undone(self._channels, restored)

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
            return self._ask_group(bad_step, what)
        if agent is None or ch is None:
            return "no checkpoint to roll back to (checkpoint=None)"
        if watch.replay_unsupported:
            return watch.replay_unsupported
        skip = watch.retry.was_retried(bad_step)
        if skip and not watch.budget.allows(bad_step):
            return self._over_budget(bad_step)
        diverging = watch.restores.exceeded(bad_step)
        if diverging:
            return diverging
        began = self._clock()
        kept = self._walk.take_kept(retry=not skip)  # a retry: its state before is kept when the replay reaches it
        restored, source, path = self._put_back(kept, bad_step) if skip and not watch.retry.bisecting else (-1, "", "")
        again = restored >= 0  # the state before the retry, kept: the snapshot restored last is still the one
        kind, secs = RestoreSource.MEMORY, self._clock() - began
        if not again:
            done = self._restore_before(agent, ch, bad_step)
            if isinstance(done, str):
                return done
            restored, source, kind, path, secs = done
        self._undone(ch, restored)
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

    def _restore_before(self, agent: CheckpointAgent, ch: TrainerChannels,
                        bad_step: int) -> tuple[int, str, RestoreSource, str, float] | str:
        """Restore the newest finite state before ``bad_step`` in place: the newest in-memory snapshot
        (:meth:`_restore_memory`), else the newest committed checkpoint, once the snapshot in flight is
        answered. Returns its step, where it came from in words, as a kind and as a path, and the
        restore's seconds; or why there is none."""
        began = self._clock()
        restored, source, path = self._restore_memory(agent, bad_step)
        kind = RestoreSource.MEMORY
        if restored < 0:
            if agent.in_flight is not None:
                agent.wait_in_flight(ch, bad_step, self._clock() + self._settings.stop_grace_secs)
            kind = RestoreSource.DISK
            if not getattr(agent.global_step, "numbered", True):  # no global step: one prefix, rewritten in place
                self._flush_summaries()
                began = self._clock()
                done = self._restore_in_place(agent, bad_step)
                if isinstance(done, str):
                    return done
                restored, source, path = done
                return restored, source, kind, path, self._clock() - began
            restored = agent.last_committed
            if restored < 0 or restored >= bad_step:
                return f"no committed checkpoint or in-memory snapshot before step {bad_step} to roll back to"
            self._flush_summaries()
            source = f"{agent.policy.basename}-{restored}"
            path = os.path.join(agent.layout.logdir, source)
            began = self._clock()
            self._read_into_state(agent, path)
        return restored, source, kind, path, self._clock() - began

    def _read_into_state(self, agent: CheckpointAgent, path: str) -> None:
        """Restore the checkpoint at ``path`` in place (the disk tier of a rollback)."""
        if isinstance(agent.store.checkpoint, NameBasedCheckpoint):  # a TF1 graph program's variables
            agent.store.checkpoint.restore(path)
        else:
            self._checkpoint.read(path).expect_partial()

    def _restore_in_place(self, agent: CheckpointAgent, bad_step: int) -> tuple[int, str, str] | str:
        """The disk tier's restore for a program without a global step: its one checkpoint, ``<basename>``
        (as TF's Supervisor names it), is rewritten in place at each save and may hold a newer step than
        the last commit this trainer was told of, so it is read at the step its manifest holds, consistent
        with a rewrite (:func:`~procsv.common.manifests.read_in_place`). Returns that step, where it came
        from in words and as a path; or why there is none before ``bad_step``."""
        import tensorflow as tf

        basename, layout = agent.policy.basename, agent.layout
        path = os.path.join(layout.logdir, basename)
        none = f"no committed checkpoint or in-memory snapshot before step {bad_step} to roll back to"

        def read(manifest: Manifest) -> None:
            if manifest.step >= bad_step:  # not read (its snapshot passed the checks: never expected)
                return
            try:
                self._read_into_state(agent, path)
            except (tf.errors.DataLossError, tf.errors.NotFoundError) as exc:  # rewritten while read
                raise CorruptCheckpoint(f"{basename}: {str(exc).splitlines()[0]}") from None

        try:
            done = read_in_place(layout, basename, read, clock=self._clock)
        except (CorruptCheckpoint, UnreadableCheckpoint) as exc:
            return f"{none}: {exc}"
        if done is None:
            return none
        if done.step >= bad_step:
            return f"{none} ({basename}, the one checkpoint of a run without a global step, holds step {done.step})"
        return done.step, basename, path

    def _undone(self, ch: TrainerChannels, restored: int) -> None:
        """The state of ``restored`` was put back in place: the steps after it are undone (the step
        count, the losses kept and judged for spikes, TensorBoard's points after it)."""
        step = self._counter.global_step
        if not getattr(step, "numbered", True):  # no global step: the count kept in Python, held by no checkpoint
            step.assign(restored)
        elif getattr(step, "forget", None) is not None:  # a graph program's global step: its last observed value is undone
            step.forget()
        self._counter.pending = 0  # the variable holds the restored step
        self._reached = max(self._reached, self._state.step)
        self._state.step = restored
        self.watch.losses.forget()
        if self.watch.spikes is not None:
            self.watch.spikes.rewind(restored)
        ch.to_summary(SessionLogEvent(SessionStatus.START, restored + 1))  # TensorBoard drops the undone steps

    def _over_budget(self, bad_step: int) -> str:
        budget = self.watch.budget
        return (f"step {bad_step} would be skip {len(budget.recent(bad_step)) + 1} within {budget.skip_window} steps "
                f"(--max-skips {budget.max_skips}; skipped so far: {', '.join(map(str, budget.skipped)) or 'none'})")

    def _ask_group(self, bad_step: int, what: str) -> str:
        """A group member found step ``bad_step`` non-finite (its ``NonfiniteDetected`` is sent): past
        ``--max-skips``, why it stops (exit 4); else it raises :class:`~procsv.common.errors.GroupRollback`
        (exit 5), once what was logged is handed off and the snapshot in flight (finite) is committed:
        the watchdog restarts the group, which skips ``bad_step`` (see the module). No retry first: a
        retry would cost a second restart of every member."""
        watch, agent, ch = self.watch, self._agent, self._channels
        if not watch.budget.allows(bad_step):
            return self._over_budget(bad_step)
        self._flush_summaries()
        if agent is not None and ch is not None and agent.in_flight is not None:
            agent.wait_in_flight(ch, bad_step, self._clock() + self._settings.stop_grace_secs)
        message = (f"non-finite training at step {bad_step}: {what}; --on-nonfinite rollback in a trainer group: "
                   f"asking for the group's restart (exit code 5); every member restores the newest state before "
                   f"step {bad_step} and skips it (skip {len(watch.budget.recent(bad_step)) + 1} of --max-skips "
                   f"{watch.budget.max_skips} within {watch.budget.skip_window} steps)")
        print(f"procsv: {message}", file=sys.stderr, flush=True)
        raise GroupRollback(bad_step, message)

    def _ask_group_spike(self, bad: LossSpiked) -> str:
        """The chief of a group found a loss spike ``bad`` under ``--on-spike rollback`` (its ``SpikeDetected``
        is sent, with its onset: the watchdog takes the onset as the step the group's rollback skips): past
        ``--max-skips``, why it stops (exit 4); else, once what was logged is handed off and the snapshot in
        flight is committed, the steps after the onset up to the detection are told skipped (the restarted
        group skips them with the onset) and it raises :class:`~procsv.common.errors.GroupRollback` (exit 5),
        as :meth:`_ask_group` for a non-finite step. No replay first: a group's spike is taken as the data's."""
        watch, agent, ch = self.watch, self._agent, self._channels
        steps = range(bad.onset, bad.detected + 1)
        over = watch.budget.first_refused(steps)
        if over is not None:
            return f"skipping steps {bad.onset}-{bad.detected}: {self._over_budget(over)}"
        self._flush_summaries()
        if agent is not None and ch is not None and agent.in_flight is not None:
            agent.wait_in_flight(ch, bad.detected, self._clock() + self._settings.stop_grace_secs)
        told = len(watch.budget.skipped) + 1  # (the onset: counted when the watchdog restarts the group)
        for s in steps[1:]:
            told += 1
            self._tell(notices.skipped(s, told, watch.position))
        skipped = f"step {bad.onset}" if bad.onset == bad.detected else f"steps {bad.onset}-{bad.detected}"
        message = (f"{bad.what}; --on-spike rollback in a trainer group: asking for the group's restart (exit code "
                   f"5); every member restores the newest state before step {bad.onset} and skips {skipped} (a "
                   f"group's spike is taken as the data's, not replayed first)")
        print(f"procsv: {message}", file=sys.stderr, flush=True)
        raise GroupRollback(bad.onset, message)

    def _put_back(self, kept: Optional[retry_state.KeptState], bad_step: int) -> tuple[int, str, str]:
        """Put back the state kept before the retry of ``bad_step`` (:mod:`.retry_state`), if it is
        that step's and the object graph is the same; returns its step, where it came from in words
        and as a path, or (-1, "", "") if not put back."""
        if kept is None or kept.step != bad_step - 1:
            return -1, "", ""
        self._flush_summaries()
        if not retry_state.put_back(self._checkpoint, kept):
            return -1, "", ""
        return kept.step, "the state kept before the retry", f"memory#retry{kept.step}"

    def _restore_memory(self, agent: CheckpointAgent, bad_step: int) -> tuple[int, str, str]:
        """Restore the newest in-memory snapshot before ``bad_step`` in place if it is at least as new
        as the newest committed checkpoint and verifies (:mod:`procsv.trainer.checkpoint.memory_restore`);
        returns its step, where it came from in words and as a path (the snapshot memory's, and
        its slot), or (-1, "", "") for the disk."""
        store = agent.store
        if isinstance(store.checkpoint, NameBasedCheckpoint):  # no assign-from-memory ops in its frozen graph
            return -1, "", ""
        copy = memory_restore.newest_before(store.copies, store.arena, bad_step)
        if copy is None or store.arena is None or copy.step < agent.last_committed:
            return -1, "", ""
        ignore = self.watch.ignore
        frames = list(copy.frames)
        checkpoint = self._checkpoint

        def poison(specs: Any, memory: Any) -> tuple[str, ...]:
            return scan.nonfinite_keys(specs, frames, memory, scan.rules(checkpoint, ignore))

        why = memory_restore.problem(checkpoint, copy, store.arena, poison)
        if why:
            print(f"procsv: not rolling back to the in-memory snapshot of step {copy.step} ({why}); "
                  "restoring from disk", file=sys.stderr, flush=True)
            return -1, "", ""
        self._flush_summaries()
        memory_restore.restore(checkpoint, copy, store.arena)
        return copy.step, "the in-memory snapshot", f"{store.arena.ref().path}#slot{copy.slot}"

    def spikes_refused(self, step: int) -> bool:
        """The finite losses read since the last judgement judged for spikes now (at the state of ``step``,
        not at a snapshot: the loop's end, Keras fit's epoch end), one found followed as a refused
        snapshot's would be (:meth:`SpikeResponse.refused`: rolled back, or a stop in order that raises
        :class:`~procsv.common.errors.TrainingDiverged`); True if one was refused."""
        try:
            self.watch.judge_spikes(step)
        except LossSpiked as spiked:
            self._spikes.refused(spiked, False)
            return True
        return False

    def settle_at_end(self, replay: Optional[Callable[[], bool]]) -> None:
        """The loop ended on its own at the current step E, before the final checkpoint: under ``rollback``,
        the training is finished as if the loop had run on. A rollback's replay the loop ended inside (E
        before the furthest step D a restore undid: a loop bounded by its own count of runs) is replayed
        on to D by ``replay`` (one more run of the loop's last step function, which reads its step itself;
        False: the program's own hook asked for no more runs), the pending retry judged and its step
        skipped or given up on the way, as at any boundary. Then the losses kept since the last check are
        checked (one read) and a non-finite one at step B is rolled back, replayed and retried or skipped
        like any other, until the step is E (or D) again. ``replay`` None (the last step function was
        handed its input as arguments; a TF1 graph program's loop feeds its own): nothing is replayed or
        checked here; a replay the loop ended inside is said in one line naming the steps lost (no
        checkpoint older than the newest committed one is committed:
        :meth:`~procsv.trainer.checkpoint.agent.CheckpointAgent.final`), and the final checkpoint's check
        stops the run with exit code 4 as ``stop`` does. Raises :class:`~procsv.common.errors.TrainingDiverged`
        where a rollback cannot be (the skip bound, ...; the program's ``NanTensorHook``'s error)."""
        watch = self.watch
        if self._program_stopped:  # the program's NanTensorHook stopped the loop on the NaN, as it asked: no rollback
            return
        if not self.detecting or watch.policy != OnNonfinite.ROLLBACK or replay is None or watch.group_refusal:
            self._say_lost()
            return
        end = max(self._state.step, self._reached)
        while True:
            if self._walk.work():  # the retry's judgement or a skip, due at this step
                continue
            if self._state.step < end:
                if replay():
                    continue
                self._say_lost()
                return
            bad = watch.losses.check()
            if bad is None:
                if self.spikes_refused(end):  # the spikes among them (--on-spike): rolled back like any other, or a stop
                    continue
                return
            what = f"the loss of step {bad} is NaN or infinite (found when the loop ended)"
            notices.tell(self._channels, notices.detected(bad, what, watch.position))
            why = self._roll_back(bad, what)
            if why:
                self.stop_diverged(NonFiniteState(end, bad), why, False)
                return

    def _say_lost(self) -> None:
        """The loop ended inside a rollback's replay, which is not finished here: one line naming the steps lost."""
        step, reached, pending = self._state.step, self._reached, self.watch.retry.target
        if reached <= step:
            return
        one = reached == step + 1
        lost = f"step {reached}" if one else f"steps {step + 1}-{reached}"
        retry = (f"; step {pending} is neither retried nor skipped" if pending is not None and pending > step else "")
        print(f"procsv: the training loop ended at step {step}, inside the replay after a non-finite rollback: {lost}, "
              f"trained before the rollback, {'is' if one else 'are'} lost{retry} (procsv cannot replay "
              f"{'it' if one else 'them'} without the program's loop); "
              f"the final checkpoint is of step {step}, and none older than the newest committed one is committed",
              file=sys.stderr, flush=True)
