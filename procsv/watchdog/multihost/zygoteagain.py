"""A node agent's pre-warmed trainer started again after its loss: node 0's rule 13, on the other hosts (issue 70).

Runs in the node agent (:mod:`procsv.watchdog.multihost.agent`) of hosts 1..M-1, which decides nothing of the job's
but owns its host's pre-warmed trainer (its zygote). One is lost when it dies or is given up on (a fork it did not
answer within ``prewarm.FORK_REPLY_TIMEOUT``: the member asked is started fresh at once). Node 0's watchdog starts
its own again after a backoff (:func:`~procsv.watchdog.rules.decide.zygote_retry_delay`, rule 13); before this, an
agent never did: one late fork, or one OOM kill of the zygote, and every later member of that host (each group
restart, each standby group) was started fresh for the rest of the run, its TensorFlow import included (measured, a
group over two hosts whose node 1 zygote held a fork past the bound: node 1's member of the next restart 5.9 s from
its spawn to the group's first step, against 1.2-1.8 s forked in the same session). The rule is node 0's, with its limits: again
``zygote_retry_secs`` after a loss, doubled per loss in a row up to ``zygote_retry_cap``, not after
``zygote_retries`` in a row; a zygote that stayed ready ``ZYGOTE_STEADY_SECS`` starts the count again. Pure: the times
are passed in (the agent's watched clock).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from procsv.watchdog.observe import ZYGOTE_STEADY_SECS
from procsv.watchdog.rules.decide import zygote_retry_delay
from procsv.watchdog.rules.limits import Limits


@dataclass
class ZygoteLosses:
    """The losses of an agent's pre-warmed trainer: when it is started again (:meth:`due`)."""

    attempt: int = 1  # the zygote's number (its log: ``logs/zygote-node<R>.<attempt>.log``)
    losses: int = 0  # lost in a row, without one staying ready ZYGOTE_STEADY_SECS in between
    lost_at: Optional[float] = None  # the last loss (None: the zygote lives, or none was lost)
    ready_at: Optional[float] = None  # when the current one became ready

    def ready(self, now: float) -> None:
        """The current zygote is ready (the first time counts)."""
        if self.ready_at is None:
            self.ready_at = now

    def lost(self, now: float, limits: Limits) -> Optional[float]:
        """The current zygote lost at ``now``: the delay before the next one, or None if none is started again."""
        steady = self.ready_at is not None and now - self.ready_at >= ZYGOTE_STEADY_SECS
        self.losses = 1 if steady else self.losses + 1
        self.lost_at, self.ready_at = now, None
        return None if self.losses >= limits.zygote_retries else zygote_retry_delay(self.losses, limits)

    def due(self, now: float, limits: Limits) -> bool:
        """Whether a new zygote is to be started now (a lost one's backoff over, within the retries)."""
        return self.lost_at is not None and self.losses < limits.zygote_retries and \
            now >= self.lost_at + zygote_retry_delay(self.losses, limits)

    def started(self) -> int:
        """A new zygote is started: its number."""
        self.attempt += 1
        self.lost_at = None
        return self.attempt


__all__ = ["ZygoteLosses"]
