"""How a graph-mode MonitoredSession ends, as TensorFlow's: one implementation for both kinds.

Runs in the trainer process, in the thread that made the MonitoredSession. :class:`SessionEnd` is the
end both graph-mode sessions share: procsv's over its Supervisor
(:class:`~procsv.trainer.monitored.graph_session.GraphMonitoredSession`) and the one over a program's
own session creator (:class:`~procsv.trainer.monitored.foreign.ForeignMonitoredSession`):

* ``request_stop()``: ``should_stop()`` is True from then on;
* a step function's ``step_context.request_stop()`` raises ``StopIteration`` out of ``run_step_fn``
  and nothing else: outside a ``with`` block ``should_stop()`` stays as it was (TF's
  ``_MonitoredSession.run_step_fn``); only a ``with`` block's exit turns it into the end;
* ``exit(exc)`` (the ``with`` block's end): ``OutOfRangeError``, ``StopIteration`` and procsv's
  clean stops are suppressed and closed as a clean end; any other exception closes as a failure;
* ``close()``: a second one (``close()`` inside a ``with`` block) calls every hook's ``end(None)``
  (unless the block failed) and is TF's ``RuntimeError('Session is already closed.')``, whatever
  ``end(None)`` raised, as TF's ``_close_internal``; the subclass's :meth:`SessionEnd._end` runs the
  hooks' ``end()`` unless the block failed and releases the session; then ``raw_session()`` is None and
  the graph is unfinalized if it was not finalized before the session was made.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from procsv.trainer.coordinator import clean_stop_types


class SessionEnd:
    """The end of a graph-mode MonitoredSession (see the module docstring). The subclass sets
    ``_tf_graph`` and ``_graph_was_finalized`` when it is made, and implements :meth:`_end` and
    :meth:`_forget`."""

    _tf_graph: Any
    _graph_was_finalized: bool
    _hooks: Sequence[Any]
    _stop_requested = False
    _closed = False

    def request_stop(self) -> None:
        self._stop_requested = True

    def close(self) -> None:
        self.close_internal(None)

    def exit(self, exc: Optional[BaseException]) -> bool:
        """The ``with`` block's end: True (suppress) for a clean stop."""
        clean = exc is not None and isinstance(exc, clean_stop_types())
        self.close_internal(None if clean else exc)
        return clean

    def close_internal(self, exc: Optional[BaseException]) -> None:
        """Close once (TF's ``RuntimeError`` the second time): :meth:`_end` (``exc``: the block failed),
        then forget the session and unfinalize the graph, whatever :meth:`_end` raised."""
        if self._closed:
            try:  # as TF's _close_internal: the hooks' end() once more, with the session gone
                if exc is None:
                    for h in self._hooks:
                        h.end(None)
            finally:
                raise RuntimeError("Session is already closed.")  # noqa: B012 (TF's: it replaces what end() raised)
        self._closed = True
        try:
            self._end(exc)
        finally:
            self._forget()
            if not self._graph_was_finalized:
                self._tf_graph._unsafe_unfinalize()

    def _end(self, exc: Optional[BaseException]) -> None:
        """``end()`` on the hooks unless ``exc``, then release the session (raising what it recorded)."""
        raise NotImplementedError

    def _forget(self) -> None:
        """Drop the session: ``raw_session()`` is None from now on."""
        raise NotImplementedError


__all__ = ["SessionEnd"]
