"""The watchdog's and the agents' clock: monotonic time without the time their process was stopped.

Runs in the watchdog (``procsv launch``, node 0's and every one-host launch's) and in each other
host's agent (:mod:`procsv.watchdog.multihost.agent`). A :class:`WatchedClock` is the ``clock`` every
timer of theirs reads (the decision function's ``now``, every observation's stamp, the probes, the
agent's view of node 0): the raw monotonic clock minus each stop (SIGSTOP, then SIGCONT: Slurm's
``scontrol suspend``/``resume`` of the job, a shell's job control, a debugger), so that after a
suspension no bound is found past for time in which nothing ran. The arithmetic, and why a stop
needs both a SIGCONT and a gap of its loop, is :mod:`procsv.watchdog.rules.unwatched` (pure).

:meth:`WatchedClock.watch` installs the SIGCONT handler (the main thread only; restored by
:meth:`WatchedClock.unwatch`) and makes the calling thread the loop's: its readings are the ones a stop
is measured from. The handler only appends the raw time it ran at to a list (one atomic append, at a
bytecode boundary of the main thread: never half-way through a reading); the loop's next reading takes
it. Until :meth:`watch`, or for a clock never watched (tests drive a fake one), the readings are the raw
clock's.
"""

from __future__ import annotations

import signal
import threading
import time
from types import FrameType
from typing import Any, Callable, Optional

from procsv.watchdog.rules.unwatched import Stop, Unwatched


class WatchedClock:
    """A callable clock: the raw clock's readings minus the stops its process's loop did not watch."""

    def __init__(self, raw: Callable[[], float] = time.monotonic) -> None:
        self._raw = raw
        self._state = Unwatched()
        self._continued: list[float] = []  # raw times of the SIGCONTs handled, not taken by the loop yet
        self._loop: Optional[int] = None  # the loop thread's ident, once watched
        self._old: Any = None  # the SIGCONT handler before watch()
        self._said = 0  # the stops already handed out by new_stops

    def __call__(self) -> float:
        raw = self._raw()
        if threading.get_ident() != self._loop:
            return self._state.peek(raw, list(self._continued))
        taken: list[float] = []
        while self._continued:
            taken.append(self._continued.pop(0))  # (a SIGCONT handled meanwhile is appended after: taken next)
        return self._state.read(raw, taken)

    def watch(self) -> None:
        """From now on the calling thread is the loop's, and SIGCONT ends a stop (the main thread only: a
        handler cannot be installed elsewhere, and a clock watched from another thread subtracts nothing)."""
        if threading.current_thread() is not threading.main_thread():
            return
        self._loop = threading.get_ident()
        self()  # (the loop's first reading: a stop is measured from the loop's readings only)
        self._old = signal.signal(signal.SIGCONT, self._on_continue)

    def unwatch(self) -> None:
        """Restore the SIGCONT handler (the clock keeps what it subtracted)."""
        if self._loop is not None:
            signal.signal(signal.SIGCONT, self._old if self._old is not None else signal.SIG_DFL)
            self._loop = None

    def _on_continue(self, signum: int, frame: Optional[FrameType]) -> None:
        self._continued.append(self._raw())

    @property
    def subtracted(self) -> float:
        """The seconds of every stop subtracted so far."""
        return self._state.subtracted

    @property
    def stops(self) -> tuple[Stop, ...]:
        """The stops subtracted so far (the newest :data:`~procsv.watchdog.rules.unwatched.STOPS_KEPT`), oldest first."""
        return tuple(self._state.stops)

    def unwatched_since(self, at: float) -> float:
        """:meth:`Unwatched.unwatched_since`: the stopped seconds since watched time ``at``."""
        return self._state.unwatched_since(at)

    def new_stops(self) -> list[Stop]:
        """The stops subtracted since the last call (the loop says each once)."""
        fresh = self._state.folded - self._said
        self._said = self._state.folded
        return self._state.stops[len(self._state.stops) - min(fresh, len(self._state.stops)):]
