"""The stacks taken before a hang's kill, and their file: ``logs/<slot>.<attempt>.stacks.txt``.

Runs in the watchdog (rule 4's :class:`~procsv.watchdog.rules.actions.TakeStacks`, carried out by the
executor). :class:`Captures` reads every trainer process of this host (:class:`~.capture.Readings`: py-spy
started in the loop, waited for by a thread of its own) and, when the run spans hosts, waits in that
thread for the other hosts' answers to the ask the executor sent their agents
(:meth:`~procsv.watchdog.multihost.stackasks.Ask.wait`, bounded by the same ``timeout``); it then writes the
one file, each member's section naming its host, with a line for each host whose stacks are missing and
why, and the member the stacks blame (:func:`~.capture.culprit`, over every member). The loop takes each
capture when it is done (:meth:`Captures.done`) and never waits for it.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from procsv.common.layout import atomic_write
from procsv.ipc.stack_messages import ProcessStacks
from procsv.watchdog.stacks.capture import Readings, culprit, innermost, render


# the other hosts' stacks, waited for at most this many seconds: what they read, and a line for each host missing
Others = Callable[[float], tuple[list[ProcessStacks], list[str]]]


@dataclass(frozen=True)
class Taken:
    """A capture done for ``slot``'s attempt judged hung: what it read, and the file it went to ("" if that failed)."""

    slot: str
    attempt: int
    stacks: tuple[ProcessStacks, ...]
    path: str
    where: dict[str, str]  # each member's main thread's innermost frame (innermost), or why it is not known, by slot
    culprit: str  # the member the stacks blame (culprit), "" if none


class Captures:
    """The watchdog's captures before a hang's SIGTERM (see the module's docstring)."""

    def __init__(self) -> None:
        self._readings: Readings[tuple[str, int], Taken] = Readings("procsv-stacks")

    def take(self, slot: str, attempt: int, targets: Sequence[tuple[str, int]], path: str, headline: str,
             timeout: float, remote: Optional[Others] = None, host: str = "") -> None:
        """Read ``targets`` (every trainer process of this host, on ``host``: "" for a run on one host) and
        the answers to ``remote`` (the other hosts'), then write them all to ``path`` under ``headline``."""
        # Python frames only: native ones pause each process for 1-5 s and delay the restart by as much,
        # while a TensorFlow main thread's native frames say little (its ops run on threads py-spy does not
        # list); the system call each thread waits in is read from /proc all the same
        until = time.monotonic() + timeout

        def then(local: list[ProcessStacks]) -> Taken:
            here = [dataclasses.replace(s, host=host) for s in local] if host else local
            there, missing = remote(until - time.monotonic()) if remote is not None else ([], [])
            return _write(slot, attempt, here + there, missing, path, headline)

        self._readings.start((slot, attempt), targets, False, timeout, then)

    def pids(self) -> set[int]:
        """The py-spy processes of the captures not taken yet (children of this process the sweep spares)."""
        return self._readings.pids()

    def done(self) -> list[Taken]:
        """The captures finished since the last call (one that raised: taken as none, with the error)."""
        return [taken if taken is not None else
                Taken(slot, attempt, (), "", {slot: f"its stacks could not be taken: {error}"}, "")
                for (slot, attempt), taken, error in self._readings.done()]

    def close(self) -> None:
        self._readings.close()


def _write(slot: str, attempt: int, stacks: list[ProcessStacks], missing: list[str], path: str,
           headline: str) -> Taken:
    """The capture thread's last part: the file's text, written to ``path``."""
    blamed = culprit(stacks)
    where = {s.role: innermost(s) for s in stacks}
    where.setdefault(slot, "its stacks were not read")
    text = f"{headline}\n" + "".join(f"{line}\n" for line in missing) + \
        (f"the stacks blame {blamed}: {where[blamed]}\n" if blamed else "") + "\n" + render(stacks)
    try:
        atomic_write(path, text)
    except OSError:
        path = ""
    return Taken(slot, attempt, tuple(stacks), path, where, blamed)
