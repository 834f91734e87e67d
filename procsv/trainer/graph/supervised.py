"""The Supervisor's graph-mode collaborator (:class:`GraphSupervision`): its session, its start, its summaries.

Runs in the trainer process, on the thread that prepares the session. In graph mode (the
Supervisor's TF1 arguments resolved to a :class:`procsv.trainer.graph.defaults.GraphSetup`) the session is
a :class:`GraphSession` over a ``tf.compat.v1.Session`` of the program's graph on ``master``
(``'local'``: an in-process local server's target, :func:`session_target`); a fresh start runs
``init_op`` (with ``init_feed_dict``) then ``init_fn(sess)``, a restore neither; then, either way,
``local_init_op`` and the ``ready_op`` check, as TF's ``SessionManager.prepare_session``. At a step
boundary every ``save_summaries_secs`` the chief runs ``summary_op`` with the feed_dict of the run
that made the step and hands the serialized ``Summary`` to the summary service. When the session
is ready the chief writes the graph to ``<logdir>/graph.pbtxt`` (as TF's ``Supervisor._write_graph``;
atomically) and, unless ``summary_writer=None``, hands its GraphDef to the summary service for the
event file (a :class:`~procsv.ipc.messages.GraphEvent`: TF's ``summary_writer.add_graph``). A
MonitoredSession's Supervisor also hands over the MetaGraphDef (TF's hooks open their writer with
the graph: ``FileWriter(logdir, graph=...)`` writes both), and writes ``graph.pbtxt`` only for a
``CheckpointSaverHook(save_graph_def=True)``, as TF; with ``graph.pbtxt``, each checkpoint gets its
``<prefix>.meta`` (the Saver's MetaGraphDef, written by the checkpoint service beside it, as TF's
``Saver.save(write_meta_graph=True)``). (``sv.saver`` is
:class:`procsv.trainer.tf1_objects.SaverShim`, as in eager mode: its ``save`` commits through the
checkpoint service.)
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any, Callable, Optional

from procsv.common.bootstrap import ChildConfig
from procsv.trainer import replica
from procsv.common.layout import Layout, atomic_write
from procsv.ipc.messages import GraphEvent
from procsv.trainer.channels import TrainerChannels
from procsv.trainer.checkpoint.keeper import CheckpointKeeper
from procsv.trainer.coordinator import Coordinator
from procsv.trainer.graph import readiness
from procsv.trainer import session_type
from procsv.trainer.graph.session import GraphSession
from procsv.trainer.graph.session_manager import finish_preparation, initialize, ready
from procsv.trainer.settings import Settings
from procsv.trainer.step_boundary import StepState


class GraphSupervision:
    """Graph mode's collaborator of the Supervisor: its session of the program's graph, the
    preparation TF's SessionManager did, what the chief writes of the graph, and ``summary_op``.

    Owns the :class:`~procsv.trainer.graph.defaults.GraphSetup` (``setup``: the graph, its ops, its
    Saver, the session of today) and what the chief writes of the graph when the session is ready:
    ``graph.pbtxt`` with ``graph_file_written`` (TF's Supervisor; a MonitoredSession's
    ``CheckpointSaverHook(save_graph_def=True)``), the GraphDef event, and the MetaGraphDef event too
    with ``meta_graph_event`` (a MonitoredSession's, as TF's hooks' writers). Given: the step state and
    the coordinator (the session's steps and stops), the checkpoints (their agent writes each
    checkpoint's ``.meta``), ``summary_computed`` (where ``summary_op``'s value goes), the Supervisor's
    settings (read live), ``commit`` (the final checkpoint, taken when the program closes the session
    before the stop) and the session's channels (:meth:`attach`)."""

    def __init__(self, setup: Any, state: StepState, coord: Coordinator, keeper: Optional[CheckpointKeeper],
                 summary_computed: Callable[..., None], clock: Callable[[], float], settings: Settings,
                 commit: Callable[[], bool], *, chief: bool, layout: Optional[Layout],
                 config: ChildConfig = ChildConfig()) -> None:
        self.setup = setup
        self._config = config  # the launch's: --ps (its parameter servers), graph_fast_run
        self._state = state
        self._coord = coord
        self._keeper = keeper
        self._summary_computed = summary_computed
        self._clock = clock
        self._chief = chief
        self._layout = layout
        self._settings = settings  # init_fn, recovery_wait_secs: read live
        self._commit = commit  # the final checkpoint (StepBoundary.commit_checkpoint)
        self.final_wanted: Callable[[], bool] = lambda: True  # the Supervisor's: save_model_secs=0 saves nothing
        self._channels: Optional[TrainerChannels] = None
        self.graph_file_written = True
        self.meta_graph_event = False
        # TF's Supervisor's checkpoint thread saves once as it starts; a MonitoredSession's hook saves itself
        self.checkpoint_at_start = True
        # TF's Supervisor builds its MetaGraphDef when it is made (the graph of then, the Saver's SaverDef)
        # and writes it after the GraphDef; a MonitoredSession's is built when the session is ready
        self.meta_graph = _meta_graph(setup) if chief and layout is not None and setup.summary_written else None
        self.graph_in_writer = False  # the graph events went to this writer: not again until a stop closes it
        self.max_wait_secs: Optional[float] = 7200  # a non-chief's wait for the chief (as TF's)

    def monitored(self, graph_file: bool) -> None:
        """A MonitoredSession drives this graph: its meta graph event written as TF's hooks write it,
        ``graph.pbtxt`` only if ``graph_file`` (its CheckpointSaverHook's ``save_graph_def``), and no
        checkpoint as the session starts (that hook saves at ``after_create_session``)."""
        self.graph_file_written, self.meta_graph_event = graph_file, True
        self.checkpoint_at_start = False

    def attach(self, channels: TrainerChannels) -> None:
        """A session is prepared: the graph's events go through ``channels``."""
        self._channels = channels

    def detach(self) -> None:
        self._channels = None

    def open_session(self, master: str, config: Any, should_stop: Callable[[], bool]) -> GraphSession:
        """A new session of the graph (not live: no boundaries until :meth:`ready`), whose
        ``should_stop()`` is ``should_stop`` (the Supervisor's)."""
        import tensorflow as tf

        setup = self.setup
        raw = tf.compat.v1.Session(session_target(master), graph=setup.graph, config=config)
        forget = getattr(setup.step, "forget", None)
        if forget is not None:
            forget()  # a new session: the step is read again, never the last session's
        setup.session = session_type.make(GraphSession, "_sess", self._state, should_stop, raw, setup.probe,
                                          getattr(setup.step, "observe", None), before_close=self._before_close,
                                          fast_runs=self._config.launch.graph_fast_run)
        return setup.session  # type: ignore[no-any-return]

    def _before_close(self) -> None:
        """The program closes the live session before ``sv.stop()`` (TF's documented pattern): the
        stop's final checkpoint reads the state through the session, so it is taken now (none when an
        error was recorded, as at the stop); the stop then finds that step committed."""
        if self._coord.exception is None and self._channels is not None and self.final_wanted():
            self._commit()

    def initialize(self) -> None:
        """A fresh start (nothing restored): ``init_op`` with ``init_feed_dict``, then ``init_fn``,
        ``local_init_op`` and the ready check."""
        setup = self.setup
        initialize(setup.session, setup.init_op, setup.init_feed_dict, self._settings.init_fn,
                   getattr(setup.session_manager, "_local_init_op", None))
        # ready before anything reads the state (the checkpoint agent reads the global step next)
        finish_preparation(setup.session_manager, setup.session, setup.init_op, self._settings.init_fn)
        setup.prepared = True

    def worker_restores(self) -> bool:
        """A non-chief (``is_chief=False``): does it restore the chief's newest checkpoint? Only when
        its variables are its own: a session of this process (no target) outside ``--ps``; it then
        waits for the chief's first committed checkpoint (at most ``max_wait_secs``, TF's
        ``DeadlineExceededError`` after) and restores it, never running ``init_op``. A session on a
        server (a target, or ``procsv launch --ps``) may share the chief's variables: restoring or
        initializing them would rewind the chief, so the worker only waits for ``ready_op``
        (:meth:`wait_for_chief`), as TF's ``SessionManager.wait_for_session``."""
        if not self._own_variables() or self._ready_look():
            return False  # shared: wait for ready_op; ready at the first look (nothing to restore), as TF's
        limit = float("inf") if self.max_wait_secs is None else float(self.max_wait_secs)
        replica.wait_for_committed(self._layout, limit, max(0.01, float(self._settings.recovery_wait_secs)),
                                   self._clock)
        return True

    def _own_variables(self) -> bool:
        """The session's variables are this process's own: no target, no ``--ps``."""
        session = self.setup.session
        return not self._config.place.ps and not (session is not None and session.sess_str)

    def _ready_look(self) -> bool:
        """One look, as TF's ``wait_for_session``: ``local_init_op`` once it may run, then ``ready_op``;
        True (and the session marked prepared) when ready. (procsv adds no variable to the program's graph:
        a graph without a global step has its runs counted in Python, so there is nothing of procsv's to set.)"""
        setup = self.setup
        manager, session = setup.session_manager, setup.session
        setup.prepared = bool(manager._try_run_local_init_op(session)[0]) and ready(manager._ready_op, session)[0]
        return bool(setup.prepared)

    def wait_for_chief(self) -> None:
        """A non-chief worker (``is_chief=False``) whose variables are the chief's (a session on a
        server, or ``procsv launch --ps N --workers M``: the parameter servers hold them), where the
        chief initializes them or restores the newest checkpoint; wait
        until ``ready_op`` reports none uninitialized (as TF's ``SessionManager.wait_for_session``),
        never restoring or initializing them itself; each look runs ``local_init_op`` once
        ``ready_for_local_init_op`` allows, then ``ready_op``, as TF's. Under ``--ps`` the chief's notice (:mod:`procsv.trainer.graph.readiness`)
        wakes the wait at once; without one, a look every ``recovery_wait_secs`` but at least every 2 s. As TF's,
        ``DeadlineExceededError`` when the model is still not ready ``max_wait_secs`` after the wait
        began (``prepare_or_wait_for_session(max_wait_secs=)``, 7200 by default; a
        ``WorkerSessionCreator``'s and ``MonitoredTrainingSession``'s own ``max_wait_secs``). A stop
        requested meanwhile raises :class:`~procsv.common.errors.TrainingStopped` (a clean stop)."""
        poll = min(readiness.FALLBACK_POLL_SECS, max(0.01, float(self._settings.recovery_wait_secs)))
        limit = float("inf") if self.max_wait_secs is None else float(self.max_wait_secs)
        if self.setup.prepared:
            return  # ready at the first look (worker_restores)
        waited = readiness.wait_until_ready(self._ready_look, self._layout, poll, limit, self._coord.should_stop,
                                            self._clock)
        if not waited.ready:
            import tensorflow as tf

            raise tf.errors.DeadlineExceededError(None, None, "Session was not ready after waiting %d secs." % limit)
        if waited.looks > 1:
            print(f"procsv: waited {waited.seconds:.2f} s for the chief to make the model ready ({waited.looks} "
                  f"looks at ready_op, {waited.woken_by_notice} woken by the chief's notice)", file=sys.stderr,
                  flush=True)

    def ready(self, start_queue_runners: Callable[[Any], Any], start: bool) -> None:
        """After the restore or the initialization: ``local_init_op``, the ready check (TF's
        ``RuntimeError`` if not ready), and the session goes live; then, as TF with
        ``start_standard_services`` (``start``), the graph's queue runners start."""
        setup = self.setup
        sess = setup.session
        self._go_live(prepared=setup.prepared)
        if self._chief and self._config.place.ps:  # --ps: the waiting workers look at ready_op now
            readiness.tell_ready(self._layout, int(setup.step.numpy()))
        if self._chief and self._layout is not None:  # TF: the chief
            if self.graph_file_written:
                write_graph(setup.graph, self._layout.logdir)
                agent = self._keeper.agent if self._keeper is not None else None
                if agent is not None and setup.saver is not None:  # TF's Saver.save writes <prefix>.meta
                    with setup.graph.as_default():
                        agent.meta_graph = setup.saver.export_meta_graph().SerializeToString()
            if setup.summary_written and self._channels is not None and not self.graph_in_writer:
                self._graph_events(setup)
        if start:
            start_queue_runners(sess)
            if self._settings.save_summaries_secs:  # TF's summary thread runs summary_op once as it starts
                self.summary(at_start=int(setup.step.numpy()))

    def replaying(self, start_queue_runners: Callable[[Any], Any], start: bool) -> None:
        """An auditor's session (issue 71), checkpoint S1 restored in it: ``local_init_op``, the ready check
        and the session live, the queue runners started as :meth:`ready` starts them; nothing written (no
        ``graph.pbtxt``, no graph events, no ``summary_op`` at the start): the replay has no side effect."""
        self._go_live(prepared=False)
        if start:
            start_queue_runners(self.setup.session)

    def _go_live(self, prepared: bool) -> None:
        """``local_init_op`` and the ready check unless ``prepared`` (a session initialized, not restored, had
        them), the step counter told the session's global step, and the session live."""
        setup = self.setup
        sess = setup.session
        if not prepared:  # restored: local_init_op and the ready check now
            finish_preparation(setup.session_manager, sess, setup.init_op, self._settings.init_fn)
        setup.prepared = False  # (for the next session)
        observe = getattr(setup.step, "observe", None)
        if observe is not None and setup.global_step is not None:
            observe(int(sess.raw.run(setup.global_step)))
        sess.live = True

    def _graph_events(self, setup: Any) -> None:
        """The GraphDef (as TF's ``add_graph``: with shapes, at step 0), then the MetaGraphDef: the
        Supervisor's of its construction (TF's ``_write_graph``), or with ``meta_graph_event`` one of the
        graph now (TF's CheckpointSaverHook), to the summary service. As TF's, once per writer: again only
        after a stop that closed it (:meth:`writer_closed`)."""
        assert self._channels is not None
        graph_def = setup.graph.as_graph_def(add_shapes=True)
        self._channels.to_summary(GraphEvent(0, time.time()), [graph_def.SerializeToString()])
        meta = _meta_graph(setup, graph_def) if self.meta_graph_event else self.meta_graph
        if meta is not None:
            self._channels.to_summary(GraphEvent(0, time.time(), meta=True), [meta])
        self.graph_in_writer = True

    def writer_closed(self) -> None:
        """A stop closed the summary writer (wrote SessionLog STOP): the next session writes the graph again."""
        self.graph_in_writer = False

    def summary(self, at_start: Optional[int] = None) -> None:
        """Every ``save_summaries_secs``, at a step boundary (chief only): ``summary_op``. ``at_start``
        (the step the session starts at): once as the standard services start, as TF's summary thread;
        a ``summary_op`` that cannot run without a step's feed is left to the step boundaries then."""
        setup = self.setup
        sess = setup.session
        if setup.summary_op is None or not setup.summary_written or not self._chief:
            return  # (no writer: TF's summary_op is sv.summary_op, but nothing runs it)
        if sess is None or not sess.live:
            return
        import tensorflow as tf

        try:
            value = sess.raw.run(setup.summary_op, feed_dict=sess.step_feed)
        except tf.errors.OpError as exc:
            if at_start is not None:
                return
            if not setup.summary_default:
                self._coord.request_stop(exc)  # TF's summary thread stopped the training with it
                return
            setup.summary_op = None
            setup.summary_off = exc.message.splitlines()[0] if exc.message else type(exc).__name__
            print(f"procsv: warning: the default summary_op (merge_all) cannot run at a step boundary, even with "
                  f"the feed_dict of the step's run ({setup.summary_off}); it is turned off. Compute summaries "
                  "in your run and pass them to sv.summary_computed(sess, summary)", file=sys.stderr, flush=True)
            return
        self._summary_computed(sess, value, self._state.step if at_start is None else at_start)


GRAPH_FILE = "graph.pbtxt"
_local_server: Optional[Any] = None
_local_lock = threading.Lock()


def session_target(master: str) -> str:
    """The ``tf.compat.v1.Session`` target of the Supervisor's ``master``: as given, except
    ``'local'``, which the Supervisor page defines as "a session that uses the RPC-based Master
    interface" (see ``tf.distribute.Server.create_local_server``): the target of one in-process
    local server, started at the first such session and kept for the life of the process.
    (TensorFlow 2.21's own ``Session('local')`` has no session factory for it: ``NotFoundError``.)"""
    global _local_server
    if master != "local":
        return master
    with _local_lock:
        if _local_server is None:
            import tensorflow as tf

            _local_server = tf.distribute.Server.create_local_server()
        return str(_local_server.target)


def _meta_graph(setup: Any, graph_def: Any = None) -> bytes:
    """The serialized MetaGraphDef of ``setup``'s graph (``graph_def``, else the graph's now, with shapes)
    with its Saver's SaverDef, as TF's Supervisor and CheckpointSaverHook build it."""
    from tensorflow.python.framework import meta_graph

    if graph_def is None:
        graph_def = setup.graph.as_graph_def(add_shapes=True)
    saver_def = getattr(setup.saver, "saver_def", None)
    return bytes(meta_graph.create_meta_graph_def(graph_def=graph_def, saver_def=saver_def, graph=setup.graph)
                 .SerializeToString())


def write_graph(graph: Any, logdir: str) -> str:
    """``graph`` as a text GraphDef (with shapes, as TF's Supervisor) in ``<logdir>/graph.pbtxt``,
    written aside, fsynced and renamed; returns its path."""
    path = os.path.join(logdir, GRAPH_FILE)
    atomic_write(path, str(graph.as_graph_def(add_shapes=True)))  # a message's str is its text format
    return path
