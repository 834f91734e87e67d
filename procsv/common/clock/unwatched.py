"""The watched clock's arithmetic: the time a process watched, without the time it was stopped.

Runs in every process that watches its clock (the watchdog, node 0's and every launch's; each other
host's agent; the trainer), inside its :class:`~procsv.common.clock.watched.WatchedClock`, and in the
watchdog's judgement of a child's wait (:func:`stopped_within`). Pure: every reading of the raw monotonic
clock, and the raw time of every SIGCONT the process handled, is passed in; nothing here reads a clock
or installs a handler.

Slurm's ``scontrol suspend`` SIGSTOPs every process of a job and ``scontrol resume`` SIGCONTs them
(a shell's job control and a debugger do the same to one process): a timer on the raw monotonic
clock then counts the suspension as silence, and on resume every rule's bound is past at once (the
checkpoint-stall rule killed the checkpoint service for "no checkpoint committed for 20.5 s" after a
20 s suspension). So the rules' ``now`` is this clock: the raw clock minus every *stop*, the gap
between the loop thread's last reading before a SIGCONT and that SIGCONT, when the gap is
:data:`MIN_STOP_SECS` or longer. Both are needed: a SIGCONT alone is no stop (``kill -CONT`` of a
running process: the loop read the clock a moment before), and a long gap alone is no stop either
(a loop blocked or descheduled while its children ran on: what they did meanwhile, a hang, a stall,
is real, and its bound counts it). A stop shorter than :data:`MIN_STOP_SECS` is counted as watched
time: every rule's bound is longer.

The clock never runs backwards for the loop thread: a fold leaves its next reading where its last
one before the stop was (:meth:`Unwatched.read`). Another thread's reading (:meth:`Unwatched.peek`)
sees the folds the loop has not taken yet, so it agrees with the loop's next one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

MIN_STOP_SECS = 1.0  # a gap from the loop's last reading to a SIGCONT this long or more is a stop, subtracted
STOPS_KEPT = 1000  # the stops remembered for unwatched_since (one a suspension of the job; their total is kept whole)


@dataclass(frozen=True)
class Stop:
    """One stop subtracted: it began at watched time ``at`` (the loop's last reading before it) and lasted
    ``secs`` (until the SIGCONT)."""

    at: float
    secs: float


@dataclass
class Unwatched:
    """The stops a process's clock subtracted so far, and the loop thread's last raw reading."""

    last_read: Optional[float] = None  # the loop thread's last raw reading (after a fold: the SIGCONT's)
    subtracted: float = 0.0  # the seconds of every stop so far
    stops: list[Stop] = field(default_factory=list)  # the newest STOPS_KEPT of them
    folded: int = 0  # the stops subtracted so far (all of them, kept or not)

    def gap(self, continued: float, last_read: Optional[float]) -> float:
        """The stop a SIGCONT at raw time ``continued`` ends, after the loop's last raw reading ``last_read``:
        the gap between them if it is :data:`MIN_STOP_SECS` or longer, else 0."""
        if last_read is None:
            return 0.0  # (before the loop's first reading: nothing was watched yet)
        gap = continued - last_read
        return gap if gap >= MIN_STOP_SECS else 0.0

    def fold(self, continued: float) -> float:
        """The loop takes a SIGCONT handled at raw time ``continued``: the seconds subtracted (0 if no stop)."""
        last = self.last_read
        secs = self.gap(continued, last)
        if secs > 0 and last is not None:  # (gap() is 0 without a reading)
            self.stops.append(Stop(last - self.subtracted, secs))
            del self.stops[:-STOPS_KEPT]
            self.folded += 1
            self.subtracted += secs
            self.last_read = continued
        return secs

    def read(self, raw: float, continued: Sequence[float] = ()) -> float:
        """The loop thread reads the clock at raw time ``raw``, after the SIGCONTs handled at ``continued``
        (raw times, oldest first, none taken before): the watched time. A reading taken just before a stop
        whose SIGCONT is folded with it reads as the SIGCONT's (the clock never runs backwards)."""
        for c in continued:
            self.fold(c)
        if self.last_read is not None:
            raw = max(raw, self.last_read)
        self.last_read = raw
        return raw - self.subtracted

    def peek(self, raw: float, continued: Sequence[float] = ()) -> float:
        """Another thread reads the clock at raw time ``raw``: the watched time, the SIGCONTs at ``continued``
        the loop has not taken yet counted as it will count them. Changes nothing."""
        last, subtracted = self.last_read, self.subtracted
        for c in continued:
            secs = self.gap(c, last)
            if secs > 0:
                subtracted += secs
                last = c
        return raw - subtracted

    def unwatched_since(self, at: float) -> float:
        """The seconds of the stops that began at watched time ``at`` or later: ``now - at`` plus this is the
        time that really passed since ``at`` (a wall time of ``at`` is ``wall_now - (now - at) - this``)."""
        return sum(s.secs for s in self.stops if s.at >= at)


def stopped_within(stops: Sequence[Stop], now: float, secs: float) -> float:
    """The seconds of ``stops`` (oldest first) that fell within the last ``secs`` seconds of real time before watched
    time ``now``: of a wait another process timed on a raw monotonic clock (a trainer's deadline for a snapshot's
    result, ``SaveOverdue.waited_secs``), the part the watchdog's process was stopped, with the job, for. Walked from
    the newest stop back: the watched time between stops counts once, each stop its length, until ``secs`` is spent
    (a wait that began during a stop counts that stop's part after it)."""
    left, cursor, total = secs, now, 0.0
    for stop in reversed(stops):
        ran = max(0.0, cursor - stop.at)  # watched (not stopped) seconds between this stop and the later one, or now
        if ran >= left:
            break
        left -= ran
        part = min(stop.secs, left)
        total, left, cursor = total + part, left - part, stop.at
        if left <= 0:
            break
    return total
