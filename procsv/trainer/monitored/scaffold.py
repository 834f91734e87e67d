"""``Scaffold`` and the session creators of ``procsv.train``: what a MonitoredSession restores or
initializes, and the :class:`procsv.Supervisor` that does it.

Runs in the trainer process. TF1's Scaffold held graph pieces (init_op, ready_op, local_init_op,
saver, summary_op); TF2 has no graph, so the stand-ins are plain Python:

* ``checkpoint``: the state to save and restore (a ``tf.train.Checkpoint`` or a mapping of names
  to trackables), the stand-in for ``saver``; ``None`` turns checkpoints off, and passing nothing
  makes the session creator's Supervisor refuse to start (as ``procsv.Supervisor()``: an eager
  program has no graph whose variables a default saver would collect);
* ``init_fn(scaffold, session)``: called when no checkpoint was restored (``init_op`` is not
  needed: TF2 variables are initialized when created);
* ``local_init_fn(session)``: called on every session creation, after restore or init;
* ``ready_fn(session)``: returns what is not ready (empty or None: ready); anything else after
  restore or init is a ``RuntimeError``, as TF's ``ready_op``;
* ``summary_op``: a callable returning ``{tag: scalar}`` (or a ``Summary`` proto, or its bytes), or
  a mapping of tags to tensors, variables or callables; :class:`SummarySaverHook` writes it.

The graph-only arguments are accepted, ignored and warned about once, naming what to use instead.

In graph mode (a TF1 program: :func:`procsv.trainer.monitored.hooks.graph_mode` when the Scaffold
is made) a Scaffold is TF's: it keeps ``init_op``, ``init_feed_dict``, ``ready_op``,
``ready_for_local_init_op``, ``local_init_op``, ``local_init_feed_dict``, ``summary_op``,
``saver`` and ``init_fn`` (read as TF's ``init_fn(session)``, which calls yours with the
scaffold), ``finalize()`` makes TF's defaults for the others and freezes the graph
(:mod:`procsv.trainer.monitored.graph_scaffold`), and the session creators build a graph-mode
Supervisor from them (:mod:`procsv.trainer.monitored.graph_creator`).

A session creator builds the Supervisor (``checkpoint_dir`` is its logdir, defaulting to the
launch's ``--logdir``) and returns the raw session (:class:`RawSession`) once restored or
initialized. Checkpoints and summaries go through procsv's checkpoint and summary services.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Optional

from procsv.common.errors import UsageError
from procsv.common.layout import Layout
from procsv.trainer.managed import readable_fetches
from procsv.trainer.tf1_args import NOT_PASSED
from procsv.trainer.monitored import graph_scaffold, hooks as api
from procsv.trainer.monitored.hooks import graph_mode

_GRAPH_ONLY = {
    "init_op": "init_fn(scaffold, session) (TF2 variables are initialized when created)",
    "init_feed_dict": "init_fn(scaffold, session)",
    "ready_op": "ready_fn(session), returning what is not ready",
    "ready_for_local_init_op": "ready_fn(session)",
    "local_init_op": "local_init_fn(session)",
    "local_init_feed_dict": "local_init_fn(session)",
    "saver": "checkpoint=tf.train.Checkpoint(model=..., optimizer=...)",
}


class Scaffold:
    """What to restore or initialize, and the summaries to write (see the module docstring)."""

    def __init__(self, init_op: Any = None, init_feed_dict: Any = None, init_fn: Optional[Callable[..., Any]] = None,
                 ready_op: Any = None, ready_for_local_init_op: Any = None, local_init_op: Any = None,
                 summary_op: Any = None, saver: Any = None, copy_from_scaffold: Optional["Scaffold"] = None,
                 local_init_feed_dict: Any = None, *, checkpoint: Any = NOT_PASSED, global_step: Any = None,
                 local_init_fn: Optional[Callable[[Any], Any]] = None,
                 ready_fn: Optional[Callable[[Any], Any]] = None) -> None:
        self._graph_mode = graph_mode()
        if self._graph_mode:
            self._graph_init(init_op, init_feed_dict, init_fn, ready_op, ready_for_local_init_op, local_init_op,
                             summary_op, saver, copy_from_scaffold, local_init_feed_dict, global_step)
            return
        given = {"init_op": init_op, "init_feed_dict": init_feed_dict, "ready_op": ready_op,
                 "ready_for_local_init_op": ready_for_local_init_op, "local_init_op": local_init_op,
                 "local_init_feed_dict": local_init_feed_dict, "saver": saver}
        for name, value in given.items():
            if value is not None:
                api.warn_once(f"Scaffold.{name}", f"Scaffold({name}=...) has no meaning in TF2 and is ignored; "
                                                  f"use {_GRAPH_ONLY[name]}")
        if copy_from_scaffold is not None:
            if not isinstance(copy_from_scaffold, Scaffold):
                raise TypeError("copy_from_scaffold is not a Scaffold instance.")
            src: Scaffold = copy_from_scaffold
            init_fn = init_fn or src.init_fn
            summary_op = summary_op if summary_op is not None else src.summary_op
            checkpoint = checkpoint if checkpoint is not NOT_PASSED else src.checkpoint
            global_step = global_step if global_step is not None else src.global_step
            local_init_fn = local_init_fn or src.local_init_fn
            ready_fn = ready_fn or src.ready_fn
        self.init_fn: Optional[Callable[..., Any]] = init_fn
        self.local_init_fn: Optional[Callable[[Any], Any]] = local_init_fn
        self.ready_fn: Optional[Callable[[Any], Any]] = ready_fn
        self.summary_op: Any = summary_op
        self.checkpoint: Any = checkpoint
        self.global_step: Any = global_step
        self._finalized = False
        # TF1 fields that have no TF2 object behind them
        self.init_op: Any = None
        self.ready_op: Any = None
        self.ready_for_local_init_op: Any = None
        self.local_init_op: Any = None
        self.init_feed_dict: Any = None
        self.local_init_feed_dict: Any = None
        self.saver: Any = None
        self._user_init_fn: Optional[Callable[..., Any]] = init_fn

    def _graph_init(self, init_op: Any, init_feed_dict: Any, init_fn: Optional[Callable[..., Any]], ready_op: Any,
                    ready_for_local_init_op: Any, local_init_op: Any, summary_op: Any, saver: Any,
                    copy_from_scaffold: Optional["Scaffold"], local_init_feed_dict: Any, global_step: Any) -> None:
        """Graph mode: TF's fields; a field not given is copied from ``copy_from_scaffold``, as TF."""
        if copy_from_scaffold is not None:
            if not isinstance(copy_from_scaffold, Scaffold):
                raise TypeError("copy_from_scaffold is not a Scaffold instance.")
            src = copy_from_scaffold

            def pick(mine: Any, theirs: Any) -> Any:
                return mine if mine is not None else theirs

            init_op, init_feed_dict = pick(init_op, src.init_op), pick(init_feed_dict, src.init_feed_dict)
            init_fn = pick(init_fn, src._user_init_fn)
            ready_op, local_init_op = pick(ready_op, src.ready_op), pick(local_init_op, src.local_init_op)
            ready_for_local_init_op = pick(ready_for_local_init_op, src.ready_for_local_init_op)
            local_init_feed_dict = pick(local_init_feed_dict, src.local_init_feed_dict)
            summary_op, saver = pick(summary_op, src.summary_op), pick(saver, src.saver)
            global_step = pick(global_step, src.global_step)
        self._user_init_fn = init_fn
        user_init_fn = init_fn
        self.init_fn = (lambda session: user_init_fn(self, session)) if user_init_fn is not None else None
        self.local_init_fn = None
        self.ready_fn = None
        self.init_op, self.init_feed_dict, self.ready_op = init_op, init_feed_dict, ready_op
        self.ready_for_local_init_op, self.local_init_op = ready_for_local_init_op, local_init_op
        self.local_init_feed_dict, self.summary_op, self.saver = local_init_feed_dict, summary_op, saver
        self.checkpoint = None
        self.global_step = global_step
        self._finalized = False

    @property
    def graph_mode(self) -> bool:
        """True for a TF1 graph program's Scaffold (made while not executing eagerly)."""
        return self._graph_mode

    def fill_defaults(self) -> None:
        """Graph mode: TF's default for every piece not given (the graph is not frozen yet)."""
        if self._graph_mode:
            graph_scaffold.fill_defaults(self)

    def finalize(self) -> "Scaffold":
        """Graph mode: make TF's defaults and freeze the graph, as TF. Eager mode has no graph:
        kept for the call order. Returns self."""
        if self._graph_mode:
            graph_scaffold.fill_defaults(self)
            graph_scaffold.finalize_graph()
        self._finalized = True
        return self

    @property
    def finalized(self) -> bool:
        return self._finalized

    get_or_default = staticmethod(graph_scaffold.get_or_default)
    default_local_init_op = staticmethod(graph_scaffold.default_local_init_op)


class RawSession:
    """The session hooks, ``StepContext.session`` and ``raw_session()`` get: no hooks run here.

    ``run(step_fn, *args, **kwargs)`` runs one training step through the Supervisor (it counts:
    the global step advances, checkpoints happen at its boundary) but calls no hook, as TF's raw
    ``tf.Session`` ran a train op without hooks. ``run(fetches)`` with tensors, variables or a
    structure of them returns their values and is not a step (a structure holding a step function,
    ``run([step_fn, loss])``, is a :class:`procsv.UsageError`); ``evaluate(fetches)`` always reads
    (a callable is called, not counted as a step).
    """

    def __init__(self, supervisor: Any, managed: Any) -> None:
        self.supervisor = supervisor
        self._managed = managed

    @property
    def global_step(self) -> Any:
        return self.supervisor.global_step

    @property
    def graph(self) -> None:
        return None

    def run(self, fetches: Any, *args: Any, **kwargs: Any) -> Any:
        import tensorflow as tf

        if callable(fetches) and not isinstance(fetches, (tf.Tensor, tf.Variable)):
            return self._managed.run(fetches, *args, **kwargs)
        readable_fetches(fetches, "session.run")  # run([step_fn, loss]): refused, never called outside a step
        for name in ("feed_dict", "options", "run_metadata"):
            if kwargs.pop(name, None) is not None:
                api.warn_once(f"raw.{name}", f"session.run(fetches, {name}=...) has no meaning in TF2 and is ignored")
        return api.evaluate(fetches)

    def evaluate(self, fetches: Any) -> Any:
        return api.evaluate(fetches)

    def should_stop(self) -> bool:
        return bool(self.supervisor.should_stop())


class SessionCreator:
    """TF's ``SessionCreator`` interface: an object whose ``create_session()`` returns a session.
    A program's own subclass (or any object with that method) passed as
    ``MonitoredSession(session_creator=)`` gets TensorFlow's coordinated, recoverable session around
    what it returns (:mod:`procsv.trainer.monitored.foreign`); procsv's own creators are below."""

    def create_session(self) -> Any:
        raise NotImplementedError(f"create_session is not implemented for {self}.")


class ChiefSessionCreator(SessionCreator):
    """Creates the chief's session: a Supervisor on ``checkpoint_dir`` (default: the launch's
    ``--logdir``) that restores the newest valid checkpoint or initializes.

    ``master`` and ``config`` are accepted and ignored (warned once): a TF2 program runs its ops
    in-process. In graph mode (a Scaffold made while not executing eagerly) the Supervisor is a
    graph-mode one built from the Scaffold's pieces (:mod:`procsv.trainer.monitored.graph_creator`),
    ``master`` and ``config`` are its session's target and ``ConfigProto``, as TF.
    ``checkpoint_filename_with_path`` is restored when the logdir has no checkpoint of its own (a
    restarted trainer resumes from its own latest one instead).
    """

    def __init__(self, scaffold: Optional[Scaffold] = None, master: str = "", config: Any = None,
                 checkpoint_dir: Optional[str] = None, checkpoint_filename_with_path: Optional[str] = None) -> None:
        graph = graph_mode()
        if master and not graph:
            api.warn_once("creator.master", "master=... has no meaning for a TF2 program and is ignored; "
                                            "use tf.distribute for remote workers")
        if config is not None and not graph:
            api.warn_once("creator.config", "config=... (a ConfigProto) is ignored; use tf.config "
                                            "(tf.config.threading, tf.config.set_visible_devices) instead")
        self.scaffold = scaffold or Scaffold()
        self.master = master
        self.config = config  # graph mode: the graph session's ConfigProto
        self.checkpoint_dir = checkpoint_dir
        self.checkpoint_filename_with_path = checkpoint_filename_with_path
        # set by MonitoredSession before create_session (from its CheckpointSaverHook and arguments)
        self.supervisor_options: dict[str, Any] = {"save_model_secs": None, "save_checkpoint_steps": None,
                                                   "save_summaries_secs": None}
        self.supervisor: Any = None
        self._checkpoint: Any = None
        self._global_step: Any = None

    def global_step(self) -> Any:
        """The global step the session will use (resolved once; the process's global step is set to it)."""
        if self._global_step is None:
            import tensorflow as tf

            ckpt = self.scaffold.checkpoint
            ckpt = None if ckpt is NOT_PASSED else ckpt  # refused by the Supervisor (create_session)
            if ckpt is not None and not isinstance(ckpt, tf.train.Checkpoint):
                if not isinstance(ckpt, Mapping):
                    raise UsageError("checkpoint must be a tf.train.Checkpoint or a mapping of names to trackables")
                ckpt = tf.train.Checkpoint(**ckpt)
            self._checkpoint = ckpt
            gs = self.scaffold.global_step
            if gs is None and ckpt is not None and isinstance(getattr(ckpt, "global_step", None), tf.Variable):
                gs = ckpt.global_step
            if gs is None:
                gs = api.get_or_create_global_step()
            self._global_step = gs
            api.set_global_step(gs)
        return self._global_step

    def create_session(self) -> Any:
        """The session, restored or initialized (a :class:`RawSession`; in graph mode a
        :class:`procsv.trainer.monitored.graph_creator.GraphRawSession`)."""
        from procsv.trainer.supervisor import Supervisor

        if self.scaffold.graph_mode:
            from procsv.trainer.monitored import graph_creator

            return graph_creator.create(self)

        gs = self.global_step()
        scaffold = self.scaffold
        holder: dict[str, RawSession] = {}

        def raw_of(managed: Any) -> RawSession:
            if "raw" not in holder:
                holder["raw"] = RawSession(sv, managed)
            return holder["raw"]

        def init(managed: Any) -> None:
            if self.checkpoint_filename_with_path and self._checkpoint is not None:
                # a plain TF checkpoint (write()) has no save_counter, which the Supervisor adds: match what is there
                self._checkpoint.restore(self.checkpoint_filename_with_path).assert_nontrivial_match().expect_partial()
                print(f"procsv: restored {self.checkpoint_filename_with_path} (checkpoint_filename_with_path)",
                      flush=True)
            elif scaffold.init_fn is not None:
                scaffold.init_fn(scaffold, raw_of(managed))

        opts = dict(self.supervisor_options)
        state = NOT_PASSED if scaffold.checkpoint is NOT_PASSED else self._checkpoint  # nothing passed: refused
        sv = Supervisor(logdir=self.checkpoint_dir, checkpoint=state, global_step=gs, init_fn=init, **opts)
        self.supervisor = sv
        try:
            managed = sv.prepare_or_wait_for_session()
        except BaseException:
            sv.front_end.release()
            raise
        raw = raw_of(managed)
        try:
            if scaffold.local_init_fn is not None:
                scaffold.local_init_fn(raw)
            if scaffold.ready_fn is not None:
                not_ready = scaffold.ready_fn(raw)
                if not_ready is not None and len(not_ready):
                    raise RuntimeError(f"Init operations did not make model ready. Not ready: {not_ready!r} "
                                       f"(init_fn: {scaffold.init_fn!r}, local_init_fn: {scaffold.local_init_fn!r})")
        except BaseException as exc:
            sv.request_stop(exc)
            sv.front_end.stop_quietly()
            raise
        return raw


class WorkerSessionCreator(ChiefSessionCreator):
    """A worker replica's session (``is_chief=False``): a Supervisor that restores the chief's
    newest committed checkpoint from ``checkpoint_dir`` (procsv addition; default: the launch's
    ``--logdir``), or initializes when there is none yet, and never saves or writes summaries.
    In TF2 the replicas of a ``tf.distribute`` job start together (the strategy's own start-up
    waits for every worker), so a worker does not wait for a checkpoint here. In graph mode under
    ``procsv launch --ps`` the worker waits for the chief to make ``ready_op`` pass, and
    ``max_wait_secs`` bounds that wait as in TF (``DeadlineExceededError``; see
    :mod:`procsv.trainer.monitored.graph_creator`); an eager worker has nothing to wait for.
    """

    def __init__(self, scaffold: Optional[Scaffold] = None, master: str = "", config: Any = None,
                 max_wait_secs: float = 30 * 60, checkpoint_dir: Optional[str] = None) -> None:
        super().__init__(scaffold, master, config, checkpoint_dir=checkpoint_dir)
        self.max_wait_secs = max_wait_secs
        self.supervisor_options["is_chief"] = False


__all__ = ["Scaffold", "RawSession", "SessionCreator", "ChiefSessionCreator", "WorkerSessionCreator"]
