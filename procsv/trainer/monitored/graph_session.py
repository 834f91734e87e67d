"""``MonitoredSession`` in graph mode: TF1's hooked, coordinated and recoverable session on procsv's Supervisor.

Runs in the trainer process, in its main thread. ``procsv.train.MonitoredSession`` and
``SingularMonitoredSession`` made in a TF1 graph program (TensorFlow not executing eagerly) hand
everything to :class:`GraphMonitoredSession`. The call order is TensorFlow's:

* creation: ``begin()`` on every hook; the session creator builds the graph-mode Supervisor,
  freezes the graph and restores the newest committed checkpoint or initializes
  (:mod:`procsv.trainer.monitored.graph_creator`); the graph's queue runners start under the
  Supervisor's coordinator; ``after_create_session(session, coord)`` on every hook;
* ``run(fetches, feed_dict, options, run_metadata)``: one ``session.run`` with every hook's
  ``SessionRunArgs`` merged in (:mod:`procsv.trainer.monitored.graph_hooked`); a run during which
  the global step changed is a step for the Supervisor (its step boundary: progress, checkpoints);
  under ``--on-nonfinite rollback`` a ``NanTensorHook``'s tensor is procsv's to watch, as in eager
  mode (:mod:`procsv.trainer.monitored.nan_watch`): kept as the step's loss, the hook not called;
* **recovery**: a run (or a creation) that raises ``AbortedError`` or ``UnavailableError`` stops
  the Supervisor's session without a final checkpoint (the failed run may have changed some
  variables), prepares a new one, which restores the newest committed checkpoint, calls
  ``after_create_session`` on every hook again and re-runs the call, in this process (not a
  trainer restart), as TF's ``_RecoverableSession``. ``SingularMonitoredSession`` does not recover;
* a run after a hook's stop is a ``RuntimeError``; after SIGTERM/SIGINT or a checkpoint failure
  :class:`procsv.TrainingStopped`, a clean stop (as in eager mode);
* a thread's error reported to the coordinator (``coord.request_stop(ex)``) lets the next runs go
  ahead; ``SingularMonitoredSession.should_stop()`` raises it, a ``MonitoredSession``'s says True (TF's
  recoverable session turns it into a stop), as TF's;
* exit (:mod:`procsv.trainer.monitored.session_end`, shared with a program's own session):
  ``end(session)`` on every hook on a clean exit only (``OutOfRangeError``, ``StopIteration``,
  ``TrainingStopped``), a thread's error recorded or not, then the Supervisor stops (a final checkpoint
  unless the block failed or an error was recorded) and the graph is unfrozen if it was not frozen
  before, as TF; a thread's error is raised then, over the block's own.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

from procsv.common.errors import TrainingStopped
from procsv.trainer.monitored import nan_watch
from procsv.trainer.monitored.hook_support import stop_quietly
from procsv.trainer.monitored.graph_hooked import GraphHookedSession
from procsv.trainer.monitored.session_end import SessionEnd


def _preemption_errors() -> tuple[type[BaseException], ...]:
    import tensorflow as tf

    return (tf.errors.AbortedError, tf.errors.UnavailableError)


class GraphMonitoredSession:
    """A MonitoredSession of a graph program (see the module docstring). Its :class:`SessionEnd`
    (``_ending``) owns whether a stop was requested and whether it is closed."""

    def __init__(self, session_creator: Any, hooks: Sequence[Any], stop_grace_period_secs: float,
                 should_recover: bool, step_context: Callable[[Any, Callable[..., Any]], Any]) -> None:
        import tensorflow as tf

        self._tf_graph = tf.compat.v1.get_default_graph()
        self._hooks = list(hooks)
        self._ending = SessionEnd(self._tf_graph, self._hooks, self._end, self._forget)
        self._creator = session_creator
        self._recover = should_recover
        self._step_context = step_context
        self._raw: Any = None
        self._sess: Optional[GraphHookedSession] = None
        for h in self._hooks:
            h.begin()
        self._sess = self._create_recovering()

    # ------------------------------------------------------------------ creation, recovery
    def _create(self) -> GraphHookedSession:
        raw = self._creator.create_session()
        sv = self._creator.supervisor
        sv.coord.suppress_no_exception()  # as TF's MonitoredSession's coordinator
        try:
            for h in self._hooks:
                h.after_create_session(raw, sv.coord)
        except BaseException as exc:
            self._stop_supervisor(exc)
            raise
        self._raw = raw
        return GraphHookedSession(raw, self._hooks, nan_watch.watched_hooks(sv, self._hooks))

    def _create_recovering(self) -> GraphHookedSession:
        while True:
            try:
                return self._create()
            except _preemption_errors() as exc:
                if not self._recover:
                    self._ending.closed_at_creation()
                    raise
                self._log_recovery(exc, "while the session was being created")

    def _log_recovery(self, exc: BaseException, where: str) -> None:
        print(f"procsv: {type(exc).__name__} {where}: a new session restores the newest checkpoint "
              f"(in-process recovery, as TF's MonitoredSession): {exc}", flush=True)

    def _recover_from(self, exc: BaseException) -> None:
        """Stop the Supervisor's session without a final checkpoint; the next run prepares a new one."""
        self._log_recovery(exc, "in a run")
        sv = self._creator.supervisor
        sv.request_stop(exc)  # recorded: the stop writes no checkpoint of a half-applied run
        stop_quietly(sv)
        raw, self._sess, self._raw = self._raw, None, None
        _close(raw)

    def _stop_supervisor(self, exc: Optional[BaseException]) -> None:
        sv = self._creator.supervisor
        if sv is None:
            return
        if exc is not None:
            sv.request_stop(exc)
        stop_quietly(sv)

    # ------------------------------------------------------------------ TF API
    @property
    def graph(self) -> Any:
        return self._tf_graph

    @property
    def supervisor(self) -> Any:
        """The :class:`procsv.Supervisor` behind this session."""
        return self._creator.supervisor

    def raw_session(self) -> Any:
        """The Supervisor's graph session, without hooks; None once closed, as TF."""
        return self._raw

    def should_stop(self) -> bool:
        """True once a stop was asked; a ``SingularMonitoredSession`` (no recovery) raises the error a
        thread reported to the coordinator, as TF's coordinated session (a recovering one says True)."""
        if self._ending.closed or self._ending.stop_requested:
            return True
        if not self._recover and self._sess is not None:
            self._creator.supervisor.coord.raise_program_error()
        if self._sess is not None and self._sess.should_stop():
            return True
        return bool(self._creator.supervisor.should_stop())

    def _check_run(self) -> None:
        if self._ending.closed:
            raise RuntimeError("Session is already closed.")
        sv = self._creator.supervisor
        if self._ending.stop_requested or (self._sess is not None and self._sess.should_stop() and not sv.should_stop()):
            raise RuntimeError("Run called even after should_stop requested.")
        if sv.should_stop() and sv.coord.ends_steps:  # (a thread's error lets the run go ahead, as TF's)
            if sv.coord.stop_signal is not None or sv.coord.exception is not None:
                raise TrainingStopped("a stop was requested (preemption or a failure); the training loop should end")
            raise RuntimeError("Run called even after should_stop requested.")

    def run(self, fetches: Any, feed_dict: Any = None, options: Any = None, run_metadata: Any = None) -> Any:
        """``session.run`` with the hooks around it; recovers from AbortedError/UnavailableError."""
        return self._recovering(lambda sess: sess.run(fetches, feed_dict=feed_dict, options=options,
                                                      run_metadata=run_metadata))

    def _recovering(self, call: Callable[[GraphHookedSession], Any]) -> Any:
        while True:
            if self._sess is None:
                self._sess = self._create_recovering()
            self._check_run()
            try:
                return call(self._sess)
            except _preemption_errors() as exc:
                if not self._recover:
                    raise
                self._recover_from(exc)
            except Exception as original:
                # as TF's coordinated session: an error another thread recorded is the cause
                recorded = self._creator.supervisor.coord.exception
                if recorded is not None and recorded is not original:
                    raise recorded from None
                raise

    def run_step_fn(self, step_fn: Callable[[Any], Any]) -> Any:
        """``step_fn(step_context)``: ``step_context.session`` is the raw session,
        ``run_with_hooks`` a run with the hooks; recovers as ``run`` (the step function is called again)."""
        def call(sess: GraphHookedSession) -> Any:
            return step_fn(self._step_context(self._raw, sess.run))

        return self._recovering(call)  # a StopIteration (request_stop) leaves should_stop() False, as TF

    def request_stop(self) -> None:
        self._ending.request_stop()

    def close(self) -> None:
        self._ending.close()

    def exit(self, exc: Optional[BaseException]) -> bool:
        """The ``with`` block's end: True (suppress) for a clean stop."""
        return self._ending.exit(exc)

    # ------------------------------------------------------------------ its end's two steps (SessionEnd's)
    def _end(self, exc: Optional[BaseException]) -> None:
        """``end()`` on every hook unless the block failed (``exc``) or procsv's own failure (a checkpoint
        failure) was recorded; a thread's error recorded in the coordinator does not skip it, as TF's close
        (the hooks' ``end()``, then its coordinator's join raises the error). Then stop the Supervisor; a
        recorded failure is raised after the stop, over what the block or ``end()`` raised."""
        sv = self._creator.supervisor
        if exc is None and sv.coord.procsv_failure is None and self._raw is not None:
            if not sv.should_stop():  # a rollback's replay the loop ended inside: the steps lost, said
                sv.front_end.rollback.settle_at_end(None)
            try:
                for h in self._hooks:
                    h.end(self._raw)
            except BaseException as err:
                self._stop_supervisor(err)
                if sv.coord.exception is not None and sv.coord.exception is not err:
                    raise sv.coord.exception  # as TF's: its coordinator's join raises the error over end()'s
                raise
        self._stop_supervisor(exc)
        if sv.coord.exception is not None and sv.coord.exception is not exc:
            raise sv.coord.exception

    def _forget(self) -> None:
        raw, self._sess, self._raw = self._raw, None, None  # as TF: raw_session() after the close is None
        _close(raw)


def _close(raw: Any) -> None:
    """Close the Supervisor's session of a MonitoredSession that ended (after its Supervisor's stop,
    as ``managed_session``'s block closes its session): TF's MonitoredSession closes its session at
    its close and before a recovery's new one; left open, each ended session kept its TensorFlow
    session (and its graph's variables) for the life of the process."""
    if raw is not None:
        raw.close()


__all__ = ["GraphMonitoredSession"]
