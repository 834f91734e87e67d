"""SIGTERM and SIGINT (and SIGHUP, unless ignored) as a stop request while a Supervisor session runs.

Runs in the trainer's main thread: a session installs the handlers when it is prepared and puts
the previous ones back when it is released. A handler only asks the session's
:class:`~procsv.trainer.coordinator.Coordinator` to stop (a flag: no lock inside a signal handler);
the loop ends at the next step boundary and the final checkpoint is a ``preempted`` one. A signal
that arrived before (while the bootstrap's own handlers were in place:
:func:`procsv.trainer.outcome.early_stop_signal`) asks for the stop at once.

SIGHUP (a closed ssh session, terminal or tmux pane) stops in order too where it is not ignored:
a plain ``python train.py`` in a terminal, which its default action ended with no checkpoint. Where
it is ignored it stays so (``nohup``; under ``procsv launch`` every child has it ignored and the
watchdog alone stops the run on it).
"""

from __future__ import annotations

import signal
from typing import Any

from procsv.trainer import outcome
from procsv.trainer.coordinator import Coordinator


class StopSignals:
    """The stop handlers of one session; owns the handlers they replaced, put back by :meth:`restore`."""

    def __init__(self) -> None:
        self._old: dict[int, Any] = {}

    def install(self, coord: Coordinator) -> None:
        """From now on SIGTERM and SIGINT (and SIGHUP where not ignored) ask ``coord`` to stop (so does
        one that came before)."""
        def on_signal(signum: int, frame: Any) -> None:
            coord.request_stop_from_signal(signum)

        for sig in (signal.SIGTERM, signal.SIGINT):
            self._old[sig] = signal.signal(sig, on_signal)
        if signal.getsignal(signal.SIGHUP) != signal.SIG_IGN:  # (ignored: nohup, or a launch's child)
            self._old[signal.SIGHUP] = signal.signal(signal.SIGHUP, on_signal)
        early = outcome.early_stop_signal()
        if early is not None:
            coord.request_stop_from_signal(early)

    def restore(self) -> None:
        """Put back the handlers :meth:`install` replaced (nothing if it did not run)."""
        for sig, handler in self._old.items():
            signal.signal(sig, handler)
        self._old = {}
