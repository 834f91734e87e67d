"""The Supervisor's step boundary: what ``session.run(step_fn)`` does before and after the step, and
the commit of a checkpoint on demand (:meth:`StepBoundary.commit_checkpoint`: at the stop, or when asked).

Runs in the trainer's main thread, the one that prepared the session. The work: the checkpoint
work of the completed step (:meth:`~procsv.trainer.checkpoint.agent.CheckpointAgent.work`), before the next
step runs; the rollback's work when a non-finite loss was met (:mod:`procsv.trainer.nonfinite.rollback`);
the progress report, the periodic summaries and the hand-off of logged summaries.

Most boundaries have none of it to do, and even looking costs (see
:mod:`procsv.trainer.step_boundary`). So each of the two halves (checkpoint work; progress and
summaries) computes, when it does its work, the first step and time at which it may have work
again, and :class:`~procsv.trainer.step_boundary.StepState` holds them for each step to read: a
boundary before them costs a clock read and two comparisons. The progress-and-summaries half also
runs right after a step when that step must not wait for the next one: a session's first step
(reported at once) and, while a checkpoint is in flight, every step (its summaries must leave the
process before a crash could make a restart skip them). Whoever changes a trigger from outside
opens its half: a save requested by a callback (:meth:`StepBoundary.save_requested`), a summary
batch filled by a logging thread (:meth:`StepBoundary.batch_waiting`).
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any, Callable, Iterator, Optional

from procsv.common.errors import GroupRollback, NonFiniteState, TrainingDiverged, TrainingStopped
from procsv.ipc.messages import Busy, SaveReason
from procsv.trainer.channels import TrainerChannels
from procsv.trainer.checkpoint.keeper import CheckpointKeeper
from procsv.trainer.coordinator import Coordinator
from procsv.trainer.nonfinite.rollback import NonfiniteRollback
from procsv.trainer.settings import Settings
from procsv.trainer.step_boundary import NEVER, ProgressReporter, StepState
from procsv.trainer.summaries.log import SummaryLog
from procsv.trainer.summaries.sender import COALESCE  # (time-driven work due this soon goes with a boundary that runs)


class StepBoundary:
    """The work around each step (:meth:`ManagedSession.run` runs the step) of one Supervisor: each
    half's work, and its bounds.

    Owns the bounds it writes into the step state, the progress reports (:class:`ProgressReporter`),
    whether the session's periodic work runs (``standard_started``: False until a program that
    prepared with ``start_standard_services=False`` calls it) and whether the last final checkpoint
    failed to commit (``unsaved``). Given: the step state (it installs its two callbacks there), the
    checkpoints (None: nothing is saved), the summaries, the rollback, the coordinator it stops
    through when checkpoints keep failing, the Supervisor's settings (read live) and the session's
    channels (:meth:`attach`)."""

    def __init__(self, state: StepState, clock: Callable[[], float], coord: Coordinator,
                 keeper: Optional[CheckpointKeeper], summaries: SummaryLog, rollback: NonfiniteRollback,
                 settings: Settings, *, chief: bool) -> None:
        self.state = state
        self._clock = clock
        self._coord = coord
        self._keeper = keeper
        self._summaries = summaries
        self._rollback = rollback
        self._chief = chief
        self._settings = settings  # stop_grace_secs, save_summaries_secs: read live
        self._channels: Optional[TrainerChannels] = None
        self.progress = ProgressReporter()
        self.standard_started = True  # a session's periodic checkpoints and summaries run
        self.unsaved = False  # the final checkpoint did not commit
        state.claim(self.before_step, self.after_step, self.between_steps)
        summaries.buffer.on_batch = self.batch_waiting
        if keeper is not None:
            keeper.configure(self._wake_on_request)

    def _wake_on_request(self, agent: Any) -> None:
        agent.hooks.claim(self.save_requested, self._stepped)
        agent.changes = self.state  # (its ``changed``: runs trained without advancing the step)

    def _stepped(self) -> bool:
        """Whether the session completed a step (its first step's report went)."""
        return self.progress.first_done

    # ----------------------------------------------------------------- the session
    def attach(self, channels: TrainerChannels) -> None:
        """A session is prepared: its reports go through ``channels``."""
        self._channels = channels

    def detach(self) -> None:
        self._channels = None

    def reset(self) -> None:
        """A session again after a stop: its first step is reported at once; nothing unsaved yet."""
        self.unsaved = False
        self.progress.first_done = False

    def start(self, save: bool = False) -> None:
        """A new session, prepared: the checkpoint half at its first boundary, the other after its first
        step; the periodic summaries one interval from now. ``save`` (a TF1 Supervisor's standard
        services, as TF's checkpoint thread, which saves once as it starts): a snapshot of the step
        restored or initialized is sent now (committed while the program goes on), unless committed."""
        agent = self._keeper.agent if self._keeper is not None else None
        self.state.changed = False  # the state is the one restored or initialized
        if (save and agent is not None and self._channels is not None and self._chief
                and agent.in_flight is None and self.state.step > agent.last_committed):
            agent.request(SaveReason.PERIODIC)  # (its wake-up opens the checkpoint half, as below)
            agent.snapshot(self._channels, self.state.step)
        self._summaries.restart_periodic()
        self.state.open_checkpoint()
        self.state.set_end(0, NEVER)
        self._between_bound()

    def start_standard_services(self) -> None:
        """``start_standard_services()`` in a live session: both halves at the next boundary, the
        periodic summaries one interval from now."""
        if self.standard_started:
            return
        self.standard_started = True
        if self._channels is not None:
            self._summaries.restart_periodic()
            self.state.open_checkpoint()
            self.state.open_end()
            self._between_bound()

    def save_requested(self) -> None:
        """A save was requested outside the boundary (the checkpoint agent calls it)."""
        self.state.open_checkpoint()

    def batch_waiting(self) -> None:
        """A whole summary batch is waiting (the buffer calls it, from the logging thread)."""
        self.state.open_end()

    # ----------------------------------------------------------------- around a step
    def before_step(self, step: int) -> None:
        """Before a step: the halves whose bounds have passed, then their new bounds (the end
        half's step bound is checked after the step, in :meth:`ManagedSession.run`)."""
        state = self.state
        if self._rollback.work():
            return  # rolled back or skipped: the step count moved (ManagedSession.run reads it again)
        now = self._clock()
        after = now >= state.end_at  # (the timer's bound; its step bound is checked after the step)
        if after:
            self._after_boundary(now, slack=COALESCE)
        # a boundary the other half's timer brought also does the reads and heartbeat due soon: the
        # halves keep one rhythm (each ~10 times a second, else apart: 20 boundaries a second, not 10)
        if step >= state.ckpt_step or now >= state.ckpt_at or (after and now + COALESCE >= state.ckpt_at):
            self._checkpoint_boundary(step, ahead=COALESCE if after else 0.0)
            self._rollback.work()  # a rollback there may have work due at once

    def after_step(self) -> None:
        """After a step that must not wait for the next boundary: the progress-and-summaries half."""
        self._after_boundary(self._clock())

    def between_steps(self) -> None:
        """After a run that is no step (a graph program's evaluation, a train op that leaves the global step
        where it is), once the step state's ``at`` or ``between_at`` has passed: what is due at the step that
        stands, as TF's threads do their work whether the step moves or not. The halves whose bounds passed,
        as before a step: a periodic checkpoint of that step (TF's checkpoint thread saves on its timer) and,
        once the session's first step is done, the progress report (a program that evaluates is working:
        its runs keep the watchdog's hang clock, as steps do) and the summaries. Before the first step
        (whose report is the watchdog's first step) only the summaries' part of the end half."""
        state = self.state
        now = self._clock()
        if now >= state.at:
            self.before_step(state.step)  # (before the first step the end half's time is NEVER: the checkpoint half)
        if self.progress.first_done or now < state.between_at:
            return
        summaries = self._summaries
        if self._settings.save_summaries_secs and self.standard_started and now >= summaries.next_periodic:
            summaries.periodic(now)
        agent = self._keeper.agent if self._keeper is not None else None
        summaries.flush(force=False, in_flight=agent is not None and agent.in_flight is not None)
        self._between_bound()

    def _between_bound(self) -> None:
        """Before the session's first step, when a run that is no step next has summaries' work: the
        hand-off's next, the periodic summaries' (NEVER where nothing is written: a worker, no logdir; and
        after the first step, whose end half's bound holds them)."""
        if not self._summaries.writes or self.progress.first_done:
            self.state.set_between(NEVER)
            return
        at = self._summaries.wake_at()
        if self._settings.save_summaries_secs and self.standard_started:
            at = min(at, self._summaries.next_periodic)
        self.state.set_between(at)

    def _checkpoint_boundary(self, step: int, ahead: float = 0.0) -> None:
        agent = self._keeper.agent if self._keeper is not None else None
        if agent is None or self._channels is None or not (self._chief or agent.group is not None) \
                or self._coord.exception is not None:  # (a group's worker: its in-memory snapshots; a failure
            # recorded (the runs a thread's error lets go ahead): no checkpoint of this state, as the stop commits none)
            self.state.set_checkpoint(NEVER, NEVER)  # no checkpoint work in this session
            return
        if not self.standard_started:
            self._group_check_alone(agent, step)
            return
        # the state is still that of ``step``; its summaries are handed off first
        start = self._clock()
        summaries = self._summaries
        try:
            agent.work(self._channels, step, start, lambda: summaries.flush(force=False, urgent=True),
                       summaries.unwritten_from, ahead)
        except NonFiniteState as bad:  # the snapshot was refused: the policy decides (stop raises)
            self._rollback.refused(bad, False)
        agent.charge_memory(step, start, self._clock())  # what an in-memory snapshot cost the loop
        self._rollback.judge_deferred(step)  # (after the charge: an earlier snapshot's spike judgement, under warn)
        if agent.failure is not None:  # checkpoints keep failing: stop, the TF way
            self._coord.request_stop(agent.failure)
            raise TrainingStopped(str(agent.failure))
        # from the step that stands: a rollback there moved it back, and a trainer group's members must all come to
        # the boundaries of its K-th steps again (procsv.trainer.nonfinite.group_verdict), not only where a clock says
        self.state.set_checkpoint(*agent.next_work(self.state.step, self._clock()))
        self._rollback.bound()  # a rollback's next work
        if agent.in_flight is not None:  # summaries go right after every step now (never later than already due:
            # a graph session checks the end half's step bound after this boundary, for the same step)
            self.state.set_end(min(step + 1, self.state.end_step), self.state.end_at)

    def _group_check_alone(self, agent: Any, step: int) -> None:
        """No checkpoint work (the program started no standard services, as TF's chief-only ones often are: a
        group's workers prepared with ``start_standard_services=False``), but a group member's K-th steps are still
        checked: there the group's verdict exchanges every member's finding in one collective
        (:mod:`procsv.trainer.nonfinite.group_verdict`), and a member that left it out left the others waiting in it
        (hung, restarted, hung again at the same step). Its row holds no copy: the verdict is the group's restart."""
        every = agent.group[2] if agent.group is not None else 0
        if not every:
            self.state.set_checkpoint(NEVER, NEVER)
            return
        if step % every == 0:
            try:
                agent.check_group_step(step)
            except NonFiniteState as bad:
                self._rollback.refused(bad, False)
        self.state.set_checkpoint((self.state.step // every + 1) * every, NEVER)  # (from a step rolled back to)
        self._rollback.bound()  # a rollback's next work

    def _after_boundary(self, now: float, slack: float = 0.0) -> None:
        """The progress-and-summaries half; a progress report due within ``slack`` s goes now."""
        ch = self._channels
        assert ch is not None
        summaries = self._summaries
        if not self.progress.first_done and self._keeper is not None:  # the first step built the program's model
            self._keeper.check_restored()
        self.progress.after_step(ch, self.state.step, now, slack)
        periodic = self._settings.save_summaries_secs and self.standard_started
        if periodic and now >= summaries.next_periodic:
            summaries.periodic(now)
        agent = self._keeper.agent if self._keeper is not None else None
        in_flight = agent is not None and agent.in_flight is not None
        summaries.flush(force=False, in_flight=in_flight)
        at = min(self.progress.next_at(), summaries.wake_at())
        if periodic:
            at = min(at, summaries.next_periodic)
        self.state.set_end(self.state.step + 1 if in_flight else NEVER, at)
        self._between_bound()

    # ----------------------------------------------------------------- on demand
    def report_busy(self, busy: Busy) -> None:
        """Tell the watchdog the step reached and what the trainer is busy with on purpose (``Busy.NONE``:
        nothing), and whether the session completed a step yet (a stop before any: not its first step); the
        watchdog judges hangs by it (:mod:`procsv.watchdog.rules.hang`). No-op before a session."""
        if self._channels is not None:
            self.progress.busy(self._channels, self.state.step, busy)

    @contextlib.contextmanager
    def waiting(self) -> Iterator[None]:
        """``Supervisor.waiting()`` (procsv's own): ``with sv.waiting(): ...`` around a wait the program
        knows may be long and quiet from outside (a remote service, a queue another job fills, a
        ``time.sleep``): the watchdog's stuck rule (``--stuck-secs``) leaves the trainer, and its group,
        alone from there to its next step; ``--hang-timeout`` still bounds it, counted from the wait's
        start. Unmarked, such a wait is judged stuck after ``--stuck-secs`` the first time. No-op before a
        session (and without ``procsv launch``)."""
        self.report_busy(Busy.WAITING)
        try:
            yield  # (its end says nothing: the next step's report does, so a loop of marked waits without a step is bounded)
        finally:  # that report goes at the next boundary, not throttled: before, within PROGRESS_EVERY of the last
            # report none went, WAITING held on, and a deadlock in the next steps was left to --hang-timeout
            self.progress.last = float("-inf")
            self.state.open_end()

    def commit_checkpoint(self, deadline: Optional[float] = None) -> bool:
        """``Supervisor.commit_checkpoint``: commit a checkpoint of the last completed step now, waiting
        up to ``stop_grace_secs`` (``preempted`` after SIGTERM/SIGINT, else ``final``); True if that step
        is committed. The Supervisor's ``stop()`` calls it; so does ``procsv.train``'s
        CheckpointSaverHook at ``end()``."""
        agent = self._keeper.agent if self._keeper is not None else None
        if agent is None or self._channels is None or not self._chief:
            return False  # only the chief saves
        self.report_busy(Busy.FINAL_CHECKPOINT)
        self._summaries.flush(force=False, urgent=True)  # hand off before the commit, as at a step
        reason = SaveReason.PREEMPTED if self._coord.stop_signal is not None else SaveReason.FINAL
        grace = self._settings.stop_grace_secs if deadline is None else max(0.0, deadline - self._clock())
        agent.final(self._channels, self.state.step, reason, grace)
        self.unsaved = agent.last_committed < self.state.step and not agent.refused_final
        return not self.unsaved

    def check_member_end(self) -> None:
        """A trainer group's member other than the chief, at its session's end: its kept losses are
        checked (:meth:`~procsv.trainer.checkpoint.agent.CheckpointAgent.check_group_end`); a
        non-finite one goes to the policy as at the chief's final checkpoint: it reports the step and
        asks for the group's rollback (exit 5), or, under ``stop``, stops as diverging (exit 4). Under
        ``rollback`` at any end, under ``stop`` at an end of its own only
        (:func:`~procsv.trainer.nonfinite.policy.member_checks_at_end`)."""
        agent = self._keeper.agent if self._keeper is not None else None
        on_its_own = self._coord.exception is None and self._coord.stop_signal is None
        if agent is None or self._channels is None or self._chief \
                or not self._rollback.member_checks_at_end(on_its_own):
            return
        try:
            agent.check_group_end(self.state.step)
        except NonFiniteState as bad:
            self._rollback.refused(bad, True)
        except Exception as err:  # noqa: BLE001 (on its way out: a read that fails, a collective's aborted context)
            if isinstance(err, (GroupRollback, TrainingDiverged)):
                raise
            print(f"procsv: could not check the losses kept since the last check on the way out: "
                  f"{type(err).__name__}: {err}", file=sys.stderr, flush=True)

    def await_in_flight(self) -> None:
        """Wait for the snapshot in flight to be answered (up to ``stop_grace_secs``; the watchdog is
        told the trainer is busy committing): TF's synchronous save, for a ``CheckpointSaverHook``
        whose listeners' ``after_save`` must come right after the run that saved."""
        agent = self._keeper.agent if self._keeper is not None else None
        if agent is None or self._channels is None or agent.in_flight is None:
            return
        self.report_busy(Busy.FINAL_CHECKPOINT)
        try:
            agent.wait_in_flight(self._channels, agent.in_flight, self._clock() + self._settings.stop_grace_secs)
        finally:
            self.report_busy(Busy.NONE)

    def save_now(self, reason: SaveReason) -> Any:
        """``sv.saver.save()``: commit the current step now (``reason``), the watchdog told the trainer
        waits on purpose; returns the service's result (None: none came in time)."""
        assert self._keeper is not None and self._channels is not None
        self.report_busy(Busy.FINAL_CHECKPOINT)  # the watchdog's longer limit while we wait for the commit
        self._summaries.flush(force=False, urgent=True)  # hand off before the commit, as at a step
        result = self._keeper.agent.final(self._channels, self.state.step, reason,
                                           self._settings.stop_grace_secs)
        self.report_busy(Busy.NONE)
        return result
