"""TensorFlow's ``ProfilerHook``: trace one step every N steps or seconds.

Runs in the trainer process, in its main thread (called by ``MonitoredSession.run``). Re-exported
by :mod:`procsv.trainer.monitored.observer_hooks` and :mod:`procsv.trainer.monitored.basic_hooks`.
In eager mode a step is traced with ``tf.profiler.experimental``; in graph mode (a TF1 program) as
TF1 did, with ``RunOptions(trace_level=FULL_TRACE)`` merged into the run
(:mod:`procsv.trainer.monitored.graph_hooked`) and a Chrome-trace timeline written from its step stats.
"""

from __future__ import annotations

import os
from typing import Any, Optional

from procsv.trainer.monitored import hooks as api
from procsv.trainer.monitored.hook_support import clock_of, global_step_fetch, graph_mode, need_global_step, supervisor_of
from procsv.trainer.monitored.hooks import SecondOrStepTimer, SessionRunArgs, SessionRunContext, SessionRunHook, \
    SessionRunValues


class ProfilerHook(SessionRunHook):
    """Traces one step with ``tf.profiler.experimental`` every ``save_steps`` or ``save_secs``, into
    ``output_dir`` (default: the logdir; TensorBoard's Profile tab reads ``plugins/profile``). As
    TF, the first run is not traced. ``show_dataflow``/``show_memory`` are accepted and ignored.
    In graph mode, as TF: the traced run gets ``RunOptions(trace_level=FULL_TRACE)`` and its step
    stats are written as ``timeline-<step>.json`` (Chrome trace format, with ``show_dataflow`` and
    ``show_memory``) into ``output_dir``, and the run's RunMetadata is added (tag ``step_<step>``) to
    the event file of ``output_dir``'s ``SummaryWriterCache`` writer, unless that is the session's
    logdir (where only procsv's summary service writes)."""

    def __init__(self, save_steps: Optional[int] = None, save_secs: Optional[float] = None, output_dir: str = "",
                 show_dataflow: bool = True, show_memory: bool = False) -> None:
        self._timer = SecondOrStepTimer(every_secs=save_secs, every_steps=save_steps)
        self._output_dir = output_dir
        self._show = {"show_dataflow": show_dataflow, "show_memory": show_memory}
        self._next_step: Optional[int] = None
        self._tracing = False
        self._gs: Any = None
        self._graph = False
        self.traced_steps: list[int] = []

    def begin(self) -> None:
        self._next_step = None
        self._graph = graph_mode()
        self._gs = global_step_fetch("ProfilerHook") if self._graph else need_global_step("ProfilerHook")

    def after_create_session(self, session: Any, coord: Any) -> None:
        self._timer.clock = clock_of(session)
        if not self._output_dir:
            sv = supervisor_of(session)
            self._output_dir = sv.logdir if sv is not None and sv.logdir is not None else os.getcwd()

    def before_run(self, run_context: SessionRunContext) -> Optional[SessionRunArgs]:
        import tensorflow as tf

        if self._graph:
            self._tracing = self._next_step is not None and self._timer.should_trigger_for_step(self._next_step)
            options = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE) if self._tracing else None
            return SessionRunArgs({"global_step": self._gs}, options=options)
        if self._next_step is not None and self._timer.should_trigger_for_step(self._next_step):
            try:
                tf.profiler.experimental.start(self._output_dir)
                self._tracing = True
            except tf.errors.OpError as exc:  # another profiler session is running
                api.warn_once("profiler", f"ProfilerHook: could not start a trace ({exc}); skipping")
        return None

    def after_run(self, run_context: SessionRunContext, run_values: SessionRunValues) -> None:
        import tensorflow as tf

        if self._graph:
            self._graph_after_run(run_context, run_values)
            return
        step = api.read_step(self._gs)
        if self._tracing:
            tf.profiler.experimental.stop()
            self._tracing = False
            self._timer.update_last_triggered_step(step)
            self.traced_steps.append(step)
        self._next_step = step + 1

    def _graph_after_run(self, run_context: SessionRunContext, run_values: SessionRunValues) -> None:
        from tensorflow.python.client import timeline

        stale = int(run_values.results["global_step"])
        if self._next_step is None:
            self._timer.update_last_triggered_step(stale)  # as TF: not before N steps or seconds
        step = stale + 1
        if self._tracing:
            self._tracing = False
            step = int(run_context.session.run(self._gs))
            self._timer.update_last_triggered_step(step)
            path = os.path.join(self._output_dir, f"timeline-{step}.json")
            api.tf_logging().info("Saving timeline for %d into '%s'.", step, path)
            os.makedirs(self._output_dir, exist_ok=True)
            with open(path, "w") as fh:
                fh.write(timeline.Timeline(run_values.run_metadata.step_stats).generate_chrome_trace_format(
                    **self._show))
            self.traced_steps.append(step)
            writer = self._metadata_writer(run_context.session)
            if writer is not None:
                writer.add_run_metadata(run_values.run_metadata, "step_%d" % step)
        self._next_step = step + 1

    def _metadata_writer(self, session: Any) -> Any:
        """Graph mode, as TF: the ``SummaryWriterCache`` writer of ``output_dir``, which gets each traced
        run's RunMetadata (TensorBoard's graph page shows it); None when ``output_dir`` is the
        session's logdir, whose event files only procsv's summary service writes."""
        from tensorflow.python.training.summary_io import SummaryWriterCache

        sv = supervisor_of(session)
        if sv is not None and sv.logdir is not None and os.path.abspath(sv.logdir) == os.path.abspath(self._output_dir):
            return None
        return SummaryWriterCache.get(self._output_dir)


__all__ = ["ProfilerHook"]
