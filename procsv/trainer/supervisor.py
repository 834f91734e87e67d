"""``procsv.Supervisor``: the trainer-side API, modelled on ``tf.compat.v1.train.Supervisor``.

Runs in the trainer process. It restores the newest *valid* committed checkpoint (or initializes),
hands out a :class:`ManagedSession` whose ``run(step_fn)`` runs one training step, and at step
boundaries (never from a thread) reports progress to the watchdog, answers the checkpoint
service's save requests with a snapshot, and hands buffered summaries to the summary service,
which write the checkpoints and event files. Without ``procsv launch`` (plain python) it starts
the two services itself (:mod:`procsv.trainer.standalone`) and stops them when the block ends.

The Supervisor is thin: it owns the session's lifecycle (prepare, stop, the final checkpoint,
release, a session again after a stop) and its collaborators, each with its own state and given
what it needs (:func:`procsv.trainer.supervisor_setup.collaborators` builds them; who calls whom:
``docs/architecture.md``, "The trainer's collaborators"). Its public names that are a
collaborator's methods are declared in :mod:`procsv.trainer.supervisor_names`; its values that are
a collaborator's, and the settings its collaborators read live (:class:`Settings`), are plain
properties here. The front-ends
(Keras ``fit``, ``procsv.train``) drive it through its port, ``front_end`` (:mod:`procsv.trainer.frontend.port`).

One concern: a Supervisor's session, from its arguments (TensorFlow's, each documented here) to its release.
"""

from __future__ import annotations

import enum
import os
import time
from typing import Any, Callable, Mapping, Optional, Sequence

from procsv.common import bootstrap, env
from procsv.common.clock.watched import process_clock
from procsv.common.errors import ProcsvError
from procsv.ipc.messages import Busy, SessionLogEvent, SessionStatus, TrainerReady
from procsv.trainer import outcome
from procsv.trainer.audit import bitflip
from procsv.trainer.audit.replay import AuditReplay, AuditSession
from procsv.trainer import replica
from procsv.trainer.channels import RemoteMember, TrainerChannels
from procsv.trainer.checkpoint.commits import CHECKPOINT_FAILURE_LIMIT
from procsv.trainer.checkpoint.restore import ReadRetry
from procsv.trainer.coordinator import Coordinator, LooperThread
from procsv.trainer.frontend.port import FrontEnd
from procsv.trainer.graph.state import CountedStep
from procsv.trainer.managed import ManagedSession, ManagedSessionContext
from procsv.trainer.nonfinite.spike import SpikeThresholds
from procsv.trainer.once import warn_once
from procsv.trainer.standalone import OwnServices, connect
from procsv.trainer.standby import wait as standby
from procsv.trainer.standby.warmup import WarmUps
from procsv.trainer.step_boundary import StepCounter, StepState
from procsv.trainer.stop_signals import StopSignals
from procsv.trainer.summaries.log import SummaryLog, session_start
from procsv.trainer.supervisor_names import SupervisorNames
from procsv.trainer.supervisor_setup import (agent_factory, check_placement, collaborators, layout_for,
                                             resolve_is_chief, retention, state_to_save)
from procsv.trainer.tf1_args import NOT_PASSED, USE_DEFAULT, add_camel_case_aliases
from procsv.trainer.tf1_objects import SaverShim, SummaryWriterShim
from procsv.trainer.settings import Settings
from procsv.trainer.tf1_surface import warn_ignored_prepare_args



class Phase(enum.Enum):
    """A Supervisor's sessions: none prepared yet, one live, or stopped (the next prepare starts afresh, as TF's
    SessionManager does in a retry loop)."""

    NEW = "new"
    LIVE = "live"
    STOPPED = "stopped"

class Supervisor(SupervisorNames):
    """Checkpoints, summaries, restore-on-restart and stop coordination for a TF2 training loop.

    Args mirror ``tf.compat.v1.train.Supervisor``; the TF2-specific ones:

    * ``checkpoint``: what to save -- a ``tf.train.Checkpoint`` or a mapping of names to trackables
      (model, optimizer, ...). ``None`` disables checkpoints; nothing passed: ``tf1_args.state_given``.
    * ``global_step``: an int64 ``tf.Variable``; created if not given (``USE_DEFAULT``). It is saved in
      the checkpoint as ``global_step`` and advanced by one by every ``session.run(step_fn)``, unless the
      program advances it itself (detected at its first steps and re-checked every 100;
      ``increment_global_step=True/False`` forces it). Graph mode: ``USE_DEFAULT`` is the graph's. None, in
      both modes, is TF's "no global step": ``sv.global_step`` is None and procsv counts the session's runs
      (:attr:`step`); the checkpoints are ``<logdir>/<checkpoint_basename>``, rewritten at each save (TF's
      name without a step), holding no step; the count is in their manifest and a restore resumes it.
    * TF1's ``graph``, ``saver``, ``summary_op``, ``summary_writer``... (keywords): see ``tf1_args``.
    * ``summary_fn``: called every ``save_summaries_secs`` at a step boundary; returns a mapping of
      scalar tags to values (the TF2 stand-in for ``summary_op``).
    * ``save_checkpoint_steps``: also checkpoint every N steps (off by default).
    * ``max_to_keep`` / ``keep_checkpoint_every_n_hours``: retention, as ``tf.train.Saver``.
    * ``clock``: the monotonic clock every timer of the step boundary reads (tests pass a fake one). Not
      given: the process's watched clock (:func:`procsv.common.clock.watched.process_clock`), the monotonic
      clock without the time the process was stopped (Slurm's ``scontrol suspend``): a deadline never runs
      out for a suspension of the job.
    * ``allow_reinit``: when committed checkpoints exist but every one is corrupt, start from step 0
      (``init_fn``) instead of raising :class:`NoRestorableCheckpoint`. Not given (None): what
      ``procsv launch --allow-reinit`` says, else False. Never applies to an unreadable checkpoint.
    * ``checkpoint_failure_limit``: after this many checkpoints in a row fail to commit,
      ``should_stop()`` becomes true and the ``managed_session`` block re-raises a
      :class:`CheckpointError` naming the cause, as TensorFlow's Supervisor stopped on an error in
      its checkpoint thread (0: train on). Not given (None): what ``procsv launch
      --on-checkpoint-failure`` says, else 3.
    * ``on_nonfinite``: not given (None): what ``procsv launch --on-nonfinite`` says, else ``"rollback"``.
    * ``on_spike``: what a loss spike (a finite loss far above the recent ones, issue 68) makes procsv do:
      ``"warn"``, ``"rollback"``, ``"stop"`` or ``"off"``; not given (None): what ``procsv launch
      --on-spike`` says, else ``"warn"``. ``spike_thresholds``: the rule's settings
      (:class:`procsv.SpikeThresholds`; None: its defaults).
    * ``read_retry_secs``: how long a checkpoint file that cannot be read (EIO, EACCES, ESTALE...)
      is retried at restore before :class:`UnreadableCheckpoint` is raised (default 5 s).

    The one precedence rule of ``allow_reinit``, ``checkpoint_failure_limit``, ``on_nonfinite`` and ``on_spike``
    (:func:`procsv.common.bootstrap.resolve`): the program's explicit argument, else the launch's flag,
    else the default. The launch's settings and this trainer's coordinates are read once, when the
    Supervisor is built (:func:`bootstrap.read_config`), and handed to its collaborators.
    """

    def __init__(
        self,
        logdir: Optional[str] = None,
        is_chief: Optional[bool] = None,
        checkpoint: Any = NOT_PASSED,
        global_step: Any = USE_DEFAULT,
        init_fn: Optional[Callable[[Any], None]] = None,
        save_model_secs: Optional[float] = 600,
        save_summaries_secs: Optional[float] = 120,
        recovery_wait_secs: float = 30,
        stop_grace_secs: float = 120,
        checkpoint_basename: str = "model.ckpt",
        max_to_keep: int = 5,
        keep_checkpoint_every_n_hours: Optional[float] = None,
        save_checkpoint_steps: Optional[int] = None,
        summary_fn: Optional[Callable[[], Mapping[str, Any]]] = None,
        clock: Optional[Callable[[], float]] = None,
        allow_reinit: Optional[bool] = None,
        read_retry_secs: float = ReadRetry.total_secs,
        checkpoint_failure_limit: Optional[int] = None,
        *,
        graph: Any = None,
        ready_op: Any = USE_DEFAULT,
        ready_for_local_init_op: Any = USE_DEFAULT,
        init_op: Any = USE_DEFAULT,
        init_feed_dict: Any = None,
        local_init_op: Any = USE_DEFAULT,
        summary_op: Any = USE_DEFAULT,
        saver: Any = USE_DEFAULT,
        session_manager: Any = None,
        summary_writer: Any = USE_DEFAULT,
        local_init_run_options: Any = None,
        increment_global_step: Optional[bool] = None,
        on_nonfinite: Optional[str] = None, nonfinite_tags: Sequence[str] = ("loss",), nonfinite_ignore: Sequence[str] = (),
        on_spike: Optional[str] = None, spike_thresholds: Optional[SpikeThresholds] = None,
    ) -> None:
        clock = process_clock() if clock is None else clock  # (not given: without the time this process was stopped)
        self._clock = clock  # every timer of the step boundary (progress, summaries, saves) reads it
        self._config = config = bootstrap.read_config()  # the launch's settings, this trainer's coordinates: once
        is_chief = resolve_is_chief(is_chief, self._ctx)
        self.layout = layout_for(logdir, self._ctx, is_chief=is_chief, checkpoint_basename=checkpoint_basename,
                                 read_retry_secs=read_retry_secs)
        self.allow_reinit = bootstrap.resolve(allow_reinit, config.launch.allow_reinit, False)
        self.is_chief = is_chief
        # as TF's: only the chief keeps save_model_secs, save_summaries_secs, save_path and a summary writer
        self.save_model_secs = save_model_secs if is_chief else None
        self.save_checkpoint_steps = save_checkpoint_steps
        # graph mode (a TF1 graph program) or eager: the TF1 arguments, the state to save, the global step
        self._tf1, checkpoint, self._global_step, created = state_to_save(
            checkpoint, summary_fn, saver, summary_op, summary_writer, global_step, self.layout.logdir if self.layout else None, {
                "graph": graph, "ready_op": ready_op, "ready_for_local_init_op": ready_for_local_init_op,
                "init_op": init_op, "init_feed_dict": init_feed_dict, "local_init_op": local_init_op,
                "session_manager": session_manager, "local_init_run_options": local_init_run_options},
            max_to_keep=max_to_keep, keep_checkpoint_every_n_hours=keep_checkpoint_every_n_hours,
            recovery_wait_secs=recovery_wait_secs, increment_global_step=increment_global_step)
        self.max_to_keep, self.keep_checkpoint_every_n_hours = retention(self._tf1, max_to_keep, keep_checkpoint_every_n_hours)
        check_placement(self._tf1, self._ctx, is_chief)  # --ps: a graph program; TF's replica devices
        self._settings = Settings(save_summaries_secs if is_chief else None, self._tf1.summary_fn, stop_grace_secs, recovery_wait_secs,
                                  init_fn, checkpoint_basename)
        self.increment_global_step, self.checkpoint = increment_global_step, checkpoint
        self.coord = Coordinator(clock=clock)
        # (graph mode: the program's runs advance the global step; GraphSession observes it)
        # (eager global_step=None: procsv counts every run, as for a graph without a step)
        counted = isinstance(self._global_step, CountedStep)
        self._counter = StepCounter(self._global_step, False if self._tf1.graph else True if counted
                                    else increment_global_step, private=created)
        # what each step reads: the step, and when the step boundary next may have work
        self._state = StepState(clock, self.coord, self._counter)

        # the collaborators (supervisor_setup.Collaborators says who is given what)
        parts = collaborators(
            self._state, self.coord, self._tf1, checkpoint, self._global_step, self.layout, clock, self._settings,
            agent_factory(checkpoint, self._global_step, self.layout, basename=checkpoint_basename,
                          save_model_secs=save_model_secs, save_checkpoint_steps=save_checkpoint_steps,
                          max_to_keep=self.max_to_keep, keep_checkpoint_every_n_hours=self.keep_checkpoint_every_n_hours,
                          allow_reinit=self.allow_reinit, read_retry_secs=read_retry_secs,
                          failure_limit=bootstrap.resolve(checkpoint_failure_limit,
                                                          config.launch.checkpoint_failure_limit, CHECKPOINT_FAILURE_LIMIT),
                          saving=is_chief, config=config) if checkpoint is not None else None,
            chief=is_chief, config=config, nonfinite=(on_nonfinite, nonfinite_tags, nonfinite_ignore),
            spike=(on_spike, spike_thresholds),
            session_thread=self._session_thread,
            connected=lambda: self._channels is not None, started=lambda: self._phase != Phase.NEW)
        self._keeper, self._summaries, self._rollback = parts.keeper, parts.summaries, parts.rollback
        self._boundary, self._graph, self._surface = parts.boundary, parts.graph, parts.surface
        if self._graph is not None:  # (the graph's session takes it too when the program closes it first)
            self._graph.final_wanted = self._final_wanted

        # the session's lifecycle
        self._channels: Optional[TrainerChannels] = None
        self._session: Optional[Any] = None  # a ManagedSession, or a GraphSession in graph mode
        self._own: Optional[OwnServices] = None
        self._kept_events: Optional[str] = None  # the event file a writer kept open leaves for the next session
        self._stopped_by_signal = False
        self._signals = StopSignals()
        self._phase = Phase.NEW  # its sessions' lifecycle: a session after STOPPED starts afresh
        self._outcome: Optional[outcome.Slot] = None  # registered when its first session starts
        self._warm_ups = WarmUps()  # warm_up(): traced at prepare
        self._audit: Optional[AuditReplay] = None  # an auditor's replay (issue 71), once its session is prepared

    @property
    def _ctx(self) -> Optional[bootstrap.ChildContext]:
        """This trainer's coordinates in its run (None: plain python), from its configuration."""
        return bootstrap.ChildContext.from_config(self._config)

    @property
    def step(self) -> int:
        """The step being run inside ``session.run``, else the number of completed steps."""
        return self._state.step

    @property
    def restored_from(self) -> Optional[str]:
        """The checkpoint prefix this process restored, or None if it initialized."""
        return self._keeper.restored_from if self._keeper is not None else None

    @property
    def global_step(self) -> Any:
        """The global step variable (int64). Handing it out makes procsv advance it at every step.
        Graph mode: the graph's global step variable. None for ``global_step=None`` (TF's: no global
        step; procsv counts the session's runs, :attr:`step`) and in a graph without one."""
        if self._tf1.graph is not None:
            return self._tf1.graph.global_step
        return None if isinstance(self._global_step, CountedStep) else self._counter.expose()

    @property
    def front_end(self) -> FrontEnd:
        """The port the front-ends (Keras ``fit``, ``procsv.train``'s sessions and hooks) drive this
        Supervisor through (:mod:`procsv.trainer.frontend.port`); a training program has no use for it."""
        return FrontEnd(self._keeper, self._boundary, self._rollback, self._state, self._graph, self._clock,
                        session=lambda: self._session, release=self._release, stop=self.stop,
                        launch_start_step=self._config.resume.launch_start_step)

    # ----------------------------------------------------------------- TF's values: the collaborators'
    # (procsv's own values of that kind, which a subclass may shadow: SupervisorNames' ForwardValue)
    @property
    def init_op(self) -> Any:
        """TF's ``init_op`` (graph mode: the one given or the default built)."""
        return self._surface.init_op

    @property
    def init_feed_dict(self) -> Any:
        """TF's ``init_feed_dict``."""
        return self._surface.init_feed_dict

    @property
    def ready_op(self) -> Any:
        """TF's ``ready_op`` (graph mode: the one given or the default built)."""
        return self._surface.ready_op

    @property
    def ready_for_local_init_op(self) -> Any:
        """TF's ``ready_for_local_init_op`` (graph mode: the one given or the default built)."""
        return self._surface.ready_for_local_init_op

    @property
    def session_manager(self) -> Any:
        """What was passed as ``session_manager``, or None."""
        return self._surface.session_manager

    @property
    def summary_op(self) -> Any:
        """Graph mode: the summary op; eager: the TF2 summary callable (``summary_fn``), or None."""
        return self._surface.summary_op

    @property
    def saver(self) -> Optional[SaverShim]:
        """TF1's ``Saver`` over the checkpoint service, or None when checkpoints are off."""
        return self._surface.saver

    @property
    def summary_writer(self) -> Optional[SummaryWriterShim]:
        """TF's ``FileWriter`` methods over the summary service, or None (as TF's)."""
        return self._surface.summary_writer

    @property
    def save_path(self) -> Optional[str]:
        """``<logdir>/<checkpoint_basename>``, or None (no logdir, or a non-chief), as TF's."""
        return self._surface.save_path

    # ----------------------------------------------------------------- settings a program may change
    # (one Settings object the collaborators hold and read live: a value set after construction is used)
    @property
    def save_summaries_secs(self) -> Optional[float]:
        """Seconds between the summaries written (``summary_op``/``summary_fn``); None or 0: none (a non-chief: None)."""
        return self._settings.save_summaries_secs

    @save_summaries_secs.setter
    def save_summaries_secs(self, value: Optional[float]) -> None:
        self._settings.change("save_summaries_secs", value)

    @property
    def summary_fn(self) -> Optional[Callable[[], Mapping[str, Any]]]:
        """The TF2 summary callable, called every ``save_summaries_secs`` at a step boundary (eager)."""
        return self._settings.summary_fn

    @summary_fn.setter
    def summary_fn(self, value: Optional[Callable[[], Mapping[str, Any]]]) -> None:
        self._settings.change("summary_fn", value)

    @property
    def stop_grace_secs(self) -> float:
        """How long ``stop()`` waits for the threads and the final checkpoint."""
        return self._settings.stop_grace_secs

    @stop_grace_secs.setter
    def stop_grace_secs(self, value: float) -> None:
        self._settings.change("stop_grace_secs", value)

    @property
    def recovery_wait_secs(self) -> float:
        """How long a worker waits between looks for the chief's model (TF's)."""
        return self._settings.recovery_wait_secs

    @recovery_wait_secs.setter
    def recovery_wait_secs(self, value: float) -> None:
        self._settings.change("recovery_wait_secs", value)

    @property
    def init_fn(self) -> Optional[Callable[[Any], None]]:
        """Called with the session to initialize the model when no checkpoint is restored."""
        return self._settings.init_fn

    @init_fn.setter
    def init_fn(self, value: Optional[Callable[[Any], None]]) -> None:
        self._settings.change("init_fn", value)

    @property
    def checkpoint_basename(self) -> str:
        """The checkpoints' prefix in the logdir (``model.ckpt``)."""
        return self._settings.checkpoint_basename

    @checkpoint_basename.setter
    def checkpoint_basename(self, value: str) -> None:
        self._settings.change("checkpoint_basename", value)

    # ----------------------------------------------------------------- session lifecycle
    def managed_session(self, master: str = "", config: Any = None, start_standard_services: bool = True,
                        close_summary_writer: bool = True) -> ManagedSessionContext:
        """Context manager: restore or initialize, yield a :class:`ManagedSession`, stop at exit.

        OutOfRangeError, StopIteration and :class:`TrainingStopped` are a clean stop, not re-raised; so is
        ``sys.exit(0)``/``sys.exit()``, re-raised after the final checkpoint; any other exception (the block's,
        else a thread's) is re-raised after the services stopped. The Supervisor can serve another block after.
        """
        warn_ignored_prepare_args(master, config, graph_mode=self._tf1.graph is not None)
        return ManagedSessionContext(self, start_standard_services, close_summary_writer, master, config,
                                     release=self._release)

    def prepare_or_wait_for_session(self, master: str = "", config: Any = None, wait_for_checkpoint: bool = False,
                                    max_wait_secs: float = 7200, start_standard_services: bool = True) -> Any:
        """Restore the newest committed checkpoint (or initialize) and return the session (graph mode: a
        :class:`procsv.trainer.graph.session.GraphSession`). Called again after :meth:`stop`, it starts afresh:
        the stop is cleared and the state restored from the newest checkpoint, as TF's SessionManager did."""
        if self._phase == Phase.LIVE:
            assert self._session is not None
            return self._session
        warn_ignored_prepare_args(master, config, graph_mode=self._tf1.graph is not None)
        if self._graph is not None:
            self._graph.max_wait_secs = max_wait_secs  # a non-chief's wait for its chief (as TF's)
        if wait_for_checkpoint:  # wait for the chief's first checkpoint (filesystem events; DeadlineExceededError)
            replica.wait_for_committed(self.layout, max_wait_secs, self.recovery_wait_secs, self._clock)
        # a session again in this process (TF's retry loop): its in-memory snapshot is not asked for (disk's newest)
        reused = self._phase == Phase.STOPPED or (self._phase == Phase.NEW and outcome.any_registered())
        if self._phase == Phase.STOPPED:
            self._reset_for_reuse()
            if self._outcome is not None:
                self._outcome.hold(self.outcome)
        if self._phase == Phase.NEW:
            self._outcome = outcome.register(self.outcome)  # once, even when reused after a stop
        self._phase = Phase.LIVE
        self._boundary.standard_started = start_standard_services  # False: the program calls start_standard_services()
        prepared_at, w0 = time.time(), self._clock()  # wall time: compared with the watchdog's records
        # a group's step runs collectives: only traced, but on shadows in a standby group (see warmup)
        child = self._config  # (config: the program's tf.ConfigProto)
        self._warm_ups.run(alone=child.place.nproc == 1, standby=self._ctx is not None and child.standby,
                           config=child)
        if self._rollback.detecting and child.place.nproc == 1 and env.memory_budget(child.launch.memory_snapshots) > 0:
            self._rollback.watch.losses.warm()  # the loss check's kernels, off the in-memory tier's first snapshots
        warm_secs = self._clock() - w0
        if self._ctx is not None and child.audit is not None:  # an auditor (issue 71): S1 exactly, then no side effect
            return self._replay(AuditReplay(self._ctx, child.audit, self.checkpoint, self._global_step), master,
                                config, start_standard_services)
        if self._ctx is not None and child.standby:  # a hot standby: everything before this is done already
            child = self._config = standby.wait_for_promotion(self._ctx)  # its Promotion's, no standby
        t0 = self._clock()
        self._signals.install(self.coord)
        endpoints, self._own = connect(self._ctx, self.is_chief, self.layout, self._kept_events)
        group_tier = self._keeper is not None and self._keeper.agent.group is not None  # a group's worker snapshots too
        channels = self._channels = TrainerChannels(
            endpoints, supervised=self._ctx is not None and self._ctx.supervised, clock=self._clock,
            services=self.is_chief and self.layout is not None, checkpoint=group_tier and self.layout is not None,
            remote=RemoteMember.of(child))
        for part in (self._keeper, self._summaries, self._rollback, self._boundary, self._graph):
            if part is not None:
                part.attach(channels)
        self._session = (self._graph.open_session(master, config, self.should_stop) if self._graph is not None
                         else ManagedSession(self._state, self.should_stop))  # (a subclass's should_stop too)
        skipped: list[str] = []
        if self._keeper is not None and (self.is_chief or self._graph is None or self._graph.worker_restores()):
            in_group = self._ctx is not None and self._ctx.supervised and self._ctx.in_group
            skipped = self._keeper.restore(self._init, chief=self.is_chief,
                                           restarted=self._ctx is not None and self._ctx.attempt > 1, reused=reused,
                                           pin_path=child.group.pin if in_group else None, config=child)
        else:
            self._init()
        if self._graph is not None:  # local_init_op, ready_op, live; queue runners
            self._graph.ready(self._surface.start_queue_runners, start_standard_services)
        step = self._state.step = int(self._global_step.numpy())
        agent = self._keeper.agent if self._keeper is not None else None
        saving = agent is not None and self.is_chief and start_standard_services  # (else no stall judged)
        channels.to_watchdog(TrainerReady(os.getpid(), self._ctx.attempt if self._ctx else 1, step, self.restored_from,
                                          self._clock() - t0, skipped, self.save_model_secs if saving else None,
                                          self.save_checkpoint_steps if saving else None, prepared_at, warm_secs,
                                          agent.restored_source if agent is not None else None))
        self._summaries.start_session(step, session_start(  # SessionLog START, when it has something to purge
            self.restored_from is not None, self._ctx is not None and self._ctx.attempt > 1, start_standard_services,
            self._tf1.graph is None or self._tf1.graph.global_step is not None), self.layout.logdir if self.layout else None)
        if agent is not None and self.is_chief:
            agent.heartbeat(channels, step, self._clock())
        if self.restored_from:
            print(f"procsv: restored step {step} from {os.path.basename(self.restored_from)}", flush=True)
        bitflip.arm(self._session, self.checkpoint, lambda: self._state.step,  # (the tests' silent corruption; nothing
                    "trainer" if self.is_chief else "worker")
        # unless PROCSV_FAULT says)
        self._boundary.start(save=bool(self._graph and self._graph.checkpoint_at_start and start_standard_services
                                       and self.save_model_secs))  # TF's checkpoint thread saves as it starts
        if (self.is_chief or self._rollback.watch.group_refusal) and self.layout is not None:  # (a group: each member)
            # the steps this run skipped before stay skipped
            self._rollback.resume(step, child.resume.skip_steps)
        return self._session

    def _replay(self, replay: AuditReplay, master: str, config: Any, start: bool) -> Any:
        """An auditor's session: checkpoint S1 restored, S2 read, the step boundary the replay's alone (no
        channels: nothing goes to the services or the watchdog until the replay's one answer). Graph mode: a
        graph session of its own, S1 restored in it, then ``local_init_op``, the ready check and the queue
        runners as at any start, nothing written (:meth:`~procsv.trainer.graph.supervised.GraphSupervised.replaying`)."""
        graph = self._graph
        if graph is not None:
            self._session = graph.open_session(master, config, self.should_stop)
        keeper = self._keeper
        # what a restart would restore (a front-end's choice: a Keras fit's restore target), and what a snapshot
        # writes first (the step, a Keras fit's position), run before the state at S2 is read
        replay.begin(keeper.take_restore_target() if keeper is not None else None,
                     keeper.prepare_snapshot if keeper is not None else None)
        if keeper is not None:  # S1 is committed: a save of it at the session's start (a hook's) is done
            keeper.agent.replaying_from(replay.start, replay.restored)  # (restored_from: Keras fit resumes at its position)
        if graph is not None:
            graph.replaying(self._surface.start_queue_runners, start)
        else:
            self._session = AuditSession(self._state, self.should_stop, replay)
        self._audit = replay
        self._state.step = int(self._global_step.numpy())
        replay.claim(self._state)
        return self._session

    def stop(self, threads: Any = None, close_summary_writer: bool = True, ignore_live_threads: bool = False) -> None:
        """Request a stop; join the threads (``sv.loop``'s and ``threads``), then the final checkpoint (unless an
        exception was recorded), flush summaries, release everything, all within one ``stop_grace_secs`` deadline.
        Re-raises as TF: the recorded exception, else ``RuntimeError`` for threads alive after the grace (not with
        ``ignore_live_threads``). ``close_summary_writer=False`` keeps TF's writer open: no STOP; the next session's
        summary service continues its event file (:mod:`~procsv.trainer.standalone`), with what is logged after."""
        deadline = self._clock() + self.stop_grace_secs
        if not close_summary_writer:
            warn_once("Supervisor.stop.close_summary_writer", "stop(close_summary_writer=False): summaries logged "
                      "after stop() are written only when this Supervisor opens its next session; log them before")
        self.coord.request_stop()
        try:
            self.coord.join(threads, stop_grace_period_secs=self.stop_grace_secs,
                            ignore_live_threads=ignore_live_threads)
        finally:
            try:
                self._stop_services(deadline, close_summary_writer)
            finally:
                if self._outcome is not None:  # what it counts for at exit if the program drops it
                    self._outcome.keep()

    def settle_at_end(self) -> None:
        """The loop ended on its own: a rollback's replay it ended inside is finished, and an unchecked
        non-finite loss is rolled back and replayed now (a graph program's: the steps lost are said)."""
        if self.is_chief:
            session = self._session
            self._rollback.settle_at_end(session.replay_last() if self._graph is None
                                         and isinstance(session, ManagedSession) else None)

    def outcome(self) -> outcome.Outcome:
        """What this Supervisor achieved so far (the trainer's bootstrap reads it at exit)."""
        agent = self._keeper.agent if self._keeper is not None else None
        ok = self.is_chief and agent is not None and agent.last_committed >= self._state.step  # its step saved
        began = self._state.step - self._counter.completed  # the step its session began at
        return outcome.of(self._counter.completed, self._stopped_by_signal and self.coord.stop_signal, self._boundary.unsaved, ok,
                          agent is not None and agent.last_committed > max(0, began))

    # ----------------------------------------------------------------- internals
    def _stop_services(self, deadline: Optional[float] = None, close_summary_writer: bool = True) -> None:
        """The second half of stop(): final checkpoint, summaries, release (no join)."""
        deadline = self._clock() + self.stop_grace_secs if deadline is None else deadline
        self.coord.request_stop()
        if self._audit is not None:  # an auditor's session ended: at S2, its program's last step, compare; before
            self._audit.stopped(self._state.step, self.coord.exception is not None)  # it, said; where it began
            # (trained nothing) or it failed before S2 (TF's retry loop), the next session answers
        if self._phase == Phase.LIVE:
            self._phase = Phase.STOPPED
        channels = self._channels
        if channels is None:
            self._release(deadline)
            return
        try:
            self._stopped_by_signal = self.coord.stop_signal is not None
            if not self.is_chief and self._keeper is not None and self._graph is None:
                self._boundary.check_member_end()  # a group member's losses since its last check
            if self.coord.exception is None and self._keeper is not None and self.is_chief and self._final_wanted():
                self.commit_checkpoint(deadline)  # (a subclass may override it)
            else:
                self._boundary.report_busy(Busy.NONE)
            self._summaries.flush(force=True, deadline=deadline)
            if close_summary_writer:
                channels.to_summary(SessionLogEvent(SessionStatus.STOP, self._state.step))
                if self._graph is not None:
                    self._graph.writer_closed()
            self._kept_events = None if close_summary_writer or self._own is None else self._own.events_tag
        finally:
            self._release(deadline)

    def _final_wanted(self) -> bool:
        """The stop commits a final checkpoint, unless ``save_model_secs=0`` without ``save_checkpoint_steps``
        asked for no checkpoint at all (TF's Supervisor saves nothing then; a MonitoredTrainingSession with
        neither ``save_checkpoint_secs`` nor ``save_checkpoint_steps`` passes it): in both modes."""
        return not (self.save_model_secs == 0 and not self.save_checkpoint_steps)

    def _reset_for_reuse(self) -> None:
        """A prepare after a stop (TF's "retry on preemption" loop): clear the stop, fresh services."""
        signalled = self.coord.stop_signal
        self.coord.clear_stop()
        if signalled is not None:  # SIGTERM/SIGINT still holds: the new block stops at once (cleanly)
            self.coord.request_stop_from_signal(signalled)
        self._boundary.reset()
        self._summaries.reset()
        if self._keeper is not None:
            self._keeper.renew()

    def _session_thread(self) -> Optional[int]:  # the thread that prepared today's session (None: none yet)
        return None if self._session is None else int(self._session.owner_thread)

    def _init(self) -> None:
        if self._graph is not None:
            if not self.is_chief:  # TF's wait_for_session: the chief makes the model ready, never a worker
                return self._graph.wait_for_chief()
            self._graph.initialize()  # init_op (init_feed_dict), then init_fn
        elif self.init_fn is not None:
            self.init_fn(self._session)

    def _release(self, deadline: Optional[float] = None) -> None:
        self._counter.sync()  # the variable holds the step again, for the program and a next session
        if self._channels is not None:
            self._channels.close()
            self._channels = None
            for part in (self._keeper, self._summaries, self._rollback, self._boundary, self._graph):
                if part is not None:
                    part.detach()
        if self._own is not None:
            self._own.release(self.stop_grace_secs if deadline is None else max(1.0, deadline - self._clock()))
            self._own = None
        self._signals.restore()


add_camel_case_aliases(Supervisor)

__all__ = ["Supervisor", "ManagedSession", "ProcsvError", "USE_DEFAULT"]
