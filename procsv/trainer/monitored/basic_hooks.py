"""TensorFlow's standard session hooks, for TF2 and procsv's services.

Runs in the trainer process, in its main thread (called by ``MonitoredSession.run``). Each hook
keeps TF's constructor, validation and call pattern (``tf.compat.v1.train.*Hook``); the
differences are TF2's (no graph: fetches are tensors, variables or callables read after the step)
and procsv's (checkpoints are written by the checkpoint service, summaries by the summary service,
both through the session's :class:`procsv.Supervisor`; timers read its monotonic clock). Log
lines go to the ``procsv.train`` logger at INFO.

Defined here: the hooks that steer the run (stop at a step, checkpoint it, wait before it, feed
its steps, read final values at its end). The hooks that watch each step and report it (NaN
check, summaries, step rate, logging, profiling) are :mod:`procsv.trainer.monitored.observer_hooks`,
re-exported here: this module names every standard hook.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional, Sequence

from procsv.common.errors import UsageError
from procsv.trainer.monitored import hooks as api
from procsv.trainer.monitored.hook_support import (front_end_of, global_step_fetch, graph_mode, need_global_step,
                                                  read_global_step, supervisor_of, warn_if_not_logdir)
from procsv.trainer.monitored.hooks import (SecondOrStepTimer, SessionRunArgs, SessionRunContext, SessionRunHook,
                                  SessionRunValues)
from procsv.trainer.monitored.plain_saver import PlainSaving
from procsv.trainer.monitored.observer_hooks import (LoggingTensorHook, NanLossDuringTrainingError, NanTensorHook, ProfilerHook,
                                           StepCounterHook, SummarySaverHook, write_summary)

if TYPE_CHECKING:
    from procsv.trainer.frontend.port import SaveListening


# ---------------------------------------------------------------------------- stop at step
class StopAtStepHook(SessionRunHook):
    """Requests a stop when the global step reaches ``last_step`` (or ``num_steps`` more than at start).

    Exact across restarts: the global step is restored with the checkpoint, and ``num_steps``
    counts from the step the launch's first trainer started at (TF counted from session creation
    and kept that through its in-process recovery; a procsv restart is that recovery). A session
    whose restored step already reached it stops before running a step (TF ran one more).
    In graph mode, as TF: every run also fetches the global step, and when that value plus one
    reaches ``last_step`` the step is read again after the run to decide.
    """

    def __init__(self, num_steps: Optional[int] = None, last_step: Optional[int] = None) -> None:
        if num_steps is None and last_step is None:
            raise ValueError("One of num_steps or last_step must be specified.")
        if num_steps is not None and last_step is not None:
            raise ValueError("Only one of num_steps or last_step can be specified.")
        self._num_steps = num_steps
        self._last_step = last_step
        self._gs: Any = None
        self._graph = False

    @property
    def last_step(self) -> Optional[int]:
        return self._last_step

    def begin(self) -> None:
        self._graph = graph_mode()
        self._gs = global_step_fetch("StopAtStepHook") if self._graph else need_global_step("StopAtStepHook")

    def after_create_session(self, session: Any, coord: Any) -> None:
        step = read_global_step(session, self._gs)
        if self._last_step is None:
            assert self._num_steps is not None
            sv = supervisor_of(session)
            start = sv.front_end.launch_start_step if sv is not None else None
            self._last_step = (step if start is None else start) + self._num_steps
        if step >= self._last_step:
            coord.request_stop()

    def before_run(self, run_context: SessionRunContext) -> Optional[SessionRunArgs]:
        return SessionRunArgs(self._gs) if self._graph else None

    def after_run(self, run_context: SessionRunContext, run_values: SessionRunValues) -> None:
        assert self._last_step is not None
        if self._graph:
            # the value fetched may be from before or after this run's increment: check again
            if int(run_values.results) + 1 >= self._last_step and \
                    int(run_context.session.run(self._gs)) >= self._last_step:
                run_context.request_stop()
            return
        if api.read_step(self._gs) >= self._last_step:
            run_context.request_stop()


# ---------------------------------------------------------------------------- checkpoints
class CheckpointSaverListener:
    """Called around checkpoints: ``begin()``, ``before_save(session, step)`` (right before the
    snapshot of ``step`` is taken, at a step boundary), ``after_save(session, step)`` (once that
    checkpoint is committed: durable, named by the ``checkpoint`` file; return True to request a
    stop), ``end(session, step)`` (after the final checkpoint)."""

    def begin(self) -> None:
        pass

    def before_save(self, session: Any, global_step_value: int) -> None:
        pass

    def after_save(self, session: Any, global_step_value: int) -> Optional[bool]:
        return None

    def end(self, session: Any, global_step_value: int) -> None:
        pass


class CheckpointSaverHook(SessionRunHook):
    """Checkpoints every ``save_secs`` or ``save_steps``, through the checkpoint service.

    The Supervisor runs the timer: a MonitoredSession gives it this hook's ``save_secs``
    (``save_model_secs``: the service's timer, which keeps ticking while a step stalls) or
    ``save_steps`` (every multiple of N). As TF, a new session without a checkpoint saves at once
    (graph mode: committed in ``after_create_session``, its listeners called there), and ``end()``
    saves the last step. Listeners see every checkpoint, the Supervisor's final and emergency ones
    included; in graph mode a run whose step was handed to the service waits for its commit, as
    TF's synchronous save: the run returns with its checkpoint on disk, and ``after_save`` (and a
    stop it asks for) comes right after that run. On a graph session without a Supervisor the hook saves as TF's,
    with TF's Saver (:mod:`procsv.trainer.monitored.plain_saver`). ``save_graph_def``: in graph mode, as TF, the chief writes
    ``graph.pbtxt`` when the session is ready (eager mode has no graph: ignored; the GraphDef and
    MetaGraphDef events are written either way, as TF's writer does). ``saver`` is ignored, except in
    graph mode, where it is the Saver the Supervisor saves and restores; else, in graph mode, the
    Saver of the hook's ``scaffold`` (as TF), else the session creator's Scaffold's.
    """

    def __init__(self, checkpoint_dir: str, save_secs: Optional[float] = None, save_steps: Optional[int] = None,
                 saver: Any = None, checkpoint_basename: str = "model.ckpt", scaffold: Any = None,
                 listeners: Optional[Sequence[CheckpointSaverListener]] = None, save_graph_def: bool = True) -> None:
        if saver is not None and scaffold is not None:
            raise ValueError("You cannot provide both saver and scaffold.")
        if saver is not None and not graph_mode():
            api.warn_once("ckpt.saver", "CheckpointSaverHook(saver=...) is ignored: the state to save is "
                                        "Scaffold(checkpoint=tf.train.Checkpoint(...))")
        self._saver = saver if graph_mode() else None
        self._scaffold = scaffold
        self._save_graph_def = save_graph_def
        self._timer = SecondOrStepTimer(every_secs=save_secs, every_steps=save_steps)  # TF's validation too
        self._plain: Optional[PlainSaving] = None  # graph mode: TF's saving, on a session without a Supervisor
        self._steps_per_run = 1000000  # as TF: read the step after every run unless told a run's step count
        self._checkpoint_dir = checkpoint_dir
        self._save_secs = save_secs
        self._save_steps = save_steps
        self._basename = checkpoint_basename
        self._listeners = list(listeners or [])
        self._session: Any = None
        self._saves: Optional[SaveListening] = None  # its listeners on the session's checkpoints
        self._gs: Any = None
        self._stop = False

    def _set_steps_per_run(self, steps_per_run: int) -> None:
        """TF's protocol for runs that advance the global step by ``steps_per_run`` (TPU-style loops):
        a run whose step before it plus ``steps_per_run`` does not reach the next save is not read again."""
        self._steps_per_run = steps_per_run
        if self._plain is not None:
            self._plain.steps_per_run = steps_per_run

    def supervisor_options(self) -> dict[str, Any]:
        opts = {"save_model_secs": self._save_secs, "save_checkpoint_steps": self._save_steps,
                "checkpoint_basename": self._basename}
        if self._saver is not None:  # graph mode: the Saver whose variables are saved
            opts["saver"] = self._saver
        elif self._scaffold_saver() is not None:  # graph mode, as TF: else the hook's Scaffold's Saver
            opts["saver"] = self._scaffold_saver()
        if graph_mode():  # graph.pbtxt when the session is ready
            opts["save_graph_def"] = self._save_graph_def
        return opts

    def _scaffold_saver(self) -> Any:
        """Graph mode: the Saver of the Scaffold passed to the hook (None until its ``finalize()``
        if it was left to the default; that default is the session's default Saver, as TF's)."""
        return getattr(self._scaffold, "saver", None) if self._scaffold is not None and graph_mode() else None

    def begin(self) -> None:
        self._gs = need_global_step("CheckpointSaverHook") if graph_mode() else None
        self._plain = None
        if self._gs is not None and self._checkpoint_dir is not None:  # (None: the session's logdir, a procsv one's)
            self._plain = PlainSaving(self._checkpoint_dir, self._basename, self._timer, self._saver, self._scaffold,
                                      self._listeners, self._save_graph_def, global_step_fetch("CheckpointSaverHook"))
            self._plain.steps_per_run = self._steps_per_run
        for listener in self._listeners:
            listener.begin()

    def _plain_for(self, session: Any) -> Optional[PlainSaving]:
        """TF's saving if ``session`` is a graph session without a Supervisor, else None."""
        return self._plain if self._plain is not None and supervisor_of(session) is None else None

    def after_create_session(self, session: Any, coord: Any) -> None:
        plain = self._plain_for(session)
        if plain is not None:
            plain.after_create_session(session)
            return
        if self._gs is not None and supervisor_of(session) is None:  # (a plain graph session, no folder to save in)
            raise ValueError("CheckpointSaverHook: checkpoint_dir is None and the session is not procsv's (whose logdir "
                             "it would save in): pass checkpoint_dir")
        self._session = session
        warn_if_not_logdir("CheckpointSaverHook", self._checkpoint_dir, session)
        sv = supervisor_of(session)
        front = front_end_of(sv)  # (a procsv.Supervisor's)
        self._saves = front.listen_to_saves(self._before_save, self._after_save) if front is not None else None
        if self._saves is None:
            api.warn_once("ckpt.none", "CheckpointSaverHook: the session has no state to save (no checkpoint=...)")
            return
        if self._saves.last_committed < self._step(session, sv):  # as TF: a checkpoint right at session creation
            if self._gs is not None and sv.is_chief:  # graph mode, as TF: committed now, listeners called
                sv.saver.save(session, sv.save_path)
            else:
                self._saves.request()

    def _step(self, session: Any, sv: Any) -> int:
        """The global step now (graph mode: run in the session)."""
        return read_global_step(session, self._gs) if self._gs is not None else api.read_step(sv.global_step)

    def _before_save(self, step: int, reason: Any) -> None:
        api.tf_logging().info("Calling checkpoint listeners before saving checkpoint %d...", step)
        for listener in self._listeners:
            listener.before_save(self._session, step)

    def _after_save(self, step: int) -> None:
        api.tf_logging().info("Calling checkpoint listeners after saving checkpoint %d...", step)
        for listener in self._listeners:
            if listener.after_save(self._session, step):
                api.tf_logging().info("A CheckpointSaverListener requested a training stop. Stopping at step %d.", step)
                self._stop = True

    def before_run(self, run_context: SessionRunContext) -> Optional[SessionRunArgs]:
        plain = self._plain_for(run_context.session)
        return SessionRunArgs(plain.gs_read) if plain is not None else None

    def after_run(self, run_context: SessionRunContext, run_values: SessionRunValues) -> None:
        plain = self._plain_for(run_context.session)
        if plain is not None:
            plain.after_run(run_context, run_values)
            return
        if self._gs is not None and self._saves is not None and self._saves.in_flight:
            self._await_commit(supervisor_of(run_context.session))
        if self._stop:
            run_context.request_stop()

    def _await_commit(self, sv: Any) -> None:
        """Graph mode, as TF's synchronous save: the checkpoint this run's step boundary handed to the
        service is waited for (up to ``stop_grace_secs``; the watchdog is told the trainer is busy
        committing), so that the run that saved returns with its checkpoint on disk (the next one
        is then never skipped for one in flight), and ``after_save``, and a stop it asks for, come
        right after that run."""
        sv.front_end.await_commit()

    def end(self, session: Any) -> None:
        plain = self._plain_for(session)
        if plain is not None:
            step = plain.end(session)
            for listener in self._listeners:
                listener.end(session, step)
            return
        sv = supervisor_of(session)
        step = self._step(session, sv) if sv is not None or self._gs is not None else 0
        if self._saves is not None:
            sv.commit_checkpoint()
            self._saves.close()
        for listener in self._listeners:
            listener.end(session, step)


# ---------------------------------------------------------------------------- final ops, waiting, feeding
class FinalOpsHook(SessionRunHook):
    """Reads ``final_ops`` (tensors, variables, callables or a structure) at ``end()``: ``final_ops_values``.
    In graph mode, as TF: ``session.run(final_ops, feed_dict=final_ops_feed_dict)``."""

    def __init__(self, final_ops: Any, final_ops_feed_dict: Any = None) -> None:
        if final_ops_feed_dict is not None and not graph_mode():
            api.warn_once("final.feed", "FinalOpsHook(final_ops_feed_dict=...) is ignored in TF2: make final_ops a "
                                        "callable that takes what it needs")
        self._final_ops = final_ops
        self._final_ops_feed_dict = final_ops_feed_dict
        self._final_ops_values: Any = None
        self._graph = False

    @property
    def final_ops_values(self) -> Any:
        return self._final_ops_values

    def begin(self) -> None:
        self._graph = graph_mode()

    def end(self, session: Any) -> None:
        if self._final_ops is None:
            return
        if self._graph:
            import tensorflow as tf

            try:
                self._final_ops_values = session.run(self._final_ops, feed_dict=self._final_ops_feed_dict)
            except (tf.errors.OutOfRangeError, StopIteration):
                api.tf_logging().warning(
                    "An OutOfRangeError or StopIteration exception is raised by the code in FinalOpsHook. This "
                    "typically means the Ops running by the FinalOpsHook have a dependency back to some input "
                    "source, which should not happen. The final ops should only read variables, not another "
                    "batch of input.")
                raise
        else:
            self._final_ops_values = api.evaluate(self._final_ops)


class GlobalStepWaiterHook(SessionRunHook):
    """Delays training until the global step reaches ``wait_until_step`` (TF: a worker polling the
    step a parameter server holds, until the chief's runs bring it there).

    Graph mode, as TF: at the first run, ``wait_until_step`` <= 0 starts at once; else the hook
    reads the global step every 0.5 s (``time.sleep``) until it is there, logging through
    ``tf.compat.v1.logging`` (the step is the graph's: under ``procsv launch --ps`` the chief's runs
    advance it, as TF's parameter server; a wait that never ends makes no step, so procsv's hang
    detection ends it). Eager mode: a process's global step advances only by its own runs (one
    trainer, or each member of a ``--nproc`` group counting its own steps), so a step below it
    could never reach it while this process waits: a :class:`procsv.UsageError` naming both at the
    first run (never a hang, never a silent start); a step already there (a restored one) starts
    at once.
    """

    def __init__(self, wait_until_step: int) -> None:
        self._wait_until_step = wait_until_step
        self._started = False
        self._gs: Any = None
        self._graph = False

    def begin(self) -> None:
        self._started = False
        self._graph = graph_mode()
        self._gs = global_step_fetch("GlobalStepWaiterHook") if self._graph else need_global_step("GlobalStepWaiterHook")

    def before_run(self, run_context: SessionRunContext) -> Optional[SessionRunArgs]:
        if self._started:
            return None
        if self._wait_until_step <= 0:
            self._started = True
            return None
        if self._graph:
            self._wait(run_context.session)
            return None
        step = read_global_step(run_context.session, self._gs)
        if step < self._wait_until_step:
            raise UsageError(
                f"GlobalStepWaiterHook(wait_until_step={self._wait_until_step}): the global step is {step}, and in "
                "procsv only this process's own runs advance it (no parameter server holds a step another worker "
                "advances), so the wait could never end; pass wait_until_step<={step} or leave the hook out")
        self._started = True
        return None

    def _wait(self, session: Any) -> None:
        """TF's wait: poll the graph's global step every 0.5 s until it reaches ``wait_until_step``."""
        log = api.tf_logging()
        log.info("Waiting for global step %d before starting training.", self._wait_until_step)
        last_logged = 0
        while True:
            step = int(session.run(self._gs))
            if step >= self._wait_until_step:
                self._started = True
                return
            if step - last_logged > 1000:
                log.info("Waiting for global step %d before starting training. Current step is %d.",
                         self._wait_until_step, step)
                last_logged = step
            time.sleep(0.5)


class FeedFnHook(SessionRunHook):
    """Calls ``feed_fn()`` before every step; its mapping reaches the step function as its
    ``feed_dict`` keyword argument (TF2 has no placeholders to feed)."""

    def __init__(self, feed_fn: Callable[[], Mapping[Any, Any]]) -> None:
        self.feed_fn = feed_fn

    def before_run(self, run_context: SessionRunContext) -> Optional[SessionRunArgs]:
        return SessionRunArgs(fetches=None, feed_dict=dict(self.feed_fn()))


__all__ = [
    "StopAtStepHook", "NanTensorHook", "NanLossDuringTrainingError", "CheckpointSaverListener", "CheckpointSaverHook",
    "SummarySaverHook", "StepCounterHook", "LoggingTensorHook", "FinalOpsHook", "GlobalStepWaiterHook", "FeedFnHook",
    "ProfilerHook", "write_summary",
]
