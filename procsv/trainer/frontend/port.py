"""The front-ends' port into their Supervisor: verbs, not the Supervisor's parts.

Runs in the trainer process, in the thread that drives the session (Keras ``fit``'s, a
``MonitoredSession``'s). A front-end (:mod:`procsv.trainer.keras.fit`, :mod:`procsv.trainer.monitored`)
drives a :class:`procsv.Supervisor` from outside a ``managed_session`` block: it asks for a
checkpoint at an epoch's end, has its own position written before each snapshot, learns what a
non-finite rollback restored, keeps its hooks' tensors as a step's losses, releases a session that
failed to start. :class:`FrontEnd` (``Supervisor.front_end``) owns none of that state: each verb
is one operation of one collaborator (the checkpoints, the step boundary, the step state, the
graph supervision), named for what the front-end wants. :class:`RollbackPort` is the same for the
non-finite rollback (``FrontEnd.rollback``): what Keras ``fit``'s replay
(:mod:`procsv.trainer.keras.rollback`) and the ``NanTensorHook`` s ask of it; :class:`SaveListening`
is a ``CheckpointSaverHook``'s listeners on one session's checkpoints (``FrontEnd.listen_to_saves``).
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from procsv.common.errors import NonFiniteState, TrainingDiverged, UsageError
from procsv.ipc.messages import Busy, SaveReason
from procsv.trainer.boundary import StepBoundary
from procsv.trainer.checkpoint.agent import CheckpointAgent
from procsv.trainer.checkpoint.keeper import CheckpointKeeper
from procsv.trainer.graph.supervised import GraphSupervision
from procsv.trainer.nonfinite.policy import OnNonfinite
from procsv.trainer.nonfinite import spike
from procsv.trainer.nonfinite.rollback import NonfiniteRollback
from procsv.trainer.nonfinite.spike import OnSpike
from procsv.trainer.step_boundary import StepState

Position = Callable[[int], Optional[tuple[int, int]]]


class RollbackPort:
    """What a front-end may ask of the non-finite rollback (``--on-nonfinite``), given the rollback
    and the step state (the step a kept loss belongs to)."""

    def __init__(self, rollback: NonfiniteRollback, state: StepState) -> None:
        self._rollback = rollback
        self._state = state

    @property
    def rolls_back(self) -> bool:
        """Non-finite losses are detected and rolled back (``rollback``, with detection on)."""
        return self._rollback.detecting and self.replaces_nan_hooks

    @property
    def rolls_back_spikes(self) -> bool:
        """Loss spikes are detected and rolled back (``--on-spike rollback``, with detection on)."""
        return self._rollback.detecting and self._rollback.watch.spike_policy == OnSpike.ROLLBACK

    @property
    def replays(self) -> bool:
        """A rollback can come (:attr:`rolls_back` or :attr:`rolls_back_spikes`): what a front-end
        trains again after a restore is kept."""
        return self.rolls_back or self.rolls_back_spikes

    @property
    def replaces_nan_hooks(self) -> bool:
        """The policy is ``rollback``: procsv watches a ``NanTensorHook``'s tensor instead of the hook."""
        return self._rollback.watch.policy == OnNonfinite.ROLLBACK

    def program_stopped_on_nonfinite(self) -> None:
        """The program's own ``NanTensorHook(fail_on_nan_loss=False)`` stopped the training on a NaN loss
        (:meth:`NonfiniteRollback.program_stopped_on_nonfinite`)."""
        self._rollback.program_stopped_on_nonfinite()

    def program_fails_on_nan(self, raise_error: Callable[[str], None]) -> None:
        """The program's own ``NanTensorHook(fail_on_nan_loss=True)`` watches this session's loss: where the
        rollback gives a NaN up, ``raise_error(line)`` raises the hook's error
        (:meth:`NonfiniteRollback.program_fails_on_nan`)."""
        self._rollback.program_fails_on_nan(raise_error)

    @property
    def checks_losses(self) -> bool:
        """The losses kept are checked here (:attr:`NonfiniteRollback.checks_losses`): else a
        ``NanTensorHook`` is the program's to call, as TF's."""
        return self._rollback.checks_losses

    @property
    def retrying(self) -> Optional[int]:
        """The non-finite step a rollback is retrying (None: none)."""
        return self._rollback.watch.retry.target

    def refuse_spike_rollback(self, where: str) -> None:
        """The front-end cannot follow ``--on-spike rollback`` (``where``: what it is): raises
        :class:`~procsv.common.errors.UsageError` with one line if that is the policy."""
        if self._rollback.watch.spike_policy == OnSpike.ROLLBACK:
            raise UsageError(spike.unsupported(where))

    def locate_steps(self, position: Position) -> None:
        """The non-finite events name a step's input position as ``position(step)`` says (Keras fit's
        (epoch, batch)); None from it: not known."""
        self._rollback.watch.position = position

    def cannot_replay(self, why: str) -> None:
        """The front-end cannot train the steps after a restored one again (``why``; "": it can)."""
        self._rollback.watch.replay_unsupported = why

    def on_restored(self, hook: Callable[[int], None]) -> None:
        """Call ``hook(step)`` after each rollback restored ``step``."""
        self._rollback.watch.on_restored.append(hook)

    def on_skipped(self, hook: Callable[[int], None]) -> None:
        """Call ``hook(step)`` after each skip of the non-finite step ``step``."""
        self._rollback.watch.on_skipped.append(hook)

    def work(self) -> bool:
        """Do the rollback's work due at this step boundary (a retry's judgement, a skip); True if any."""
        return self._rollback.work()

    def first_nonfinite(self) -> Optional[int]:
        """Check the losses kept since the last check (one host read, forgetting them): the first step
        whose loss is NaN or infinite, None if none."""
        return self._rollback.watch.losses.check()

    def spikes_refused(self, step: int) -> bool:
        """Judge the finite losses read since the last judgement for spikes now (at the state of ``step``)
        and follow ``--on-spike`` on one found, as a snapshot's check would; True if one was refused
        (rolled back; a stop raises :class:`~procsv.common.errors.TrainingDiverged`)."""
        return self._rollback.spikes_refused(step)

    def refuse(self, step: int, bad: int) -> None:
        """The state at ``step`` holds step ``bad``'s non-finite update: roll back (or stop with exit 4)."""
        self._rollback.refused(NonFiniteState(step, bad), False)

    def abandon(self, step: int, why: str) -> None:
        """Give up the retry of the bad step after the rollback to ``step`` (``why``: said once)."""
        self._rollback.abandon(step, why)

    def stop_diverged(self, step: int, bad: int, why: str) -> None:
        """Stop in order with exit code 4 (:class:`~procsv.common.errors.TrainingDiverged`), ``why`` named."""
        self._rollback.stop_diverged(NonFiniteState(step, bad), why, False)

    def settle_at_end(self, replay: Optional[Callable[[], bool]]) -> None:
        """The front-end's loop ended on its own: the rollback finishes a replay the loop ended inside and
        rolls back an unchecked non-finite loss, with ``replay`` (one more run of the loop's last step; False:
        no more runs; None: none can be made, the steps lost are said), where this trainer checks the losses
        it keeps (:meth:`NonfiniteRollback.settle_at_end`; raises
        :class:`~procsv.common.errors.TrainingDiverged` where it gives up)."""
        if self._rollback.checks_losses:
            self._rollback.settle_at_end(replay)

    def keep_loss(self, value: Any) -> None:
        """Keep ``value`` (a device scalar or tensor) as a loss of the step that just ran (nothing when
        no loss is watched: detection is off)."""
        state = self._state
        if state.losses is not None:
            state.losses.keep(state.step, value)


class SaveListening:
    """A front-end's listeners on one session's checkpoints (a ``CheckpointSaverHook``'s listeners):
    ``before(step, reason)`` right before each snapshot, ``after(step)`` when each commits, until
    :meth:`close`. Given the session's checkpoint agent, which it reads for the verbs below."""

    def __init__(self, agent: CheckpointAgent, before: Callable[[int, SaveReason], None],
                 after: Callable[[int], None]) -> None:
        self._agent = agent
        self._before, self._after = before, after
        agent.hooks.before.append(before)
        agent.hooks.committed.append(after)

    @property
    def last_committed(self) -> int:
        """The newest committed step (-1: none)."""
        return self._agent.last_committed

    @property
    def in_flight(self) -> bool:
        """A snapshot was handed to the checkpoint service and its commit not yet answered."""
        return self._agent.in_flight is not None

    def request(self) -> None:
        """Checkpoint at the next step boundary."""
        self._agent.request(SaveReason.STEPS)

    def close(self) -> None:
        """No more calls of the listeners."""
        self._agent.hooks.before.remove(self._before)
        self._agent.hooks.committed.remove(self._after)


class FrontEnd:
    """A Supervisor's verbs for its front-ends (see the module). Given the Supervisor's collaborators
    (``keeper`` None: nothing is saved; ``graph`` None: eager), its clock, its open session (``session``:
    read at each call), its ``release`` and its ``stop``."""

    def __init__(self, keeper: Optional[CheckpointKeeper], boundary: StepBoundary, rollback: NonfiniteRollback,
                 state: StepState, graph: Optional[GraphSupervision], clock: Callable[[], float], *,
                 session: Callable[[], Any], release: Callable[[], None], stop: Callable[..., None],
                 launch_start_step: Optional[int] = None) -> None:
        self._keeper = keeper
        self._boundary = boundary
        self._graph = graph
        self._session = session
        self.clock = clock  # the monotonic clock the Supervisor's timers read (tests inject one)
        self.rollback = RollbackPort(rollback, state)
        self._stop = stop  # Supervisor.stop
        self.release = release  # let a session that did not start go: its channels, its own services
        # the step this launch's first trainer began at, as the watchdog told a restarted one (None: this is
        # the launch's first trainer, or no watchdog): a StopAtStepHook's num_steps count from there
        self.launch_start_step = launch_start_step

    # ---------------------------------------------------------------- checkpoints
    @property
    def saves(self) -> bool:
        """Something is saved (a checkpoint was given and there is a logdir)."""
        return self._keeper is not None

    def before_each_snapshot(self, prepare: Callable[[], None]) -> None:
        """Call ``prepare()`` right before each snapshot, of this session and of every later one (a
        front-end writes the state it keeps in Python into its variables). Nothing if nothing is saved."""
        if self._keeper is not None:
            self._keeper.configure(lambda agent: agent.hooks.prepare.append(prepare))

    def listen_to_saves(self, before: Callable[[int, SaveReason], None],
                        after: Callable[[int], None]) -> Optional[SaveListening]:
        """Call ``before(step, reason)`` right before each snapshot of this session and ``after(step)`` when
        each commits, until the listening is closed; None if nothing is saved."""
        return SaveListening(self._keeper.agent, before, after) if self._keeper is not None else None

    def restore_into(self, target: Any) -> None:
        """The next session's restore restores ``target`` (an object with ``restore(path)`` returning a
        status, as ``tf.train.Checkpoint``: a part of the state, or an empty one when the state in memory is
        already the newest) from the checkpoint it chooses, instead of the whole checkpoint object; the
        global step is set from that checkpoint either way. Nothing if nothing is saved."""
        if self._keeper is not None:
            self._keeper.restore_target = target

    def request_checkpoint(self) -> None:
        """Checkpoint at the next step boundary (or in the final commit). Nothing if nothing is saved."""
        if self._keeper is not None:
            self._keeper.agent.request(SaveReason.STEPS)

    def newest_restorable(self, step: int) -> int:
        """The newest step a rollback can restore: the newest in-memory snapshot or committed checkpoint
        (``step``, the step now, if nothing is saved: nothing to restore)."""
        if self._keeper is None:
            return step
        agent = self._keeper.agent
        return max([agent.last_committed] + [c.step for c in agent.store.copies.values()])

    def delete_checkpoints(self, grace_secs: float) -> Optional[str]:
        """Have the checkpoint service delete this run's checkpoints, waiting up to ``grace_secs`` (Keras'
        ``delete_checkpoint``); None if done, else why not. Needs an open session."""
        if self._keeper is None:
            return "nothing is saved"
        return self._keeper.delete_all(grace_secs)

    def await_commit(self) -> None:
        """Wait for the snapshot in flight to commit (at most ``stop_grace_secs``), as TF's synchronous save."""
        self._boundary.await_in_flight()

    # ---------------------------------------------------------------- the session
    def stop_quietly(self) -> None:
        """``Supervisor.stop()`` (live threads ignored), re-raising only a diverging stop (exit 4):
        ``procsv.train``'s sessions raise the recorded exception themselves."""
        try:
            self._stop(ignore_live_threads=True)
        except TrainingDiverged:
            raise
        except BaseException:
            pass

    def report_busy(self, busy: Busy) -> None:
        """Tell the watchdog what the trainer is busy with on purpose (before its first step: reading its input)."""
        self._boundary.report_busy(busy)

    @property
    def session(self) -> Any:
        """The open session (a ManagedSession, graph mode a GraphSession), None before the first prepare."""
        return self._session()

    def monitored_graph(self, graph_file: bool) -> None:
        """A MonitoredSession drives this graph program: its events as TF's hooks write them, and no
        checkpoint as the session starts (its CheckpointSaverHook saves then); ``graph_file``: write
        ``graph.pbtxt`` (the hook's ``save_graph_def``)."""
        if self._graph is not None:
            self._graph.monitored(graph_file)


__all__ = ["FrontEnd", "RollbackPort", "SaveListening"]
