"""How a graph-mode MonitoredSession ends, as TensorFlow's: one implementation for both kinds.

Runs in the trainer process, in the thread that made the MonitoredSession. :class:`SessionEnd` is the
end both graph-mode sessions share, each keeping one: procsv's over its Supervisor
(:class:`~procsv.trainer.monitored.graph_session.GraphMonitoredSession`) and the one over a program's
own session creator (:class:`~procsv.trainer.monitored.foreign.ForeignMonitoredSession`). It owns
whether a stop was requested and whether the session is closed; the session gives it, when it is
made, the graph, the hooks, and its own two steps of the close (``end`` and ``forget``):

* ``request_stop()``: ``stop_requested`` (and so the session's ``should_stop()``) is True from then on;
* a step function's ``step_context.request_stop()`` raises ``StopIteration`` out of ``run_step_fn``
  and nothing else: outside a ``with`` block ``should_stop()`` stays as it was (TF's
  ``_MonitoredSession.run_step_fn``); only a ``with`` block's exit turns it into the end;
* ``exit(exc)`` (the ``with`` block's end): ``OutOfRangeError``, ``StopIteration`` and procsv's
  clean stops are suppressed and closed as a clean end; any other exception closes as a failure;
* ``close()``: a second one (``close()`` inside a ``with`` block) calls every hook's ``end(None)``
  (unless the block failed) and is TF's ``RuntimeError('Session is already closed.')``, whatever
  ``end(None)`` raised, as TF's ``_close_internal``; the session's ``end`` runs the hooks' ``end()``
  unless the block failed and releases the session; then its ``forget`` drops it (``raw_session()``
  is None) and the graph is unfinalized if it was not finalized before the session was made.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

from procsv.trainer.coordinator import clean_stop_types


class SessionEnd:
    """The end of one graph-mode MonitoredSession (see the module docstring). Owns ``stop_requested``
    and ``closed``; given the session's graph (its ``finalized`` read now, when the session is made),
    its hooks, ``end(exc)`` (``end()`` on the hooks unless ``exc``, then release the session, raising
    what it recorded) and ``forget()`` (drop the session: ``raw_session()`` is None from then on)."""

    def __init__(self, tf_graph: Any, hooks: Sequence[Any], end: Callable[[Optional[BaseException]], None],
                 forget: Callable[[], None]) -> None:
        self._tf_graph = tf_graph
        self._graph_was_finalized: bool = tf_graph.finalized
        self._hooks = hooks
        self._end = end
        self._forget = forget
        self.stop_requested = False
        self.closed = False

    def request_stop(self) -> None:
        self.stop_requested = True

    def closed_at_creation(self) -> None:
        """The session could not be made (and does not recover): it is closed, with nothing to end."""
        self.closed = True

    def close(self) -> None:
        self.close_internal(None)

    def exit(self, exc: Optional[BaseException]) -> bool:
        """The ``with`` block's end: True (suppress) for a clean stop."""
        clean = exc is not None and isinstance(exc, clean_stop_types())
        self.close_internal(None if clean else exc)
        return clean

    def close_internal(self, exc: Optional[BaseException]) -> None:
        """Close once (TF's ``RuntimeError`` the second time): ``end`` (``exc``: the block failed),
        then ``forget`` the session and unfinalize the graph, whatever ``end`` raised."""
        if self.closed:
            try:  # as TF's _close_internal: the hooks' end() once more, with the session gone
                if exc is None:
                    for h in self._hooks:
                        h.end(None)
            finally:
                raise RuntimeError("Session is already closed.")  # noqa: B012 (TF's: it replaces what end() raised)
        self.closed = True
        try:
            self._end(exc)
        finally:
            self._forget()
            if not self._graph_was_finalized:
                self._tf_graph._unsafe_unfinalize()


__all__ = ["SessionEnd"]
