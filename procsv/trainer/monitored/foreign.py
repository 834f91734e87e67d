"""A MonitoredSession over a program's own session creator: TensorFlow's coordinated, recoverable session.

Runs in the trainer process, in the thread that made the MonitoredSession (its main thread). A TF1
program may pass ``MonitoredSession(session_creator=...)`` any object with ``create_session()``
(TF's ``SessionCreator`` interface) that returns a session of its own making, a plain
``tf.compat.v1.Session`` or a wrapper of one. procsv has no Supervisor behind such a session (no
checkpoint service, no step boundaries: the program chose its session), so what this module gives
is TensorFlow's own behaviour around it, in TF's order:

* creation: ``begin()`` on every hook; then, for each session the creator makes, a new
  :class:`~procsv.trainer.coordinator.Coordinator` that suppresses no exception, the graph's queue
  runners started under it, ``after_create_session(session, coord)`` on every hook;
* ``run``: one hooked run (:class:`~procsv.trainer.monitored.graph_hooked.GraphHookedSession`); an
  error that is not ``AbortedError``/``UnavailableError`` while the coordinator holds one of those is
  raised as the coordinator's (the root cause), as TF's ``_CoordinatedSession``;
* **recovery** (``MonitoredSession``; ``SingularMonitoredSession`` has none): a run, a step function
  or a creation that raises ``AbortedError``/``UnavailableError``, or a ``should_stop()`` that finds
  one recorded in the coordinator, closes the session (its coordinator stopped, its threads joined
  for ``stop_grace_period_secs``) and asks the creator for a new one, as TF's ``_RecoverableSession``;
  any other error recorded in the coordinator makes ``should_stop()`` True and is raised by ``close()``;
* exit (:mod:`procsv.trainer.monitored.session_end`, shared with procsv's own graph session):
  ``end(session)`` on every hook unless the block failed, then the coordinator is stopped and joined
  (its recorded error raised) and the session closed; ``raw_session()`` is None afterwards and a
  second ``close()`` is TF's ``RuntimeError('Session is already closed.')``; a step function's
  ``request_stop()`` outside a ``with`` block leaves ``should_stop()`` False, as TF's.

procsv's ``CheckpointSaverHook`` and the other standard hooks see a session without a Supervisor and
save or write as TensorFlow's do (:mod:`procsv.trainer.monitored.plain_saver`).
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

from procsv.trainer.coordinator import Coordinator
from procsv.trainer.monitored import hooks as api
from procsv.trainer.monitored.graph_hooked import GraphHookedSession
from procsv.trainer.monitored.session_end import SessionEnd


def _preemption_errors() -> tuple[type[BaseException], ...]:
    import tensorflow as tf

    return (tf.errors.AbortedError, tf.errors.UnavailableError)


def _log_recovery(where: str, exc: BaseException) -> None:
    api.tf_logging().info("An error was raised %s. This may be due to a preemption in a connected worker or "
                          "parameter server. A new session will be created. Error: %s", where, exc)


class _Coordinated:
    """One session the creator made: its hooked run and its coordinator (TF's ``_CoordinatedSession``)."""

    def __init__(self, tf_sess: Any, hooks: Sequence[Any], grace_secs: float) -> None:
        import tensorflow as tf

        self.tf_sess = tf_sess
        self.coord = Coordinator(clean_stop_exception_types=())  # as TF's: suppresses no exception
        self._grace = grace_secs
        if tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.QUEUE_RUNNERS):
            tf.compat.v1.train.start_queue_runners(sess=tf_sess, coord=self.coord)
        for hook in hooks:
            hook.after_create_session(tf_sess, self.coord)
        self.hooked = GraphHookedSession(tf_sess, hooks)

    @property
    def _sess(self) -> GraphHookedSession:
        """The hooked session (TF's private name for this layer's inner session)."""
        return self.hooked

    def check_stop(self) -> bool:
        """Raises the error the coordinator recorded, else whether it was asked to stop."""
        self.coord.raise_requested_exception()
        return self.coord.should_stop()

    def should_stop(self) -> bool:
        return self.check_stop() or self.hooked.should_stop()

    def run(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return self.hooked.run(*args, **kwargs)
        except _preemption_errors():
            raise
        except Exception as original:
            try:
                self.coord.raise_requested_exception()
            except _preemption_errors():
                raise  # the coordinator's preemption is the root cause
            except Exception:
                raise original from None
            raise

    def run_step_fn(self, step_fn: Callable[[Any], Any], step_context: Callable[[Any, Callable[..., Any]], Any],
                    raw: Any, run_with_hooks: Optional[Callable[..., Any]]) -> Any:
        return step_fn(step_context(raw, run_with_hooks or self.run))

    def close(self) -> None:
        """Stop and join the coordinator (its recorded error is raised), then close the session."""
        self.coord.request_stop()
        try:
            self.coord.join(stop_grace_period_secs=self._grace, ignore_live_threads=True)
        finally:
            try:
                self.tf_sess.close()
            except Exception:  # as TF: the useful error is join's
                pass


class ForeignMonitoredSession:
    """A MonitoredSession whose creator is the program's own (see the module docstring). Its
    :class:`SessionEnd` (``_ending``) owns whether a stop was requested and whether it is closed."""

    def __init__(self, session_creator: Any, hooks: Sequence[Any], stop_grace_period_secs: float,
                 should_recover: bool, step_context: Callable[[Any, Callable[..., Any]], Any]) -> None:
        import tensorflow as tf

        self._creator = session_creator
        self._hooks = list(hooks)
        self._ending = SessionEnd(tf.compat.v1.get_default_graph(), self._hooks, self._end, self._forget)
        self._grace = stop_grace_period_secs
        self._recover = should_recover
        self._step_context = step_context
        self._current: Optional[_Coordinated] = None
        for h in self._hooks:
            h.begin()
        self._current = self._create_recovering() if should_recover else self._create()

    # ------------------------------------------------------------------ sessions
    def _create(self) -> _Coordinated:
        return _Coordinated(self._creator.create_session(), self._hooks, self._grace)

    def _create_recovering(self) -> _Coordinated:
        while True:
            try:
                return self._create()
            except _preemption_errors() as exc:
                _log_recovery("while a session was being created", exc)

    def _drop(self) -> None:
        """Close the current session (a preemption error on the way is logged, as TF)."""
        current, self._current = self._current, None
        if current is not None:
            try:
                current.close()
            except _preemption_errors() as exc:
                api.tf_logging().error("An error occurred when attempting to close the session. This may be due "
                                       "to a preemption in a connected worker or parameter server. Error: %s", exc)

    def _check_stop(self) -> bool:
        if self._current is None:
            return True
        if not self._recover:
            return self._current.check_stop()
        try:
            return self._current.check_stop()
        except _preemption_errors() as exc:
            _log_recovery("while considering whether the session is complete", exc)
            self._drop()
            self._current = self._create_recovering()
            return False  # a new session: the computation goes on
        except Exception:
            return True  # should_stop() says True rather than raising

    def _recovering(self, call: Callable[[_Coordinated], Any]) -> Any:
        if self._ending.closed:
            raise RuntimeError("Session is already closed.")
        if self._ending.stop_requested:
            raise RuntimeError("Run called even after should_stop requested.")
        while True:
            if self._current is None:
                self._current = self._create_recovering()
            current = self._current
            try:
                return call(current)
            except _preemption_errors() as exc:
                if not self._recover:
                    raise
                _log_recovery("in a run", exc)
                self._drop()

    @property
    def _sess(self) -> Optional[_Coordinated]:
        """The current coordinated session (TF's private name for this layer's inner session)."""
        return self._current

    # ------------------------------------------------------------------ TF API
    @property
    def graph(self) -> Any:
        return self._current.tf_sess.graph if self._current is not None else None

    @property
    def supervisor(self) -> Any:
        """None: the program's own session has no procsv Supervisor."""
        return None

    def raw_session(self) -> Any:
        """The session the creator made (None once closed)."""
        return self._current.tf_sess if self._current is not None else None

    def should_stop(self) -> bool:
        if self._ending.closed or self._ending.stop_requested:
            return True
        if self._check_stop():
            return True
        return self._current is None or self._current.hooked.should_stop()

    def run(self, fetches: Any, feed_dict: Any = None, options: Any = None, run_metadata: Any = None) -> Any:
        return self._recovering(lambda current: current.run(fetches, feed_dict=feed_dict, options=options,
                                                            run_metadata=run_metadata))

    def run_step_fn(self, step_fn: Callable[[Any], Any], raw_of: Optional[Callable[[], Any]] = None) -> Any:
        """``step_fn(step_context)``: ``step_context.session`` is ``raw_of()`` (default: the
        creator's session), ``run_with_hooks`` the current session's hooked run (a preemption inside
        it recovers and calls ``step_fn`` again)."""
        def call(current: _Coordinated) -> Any:
            raw = raw_of() if raw_of is not None else current.tf_sess
            return current.run_step_fn(step_fn, self._step_context, raw, current.run)

        return self._recovering(call)  # a StopIteration (request_stop) leaves should_stop() as it was, as TF

    def request_stop(self) -> None:
        self._ending.request_stop()

    def close(self) -> None:
        self._ending.close()

    def exit(self, exc: Optional[BaseException]) -> bool:
        """The ``with`` block's end: True (suppress) for a clean stop."""
        return self._ending.exit(exc)

    # ------------------------------------------------------------------ its end's two steps (SessionEnd's)
    def _end(self, exc: Optional[BaseException]) -> None:
        """``end()`` on every hook unless the block failed; then the session closes, as TF's."""
        try:
            if exc is None and self._current is not None:
                for h in self._hooks:
                    h.end(self._current.tf_sess)
        finally:
            self._drop()

    def _forget(self) -> None:
        self._current = None


__all__ = ["ForeignMonitoredSession"]
