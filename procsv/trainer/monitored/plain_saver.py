"""``CheckpointSaverHook`` on a session that is not procsv's: TF's own saving, in the hook.

Runs in the trainer process (or any TF1 program), in the thread that runs the session: the hook
(:class:`procsv.trainer.monitored.basic_hooks.CheckpointSaverHook`) hands its calls here when it
is driven by a plain ``tf.compat.v1.Session`` (TF's ``_HookedSession``, TF's ``MonitoredSession``,
a program's own loop): a graph program whose session has no :class:`procsv.Supervisor`, so no
checkpoint service to save through. Then the hook does what TensorFlow's does, synchronously, in
the calling thread: at ``after_create_session`` it writes ``graph.pbtxt`` (``save_graph_def``),
adds the GraphDef and MetaGraphDef to the directory's ``SummaryWriterCache`` writer and saves the
step it starts at; after a run it saves when its timer says (every ``save_steps``, or ``save_secs``
on TF's clock, ``time.time``), the global step read again after the run; at ``end()`` it saves the
last step unless that one was just saved. Each save is ``Saver.save(session, <dir>/<basename>,
global_step=step)`` (TF's Saver: files written aside and renamed, the ``checkpoint`` file last) with
the listeners' ``before_save``/``after_save`` around it, and a ``SessionLog`` CHECKPOINT event; an
``after_save`` returning True requests a stop after that run. The Saver is the hook's ``saver``,
else its ``scaffold``'s, else the only one of the graph's ``SAVERS`` collection (as TF).
"""

from __future__ import annotations

import os
from typing import Any, Optional, Sequence

from procsv.trainer.monitored import hooks as api
from procsv.trainer.monitored.hooks import SecondOrStepTimer, SessionRunContext, SessionRunValues


class PlainSaving:
    """TF's saving for one :class:`CheckpointSaverHook`: its timer, Saver and listeners (see the
    module docstring). ``gs_read`` is the graph's global step read (TF's, made in ``begin()``)."""

    def __init__(self, checkpoint_dir: str, basename: str, timer: SecondOrStepTimer, saver: Any, scaffold: Any,
                 listeners: Sequence[Any], save_graph_def: bool, gs_read: Any) -> None:
        self._dir = checkpoint_dir
        self._save_path = os.path.join(checkpoint_dir, basename)
        self._timer = timer
        self._saver = saver
        self._scaffold = scaffold
        self._listeners = list(listeners)
        self._save_graph_def = save_graph_def
        self.gs_read = gs_read
        self.steps_per_run = 1000000  # as TF: never skips reading the step, unless told the run's step count

    def _writer(self) -> Any:
        from tensorflow.python.training.summary_io import SummaryWriterCache

        return SummaryWriterCache.get(self._dir)

    def after_create_session(self, session: Any) -> None:
        import tensorflow as tf
        from tensorflow.python.framework import meta_graph
        from tensorflow.python.training import training_util

        step = int(session.run(self.gs_read))
        graph = tf.compat.v1.get_default_graph()
        if self._save_graph_def:
            training_util.write_graph(graph.as_graph_def(add_shapes=True), self._dir, "graph.pbtxt")
        saver = self.saver()
        meta = meta_graph.create_meta_graph_def(graph_def=graph.as_graph_def(add_shapes=True),
                                                saver_def=saver.saver_def if saver is not None else None)
        writer = self._writer()
        writer.add_graph(graph)
        writer.add_meta_graph(meta)
        self.save(session, step)  # the state at the step the session starts at, as TF
        self._timer.update_last_triggered_step(step)

    def after_run(self, run_context: SessionRunContext, run_values: SessionRunValues) -> None:
        stale = int(run_values.results)
        if not self._timer.should_trigger_for_step(stale + self.steps_per_run):
            return
        step = int(run_context.session.run(self.gs_read))  # the value after the run
        if self._timer.should_trigger_for_step(step):
            self._timer.update_last_triggered_step(step)
            if self.save(run_context.session, step):
                run_context.request_stop()

    def end(self, session: Any) -> int:
        """Save the last step unless it was the last saved; return it (for the listeners' ``end``)."""
        step = int(session.run(self.gs_read))
        if step != self._timer.last_triggered_step():
            self.save(session, step)
        return step

    def save(self, session: Any, step: int) -> bool:
        """One checkpoint of ``step``, the listeners around it; True if one of them asks for a stop."""
        from tensorflow.core.util.event_pb2 import SessionLog

        log = api.tf_logging()
        log.info("Calling checkpoint listeners before saving checkpoint %d...", step)
        for listener in self._listeners:
            listener.before_save(session, step)
        log.info("Saving checkpoints for %d into %s.", step, self._save_path)
        self.saver().save(session, self._save_path, global_step=step, write_meta_graph=self._save_graph_def)
        self._writer().add_session_log(SessionLog(status=SessionLog.CHECKPOINT, checkpoint_path=self._save_path),
                                       step)
        log.info("Calling checkpoint listeners after saving checkpoint %d...", step)
        stop = False
        for listener in self._listeners:
            if listener.after_save(session, step):
                log.info("A CheckpointSaverListener requested that training be stopped. listener: %s", listener)
                stop = True
        return stop

    def saver(self) -> Any:
        """The hook's Saver, else its Scaffold's, else the graph's only ``SAVERS`` one (RuntimeError as TF)."""
        import tensorflow as tf

        if self._saver is not None:
            return self._saver
        if self._scaffold is not None:
            return self._scaffold.saver
        savers: Optional[list[Any]] = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.SAVERS)
        if not savers:
            raise RuntimeError("No items in collection savers. Please add a saver to the collection or provide a "
                               "saver or scaffold.")
        if len(savers) > 1:
            raise RuntimeError("More than one item in collection savers. Please indicate which one to use by "
                               "passing it to the constructor.")
        self._saver = savers[0]
        return self._saver


__all__ = ["PlainSaving"]
