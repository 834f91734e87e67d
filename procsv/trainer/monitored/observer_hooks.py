"""TensorFlow's standard hooks that watch each step and report it: NaN check, summaries, step rate, logging, profiling.

Runs in the trainer process, in its main thread (called by ``MonitoredSession.run``). Each hook
keeps TF's constructor, validation and call pattern (``tf.compat.v1.train.*Hook``), with TF2's and
procsv's differences (see :mod:`procsv.trainer.monitored.basic_hooks`, which re-exports all of them):
fetches are tensors, variables or callables read after the step; summaries go to the summary
service through the session's :class:`procsv.Supervisor`; timers read its monotonic clock. Log
lines go to the ``procsv.train`` logger at INFO.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Mapping, Optional

import numpy as np

from procsv.trainer.monitored import hooks as api
from procsv.trainer.monitored.hook_support import clock_of, need_global_step, supervisor_of, warn_if_not_logdir
from procsv.trainer.monitored.hooks import (NeverTriggerTimer, SecondOrStepTimer, SessionRunArgs, SessionRunContext,
                                  SessionRunHook, SessionRunValues, logger)


# ---------------------------------------------------------------------------- NaN
class NanLossDuringTrainingError(RuntimeError):
    """The loss became NaN (:class:`NanTensorHook`). The watchdog knows it by this name (``program_errors``)."""

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


# ---------------------------------------------------------------------------- summaries, step rate
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
        self._sv = supervisor_of(session)
        self._timer.clock = clock_of(session)
        warn_if_not_logdir("SummarySaverHook", self._output_dir, session)

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
        need_global_step("StepCounterHook")

    def after_create_session(self, session: Any, coord: Any) -> None:
        self._sv = supervisor_of(session)
        self._timer.clock = clock_of(session)
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


# ---------------------------------------------------------------------------- logging, profiling
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
        self._timer.clock = clock_of(session)

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
        self._gs = need_global_step("ProfilerHook")

    def after_create_session(self, session: Any, coord: Any) -> None:
        self._timer.clock = clock_of(session)
        if not self._output_dir:
            sv = supervisor_of(session)
            self._output_dir = sv.logdir if sv is not None and sv.logdir is not None else os.getcwd()

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
    "NanTensorHook", "NanLossDuringTrainingError", "SummarySaverHook", "write_summary", "StepCounterHook",
    "LoggingTensorHook", "ProfilerHook",
]
