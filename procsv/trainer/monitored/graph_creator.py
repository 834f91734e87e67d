"""The session creators' graph mode: a graph-mode :class:`procsv.Supervisor` built from a Scaffold.

Runs in the trainer process, in its main thread (``ChiefSessionCreator.create_session`` /
``WorkerSessionCreator.create_session`` of a TF1 graph program, called by a MonitoredSession).
The first creation fills the Scaffold's defaults, builds the Supervisor from TF's pieces
(``init_op``, ``init_feed_dict``, ``init_fn``, ``ready_op``, ``ready_for_local_init_op``,
``local_init_op`` (fed ``local_init_feed_dict``, as TF), ``saver``; ``summary_op=None``: a MonitoredSession's summaries are its
SummarySaverHook's) and freezes the graph; every creation (the first, and each in-process
recovery after an ``AbortedError``/``UnavailableError``) is ``prepare_or_wait_for_session()`` on
that Supervisor: the newest committed checkpoint restored, or the variables initialized (a
worker under ``procsv launch --ps``: waited for, until its chief made them ready, at most the
``WorkerSessionCreator``'s ``max_wait_secs``, then TF's ``DeadlineExceededError``).
``checkpoint_filename_with_path`` is restored (with the Scaffold's saver, after ``init_op``) when
the logdir has no checkpoint of its own, as in eager mode.
"""

from __future__ import annotations

from typing import Any

from procsv.trainer import session_type


class GraphRawSession:
    """The session hooks, ``StepContext.session`` and ``raw_session()`` get in graph mode: the
    Supervisor's graph session without hooks (its runs are still steps for the Supervisor: progress,
    checkpoints), with ``supervisor`` beside it. Made by :func:`procsv.trainer.session_type.make`: a
    ``tf.compat.v1.Session`` subclass (``isinstance`` holds; ``saver.save(session, path)``, TF's own
    ``CheckpointSaverHook`` and ``start_queue_runners`` take it) that forwards every method of TF's
    session to the Supervisor's; ``as_default()`` is TF's (this session becomes the default)."""

    def __init__(self, session: Any, supervisor: Any) -> None:
        self._inner = session  # (not ``_session``: TF's BaseSession names its handle so)
        self.supervisor = supervisor

    def run(self, fetches: Any, feed_dict: Any = None, options: Any = None, run_metadata: Any = None) -> Any:
        return self._inner.run(fetches, feed_dict=feed_dict, options=options, run_metadata=run_metadata)

    @property
    def graph(self) -> Any:
        return self._inner.graph

    @property
    def graph_def(self) -> Any:
        return self._inner.graph_def

    @property
    def sess_str(self) -> Any:
        return self._inner.sess_str

    def partial_run_setup(self, fetches: Any, feeds: Any = None) -> Any:
        return self._inner.partial_run_setup(fetches, feeds)

    def partial_run(self, handle: Any, fetches: Any, feed_dict: Any = None) -> Any:
        return self._inner.partial_run(handle, fetches, feed_dict)

    def make_callable(self, fetches: Any, feed_list: Any = None, accept_options: bool = False) -> Any:
        """The Supervisor's session's callable: its calls are runs of that session (steps)."""
        return self._inner.make_callable(fetches, feed_list, accept_options)

    def list_devices(self) -> Any:
        return self._inner.list_devices()

    def close(self) -> None:
        """Close the Supervisor's session (as TF's ``raw_session().close()`` closes the session)."""
        self._inner.close()

    def __enter__(self) -> "GraphRawSession":
        """As TF's session: the default session (and its graph the default graph) inside the block."""
        return session_type.enter(self)  # type: ignore[no-any-return]

    def __exit__(self, *exc: Any) -> None:
        session_type.leave(self, *exc)

    @property
    def session(self) -> Any:
        """The Supervisor's own graph session."""
        return self._inner

    def should_stop(self) -> bool:
        return bool(self.supervisor.should_stop())

    def __getattr__(self, name: str) -> Any:  # the Supervisor's session's own attributes (``raw``, ``live``)
        if name.startswith("__") or name == "_inner":
            raise AttributeError(name)
        return getattr(self._inner, name)


def _queue_runners_started(sv: Any, session: Any) -> None:
    import tensorflow as tf

    if tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.QUEUE_RUNNERS):
        sv.start_queue_runners(session)


def create(creator: Any) -> GraphRawSession:
    """A graph session for ``creator`` (a Chief/WorkerSessionCreator; see the module docstring)."""
    if creator.supervisor is None:
        creator.supervisor = _build_supervisor(creator)
    sv = creator.supervisor
    try:
        # a worker's max_wait_secs bounds its wait for the chief (graph mode under --ps), as TF's wait_for_session
        wait = getattr(creator, "max_wait_secs", 7200)
        session = sv.prepare_or_wait_for_session(master=creator.master, config=creator.config, max_wait_secs=wait)
        raw = session_type.make(GraphRawSession, "_inner", session, sv)
        _queue_runners_started(sv, session)
    except BaseException:
        sv.front_end.release()
        raise
    return raw


def _build_supervisor(creator: Any) -> Any:
    import tensorflow as tf

    from procsv.trainer.supervisor import Supervisor

    scaffold = creator.scaffold
    scaffold.fill_defaults()
    opts = dict(creator.supervisor_options)
    opts.pop("save_summaries_secs", None)
    is_chief = opts.pop("is_chief", True)
    saver = opts.pop("saver", None) or scaffold.saver
    graph_file = opts.pop("save_graph_def", False)  # a CheckpointSaverHook's (TF: only that hook writes graph.pbtxt)
    path = creator.checkpoint_filename_with_path
    user_init_fn = scaffold.init_fn

    def init_fn(session: Any) -> None:
        if path:
            saver.restore(session, path)
            print(f"procsv: restored {path} (checkpoint_filename_with_path)", flush=True)
        elif user_init_fn is not None:
            user_init_fn(session)

    extra: dict[str, Any] = {}
    if scaffold.local_init_feed_dict is not None:  # as TF's session creator: its SessionManager feeds local_init_op
        from procsv.trainer.graph.session_manager import SessionManager

        extra["session_manager"] = SessionManager(
            local_init_op=scaffold.local_init_op, ready_op=scaffold.ready_op,
            ready_for_local_init_op=scaffold.ready_for_local_init_op, graph=tf.compat.v1.get_default_graph(),
            local_init_feed_dict=scaffold.local_init_feed_dict)
    if scaffold.global_step is not None:
        extra["global_step"] = scaffold.global_step
    sv = Supervisor(logdir=creator.checkpoint_dir, graph=tf.compat.v1.get_default_graph(), is_chief=is_chief,
                    init_op=scaffold.init_op, init_feed_dict=scaffold.init_feed_dict, init_fn=init_fn,
                    ready_op=scaffold.ready_op, ready_for_local_init_op=scaffold.ready_for_local_init_op,
                    local_init_op=scaffold.local_init_op, summary_op=None, saver=saver, **extra, **opts)
    sv.front_end.monitored_graph(bool(graph_file))  # (its CheckpointSaverHook saves at after_create_session)
    scaffold.finalize()
    return sv


__all__ = ["GraphRawSession", "create"]
