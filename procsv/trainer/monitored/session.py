"""``MonitoredSession`` and friends for TF2: hooks around procsv's Supervisor.

Runs in the trainer process, in its main thread. The call order is TensorFlow's
(``tf.compat.v1.train.MonitoredSession``):

* creation: ``begin()`` on every hook, ``scaffold.finalize()``, restore or initialize (through the
  session creator's :class:`procsv.Supervisor`: ``init_fn``, ``local_init_fn``, ``ready_fn``),
  then ``after_create_session(session, coord)`` on every hook;
* ``run(step_fn, *args, **kwargs)``: ``before_run`` on every hook (each may return
  ``SessionRunArgs``), one training step (``step_fn(*args, **kwargs)`` through the Supervisor's
  managed session: the global step advances, checkpoints and summaries happen at its boundary),
  the hooks' fetches are read, ``after_run`` on every hook; returns what ``step_fn`` returned;
* a run after a stop was requested (by a hook or ``request_stop()``; ``StepContext.request_stop``
  only raises StopIteration, as TF) is a ``RuntimeError``; after SIGTERM/SIGINT (preemption) or a checkpoint
  failure it is :class:`procsv.TrainingStopped`, a clean stop, so the block still saves;
* a thread's error reported to the coordinator (``coord.request_stop(ex)``, ``stop_on_exception``)
  lets the next runs go ahead; ``SingularMonitoredSession.should_stop()`` raises it, a
  ``MonitoredSession``'s says True, as TF's (its recoverable session turns the error into a stop);
* exit: ``end(session)`` on every hook on a clean exit only (``OutOfRangeError``,
  ``StopIteration`` and ``TrainingStopped`` are clean and suppressed by the ``with`` block; a thread's
  error recorded does not skip it, as TF's, and is raised after the stop, over the block's own), then
  the Supervisor stops: a final checkpoint of the last completed step unless the block failed; a
  second close is ``end(None)`` on every hook, then ``RuntimeError``, as TF's. TF's in-process
  recovery (``AbortedError``/``UnavailableError``) is the watchdog restarting the trainer.

In graph mode (a TF1 program: TensorFlow not executing eagerly when the session is made) these
classes are TF1's, ``run(fetches, feed_dict, options, run_metadata)`` included, in-process
recovery too: everything is handed to :class:`procsv.trainer.monitored.graph_session.GraphMonitoredSession`.
A session creator of the program's own (any object with ``create_session()``, not procsv's) is
handed to :class:`procsv.trainer.monitored.foreign.ForeignMonitoredSession`: TensorFlow's
coordinated, recoverable session around the session it makes, with no Supervisor.

One concern: TensorFlow's MonitoredSession call order (hooks, step, stop) over procsv's Supervisor.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Optional, Sequence

from procsv.common.errors import TrainingStopped
from procsv.trainer.monitored import hooks as api
from procsv.trainer.monitored import nan_watch
from procsv.trainer.monitored.hook_support import stop_quietly
from procsv.trainer.monitored.foreign import ForeignMonitoredSession
from procsv.trainer.monitored.graph_session import GraphMonitoredSession
from procsv.trainer.coordinator import clean_stop_types
from procsv.trainer.tf1_args import NOT_PASSED
from procsv.trainer.monitored.scaffold import ChiefSessionCreator, RawSession, Scaffold, WorkerSessionCreator

USE_DEFAULT: Any = object()


class StepContext:
    """What ``run_step_fn`` passes to its step function: ``session`` (the raw session: no hooks),
    ``run_with_hooks(step_fn, *args)`` (a run with hooks) and ``request_stop()``."""

    def __init__(self, session: Any, run_with_hooks_fn: Callable[..., Any]) -> None:
        self._session = session
        self._run_with_hooks_fn = run_with_hooks_fn

    @property
    def session(self) -> Any:
        return self._session

    def run_with_hooks(self, *args: Any, **kwargs: Any) -> Any:
        """Same as ``MonitoredSession.run``."""
        return self._run_with_hooks_fn(*args, **kwargs)

    def request_stop(self) -> None:
        """End the loop: raises StopIteration out of the step function and ``run_step_fn``; a ``with``
        block ends cleanly (``should_stop()`` itself stays False, as TF's)."""
        raise StopIteration("step_fn has requested the iterations to stop.")


class _MonitoredSession:
    """The hooks and raw session behind a MonitoredSession: calls the hooks around each run and ends in order."""

    def __init__(self, session_creator: Any, hooks: Sequence[api.SessionRunHook],
                 stop_grace_period_secs: float, should_recover: bool = True) -> None:
        from procsv.trainer.monitored.basic_hooks import CheckpointSaverHook

        self._graph: Optional[GraphMonitoredSession | ForeignMonitoredSession] = None
        self._hooks = list(hooks)
        self._creator = session_creator
        self._recover = should_recover
        self._stop_requested = False
        self._closed = False
        if not hasattr(session_creator, "supervisor_options"):  # not procsv's kind: TF's session around it
            self._graph = ForeignMonitoredSession(session_creator, self._hooks, stop_grace_period_secs,
                                                  should_recover, StepContext)
            return
        opts = session_creator.supervisor_options
        opts["stop_grace_secs"] = stop_grace_period_secs
        savers = [h for h in self._hooks if isinstance(h, CheckpointSaverHook)]
        if savers:
            # the Supervisor runs the saving timers (the save_model_secs timer in the checkpoint
            # service keeps ticking when a step stalls); the hook adds the listeners
            opts.update(savers[0].supervisor_options())
            if len(savers) > 1:
                api.warn_once("ms.savers", "several CheckpointSaverHooks: the first one's save_secs/save_steps apply")
        if session_creator.scaffold.graph_mode:
            self._graph = GraphMonitoredSession(session_creator, self._hooks, stop_grace_period_secs, should_recover,
                                                StepContext)
            return
        session_creator.global_step()  # hooks read the process's global step from begin() on
        for h in self._hooks:
            h.begin()
        session_creator.scaffold.finalize()
        self._raw: RawSession = session_creator.create_session()
        self._sv = session_creator.supervisor
        self._sv.coord.suppress_no_exception()  # as TF's MonitoredSession's coordinator
        self._nan_watched = nan_watch.watched_hooks(self._sv, self._hooks)
        try:
            for h in self._hooks:
                h.after_create_session(self._raw, self._sv.coord)
        except BaseException as exc:
            self._closed = True
            self._sv.request_stop(exc)
            stop_quietly(self._sv)
            raise

    # ------------------------------------------------------------------ TF API
    @property
    def graph(self) -> Any:
        """TF2 has no graph: None (graph mode: the graph)."""
        return self._graph.graph if self._graph is not None else None

    @property
    def supervisor(self) -> Any:
        """The :class:`procsv.Supervisor` behind this session (log_scalar, step, ...)."""
        return self._graph.supervisor if self._graph is not None else self._sv

    def should_stop(self) -> bool:
        """True once a stop was asked; a ``SingularMonitoredSession`` raises the error a thread of the
        program reported to the coordinator, as TF's (a ``MonitoredSession`` says True: TF's recoverable
        session turns the error into a stop, and the close raises it)."""
        if self._graph is not None:
            return self._graph.should_stop()
        if not self._recover and not self._closed:
            self._sv.coord.raise_program_error()
        return self._stop_requested or bool(self._sv.should_stop())

    def run(self, fetches: Any, *args: Any, **kwargs: Any) -> Any:
        """Run one training step, ``fetches(*args, **kwargs)``, with the hooks around it; return its result.

        ``feed_dict``, ``options`` and ``run_metadata`` keywords that the step function does not
        take are TF1's: the feeds (merged with the hooks' ``SessionRunArgs.feed_dict``) go to the
        step function as ``feed_dict=`` if it has that parameter, else they are ignored with a
        warning (once); options and run metadata are ignored with a warning.
        """
        import tensorflow as tf

        if self._graph is not None:
            return self._graph.run(fetches, *args, **kwargs)
        if self._closed:
            raise RuntimeError("Session is already closed.")
        if not callable(fetches) or isinstance(fetches, (tf.Tensor, tf.Variable)):
            held = [x for x in tf.nest.flatten(fetches) if callable(x) and not isinstance(x, (tf.Tensor, tf.Variable))]
            got = f"a {type(fetches).__name__} holding a step function ({getattr(held[0], '__name__', '?')})" if held \
                else f"a {type(fetches).__name__}"
            raise TypeError(f"MonitoredSession.run takes a step function, not {got}: sess.run(step_fn, *args, "
                            "**kwargs) runs one training step (return the loss from step_fn to get it); to read "
                            "tensors or variables use the hooks' SessionRunArgs (or, in a SingularMonitoredSession, "
                            "sess.raw_session().run(fetches))")
        sv = self._sv
        if self._stop_requested:
            raise RuntimeError("Run called even after should_stop requested.")
        if sv.should_stop() and sv.coord.ends_steps:  # (a thread's error lets the run go ahead, as TF's)
            if sv.coord.stop_signal is not None or sv.coord.exception is not None:
                raise TrainingStopped("a stop was requested (preemption or a failure); the training loop should end")
            raise RuntimeError("Run called even after should_stop requested.")
        feeds: Optional[dict[Any, Any]] = None
        if not api.takes_keyword(fetches, "feed_dict"):
            feeds = kwargs.pop("feed_dict", None)
        for name in ("options", "run_metadata"):
            if not api.takes_keyword(fetches, name) and kwargs.pop(name, None) is not None:
                api.warn_once(f"ms.{name}", f"run(..., {name}=...) has no meaning in TF2 and is ignored")
        user_feeds = kwargs.get("feed_dict") if feeds is None else feeds
        ctx = api.SessionRunContext(api.SessionRunArgs(fetches, user_feeds), self._raw)
        requests: dict[int, api.SessionRunArgs] = {}
        merged: dict[Any, Any] = dict(user_feeds or {})
        hook_fed: set[Any] = set()
        for i, h in enumerate(self._hooks):
            req = h.before_run(ctx)
            if req is None:
                continue
            requests[i] = req
            for key, value in (req.feed_dict or {}).items():
                if key in hook_fed:
                    raise RuntimeError(f"Same tensor is fed by two hooks: {key!r}")
                if user_feeds and key in user_feeds:
                    raise RuntimeError(f"Same tensor is fed by a SessionRunHook and user: {key!r}")
                hook_fed.add(key)
                merged[key] = value
        if merged:
            if api.takes_keyword(fetches, "feed_dict"):
                kwargs["feed_dict"] = merged
            else:
                api.warn_once("ms.feed_dict", "feeds (feed_dict, FeedFnHook) reach a step function only through its "
                                              "feed_dict parameter; this one has none, so they are ignored: pass "
                                              "the batch as arguments, sess.run(step_fn, x, y)")
        session = sv.front_end.session
        out = session.run(fetches, *args, **kwargs)
        if getattr(session, "moved", False):  # a rollback or a skip moved the step: no step ran, no
            return None  # hook sees one (procsv.trainer.managed); the loop's next run is the next step
        nan_watch.keep(sv, [req.fetches for i, req in requests.items() if i in self._nan_watched])
        results = {i: api.evaluate(req.fetches) for i, req in requests.items() if i not in self._nan_watched}
        for i, h in enumerate(self._hooks):
            if i in self._nan_watched:
                continue  # procsv watches its tensor (rollback): a NaN it rolls back never reaches the hook
            req = requests.get(i)
            h.after_run(ctx, api.SessionRunValues(results.get(i), req.options if req else None, None, out))
        self._stop_requested = self._stop_requested or ctx.stop_requested
        return out

    def run_step_fn(self, step_fn: Callable[[StepContext], Any]) -> Any:
        """Call ``step_fn(step_context)``; return what it returns.

        Raises ``ValueError`` if ``step_fn`` does not take exactly one ``step_context`` argument
        (after ``self``), and ``StopIteration`` if it called ``step_context.request_stop()`` (a
        ``with`` block ends cleanly; outside one, ``should_stop()`` stays False, as TF).
        """
        try:
            names = list(inspect.signature(step_fn).parameters)
        except (TypeError, ValueError):
            names = []
        if names != ["step_context"] and names != ["self", "step_context"]:
            raise ValueError("`step_fn` may either have one `step_context` argument, or `self` and `step_context` "
                             f"arguments if it's an instance method. Got {tuple(names)} instead.")
        if isinstance(self._graph, ForeignMonitoredSession):
            return self._graph.run_step_fn(step_fn, self._tf_sess)
        if self._graph is not None:
            return self._graph.run_step_fn(step_fn)
        return step_fn(StepContext(self._raw, self.run))

    @property
    def _sess(self) -> Any:
        """The session behind this one (TF's private name for the layer under a MonitoredSession)."""
        return self._graph

    def _tf_sess(self) -> Any:
        """The raw session a step function gets as ``step_context.session`` (TF's private name)."""
        if self._graph is not None:
            return self._graph.raw_session()
        return None if self._closed else self._raw

    def request_stop(self) -> None:
        """End the loop (procsv addition; TF's hooks use ``run_context.request_stop()``)."""
        self._stop_requested = True
        if self._graph is not None:
            self._graph.request_stop()

    def close(self) -> None:
        """``end()`` on every hook, then stop the Supervisor (final checkpoint, summaries flushed)."""
        if self._graph is not None:
            self._graph.close()
            return
        self._close_internal(None)

    def __enter__(self) -> "_MonitoredSession":
        return self

    def __exit__(self, exc_type: Any, exc: Optional[BaseException], tb: Any) -> bool:
        if self._graph is not None:
            return self._graph.exit(exc)
        clean = exc is not None and isinstance(exc, clean_stop_types())
        self._close_internal(None if clean else exc)
        return clean

    def _close_internal(self, exc: Optional[BaseException]) -> None:
        """``exc``: what the block raised (None: a clean exit). As TF's, a thread's error recorded in the
        coordinator does not skip ``end()`` (TF's close runs the hooks' ``end()``, then its coordinator's
        join raises the error): it is raised after the stop, over what the block or ``end()`` raised.
        procsv's own failure recorded there (a checkpoint failure) skips ``end()``."""
        if self._closed:  # as TF: a second close (close() inside a ``with`` block) is an error,
            try:  # after the hooks' end() once more, with the session gone
                for h in self._hooks if exc is None else ():
                    h.end(None)
            finally:
                raise RuntimeError("Session is already closed.")  # noqa: B012 (TF's: it replaces what end() raised)
        sv = self._sv
        settled = self._settle() if exc is None and sv.coord.procsv_failure is None else None
        self._closed = True
        exc = exc or settled  # (the rollback gave up at the loop's end: as a NaN run's error in the block)
        if exc is None and sv.coord.procsv_failure is None:
            try:
                for h in self._hooks:
                    h.end(self._raw)
            except BaseException as err:
                sv.request_stop(err)
                stop_quietly(sv)
                if sv.coord.exception is not None and sv.coord.exception is not err:
                    raise sv.coord.exception  # as TF's: its coordinator's join raises the error over end()'s
                raise
        elif exc is not None:
            sv.request_stop(exc)
        stop_quietly(sv)
        if sv.coord.exception is not None and sv.coord.exception is not exc:
            raise sv.coord.exception
        if settled is not None:
            raise settled

    def _settle(self) -> Optional[BaseException]:
        """The ``with`` block ended cleanly: unless a stop was asked of the Supervisor (a signal, a failure),
        the rollback finishes a replay the loop ended inside, up to the step reached before its restore,
        and rolls back a non-finite loss still unchecked (:meth:`~procsv.trainer.frontend.port.RollbackPort.settle_at_end`),
        replaying with this session's runs of the loop's last step function (the hooks around each; none
        once a hook asked for a stop during the replay, or the input ran out; a stop asked before it, at a
        step the rollback undid, is asked again by the replay's runs). Returns what ended it in error (its give-up:
        the program's ``NanTensorHook``'s error, or exit 4), for the close to end the session with."""
        sv = self._sv
        if sv.should_stop():
            return None
        fn = getattr(sv.front_end.session, "last_replayable", None)
        # a hook's stop that ended the loop (StopAtStepHook at its last step) is asked again by a replayed run's
        # hooks once due, not taken as a refusal of the replay before it: the replay ends where the loop did
        asked, self._stop_requested = self._stop_requested, False

        def again() -> bool:
            if self._stop_requested:
                return False
            try:
                self.run(fn)
            except clean_stop_types():  # the input ran out (OutOfRangeError), a step function's StopIteration
                return False
            return True

        try:
            sv.front_end.rollback.settle_at_end(again if fn is not None else None)
        except BaseException as err:
            return err
        finally:
            self._stop_requested = self._stop_requested or asked
        return None


class MonitoredSession(_MonitoredSession):
    """Session-like object that restores or initializes, runs hooks and saves (see the module docstring).

    ``session_creator`` defaults to ``ChiefSessionCreator()`` (the launch's logdir); any other
    object with ``create_session()`` (TF's ``SessionCreator`` interface: the program makes its own
    session) gets TensorFlow's coordinated, recoverable session around what it returns, with no
    Supervisor (:mod:`procsv.trainer.monitored.foreign`). ``stop_grace_period_secs`` is the
    Supervisor's ``stop_grace_secs`` (a program's own creator: the grace its threads get at a close).
    """

    StepContext = StepContext

    def __init__(self, session_creator: Any = None,
                 hooks: Optional[Sequence[api.SessionRunHook]] = None, stop_grace_period_secs: float = 120) -> None:
        super().__init__(session_creator or ChiefSessionCreator(), hooks or [], stop_grace_period_secs)


class SingularMonitoredSession(_MonitoredSession):
    """A MonitoredSession that is always the chief, with ``raw_session()``."""

    StepContext = StepContext

    def __init__(self, hooks: Optional[Sequence[api.SessionRunHook]] = None, scaffold: Optional[Scaffold] = None,
                 master: str = "", config: Any = None, checkpoint_dir: Optional[str] = None,
                 stop_grace_period_secs: float = 120, checkpoint_filename_with_path: Optional[str] = None) -> None:
        creator = ChiefSessionCreator(scaffold=scaffold, master=master, config=config, checkpoint_dir=checkpoint_dir,
                                      checkpoint_filename_with_path=checkpoint_filename_with_path)
        super().__init__(creator, hooks or [], stop_grace_period_secs, should_recover=False)

    def raw_session(self) -> Any:
        """The session without hooks (see :class:`RawSession`; graph mode: the Supervisor's graph
        session); None once the session is closed, as TF."""
        if self._graph is not None:
            return self._graph.raw_session()
        return None if self._closed else self._raw


def save_intervals(save_checkpoint_secs: Any, save_checkpoint_steps: Any, save_summaries_steps: Any,
                   save_summaries_secs: Any) -> tuple[Any, Any, Any, Any]:
    """MonitoredTrainingSession's ``USE_DEFAULT`` rules, as TF: checkpoints every 600 s unless steps
    are given, summaries every 100 steps unless seconds are given; an explicit value (None
    included) wins and the other becomes None. Returns (ckpt secs, ckpt steps, summary steps, summary secs)."""
    if save_summaries_steps is USE_DEFAULT and save_summaries_secs is USE_DEFAULT:
        save_summaries_steps, save_summaries_secs = 100, None
    elif save_summaries_secs is USE_DEFAULT:
        save_summaries_secs = None
    elif save_summaries_steps is USE_DEFAULT:
        save_summaries_steps = None
    if save_checkpoint_steps is USE_DEFAULT and save_checkpoint_secs is USE_DEFAULT:
        save_checkpoint_steps, save_checkpoint_secs = None, 600
    elif save_checkpoint_secs is USE_DEFAULT:
        save_checkpoint_secs = None
    elif save_checkpoint_steps is USE_DEFAULT:
        save_checkpoint_steps = None
    return save_checkpoint_secs, save_checkpoint_steps, save_summaries_steps, save_summaries_secs


def MonitoredTrainingSession(master: str = "", is_chief: Optional[bool] = None, checkpoint_dir: Optional[str] = None,
                             scaffold: Optional[Scaffold] = None,
                             hooks: Optional[Sequence[api.SessionRunHook]] = None,
                             chief_only_hooks: Optional[Sequence[api.SessionRunHook]] = None,
                             save_checkpoint_secs: Any = USE_DEFAULT, save_summaries_steps: Any = USE_DEFAULT,
                             save_summaries_secs: Any = USE_DEFAULT, config: Any = None,
                             stop_grace_period_secs: float = 120, log_step_count_steps: Optional[int] = 100,
                             max_wait_secs: float = 7200, save_checkpoint_steps: Any = USE_DEFAULT,
                             summary_dir: Optional[str] = None, save_graph_def: bool = True,
                             checkpoint: Any = NOT_PASSED) -> MonitoredSession:
    """A MonitoredSession with TensorFlow's standard hooks, saving through procsv's services.

    As TF: checkpoints every 600 s unless ``save_checkpoint_steps`` is given (``save_checkpoint_secs`` None
    or 0 without steps: the program asked for none, so nothing is saved, not even at the end, and no
    in-memory snapshot is kept: a rerun, or a restart under ``procsv launch``, starts at step 0), summaries every 100
    steps unless ``save_summaries_secs`` is given, a ``global_step/sec`` line and summary every
    ``log_step_count_steps``. The chief's hooks, in order: ``chief_only_hooks``, StepCounterHook,
    SummarySaverHook, CheckpointSaverHook, then ``hooks``. ``checkpoint_dir`` defaults to the
    launch's ``--logdir``. ``checkpoint`` (procsv addition) is the state to save, as
    ``Scaffold(checkpoint=...)``; passing neither is refused with a :class:`procsv.UsageError` naming
    ``checkpoint=`` (``checkpoint=None``: no checkpoints). ``is_chief=False``: a worker replica (:class:`WorkerSessionCreator`:
    restores the chief's checkpoints from ``checkpoint_dir``, saves nothing, only ``hooks`` run).
    ``save_graph_def`` (graph mode): the CheckpointSaverHook's, as TF (eager: no graph, no effect). ``is_chief`` defaults to the task's under
    ``procsv launch --nproc N`` (task 0 is the chief), else True, as the Supervisor's.
    """
    from procsv.common import bootstrap
    from procsv.trainer.monitored import basic_hooks as bh
    from procsv.trainer.supervisor_setup import resolve_is_chief

    is_chief = resolve_is_chief(is_chief, bootstrap.ChildContext.from_env())

    save_checkpoint_secs, save_checkpoint_steps, save_summaries_steps, save_summaries_secs = save_intervals(
        save_checkpoint_secs, save_checkpoint_steps, save_summaries_steps, save_summaries_secs)
    if checkpoint is not NOT_PASSED:  # None too: the opt-out
        scaffold = Scaffold(copy_from_scaffold=scaffold, checkpoint=checkpoint) if scaffold else Scaffold(
            checkpoint=checkpoint)
    scaffold = scaffold or Scaffold()
    if checkpoint_dir is None:
        ctx = bootstrap.ChildContext.from_env()
        checkpoint_dir = ctx.layout.logdir if ctx else None
    if not is_chief:  # as TF: a worker gets only ``hooks`` (no saver, summary or step-counter hook)
        return MonitoredSession(WorkerSessionCreator(scaffold, master, config, max_wait_secs, checkpoint_dir),
                                hooks or [], stop_grace_period_secs)
    all_hooks: list[api.SessionRunHook] = list(chief_only_hooks or [])
    creator = ChiefSessionCreator(scaffold=scaffold, master=master, config=config, checkpoint_dir=checkpoint_dir)
    summary_dir = summary_dir or checkpoint_dir
    if summary_dir:
        if log_step_count_steps and log_step_count_steps > 0:
            all_hooks.append(bh.StepCounterHook(every_n_steps=log_step_count_steps, output_dir=summary_dir))
        if (save_summaries_steps and save_summaries_steps > 0) or (save_summaries_secs and save_summaries_secs > 0):
            all_hooks.append(bh.SummarySaverHook(save_steps=save_summaries_steps, save_secs=save_summaries_secs,
                                                 output_dir=summary_dir, scaffold=scaffold))
    if checkpoint_dir and ((save_checkpoint_secs and save_checkpoint_secs > 0)
                           or (save_checkpoint_steps and save_checkpoint_steps > 0)):
        all_hooks.append(bh.CheckpointSaverHook(checkpoint_dir, save_secs=save_checkpoint_secs,
                                                save_steps=save_checkpoint_steps, scaffold=scaffold,
                                                save_graph_def=save_graph_def))
    elif not save_checkpoint_secs and not save_checkpoint_steps:  # None or 0, as TF: no CheckpointSaverHook, so
        creator.supervisor_options["save_model_secs"] = 0  # the program asked for none: no final checkpoint either
    all_hooks.extend(hooks or [])
    return MonitoredSession(creator, all_hooks, stop_grace_period_secs)


__all__ = ["MonitoredSession", "SingularMonitoredSession", "MonitoredTrainingSession", "StepContext", "USE_DEFAULT"]
