"""The Supervisor's graph-mode methods (a mixin): its session, its start, its summaries, its saver.

Runs in the trainer process, on the thread that prepares the session. In graph mode
(``Supervisor._tf1.graph`` is a :class:`procsv.trainer.graph.defaults.GraphSetup`) the session is
a :class:`GraphSession` over a ``tf.compat.v1.Session`` of the program's graph; a fresh start runs
``init_op`` (with ``init_feed_dict``) then ``init_fn(sess)``, a restore neither; then, either way,
``local_init_op`` and the ``ready_op`` check, as TF's ``SessionManager.prepare_session``. At a step
boundary every ``save_summaries_secs`` the chief runs ``summary_op`` with the feed_dict of the run
that made the step and hands the serialized ``Summary`` to the summary service. ``sv.saver.save``
commits through the checkpoint service.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any, Callable, Optional

from procsv.ipc.messages import Busy, SaveReason
from procsv.trainer.graph.session import GraphSession
from procsv.trainer.graph.session_manager import finish_preparation, initialize
from procsv.trainer.monitored.hooks import warn_once
from procsv.trainer.tf1_args import Tf1Choices


class GraphMethods:
    """Graph mode's part of the Supervisor (it owns no state beyond the GraphSetup's)."""

    _tf1: Tf1Choices
    _session: Any
    _state: Any
    _ckpt: Any
    _channels: Any
    coord: Any
    is_chief: bool
    init_fn: Optional[Callable[[Any], None]]
    stop_grace_secs: float
    checkpoint_basename: str
    logdir: str
    _report_busy: Callable[[Busy], None]
    _flush_summaries: Callable[..., None]
    summary_computed: Callable[..., None]
    start_queue_runners: Callable[..., list[Any]]
    should_stop: Callable[[], bool]

    def _open_session(self, master: str, config: Any) -> GraphSession:
        """A new session of the graph (not live: no boundaries until :meth:`_graph_ready`)."""
        import tensorflow as tf

        setup = self._tf1.graph
        raw = tf.compat.v1.Session(master, graph=setup.graph, config=config)
        forget = getattr(setup.step, "forget", None)
        if forget is not None:
            forget()  # a new session: the step is read again, never the last session's
        setup.session = GraphSession(self, raw, setup.probe, getattr(setup.step, "observe", None))
        return setup.session  # type: ignore[no-any-return]

    def _graph_initialize(self) -> None:
        """A fresh start (nothing restored): ``init_op`` with ``init_feed_dict``, then ``init_fn``,
        ``local_init_op`` and the ready check."""
        setup = self._tf1.graph
        initialize(self._session, setup.init_op, setup.init_feed_dict, self.init_fn,
                   getattr(setup.session_manager, "_local_init_op", None))
        # ready before anything reads the state (the checkpoint agent reads the global step next)
        finish_preparation(setup.session_manager, self._session, setup.init_op, self.init_fn)
        setup.prepared = True

    def _graph_ready(self, start_queue_runners: bool) -> None:
        """After the restore or the initialization: ``local_init_op``, the ready check (TF's
        ``RuntimeError`` if not ready), and the session goes live; then, as TF with
        ``start_standard_services``, the graph's queue runners start."""
        setup = self._tf1.graph
        sess = setup.session
        if not setup.prepared:  # restored: local_init_op and the ready check now
            finish_preparation(setup.session_manager, sess, setup.init_op, self.init_fn)
        setup.prepared = False  # (for the next session)
        observe = getattr(setup.step, "observe", None)
        if observe is not None:
            observe(int(sess.raw.run(setup.global_step)))
        sess.live = True
        if start_queue_runners:
            self.start_queue_runners(sess)

    def _graph_summary(self) -> None:
        """Every ``save_summaries_secs``, at a step boundary (chief only): ``summary_op``."""
        setup = self._tf1.graph
        sess = setup.session
        if setup.summary_op is None or not self.is_chief or sess is None or not sess.live:
            return
        import tensorflow as tf

        try:
            value = sess.raw.run(setup.summary_op, feed_dict=sess.step_feed)
        except tf.errors.OpError as exc:
            if not setup.summary_default:
                self.coord.request_stop(exc)  # TF's summary thread stopped the training with it
                return
            setup.summary_op = None
            setup.summary_off = exc.message.splitlines()[0] if exc.message else type(exc).__name__
            print(f"procsv: warning: the default summary_op (merge_all) cannot run at a step boundary, even with "
                  f"the feed_dict of the step's run ({setup.summary_off}); it is turned off. Compute summaries "
                  "in your run and pass them to sv.summary_computed(sess, summary)", file=sys.stderr, flush=True)
            return
        self.summary_computed(sess, value, self._state.step)

    @property
    def _graph_saver(self) -> Optional["GraphSaver"]:
        saver = self._tf1.graph.saver
        return None if saver is None else GraphSaver(saver, self)

    def _save_now(self, save_path: str) -> Optional[str]:
        """``sv.saver.save``: commit the current step through the checkpoint service now (from the
        session's thread; from another thread at its next step boundary). The path of the
        checkpoint, or None (no checkpoints here: a worker, no session, checkpoints off)."""
        agent = self._ckpt
        if agent is None or self._channels is None or not self.is_chief:
            return None
        prefix = os.path.join(self.logdir, self.checkpoint_basename)
        if os.path.abspath(save_path) != prefix:
            warn_once("Supervisor.saver.save", f"saver.save(sess, {save_path!r}): procsv's checkpoint service "
                                               f"writes the checkpoints into the logdir, as {prefix}-<step>")
        step = self._state.step
        sess = self._tf1.graph.session
        if sess is None or threading.get_ident() != sess._owner:
            agent.request(SaveReason.PERIODIC)
            return f"{prefix}-{step}"
        self._report_busy(Busy.FINAL_CHECKPOINT)
        try:
            self._flush_summaries(force=False, urgent=True)  # hand off before the commit, as at a step
            agent.final(self._channels, step, SaveReason.PERIODIC, self.stop_grace_secs)
        finally:
            self._report_busy(Busy.NONE)
            self._state.open_checkpoint()
        return f"{prefix}-{step}" if agent.last_committed >= step else None


class GraphSaver:
    """``sv.saver`` in graph mode: the program's ``tf.compat.v1.train.Saver``, whose ``save`` asks
    the checkpoint service for an atomic commit (manifest, retention) instead of writing itself."""

    def __init__(self, saver: Any, sv: GraphMethods) -> None:
        self._saver = saver
        self._sv = sv

    def save(self, sess: Any, save_path: str, global_step: Any = None, latest_filename: Any = None,
             meta_graph_suffix: str = "meta", write_meta_graph: bool = True, write_state: bool = True,
             strip_default_attrs: bool = False, save_debug_info: bool = False) -> Optional[str]:
        """Commit the current step through the checkpoint service; its path (``<logdir>/<basename>-<step>``)."""
        return self._sv._save_now(save_path)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._saver, name)
