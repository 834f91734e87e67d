"""TensorFlow's standard hooks that watch each step and report it: NaN check, summaries, step rate, logging
(and profiling, re-exported from :mod:`procsv.trainer.monitored.profiler_hook`).

Runs in the trainer process, in its main thread (called by ``MonitoredSession.run``). Each hook
keeps TF's constructor, validation and call pattern (``tf.compat.v1.train.*Hook``), with TF2's and
procsv's differences (see :mod:`procsv.trainer.monitored.basic_hooks`, which re-exports all of them):
fetches are tensors, variables or callables read after the step; summaries go to the summary
service through the session's :class:`procsv.Supervisor`; timers read its monotonic clock. Log
lines go to the ``procsv.train`` logger at INFO.

In graph mode (a TF1 program, :func:`procsv.trainer.monitored.hooks.graph_mode` at ``begin()``)
each keeps TF1's meaning on tensors: the global step and the hook's tensors are fetched in the
same ``session.run`` (:mod:`procsv.trainer.monitored.graph_hooked`), the step read again after
the run when a timer triggers, as TF; summaries go through the session's Supervisor
(``summary_computed``), or, on a session without one, to ``output_dir`` with TF's
``FileWriterCache``.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Mapping, Optional

import numpy as np

from procsv.trainer.monitored import hooks as api
from procsv.trainer.monitored.hook_support import (clock_of, front_end_of, global_step_fetch, graph_mode, need_global_step,
                                                  read_global_step, supervisor_of, warn_if_not_logdir)
from procsv.trainer.monitored.profiler_hook import ProfilerHook
from procsv.trainer.tf1_objects import SummaryWriterShim
from procsv.trainer.monitored.hooks import (NeverTriggerTimer, SecondOrStepTimer, SessionRunArgs, SessionRunContext,
                                  SessionRunHook, SessionRunValues)


# ---------------------------------------------------------------------------- NaN
class NanLossDuringTrainingError(RuntimeError):
    """The loss became NaN (:class:`NanTensorHook`). The watchdog knows it by this name (``program_errors``).
    What the hook raises is also TF's ``tf.compat.v1.train.NanLossDuringTrainingError`` (:func:`nan_loss_error`)."""

    def __str__(self) -> str:
        return "NaN loss during training."


@functools.lru_cache(maxsize=1)
def nan_loss_error() -> type[NanLossDuringTrainingError]:
    """The class a NaN loss raises: procsv's and TF's at once (both ``RuntimeError`` s of that name), so that a
    program swapped to ``procsv.train`` catches it with either ``except`` (made when first raised: TensorFlow
    is loaded by then, and importing ``procsv.train`` does not load it)."""
    import tensorflow as tf

    return type("NanLossDuringTrainingError", (NanLossDuringTrainingError, tf.compat.v1.train.NanLossDuringTrainingError),
                {"__module__": __name__, "__doc__": NanLossDuringTrainingError.__doc__})


class NanTensorHook(SessionRunHook):
    """Raises :class:`NanLossDuringTrainingError` (or requests a stop) when the loss is NaN.

    ``loss_tensor`` is read after every step: a tensor, a variable, a callable, or None for what
    the step function returned (any NaN in it counts).
    """

    def __init__(self, loss_tensor: Any, fail_on_nan_loss: bool = True) -> None:
        self._loss = loss_tensor
        self._fail = fail_on_nan_loss

    @property
    def fail_on_nan_loss(self) -> bool:
        """True: a NaN loss raises; False: it stops the training cleanly (procsv commits no checkpoint of it)."""
        return self._fail

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
                api.tf_logging().error(message)
                raise nan_loss_error()
            api.tf_logging().warning(message)
            run_context.request_stop()
            front = front_end_of(supervisor_of(run_context.session))
            if front is not None:  # the program's stop: its state is not committed, and no exit 4 for it
                front.rollback.program_stopped_on_nonfinite()


# ---------------------------------------------------------------------------- summaries, step rate
class SummarySaverHook(SessionRunHook):
    """Writes ``summary_op`` (or ``scaffold.summary_op``) every ``save_steps`` or ``save_secs``,
    at the global step, through the summary service. ``summary_op`` in TF2: a callable returning
    ``{tag: value}`` (scalars; arrays become histograms), a ``Summary`` proto or its bytes; a mapping
    of tags to tensors, variables or callables; or a list of those. Without ``summary_writer`` the
    summary service writes the logdir's event files (``output_dir`` should be the logdir). Graph
    mode, as TF: a passed ``summary_writer`` (a ``tf.compat.v1.summary.FileWriter``, or
    ``sv.summary_writer``) gets the summaries, and a ``SessionLog`` START at the first run, in its
    own directory, and is flushed at ``end()``; in eager mode only ``sv.summary_writer`` has a meaning
    (TF1's ``FileWriter`` does not work under eager execution): another writer is warned about once
    and ignored."""

    def __init__(self, save_steps: Optional[int] = None, save_secs: Optional[float] = None,
                 output_dir: Optional[str] = None, summary_writer: Any = None, scaffold: Any = None,
                 summary_op: Any = None) -> None:
        if (scaffold is None and summary_op is None) or (scaffold is not None and summary_op is not None):
            raise ValueError("Exactly one of scaffold or summary_op must be provided.")
        self._writer = summary_writer
        self._timer = SecondOrStepTimer(every_secs=save_secs, every_steps=save_steps)
        self._output_dir = output_dir
        self._scaffold = scaffold
        self._summary_op = summary_op
        self._sv: Any = None
        self._session: Any = None
        self._gs: Any = None  # graph mode: the global step, fetched with every run
        self._next_step: Optional[int] = None
        self._request_summary = False

    def begin(self) -> None:
        self._gs = global_step_fetch("SummarySaverHook") if graph_mode() else None
        self._next_step = None
        if self._writer is not None and self._gs is None and not isinstance(self._writer, SummaryWriterShim):
            api.warn_once("summary.writer", "SummarySaverHook(summary_writer=...) is ignored in an eager program: "
                                            "procsv's summary service writes the logdir's event files")

    def after_create_session(self, session: Any, coord: Any) -> None:
        self._sv = supervisor_of(session)
        self._session = session
        self._timer.clock = clock_of(session)
        if self._writer is None:  # (a writer's own directory is where its summaries go, as TF)
            warn_if_not_logdir("SummarySaverHook", self._output_dir, session)

    def _ops(self) -> list[Any]:
        op = self._summary_op if self._summary_op is not None else getattr(self._scaffold, "summary_op", None)
        if op is None:
            return []
        return list(op) if isinstance(op, (list, tuple)) else [op]

    def before_run(self, run_context: SessionRunContext) -> Optional[SessionRunArgs]:
        if self._gs is None:
            return None
        self._request_summary = self._next_step is None or self._timer.should_trigger_for_step(self._next_step)
        requests: dict[str, Any] = {"global_step": self._gs}
        if self._request_summary and self._ops():
            requests["summary"] = self._ops()
        return SessionRunArgs(requests)

    def after_run(self, run_context: SessionRunContext, run_values: SessionRunValues) -> None:
        if self._gs is not None:
            self._graph_after_run(run_context, run_values)
            return
        step = api.read_step(self._sv.global_step)
        if not self._timer.should_trigger_for_step(step):
            return
        self._timer.update_last_triggered_step(step)
        op = self._summary_op if self._summary_op is not None else getattr(self._scaffold, "summary_op", None)
        if op is not None:
            write_summary(self._sv, op, step)

    def _graph_after_run(self, run_context: SessionRunContext, run_values: SessionRunValues) -> None:
        step = int(run_values.results["global_step"]) + 1
        if self._next_step is None or self._request_summary:
            step = int(run_context.session.run(self._gs))
        writer = self._writer
        if self._next_step is None and writer is not None and not isinstance(writer, SummaryWriterShim):
            import tensorflow as tf

            writer.add_session_log(tf.compat.v1.SessionLog(status=tf.compat.v1.SessionLog.START), step)
        if self._request_summary:
            self._timer.update_last_triggered_step(step)
            for summary in run_values.results.get("summary", []):
                write_graph_summary(self._sv, self._session, self._output_dir, summary, step, writer)
        self._next_step = step + 1

    def end(self, session: Any) -> None:
        if self._writer is not None and self._gs is not None:
            self._writer.flush()  # as TF


def write_graph_summary(sv: Any, session: Any, output_dir: Optional[str], summary: Any, step: int,
                        writer: Any = None) -> None:
    """Graph mode: write a ``Summary`` (proto or bytes) at ``step`` with the hook's ``writer`` if it
    was given one (TF's ``summary_writer=``), else through the Supervisor, or, on a session without
    one, into ``output_dir`` with TF's ``FileWriterCache`` (nothing without any)."""
    if writer is not None:
        writer.add_summary(summary, step)
    elif sv is not None:
        sv.summary_computed(session, summary, step)
    elif output_dir:
        import tensorflow as tf

        tf.compat.v1.summary.FileWriterCache.get(output_dir).add_summary(summary, step)


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
    ``every_n_secs``, through the summary service; graph mode, as TF: into ``summary_writer`` if one
    is passed (its own directory), the tag is ``<the global step's op name>/sec``, and a run that
    did not advance the global step is warned about (``tf.compat.v1.logging``, the first 5 times).
    Eager mode: as :class:`SummarySaverHook`'s ``summary_writer``."""

    def __init__(self, every_n_steps: Optional[int] = 100, every_n_secs: Optional[float] = None,
                 output_dir: Optional[str] = None, summary_writer: Any = None) -> None:
        if (every_n_steps is None) == (every_n_secs is None):
            raise ValueError("exactly one of every_n_steps and every_n_secs should be provided.")
        self._timer = SecondOrStepTimer(every_steps=every_n_steps, every_secs=every_n_secs)
        self._output_dir = output_dir
        self._writer = summary_writer
        self._sv: Any = None
        self._session: Any = None
        self._gs: Any = None
        self._graph = False
        self._tag = "global_step/sec"
        self._steps_per_run = 1
        self._last_stale: Optional[int] = None
        self.last_rate: Optional[float] = None

    def _set_steps_per_run(self, steps_per_run: int) -> None:
        """TF's protocol for runs that advance the global step by ``steps_per_run``: the step is read
        again after a run only when the step before it plus ``steps_per_run`` may trigger."""
        self._steps_per_run = steps_per_run

    def begin(self) -> None:
        self._graph = graph_mode()
        self._gs = global_step_fetch("StepCounterHook") if self._graph else need_global_step("StepCounterHook")
        self._last_stale = None
        if self._graph:
            self._tag = api.get_global_step().op.name + "/sec"  # as TF
        if self._writer is not None and not self._graph and not isinstance(self._writer, SummaryWriterShim):
            api.warn_once("step_counter.writer", "StepCounterHook(summary_writer=...) is ignored in an eager program: "
                                                 "procsv's summary service writes the logdir's event files")

    def after_create_session(self, session: Any, coord: Any) -> None:
        self._sv = supervisor_of(session)
        self._session = session
        self._timer.clock = clock_of(session)
        if not self._graph:  # graph mode, as TF: the first run's step starts the count
            self._timer.update_last_triggered_step(read_global_step(session, self._gs))

    def before_run(self, run_context: SessionRunContext) -> Optional[SessionRunArgs]:
        return SessionRunArgs(self._gs) if self._graph else None

    def after_run(self, run_context: SessionRunContext, run_values: SessionRunValues) -> None:
        if self._graph:
            self._graph_after_run(run_context, int(run_values.results))
            return
        step = api.read_step(self._sv.global_step)
        if self._timer.should_trigger_for_step(step):
            self._record(step)

    def _graph_after_run(self, run_context: SessionRunContext, stale: int) -> None:
        """As TF: the fetched value may be from before this run's increment; read it again to count."""
        if self._timer.should_trigger_for_step(stale + self._steps_per_run):
            step = int(run_context.session.run(self._gs))
            if self._timer.should_trigger_for_step(step):
                self._record(step, run_context.session)
        if stale == self._last_stale:
            log = api.tf_logging()
            log.log_first_n(log.WARN, "It seems that global step (tf.train.get_global_step) has not been increased. "
                            "Current value (could be stable): %s vs previous value: %s. You could increase the global "
                            "step by passing tf.train.get_global_step() to Optimizer.apply_gradients or "
                            "Optimizer.minimize.", 5, stale, self._last_stale)
        self._last_stale = stale

    def _record(self, step: int, session: Any = None) -> None:
        secs, steps = self._timer.update_last_triggered_step(step)
        if secs is None or steps is None or secs <= 0:
            return
        self.last_rate = steps / secs
        api.tf_logging().info("%s: %g", self._tag, self.last_rate)
        if self._graph:  # a Summary proto, as TF's hook writes it
            import tensorflow as tf

            summary = tf.compat.v1.Summary(value=[tf.compat.v1.Summary.Value(tag=self._tag,
                                                                             simple_value=self.last_rate)])
            write_graph_summary(self._sv, session if session is not None else self._session, self._output_dir,
                                summary.SerializeToString(), step, self._writer)
        elif self._sv is not None:
            self._sv.log_scalar(self._tag, self.last_rate, step)


# ---------------------------------------------------------------------------- logging, profiling
class LoggingTensorHook(SessionRunHook):
    """Logs ``tensors`` every ``every_n_iter`` runs or ``every_n_secs`` seconds, and/or at the end.

    ``tensors``: a mapping of tags to tensors, variables or callables, or a list of them (tagged
    by their ``name`` or ``__name__``, else ``tensor_<i>``). ``formatter(values)`` returns the line.
    In graph mode they may also be tensor names (``"loss:0"``, or an op name ``"loss"`` for its
    only output), found in the graph at ``begin()``, as TF.
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
                if isinstance(item, str) and not graph_mode():
                    raise ValueError(f"tensor names ({item!r}) have no meaning in TF2: pass the tensors, "
                                     "variables or callables themselves")
                tag = item if isinstance(item, str) else (getattr(item, "name", None) or getattr(item, "__name__", None)
                                                          or f"tensor_{i}")
                self._tensors[str(tag)] = item
        self._timer: SecondOrStepTimer = (NeverTriggerTimer() if only_at_end
                                          else SecondOrStepTimer(every_secs=every_n_secs, every_steps=every_n_iter))
        self._at_end = at_end
        self._formatter = formatter
        self._iter_count = 0
        self._should_trigger = False
        self._fetches: dict[str, Any] = self._tensors
        self._graph = False

    def begin(self) -> None:
        self._timer.reset()
        self._iter_count = 0
        self._graph = graph_mode()
        if self._graph:
            import tensorflow as tf

            graph = tf.compat.v1.get_default_graph()
            self._fetches = {tag: _as_graph_element(graph, t) for tag, t in self._tensors.items()}

    def after_create_session(self, session: Any, coord: Any) -> None:
        self._timer.clock = clock_of(session)

    def before_run(self, run_context: SessionRunContext) -> Optional[SessionRunArgs]:
        self._should_trigger = self._timer.should_trigger_for_step(self._iter_count)
        return SessionRunArgs(self._fetches) if self._should_trigger else None

    def _log_tensors(self, values: dict[str, Any]) -> None:
        secs, _ = self._timer.update_last_triggered_step(self._iter_count)
        with np.printoptions(suppress=True):
            if self._formatter is not None:
                api.tf_logging().info(self._formatter(values))
                return
            line = ", ".join(f"{tag} = {values[tag]}" for tag in self._tensors)
        if secs is not None:
            api.tf_logging().info("%s (%.3f sec)", line, secs)
        else:
            api.tf_logging().info("%s", line)

    def after_run(self, run_context: SessionRunContext, run_values: SessionRunValues) -> None:
        if self._should_trigger:
            self._log_tensors(run_values.results)
        self._iter_count += 1

    def end(self, session: Any) -> None:
        if self._at_end:
            self._log_tensors(session.run(self._fetches) if self._graph else api.evaluate(self._tensors))


def _as_graph_element(graph: Any, obj: Any) -> Any:
    """A tensor name (or an op name, for its only output) as the graph's tensor; anything else as is."""
    if not isinstance(obj, str):
        return obj
    if ":" in obj:
        return graph.as_graph_element(obj)
    element = graph.as_graph_element(obj + ":0")
    try:
        graph.as_graph_element(obj + ":1")
    except (KeyError, ValueError):
        return element
    raise ValueError(f"Name {obj} is ambiguous, as this `Operation` has multiple outputs (at least 2).")


__all__ = [
    "NanTensorHook", "NanLossDuringTrainingError", "SummarySaverHook", "write_summary", "StepCounterHook",
    "LoggingTensorHook", "ProfilerHook", "write_graph_summary",
]
