"""A node agent's SIGTERM/SIGINT: left to node 0 while node 0 is there (pure: no clock, no I/O).

Runs in the node agent (``procsv launch --node-rank R``, R > 0). Slurm's ``scancel``, ``scontrol
requeue`` and preemption send SIGTERM to every process of the job on every node at once. An agent
that stopped its trainers on it would break the group's collectives under node 0's chief, which
then could not commit its emergency checkpoint. So an agent connected to node 0 does not stop on
the first signal: it tells node 0 (``NodeHello.stop``; node 0 stops the whole job in order, as on
its own SIGTERM) and waits for node 0's :class:`~procsv.ipc.messages.NodeStop`. It stops on its
own when node 0 is silent, after ``limit`` seconds (node 0's grace plus its node timeout), on a
second SIGINT, or at once when it is not connected. A repeated SIGTERM (Slurm's own and the one
``srun`` forwards) changes nothing.
"""

from __future__ import annotations

import signal
from typing import Callable, Optional


class StopRequest:
    """The first stop signal this agent got, and whether it still waits for node 0's stop."""

    def __init__(self, limit: float) -> None:
        self.limit = limit  # seconds after the signal the agent waits for node 0 at most
        self.signum: Optional[int] = None
        self.at = 0.0
        self.news = False  # a new request: say so and tell node 0 at once

    def decide(self, stops: list[int], now: float, connected: bool) -> Optional[int]:
        """Take the signals in ``stops`` (emptied); the exit code to stop with now, or None."""
        while stops:
            sig = stops.pop(0)
            if self.signum is None and connected:
                self.signum, self.at, self.news = sig, now, True
            elif self.signum is None or sig == signal.SIGINT:
                return 128 + sig  # not connected: nobody to leave it to; a second ^C: now
        if self.signum is not None and (not connected or now - self.at > self.limit):
            return 128 + self.signum
        return None

    def take(self, stops: list[int], now: float, connected: bool, say: Callable[[str], None]) -> Optional[int]:
        """:meth:`decide`, saying a new request once (node 0 hears of it at the next heartbeat)."""
        code = self.decide(stops, now, connected)
        if code is None and self.news:
            self.news = False
            say(self.line())
        return code

    def line(self) -> str:
        name = signal.Signals(self.signum or signal.SIGTERM).name
        return (f"{name} received: node 0 stops the job in order (this host's trainers stop when it says so; on "
                f"their own if node 0 is silent or after {self.limit:g} s)")
