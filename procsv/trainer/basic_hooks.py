"""TensorFlow's standard session hooks, for TF2 and procsv's services.

Runs in the trainer process, in its main thread (called by ``MonitoredSession.run``). Each hook
keeps TF's constructor, validation and call pattern (``tf.compat.v1.train.*Hook``); the
differences are TF2's (no graph: fetches are tensors, variables or callables read after the step)
and procsv's (checkpoints are written by the checkpoint service, summaries by the summary service,
both through the session's :class:`procsv.Supervisor`; timers read its monotonic clock). Log
lines go to the ``procsv.train`` logger at INFO.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np

from procsv.trainer import hooks as api
from procsv.trainer.hooks import (NeverTriggerTimer, SecondOrStepTimer, SessionRunArgs, SessionRunContext,
                                  SessionRunHook, SessionRunValues, logger)


def _sv(session: Any) -> Any:
    return getattr(session, "supervisor", None)


def _clock(session: Any) -> Callable[[], float]:
    clock: Callable[[], float] = getattr(_sv(session), "_clock", time.monotonic)
    return clock


def _need_global_step(hook: str) -> Any:
    gs = api.get_global_step()
    if gs is None:
        raise RuntimeError(f"Global step should be created to use {hook}.")
    return gs


def _same_dir(what: str, given: Optional[str], session: Any) -> None:
    sv = _sv(session)
    if given and sv is not None and os.path.abspath(given) != os.path.abspath(sv.logdir):
        api.warn_once(f"{what}.dir", f"{what}: {given!r} is not the session's logdir {sv.logdir!r}; procsv's services "
                                     "write there (pass checkpoint_dir to the session creator)")


# ---------------------------------------------------------------------------- stop at step
class StopAtStepHook(SessionRunHook):
    """Requests a stop when the global step reaches ``last_step`` (or ``num_steps`` more than at start).

    Exact across restarts: the global step is restored with the checkpoint, and ``num_steps``
    counts from the step the launch's first trainer started at (TF counted from session creation
    and kept that through its in-process recovery; a procsv restart is that recovery). A session
    whose restored step already reached it stops before running a step (TF ran one more).
    """

    def __init__(self, num_steps: Optional[int] = None, last_step: Optional[int] = None) -> None:
        if num_steps is None and last_step is None:
            raise ValueError("One of num_steps or last_step must be specified.")
        if num_steps is not None and last_step is not None:
            raise ValueError("Only one of num_steps or last_step can be specified.")
        self._num_steps = num_steps
        self._last_step = last_step
        self._gs: Any = None

    @property
    def last_step(self) -> Optional[int]:
        return self._last_step

    def begin(self) -> None:
        self._gs = _need_global_step("StopAtStepHook")

    def after_create_session(self, session: Any, coord: Any) -> None:
        from procsv.trainer.scaffold import launch_start_step

        step = api.read_step(self._gs)
        if self._last_step is None:
            assert self._num_steps is not None
            sv = _sv(session)
            start = launch_start_step(sv.logdir) if sv is not None else None
            self._last_step = (step if start is None else start) + self._num_steps
        if step >= self._last_step:
            coord.request_stop()

    def after_run(self, run_context: SessionRunContext, run_values: SessionRunValues) -> None:
        assert self._last_step is not None
        if api.read_step(self._gs) >= self._last_step:
            run_context.request_stop()


# ---------------------------------------------------------------------------- NaN
class NanLossDuringTrainingError(RuntimeError):
    def __str__(self) -> str:
        return "NaN loss during training."


class NanTensorHook(SessionRunHook):
    """Raises :class:`NanLossDuringTrainingError` (or requests a stop) when the loss is NaN.

    ``loss_tensor`` is read after every step: a tensor, a variable, a callable, or None for what
    the step function returned (any NaN in it counts).
    """

    def __init__(self, loss_tensor: Any, fail_on_nan_loss: bool = True) -> None:
        self._loss = loss_tensor
        self._fail = fail_on_nan_loss

    def before_run(self, run_context: SessionRunContext) -> Optional[SessionRunArgs]:
        return SessionRunArgs(self._loss) if self._loss is not None else None

    def after_run(self, run_context: SessionRunContext, run_values: SessionRunValues) -> None:
        import tensorflow as tf

        value = run_values.results if self._loss is not None else run_values.step_result
        leaves = [np.asarray(x.numpy() if isinstance(x, (tf.Tensor, tf.Variable)) else x)
                  for x in tf.nest.flatten(value)]
        if any(leaf.dtype.kind in "fc" and np.isnan(leaf).any() for leaf in leaves):
            message = "Model diverged with loss = NaN."
            if self._fail:
                logger.error(message)
                raise NanLossDuringTrainingError
            logger.warning(message)
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
    ``save_steps`` (every multiple of N). As TF, a new session without a checkpoint saves at once,
    and ``end()`` saves the last step. Listeners see every checkpoint, the Supervisor's final and
    emergency ones included. ``saver`` and ``save_graph_def`` are accepted and ignored.
    """

    def __init__(self, checkpoint_dir: str, save_secs: Optional[float] = None, save_steps: Optional[int] = None,
                 saver: Any = None, checkpoint_basename: str = "model.ckpt", scaffold: Any = None,
                 listeners: Optional[Sequence[CheckpointSaverListener]] = None, save_graph_def: bool = True) -> None:
        if saver is not None and scaffold is not None:
            raise ValueError("You cannot provide both saver and scaffold.")
        if saver is not None:
            api.warn_once("ckpt.saver", "CheckpointSaverHook(saver=...) is ignored: the state to save is "
                                        "Scaffold(checkpoint=tf.train.Checkpoint(...))")
        SecondOrStepTimer(every_secs=save_secs, every_steps=save_steps)  # TF's validation
        self._checkpoint_dir = checkpoint_dir
        self._save_secs = save_secs
        self._save_steps = save_steps
        self._basename = checkpoint_basename
        self._listeners = list(listeners or [])
        self._session: Any = None
        self._agent: Any = None
        self._stop = False

    def supervisor_options(self) -> dict[str, Any]:
        return {"save_model_secs": self._save_secs, "save_checkpoint_steps": self._save_steps,
                "checkpoint_basename": self._basename}

    def begin(self) -> None:
        _need_global_step("CheckpointSaverHook")
        for listener in self._listeners:
            listener.begin()

    def after_create_session(self, session: Any, coord: Any) -> None:
        from procsv.ipc.messages import SaveReason

        self._session = session
        _same_dir("CheckpointSaverHook", self._checkpoint_dir, session)
        sv = _sv(session)
        self._agent = getattr(sv, "_ckpt", None)
        if self._agent is None:
            api.warn_once("ckpt.none", "CheckpointSaverHook: the session has no state to save (no checkpoint=...)")
            return
        self._agent.before_snapshot.append(self._before_save)
        self._agent.on_commit.append(self._after_save)
        if self._agent.last_committed < api.read_step(sv.global_step):
            self._agent.request(SaveReason.STEPS)  # as TF: a checkpoint right at session creation

    def _before_save(self, step: int, reason: Any) -> None:
        logger.info("Calling checkpoint listeners before saving checkpoint %d...", step)
        for listener in self._listeners:
            listener.before_save(self._session, step)

    def _after_save(self, step: int) -> None:
        logger.info("Calling checkpoint listeners after saving checkpoint %d...", step)
        for listener in self._listeners:
            if listener.after_save(self._session, step):
                logger.info("A CheckpointSaverListener requested a training stop. Stopping at step %d.", step)
                self._stop = True

    def after_run(self, run_context: SessionRunContext, run_values: SessionRunValues) -> None:
        if self._stop:
            run_context.request_stop()

    def end(self, session: Any) -> None:
        sv = _sv(session)
        step = api.read_step(sv.global_step) if sv is not None else 0
        if self._agent is not None:
            sv.commit_checkpoint()
            self._agent.before_snapshot.remove(self._before_save)
            self._agent.on_commit.remove(self._after_save)
        for listener in self._listeners:
            listener.end(session, step)


# ---------------------------------------------------------------------------- summaries
class SummarySaverHook(SessionRunHook):
    """Writes ``summary_op`` (or ``scaffold.summary_op``) every ``save_steps`` or ``save_secs``,
    at the global step, through the summary service. ``summary_op`` in TF2: a callable returning
    ``{tag: value}`` (scalars; arrays become histograms), a ``Summary`` proto or its bytes; a mapping
    of tags to tensors, variables or callables; or a list of those. ``summary_writer`` is ignored:
    the summary service writes the logdir's event files (``output_dir`` should be the logdir)."""

    def __init__(self, save_steps: Optional[int] = None, save_secs: Optional[float] = None,
                 output_dir: Optional[str] = None, summary_writer: Any = None, scaffold: Any = None,
                 summary_op: Any = None) -> None:
        if (scaffold is None and summary_op is None) or (scaffold is not None and summary_op is not None):
            raise ValueError("Exactly one of scaffold or summary_op must be provided.")
        if summary_writer is not None:
            api.warn_once("summary.writer", "SummarySaverHook(summary_writer=...) is ignored: procsv's summary "
                                            "service writes the logdir's event files")
        self._timer = SecondOrStepTimer(every_secs=save_secs, every_steps=save_steps)
        self._output_dir = output_dir
        self._scaffold = scaffold
        self._summary_op = summary_op
        self._sv: Any = None

    def after_create_session(self, session: Any, coord: Any) -> None:
        self._sv = _sv(session)
        self._timer.clock = _clock(session)
        _same_dir("SummarySaverHook", self._output_dir, session)

    def after_run(self, run_context: SessionRunContext, run_values: SessionRunValues) -> None:
        step = api.read_step(self._sv.global_step)
        if not self._timer.should_trigger_for_step(step):
            return
        self._timer.update_last_triggered_step(step)
        op = self._summary_op if self._summary_op is not None else getattr(self._scaffold, "summary_op", None)
        if op is not None:
            write_summary(self._sv, op, step)


def write_summary(sv: Any, op: Any, step: int) -> None:
    """Evaluate a TF2 ``summary_op`` (see :class:`SummarySaverHook`) and log it at ``step``."""
    import tensorflow as tf

    if isinstance(op, (list, tuple)):
        for one in op:
            write_summary(sv, one, step)
        return
    if callable(op) and not isinstance(op, (tf.Tensor, tf.Variable)):
        op = op()
    if isinstance(op, Mapping):
        for tag, value in op.items():
            value = api.evaluate(value)
            if np.ndim(value) == 0:
                sv.log_scalar(tag, value, step)
            else:
                sv.log_histogram(tag, value, step)
        return
    if isinstance(op, (tf.Tensor, tf.Variable)):
        op = op.numpy()
    sv.summary_computed(None, op, step)


class StepCounterHook(SessionRunHook):
    """Logs ``global_step/sec`` (a line and a summary of that tag) every ``every_n_steps`` or
    ``every_n_secs``. ``summary_writer`` is ignored (the summary service writes)."""

    def __init__(self, every_n_steps: Optional[int] = 100, every_n_secs: Optional[float] = None,
                 output_dir: Optional[str] = None, summary_writer: Any = None) -> None:
        if (every_n_steps is None) == (every_n_secs is None):
            raise ValueError("exactly one of every_n_steps and every_n_secs should be provided.")
        self._timer = SecondOrStepTimer(every_steps=every_n_steps, every_secs=every_n_secs)
        self._output_dir = output_dir
        self._sv: Any = None
        self.last_rate: Optional[float] = None

    def begin(self) -> None:
        _need_global_step("StepCounterHook")

    def after_create_session(self, session: Any, coord: Any) -> None:
        self._sv = _sv(session)
        self._timer.clock = _clock(session)
        self._timer.update_last_triggered_step(api.read_step(self._sv.global_step))

    def after_run(self, run_context: SessionRunContext, run_values: SessionRunValues) -> None:
        step = api.read_step(self._sv.global_step)
        if not self._timer.should_trigger_for_step(step):
            return
        secs, steps = self._timer.update_last_triggered_step(step)
        if secs is not None and steps is not None and secs > 0:
            self.last_rate = steps / secs
            logger.info("global_step/sec: %g", self.last_rate)
            self._sv.log_scalar("global_step/sec", self.last_rate, step)


# ---------------------------------------------------------------------------- logging, final ops
class LoggingTensorHook(SessionRunHook):
    """Logs ``tensors`` every ``every_n_iter`` runs or ``every_n_secs`` seconds, and/or at the end.

    ``tensors``: a mapping of tags to tensors, variables or callables, or a list of them (tagged
    by their ``name`` or ``__name__``, else ``tensor_<i>``). ``formatter(values)`` returns the line.
    """

    def __init__(self, tensors: Any, every_n_iter: Optional[int] = None, every_n_secs: Optional[float] = None,
                 at_end: bool = False, formatter: Optional[Callable[[dict[str, Any]], str]] = None) -> None:
        only_at_end = at_end and every_n_iter is None and every_n_secs is None
        if not only_at_end and (every_n_iter is None) == (every_n_secs is None):
            raise ValueError("either at_end and/or exactly one of every_n_iter and every_n_secs must be provided.")
        if every_n_iter is not None and every_n_iter <= 0:
            raise ValueError(f"invalid every_n_iter={every_n_iter}.")
        if isinstance(tensors, Mapping):
            self._tensors = dict(tensors)
        else:
            self._tensors = {}
            for i, item in enumerate(tensors):
                if isinstance(item, str):
                    raise ValueError(f"tensor names ({item!r}) have no meaning in TF2: pass the tensors, "
                                     "variables or callables themselves")
                tag = getattr(item, "name", None) or getattr(item, "__name__", None) or f"tensor_{i}"
                self._tensors[str(tag)] = item
        self._timer: SecondOrStepTimer = (NeverTriggerTimer() if only_at_end
                                          else SecondOrStepTimer(every_secs=every_n_secs, every_steps=every_n_iter))
        self._at_end = at_end
        self._formatter = formatter
        self._iter_count = 0
        self._should_trigger = False

    def begin(self) -> None:
        self._timer.reset()
        self._iter_count = 0

    def after_create_session(self, session: Any, coord: Any) -> None:
        self._timer.clock = _clock(session)

    def before_run(self, run_context: SessionRunContext) -> Optional[SessionRunArgs]:
        self._should_trigger = self._timer.should_trigger_for_step(self._iter_count)
        return SessionRunArgs(self._tensors) if self._should_trigger else None

    def _log_tensors(self, values: dict[str, Any]) -> None:
        secs, _ = self._timer.update_last_triggered_step(self._iter_count)
        with np.printoptions(suppress=True):
            if self._formatter is not None:
                logger.info(self._formatter(values))
                return
            line = ", ".join(f"{tag} = {values[tag]}" for tag in self._tensors)
        if secs is not None:
            logger.info("%s (%.3f sec)", line, secs)
        else:
            logger.info("%s", line)

    def after_run(self, run_context: SessionRunContext, run_values: SessionRunValues) -> None:
        if self._should_trigger:
            self._log_tensors(run_values.results)
        self._iter_count += 1

    def end(self, session: Any) -> None:
        if self._at_end:
            self._log_tensors(api.evaluate(self._tensors))


class FinalOpsHook(SessionRunHook):
    """Reads ``final_ops`` (tensors, variables, callables or a structure) at ``end()``: ``final_ops_values``."""

    def __init__(self, final_ops: Any, final_ops_feed_dict: Any = None) -> None:
        if final_ops_feed_dict is not None:
            api.warn_once("final.feed", "FinalOpsHook(final_ops_feed_dict=...) is ignored in TF2: make final_ops a "
                                        "callable that takes what it needs")
        self._final_ops = final_ops
        self._final_ops_values: Any = None

    @property
    def final_ops_values(self) -> Any:
        return self._final_ops_values

    def end(self, session: Any) -> None:
        if self._final_ops is not None:
            self._final_ops_values = api.evaluate(self._final_ops)


class GlobalStepWaiterHook(SessionRunHook):
    """Delays training until the global step reaches ``wait_until_step`` (TF: a worker waiting for
    the chief). procsv runs one trainer, whose own steps are the only ones that advance the global
    step, so waiting could never end: if the step is below it, this logs a warning and starts."""

    def __init__(self, wait_until_step: int) -> None:
        self._wait_until_step = wait_until_step
        self._started = False
        self._gs: Any = None

    def begin(self) -> None:
        self._started = False
        self._gs = _need_global_step("GlobalStepWaiterHook")

    def before_run(self, run_context: SessionRunContext) -> Optional[SessionRunArgs]:
        if self._started:
            return None
        self._started = True
        step = api.read_step(self._gs)
        if self._wait_until_step > 0 and step < self._wait_until_step:
            api.warn_once("waiter", f"GlobalStepWaiterHook: the global step is {step}, below wait_until_step="
                                    f"{self._wait_until_step}, and nothing else advances it (one trainer): starting now")
        return None


class FeedFnHook(SessionRunHook):
    """Calls ``feed_fn()`` before every step; its mapping reaches the step function as its
    ``feed_dict`` keyword argument (TF2 has no placeholders to feed)."""

    def __init__(self, feed_fn: Callable[[], Mapping[Any, Any]]) -> None:
        self.feed_fn = feed_fn

    def before_run(self, run_context: SessionRunContext) -> Optional[SessionRunArgs]:
        return SessionRunArgs(fetches=None, feed_dict=dict(self.feed_fn()))


class ProfilerHook(SessionRunHook):
    """Traces one step with ``tf.profiler.experimental`` every ``save_steps`` or ``save_secs``, into
    ``output_dir`` (default: the logdir; TensorBoard's Profile tab reads ``plugins/profile``). As
    TF, the first run is not traced. ``show_dataflow``/``show_memory`` are accepted and ignored."""

    def __init__(self, save_steps: Optional[int] = None, save_secs: Optional[float] = None, output_dir: str = "",
                 show_dataflow: bool = True, show_memory: bool = False) -> None:
        self._timer = SecondOrStepTimer(every_secs=save_secs, every_steps=save_steps)
        self._output_dir = output_dir
        self._next_step: Optional[int] = None
        self._tracing = False
        self._gs: Any = None
        self.traced_steps: list[int] = []

    def begin(self) -> None:
        self._next_step = None
        self._gs = _need_global_step("ProfilerHook")

    def after_create_session(self, session: Any, coord: Any) -> None:
        self._timer.clock = _clock(session)
        if not self._output_dir:
            sv = _sv(session)
            self._output_dir = sv.logdir if sv is not None else os.getcwd()

    def before_run(self, run_context: SessionRunContext) -> Optional[SessionRunArgs]:
        import tensorflow as tf

        if self._next_step is not None and self._timer.should_trigger_for_step(self._next_step):
            try:
                tf.profiler.experimental.start(self._output_dir)
                self._tracing = True
            except tf.errors.OpError as exc:  # another profiler session is running
                api.warn_once("profiler", f"ProfilerHook: could not start a trace ({exc}); skipping")
        return None

    def after_run(self, run_context: SessionRunContext, run_values: SessionRunValues) -> None:
        import tensorflow as tf

        step = api.read_step(self._gs)
        if self._tracing:
            tf.profiler.experimental.stop()
            self._tracing = False
            self._timer.update_last_triggered_step(step)
            self.traced_steps.append(step)
        self._next_step = step + 1


__all__ = [
    "StopAtStepHook", "NanTensorHook", "NanLossDuringTrainingError", "CheckpointSaverListener", "CheckpointSaverHook",
    "SummarySaverHook", "StepCounterHook", "LoggingTensorHook", "FinalOpsHook", "GlobalStepWaiterHook", "FeedFnHook",
    "ProfilerHook", "write_summary",
]
