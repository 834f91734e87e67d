"""``procsv.Supervisor``: the trainer-side API, modelled on ``tf.compat.v1.train.Supervisor``.

Runs in the trainer process. It restores the newest *valid* committed checkpoint (or
initializes), hands out a :class:`ManagedSession` whose ``run(step_fn)`` runs one training step,
and at step boundaries -- never from a thread -- reports progress to the watchdog, answers the
checkpoint service's save requests with a snapshot, and hands buffered summaries to the summary
service. Checkpoints and event files are written by those service processes, not by the trainer.

Without ``procsv launch`` (a plain ``python train.py``), the Supervisor starts the two services
itself as child processes, in a private runtime directory, and stops them when the block ends;
nothing restarts a crashed trainer then, but running the script again resumes from the latest
checkpoint.

Here: the session lifecycle (prepare, stop, final checkpoint, release, a session again after a
stop). Elsewhere: the constructor's decisions (``supervisor_setup``), the step boundary
(``step_boundary``), the summary methods (``summary_methods``), TF's surface (``tf1_methods``).
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable, Mapping, Optional, Sequence

from procsv.ipc.messages import Busy, SessionLogEvent, SessionStatus, TrainerReady
from procsv.ipc.transport import Endpoints
from procsv.common import bootstrap, env
from procsv.common.errors import ProcsvError
from procsv import cluster
from procsv.trainer import outcome, replica
from procsv.trainer.checkpoint import restore_at_start
from procsv.trainer.standby import wait as standby, warmup
from procsv.trainer.channels import TrainerChannels
from procsv.trainer.checkpoint.agent import CheckpointAgent
from procsv.trainer.coordinator import Coordinator
from procsv.common.errors import TrainingDiverged
from procsv.trainer.managed import ManagedSession, ManagedSessionContext
from procsv.trainer.replica import GroupPin
from procsv.trainer.checkpoint.restore import ReadRetry
from procsv.trainer.standalone import OwnServices
from procsv.trainer.step_boundary import ProgressReporter, StepCounter, StepState
from procsv.trainer.stop_signals import StopSignals
from procsv.trainer.summaries import SummaryBuffer
from procsv.trainer.boundary_methods import BoundaryMethods
from procsv.trainer.supervisor_setup import (agent_factory, layout_for, refuse_eager_under_ps, resolve_is_chief,
                                             state_to_save)
from procsv.trainer.tf1_args import NOT_PASSED, USE_DEFAULT, Tf1Properties, add_camel_case_aliases
from procsv.trainer.graph.supervised import GraphMethods
from procsv.trainer.once import warn_once
from procsv.trainer.tf1_methods import Tf1Methods, warn_ignored_prepare_args


class Supervisor(BoundaryMethods, GraphMethods, Tf1Properties, Tf1Methods):
    """Checkpoints, summaries, restore-on-restart and stop coordination for a TF2 training loop.

    Args mirror ``tf.compat.v1.train.Supervisor``; the TF2-specific ones:

    * ``checkpoint``: what to save -- a ``tf.train.Checkpoint`` or a mapping of names to trackables
      (model, optimizer, ...). ``None`` disables checkpoints; nothing passed: ``tf1_args.state_given``.
    * ``global_step``: an int64 ``tf.Variable``; created if not given. It is saved in the
      checkpoint as ``global_step`` and advanced by one by every ``session.run(step_fn)``, unless
      the program advances it itself (detected at its first steps and re-checked every 100;
      ``increment_global_step=True/False`` forces it).
    * TF1's ``graph``, ``saver``, ``summary_op``, ``summary_writer``... (keywords): see ``tf1_args``.
    * ``summary_fn``: called every ``save_summaries_secs`` at a step boundary; returns a mapping of
      scalar tags to values (the TF2 stand-in for ``summary_op``).
    * ``save_checkpoint_steps``: also checkpoint every N steps (off by default).
    * ``max_to_keep`` / ``keep_checkpoint_every_n_hours``: retention, as ``tf.train.Saver``.
    * ``clock``: the monotonic clock every timer of the step boundary reads (tests pass a fake one).
    * ``allow_reinit``: when committed checkpoints exist but every one is corrupt, start from step 0
      (``init_fn``) instead of raising :class:`NoRestorableCheckpoint`. Also set by
      ``procsv launch --allow-reinit``. Never applies to an unreadable checkpoint.
    * ``checkpoint_failure_limit``: after this many checkpoints in a row fail to commit,
      ``should_stop()`` becomes true and the ``managed_session`` block re-raises a
      :class:`CheckpointError` naming the cause, as TensorFlow's Supervisor stopped on an error in
      its checkpoint thread (0: train on). ``procsv launch --on-checkpoint-failure`` sets it.
    * ``read_retry_secs``: how long a checkpoint file that cannot be read (EIO, EACCES, ESTALE...)
      is retried at restore before :class:`UnreadableCheckpoint` is raised (default 5 s).
    """

    USE_DEFAULT: Any = USE_DEFAULT  # TF's: build the default piece (None turns that service off)

    def __init__(
        self,
        logdir: Optional[str] = None,
        is_chief: Optional[bool] = None,
        checkpoint: Any = NOT_PASSED,
        global_step: Any = None,
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
        clock: Callable[[], float] = time.monotonic,
        allow_reinit: bool = False,
        read_retry_secs: float = ReadRetry.total_secs,
        checkpoint_failure_limit: int = 3,
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
        on_nonfinite: Optional[str] = None, nonfinite_tags: Sequence[str] = ("loss",), nonfinite_ignore: Sequence[str] = ()
    ) -> None:
        self._clock = clock  # every timer of the step boundary (progress, summaries, saves) reads it
        self._ctx = bootstrap.ChildContext.from_env()
        is_chief = resolve_is_chief(is_chief, self._ctx)
        self.layout = layout_for(logdir, self._ctx, is_chief=is_chief, checkpoint_basename=checkpoint_basename,
                                 read_retry_secs=read_retry_secs)
        self.allow_reinit = allow_reinit or os.environ.get(env.ALLOW_REINIT) == "1"
        self.is_chief = is_chief
        self.save_model_secs = save_model_secs
        self.save_summaries_secs = save_summaries_secs
        self.recovery_wait_secs = recovery_wait_secs
        self.stop_grace_secs = stop_grace_secs
        self.checkpoint_basename = checkpoint_basename
        self.max_to_keep = max_to_keep
        self.keep_checkpoint_every_n_hours = keep_checkpoint_every_n_hours
        self.save_checkpoint_steps = save_checkpoint_steps
        self.init_fn = init_fn
        # graph mode (a TF1 graph program) or eager: the TF1 arguments, the state to save, the global step
        self._tf1, checkpoint, self._global_step, created = state_to_save(
            checkpoint, summary_fn, saver, summary_op, summary_writer, global_step, self.logdir, {
                "graph": graph, "ready_op": ready_op, "ready_for_local_init_op": ready_for_local_init_op,
                "init_op": init_op, "init_feed_dict": init_feed_dict, "local_init_op": local_init_op,
                "session_manager": session_manager, "local_init_run_options": local_init_run_options},
            max_to_keep=max_to_keep, keep_checkpoint_every_n_hours=keep_checkpoint_every_n_hours,
            recovery_wait_secs=recovery_wait_secs, increment_global_step=increment_global_step)
        refuse_eager_under_ps(self._tf1.graph is not None, self._ctx)
        self.summary_fn = self._tf1.summary_fn
        self.increment_global_step = increment_global_step
        self.coord = Coordinator(clock=clock)
        # (graph mode: the program's runs advance the global step; GraphSession observes it)
        self._counter = StepCounter(self._global_step, False if self._tf1.graph else increment_global_step,
                                    private=created)
        self.checkpoint = checkpoint
        self._new_agent = agent_factory(
            checkpoint, self._global_step, self.layout, basename=checkpoint_basename,
            save_model_secs=save_model_secs, save_checkpoint_steps=save_checkpoint_steps,
            max_to_keep=max_to_keep, keep_checkpoint_every_n_hours=keep_checkpoint_every_n_hours,
            allow_reinit=self.allow_reinit, read_retry_secs=read_retry_secs,
            failure_limit=checkpoint_failure_limit, saving=is_chief)
        # what each step reads: the step, and when the step boundary next may have work (boundary_methods)
        self._state = StepState(clock, self.coord, self._counter, self._boundary, self._after_step)
        self._ckpt: Optional[CheckpointAgent] = self._agent() if checkpoint is not None else None
        self._attach_nonfinite(on_nonfinite, nonfinite_tags, nonfinite_ignore)  # boundary_methods; docs/python-api.md

        self._channels: Optional[TrainerChannels] = None
        self._summaries = SummaryBuffer(clock)
        self._summaries.on_batch = self._batch_waiting
        self._session: Optional[Any] = None  # a ManagedSession, or a GraphSession in graph mode
        self._own: Optional[OwnServices] = None
        self._stopped_by_signal = False
        self._unsaved = False  # the final checkpoint did not commit
        self._signals = StopSignals()
        self._progress = ProgressReporter()
        self._next_summary = 0.0
        self._started = False
        self._standard_started = True  # a session's periodic checkpoints and summaries run (tf1_methods)
        self._stopped = False  # stop() ran: a further prepare_or_wait_for_session() starts afresh
        self._warm_ups: list[tuple[Any, tuple[Any, ...], dict[str, Any]]] = []  # warm_up(): traced at prepare

    # ----------------------------------------------------------------- properties
    @property
    def step(self) -> int:
        """The step being run inside ``session.run``, else the number of completed steps."""
        return self._state.step

    @property
    def restored_from(self) -> Optional[str]:
        """The checkpoint prefix this process restored, or None if it initialized."""
        return self._ckpt.restored_from if self._ckpt else None

    # ----------------------------------------------------------------- session lifecycle
    def managed_session(self, master: str = "", config: Any = None, start_standard_services: bool = True,
                        close_summary_writer: bool = True) -> ManagedSessionContext:
        """Context manager: restore or initialize, yield a :class:`ManagedSession`, stop at exit.

        OutOfRangeError, StopIteration and :class:`TrainingStopped` are a clean stop, not re-raised; so is
        ``sys.exit(0)``/``sys.exit()``, re-raised after the final checkpoint; any other exception (the block's,
        else a thread's) is re-raised after the services stopped. The Supervisor can serve another block after.
        """
        warn_ignored_prepare_args(master, config, graph_mode=self._tf1.graph is not None)
        return ManagedSessionContext(self, start_standard_services, close_summary_writer, master, config)

    def warm_up(self, fn: Any, *args: Any, **kwargs: Any) -> None:
        """Trace ``fn`` (a ``tf.function``, e.g. the train step) for these example arguments when the
        session is prepared, before the restore, and have TensorFlow instantiate the traced function
        (optimize and place its graph); in a hot standby before it waits, so that a promoted
        standby's first step pays neither. Nothing runs: no variable changes, no summary
        (:mod:`procsv.trainer.standby.warmup` says how). In a group (``--nproc`` > 1) it is only traced. Give
        arguments of the loop's shapes and dtypes (numpy arrays or tensors; another shape is traced
        again at its first call, as always)."""
        if not callable(getattr(fn, "get_concrete_function", None)):
            raise TypeError(f"Supervisor.warm_up takes a tf.function, not {type(fn).__name__}")
        self._warm_ups.append((fn, args, kwargs))

    def prepare_or_wait_for_session(self, master: str = "", config: Any = None, wait_for_checkpoint: bool = False,
                                    max_wait_secs: float = 7200, start_standard_services: bool = True) -> Any:
        """Restore the newest committed checkpoint (or initialize) and return the session (graph
        mode: a :class:`procsv.trainer.graph.session.GraphSession`). Called
        again after :meth:`stop`, it starts afresh: the stop is cleared and the state restored
        again from the newest checkpoint, as TF's SessionManager did for a new session."""
        if self._started and not self._stopped:
            assert self._session is not None
            return self._session
        warn_ignored_prepare_args(master, config, graph_mode=self._tf1.graph is not None)
        self._max_wait_secs = max_wait_secs  # graph mode under --ps: a non-chief's wait for ready_op (as TF's)
        if wait_for_checkpoint:  # wait for the chief's first checkpoint (filesystem events; DeadlineExceededError)
            replica.wait_for_committed(self.layout, max_wait_secs, self.recovery_wait_secs, self._clock)
        # a session again after a stop, or a new Supervisor after another's session, in this process (TF's
        # retry loop): the service's in-memory snapshot is this process's own, not asked for (disk's newest)
        reused = self._stopped or (not self._started and outcome.any_registered())
        if self._stopped:
            self._reset_for_reuse()
        if not self._started and not self._stopped:
            outcome.register(self.outcome)  # once, even when reused after a stop
        self._started = True
        self._standard_started = start_standard_services  # False: the program calls start_standard_services()
        alone = cluster.nproc() == 1  # a group's step runs collectives: only traced (see warmup)
        for fn, args, kwargs in self._warm_ups:
            warmup.trace_and_instantiate(fn, args, kwargs, instantiate_too=alone)
            if alone and self._ctx is not None and standby.is_standby():  # idle time: make its kernels too
                warmup.standby_run(fn, args, kwargs)
        self._warm_ups = []  # traced once: a later prepare (after a stop) finds the trace in place
        if self._ctx is not None and standby.is_standby():
            standby.wait_for_promotion(self._ctx)  # a hot standby: everything before this is done already
        t0 = self._clock()
        self._signals.install(self.coord)
        endpoints = self._connect_services()
        self._channels = TrainerChannels(endpoints, supervised=self._ctx is not None and self._ctx.supervised,
                                         clock=self._clock, services=self.is_chief and self.layout is not None)
        self._session = self._open_session(master, config) if self._tf1.graph else ManagedSession(self)
        skipped: list[str] = []
        if self._ckpt is not None and (self.is_chief or not cluster.ps_tasks()):  # --ps: only the chief restores
            pin_path = os.environ.get(env.GROUP_PIN) if self._in_group() else None
            pin = GroupPin(pin_path) if pin_path else None
            if self._ctx is not None and self._ctx.attempt > 1 and self.is_chief and not reused and pin is None:
                if self._ckpt.memory_budget > 0:  # a dead trainer's in-memory snapshot, if the service held one
                    restore_at_start.recover_memory(self._channels)
            # a group's workers restore exactly what the chief restored (a newer commit in between would diverge them)
            pinned = restore_at_start.Pinned(pin.wait()) if pin is not None and not self.is_chief else None
            skipped = self._ckpt.restore_or_init(self._init, pinned=pinned)
            if pin is not None and self.is_chief:
                pin.publish(self.restored_from or None)
        else:
            self._init()
        if self._tf1.graph is not None:
            self._graph_ready(start_standard_services)  # local_init_op, ready_op, live; queue runners
        self._state.step = int(self._global_step.numpy())
        pid = os.getpid()
        attempt = self._ctx.attempt if self._ctx else 1
        saving = self._ckpt is not None and self.is_chief and start_standard_services  # (else no stall judged)
        self._channels.to_watchdog(TrainerReady(pid, attempt, self._state.step, self.restored_from,
                                                self._clock() - t0, skipped,
                                                self.save_model_secs if saving else None,
                                                self.save_checkpoint_steps if saving else None))
        # TensorBoard discards every event at or after the next step we log: re-run steps don't duplicate
        self._channels.to_summary(SessionLogEvent(SessionStatus.START, self._state.step + 1))
        now = self._clock()
        if self._ckpt is not None and self.is_chief:
            self._ckpt.heartbeat(self._channels, self._state.step, now)
        self._next_summary = now + (self.save_summaries_secs or 0)
        if self.restored_from:
            print(f"procsv: restored step {self._state.step} from {os.path.basename(self.restored_from)}", flush=True)
        self._start_bounds()
        return self._session

    def stop(self, threads: Any = None, close_summary_writer: bool = True, ignore_live_threads: bool = False) -> None:
        """Request a stop; join the threads (``sv.loop``'s and ``threads``), then write the final
        checkpoint (unless an exception was recorded), flush summaries and release everything, all
        within one ``stop_grace_secs`` deadline. Re-raises like TF: the recorded exception, else a
        ``RuntimeError`` for threads still alive after the grace period (unless ``ignore_live_threads``).
        ``close_summary_writer=False`` skips the SessionLog STOP; summaries logged after the stop wait
        for this Supervisor's next session (TF kept the writer open): warned once."""
        deadline = self._clock() + self.stop_grace_secs
        if not close_summary_writer:
            warn_once("Supervisor.stop.close_summary_writer",
                      "stop(close_summary_writer=False): no SessionLog STOP is written, but the summary "
                      "service is a process the stop disconnects from, so summaries logged after stop() are "
                      "written only when this Supervisor opens its next session (TF wrote them at once); "
                      "log them before stop()")
        self.coord.request_stop()
        try:
            self.coord.join(threads, stop_grace_period_secs=self.stop_grace_secs,
                            ignore_live_threads=ignore_live_threads)
        finally:
            self._stop_services(deadline, close_summary_writer)

    def _stop_quietly(self) -> None:
        """stop() that re-raises nothing but a diverging stop (exit 4: the final checkpoint refused a
        poisoned state): procsv.train's sessions raise the recorded exception themselves."""
        try:
            self.stop(ignore_live_threads=True)
        except TrainingDiverged:
            raise
        except BaseException:
            pass

    def _stop_services(self, deadline: Optional[float] = None, close_summary_writer: bool = True) -> None:
        """The second half of stop(): final checkpoint, summaries, release (no join)."""
        if deadline is None:
            deadline = self._clock() + self.stop_grace_secs
        self.coord.request_stop()
        self._stopped = self._started
        if self._channels is None:
            self._release(deadline)
            return
        try:
            self._stopped_by_signal = self.coord.stop_signal is not None
            if self.coord.exception is None and self._ckpt is not None and self.is_chief:
                self.commit_checkpoint(deadline)
            else:
                self._report_busy(Busy.NONE)
            self._flush_summaries(force=True, deadline=deadline)
            if close_summary_writer:
                self._channels.to_summary(SessionLogEvent(SessionStatus.STOP, self._state.step))
        finally:
            self._release(deadline)

    def outcome(self) -> outcome.Outcome:
        """What this Supervisor achieved so far (the trainer's bootstrap reads it at exit)."""
        ok = self.is_chief and self._ckpt is not None and self._ckpt.last_committed >= self._state.step  # its step saved
        return outcome.of(self._counter.completed, self._stopped_by_signal and self.coord.stop_signal, self._unsaved, ok)

    # ----------------------------------------------------------------- internals
    def _reset_for_reuse(self) -> None:
        """A prepare after a stop (TF's "retry on preemption" loop): clear the stop, fresh services."""
        signalled = self.coord.stop_signal
        self.coord.clear_stop()
        if signalled is not None:  # SIGTERM/SIGINT still holds: the new block stops at once (cleanly)
            self.coord.request_stop_from_signal(signalled)
        self._stopped = False
        self._unsaved = False
        self._progress.first_done = False
        self.__dict__.pop("_summary_sender", None)
        if self._ckpt is not None:
            self._ckpt = self._agent()

    def _agent(self) -> CheckpointAgent:
        """A session's checkpoint agent; every snapshot it takes first brings global_step up to date."""
        agent = self._new_agent()
        agent.prepare_snapshot.append(self._counter.sync)
        agent.wake = self._save_requested
        return agent

    @property
    def global_step(self) -> Any:
        """The global step variable (int64). Handing it out makes procsv advance it at every step.
        Graph mode: the graph's global step variable."""
        return self._tf1.graph.global_step if self._tf1.graph is not None else self._counter.expose()

    def _in_group(self) -> bool:
        """One trainer of a ``procsv launch --nproc N`` group."""
        return self._ctx is not None and self._ctx.supervised and self._ctx.in_group

    def _connect_services(self) -> Endpoints:
        if self._ctx is not None:
            return self._ctx.endpoints
        if not self.is_chief or self.layout is None:  # a worker (or no logdir) connects to no service
            return Endpoints("")
        self._own = OwnServices(self.layout)
        return self._own.start()

    def _init(self) -> None:
        if self._tf1.graph is not None:
            if not self.is_chief and cluster.ps_tasks():  # --ps: the chief makes the model ready
                return self._graph_wait_for_chief()
            self._graph_initialize()  # init_op (init_feed_dict), then init_fn
        elif self.init_fn is not None:
            self.init_fn(self._session)

    def _release(self, deadline: Optional[float] = None) -> None:
        self._counter.sync()  # the variable holds the step again, for the program and a next session
        if self._channels is not None:
            self._channels.close()
            self._channels = None
        if self._own is not None:
            grace = self.stop_grace_secs if deadline is None else max(1.0, deadline - self._clock())
            self._own.release(grace)
            self._own = None
        self._signals.restore()


add_camel_case_aliases(Supervisor)

__all__ = ["Supervisor", "ManagedSession", "ProcsvError", "USE_DEFAULT"]
