"""A process's watched clock: monotonic time without the time the process was stopped.

Runs in the watchdog (``procsv launch``, node 0's and every one-host launch's), in each other host's agent
(:mod:`procsv.watchdog.multihost.agent`) and in the trainer (:func:`process_clock`, the default clock of a
:class:`procsv.Supervisor`). A :class:`WatchedClock` is the ``clock`` every timer of theirs reads (the
watchdog's decision function's ``now``, every observation's stamp, the probes, the agent's view of node 0;
the trainer's step boundary: a snapshot's deadline, a summary batch's, the saves' and summaries' intervals,
the final checkpoint's grace): the raw monotonic clock minus each stop (SIGSTOP, then SIGCONT: Slurm's
``scontrol suspend``/``resume`` of the job, a shell's job control, a debugger), so that after a suspension no
bound is found past for time in which nothing ran. The arithmetic, and why a stop needs both a SIGCONT and a
gap of its loop, is :mod:`procsv.common.clock.unwatched` (pure).

:meth:`WatchedClock.watch` installs the SIGCONT handler (the main thread only; restored by
:meth:`WatchedClock.unwatch`; a handler installed before it is still called) and makes the calling thread the
loop's: its readings are the ones a stop is measured from (the watchdog's and the agent's loop; the trainer's
main thread, which runs the program's steps and their boundaries). The handler only appends the raw time it
ran at to a list (one atomic append, at a bytecode boundary of the main thread: never half-way through a
reading); the loop's next reading takes it. Until :meth:`watch`, or for a clock never watched (tests drive a
fake one), the readings are the raw clock's.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import threading
import time
from types import FrameType
from typing import Any, Callable, Optional

from procsv.common.clock.unwatched import MIN_STOP_SECS, Stop, Unwatched


TICK_SECS = 0.25  # a ticked clock's loop reads the clock this often: a stop is measured from this long before it at most
BYTE_WAIT_SECS = 0.1  # after a gap of the ticks, how long the loop waits for a SIGCONT's byte on the wakeup fd


class WatchedClock:
    """A callable clock: the raw clock's readings minus the stops its process's loop did not watch."""

    def __init__(self, raw: Callable[[], float] = time.monotonic) -> None:
        self._raw = raw
        self._state = Unwatched()
        self._continued: list[float] = []  # raw times of the SIGCONTs handled, not taken by the loop yet
        self._loop: Optional[int] = None  # the loop thread's ident, once watched
        self._old: Any = None  # the SIGCONT handler before watch()
        self._said = 0  # the stops already handed out by new_stops
        self._ticker: Optional[_Ticker] = None  # a ticked clock's loop thread (watch(ticked=True))
        self._high = float("-inf")  # the highest reading another thread than the loop's took

    def __call__(self) -> float:
        raw = self._raw()
        if threading.get_ident() != self._loop:
            # (a stop is measured from the loop's last reading: another thread's reading since, up to a tick later,
            # would step back at the fold; it stays where it was instead)
            self._high = now = max(self._high, self._state.peek(raw, list(self._continued)))
            return now
        taken: list[float] = []
        while self._continued:
            taken.append(self._continued.pop(0))  # (a SIGCONT handled meanwhile is appended after: taken next)
        return self._state.read(raw, taken)

    def __copy__(self) -> WatchedClock:
        return self  # (one clock per process: an object copied with its clock, a Keras callback say, keeps it)

    def __deepcopy__(self, memo: dict[int, Any]) -> WatchedClock:
        return self

    def watch(self, ticked: bool = False) -> None:
        """From now on SIGCONT ends a stop (the main thread only: a handler cannot be installed elsewhere, and
        a clock watched from another thread subtracts nothing), measured from the loop's last reading: the
        calling thread's, or with ``ticked`` a thread of the clock's own that reads it every
        :data:`TICK_SECS` (a process whose main thread may not read its clock for long: a trainer in a long
        step, or blocked in a wait). A ticked loop learns of a SIGCONT as it is delivered, through the
        wakeup fd (``signal.set_wakeup_fd``; a fd set before is still written), not when the main thread
        next runs Python: a step in TensorFlow's C++ code at the resume delays the handler, not the stamp."""
        if threading.current_thread() is not threading.main_thread() or self._loop is not None:
            return
        self._old = signal.signal(signal.SIGCONT, self._on_continue)
        if not ticked:
            self._loop = threading.get_ident()
            self()  # (the loop's first reading: a stop is measured from the loop's readings only)
            return
        self._ticker = _Ticker(self)
        self._loop = self._ticker.start()

    def unwatch(self) -> None:
        """Restore the SIGCONT handler (the clock keeps what it subtracted); a ticked clock's thread ends."""
        if self._loop is not None:
            signal.signal(signal.SIGCONT, self._old if self._old is not None else signal.SIG_DFL)
            self._loop = None
            if self._ticker is not None:
                self._ticker.stop()
                self._ticker = None

    def _on_continue(self, signum: int, frame: Optional[FrameType]) -> None:
        self._continued.append(self._raw())
        if callable(self._old):  # (a handler the program installed before: it still runs)
            self._old(signum, frame)

    def continued_at(self, raw: float) -> None:
        """A SIGCONT was delivered at raw time ``raw`` (a ticked loop's stamp of it): the loop's next reading
        takes it, as a handled one's."""
        self._continued.append(raw)

    def raw(self) -> float:
        """A reading of the raw clock (nothing subtracted, nothing taken)."""
        return self._raw()

    def last_raw(self) -> Optional[float]:
        """The loop's last raw reading (None before its first)."""
        return self._state.last_read

    @property
    def watched(self) -> bool:
        """True from :meth:`watch` (from the main thread) until :meth:`unwatch`."""
        return self._loop is not None

    @property
    def subtracted(self) -> float:
        """The seconds of every stop subtracted so far."""
        return self._state.subtracted

    @property
    def stops(self) -> tuple[Stop, ...]:
        """The stops subtracted so far (the newest :data:`~procsv.common.clock.unwatched.STOPS_KEPT`), oldest first."""
        return tuple(self._state.stops)

    def unwatched_since(self, at: float) -> float:
        """:meth:`Unwatched.unwatched_since`: the stopped seconds since watched time ``at``."""
        return self._state.unwatched_since(at)

    def new_stops(self) -> list[Stop]:
        """The stops subtracted since the last call (the loop says each once)."""
        fresh = self._state.folded - self._said
        self._said = self._state.folded
        return self._state.stops[len(self._state.stops) - min(fresh, len(self._state.stops)):]


class _Ticker:
    """A ticked clock's loop: a daemon thread that reads the clock every :data:`TICK_SECS` and stamps each
    SIGCONT as the wakeup fd brings its byte (its signal number). Owns the socket pair and the wakeup fd it
    set (bytes of the other signals, and SIGCONT's, are passed on to a fd set before it)."""

    def __init__(self, clock: WatchedClock) -> None:
        self._clock = clock
        self._r, self._w = socket.socketpair()
        self._r.setblocking(False)
        self._w.setblocking(False)
        self._old_fd = signal.set_wakeup_fd(self._w.fileno(), warn_on_full_buffer=False)
        self._done = False
        self._thread = threading.Thread(target=self._run, name="procsv-watched-clock", daemon=True)

    def start(self) -> int:
        """Start the thread: its ident (the clock's loop)."""
        self._thread.start()
        ident = self._thread.ident
        assert ident is not None  # (started)
        return ident

    def stop(self) -> None:
        """End the thread and give the wakeup fd back (the main thread)."""
        self._done = True
        signal.set_wakeup_fd(self._old_fd)
        try:
            self._w.send(b"\0")
        except OSError:
            pass
        self._thread.join(timeout=2 * TICK_SECS)
        self._r.close()
        self._w.close()

    def _continued(self, timeout: float) -> bool:
        """Wait up to ``timeout`` for bytes on the wakeup fd: True if a SIGCONT's came."""
        ready, _, _ = select.select([self._r], [], [], timeout)
        if not ready:
            return False
        try:
            data = self._r.recv(4096)
        except (BlockingIOError, InterruptedError):
            return False
        if self._old_fd >= 0:
            try:
                os.write(self._old_fd, data)
            except OSError:
                pass
        return signal.SIGCONT in data

    def _run(self) -> None:
        clock = self._clock
        clock()  # (the loop's first reading)
        while not self._done:
            continued = self._continued(TICK_SECS)
            raw = clock.raw()
            last = clock.last_raw()
            if not continued and last is not None and raw - last >= MIN_STOP_SECS:
                continued = self._continued(BYTE_WAIT_SECS)  # (a gap: its SIGCONT's byte may be a moment late)
            if continued:
                clock.continued_at(raw)
            clock()


_PROCESS: Optional[WatchedClock] = None


def process_clock() -> WatchedClock:
    """The process's one watched clock, watched from its first call on the main thread (a trainer's: every
    :class:`procsv.Supervisor` that is given no clock reads it; one SIGCONT handler however many Supervisors the
    program builds). Called first on another thread it is the raw clock's until a call on the main thread."""
    global _PROCESS
    if _PROCESS is None:
        _PROCESS = WatchedClock()
    if not _PROCESS.watched:
        _PROCESS.watch(ticked=True)
    return _PROCESS


def stopped_since(clock: Callable[[], float], at: float) -> float:
    """The seconds ``clock`` left out since its time ``at``: a :class:`WatchedClock`'s stops since (``now - at``
    plus this is the real time since ``at``), 0 for any other clock."""
    return clock.unwatched_since(at) if isinstance(clock, WatchedClock) else 0.0


def is_process_clock(clock: object) -> bool:
    """True if ``clock`` is :func:`process_clock`'s (a Supervisor given no clock), without making one."""
    return _PROCESS is not None and clock is _PROCESS


def _forget_in_child() -> None:
    global _PROCESS
    _PROCESS = None  # (a forked child has no ticker thread: its first call watches afresh)


os.register_at_fork(after_in_child=_forget_in_child)
