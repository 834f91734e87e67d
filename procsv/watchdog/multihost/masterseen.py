"""When a node agent gives up on a silent master; with an elastic job's, not while the master is live.

Runs in the node agent (:mod:`procsv.watchdog.multihost.agent`): :class:`MasterSeen` in its loop, the reads of
:func:`status_stamp` in its logdir thread. An agent gives up (exits 1) once the master is silent past
``--rejoin-timeout``. With ``--min-nodes K`` (rule 15) node 0 trains on without a host it lost and takes
the host back when its agent is heard again, however long that takes: an agent cut off by a network
partition must not give up on a master that is still live, or its host is out of the group for good.
So an elastic job's agent, silent past ``--rejoin-timeout``, reads node 0's ``status.json`` in the shared
logdir every ``node_timeout``: node 0's watchdog rewrites it (its ``updated_at``) while it runs; the agent
gives up once a read has not found it changed for ``rejoin_timeout`` + 2 x ``node_timeout`` (a master that is
gone: SIGKILLed, its host lost, or a logdir this host cannot read).
"""

from __future__ import annotations

from typing import Any, Optional

from procsv.common.layout import Layout, read_json
from procsv.watchdog.diskjobs import DiskJobs, Job


def status_stamp(layout: Layout) -> Any:
    """The ``updated_at`` of node 0's ``status.json`` (None: unreadable or not written)."""
    try:
        status = read_json(layout.status)
    except OSError:  # (a network filesystem's EIO, ESTALE: as unread)
        return None
    return status.get("updated_at") if isinstance(status, dict) else None


class MasterSeen:
    """Whether the master is gone for this agent (:meth:`gone`)."""

    def __init__(self, layout: Layout, disk: DiskJobs, rejoin_timeout: float, elastic: bool) -> None:
        self.layout, self.disk, self.rejoin_timeout = layout, disk, rejoin_timeout
        self.elastic = elastic  # --min-nodes K < --nnodes M: node 0 takes this host back (rule 15)
        self._stamp: Any = None  # the status file's ``updated_at`` as last read
        self.changed_at = float("-inf")  # when a read found it changed (the first read counts)
        self._read: Optional[Job[Any]] = None  # a read in the logdir thread
        self._read_at = float("-inf")

    def gone(self, now: float, heard_at: float, node_timeout: float) -> bool:
        """The master last heard at ``heard_at``: silent past ``rejoin_timeout`` and, in an elastic job, its
        status file not found changed for ``rejoin_timeout`` + 2 x ``node_timeout`` (reads every ``node_timeout``)."""
        if now - heard_at <= self.rejoin_timeout:
            return False
        if not self.elastic:
            return True
        if self._read is not None and self._read.done:
            if self._read.result is not None and self._read.result != self._stamp:
                self._stamp, self.changed_at = self._read.result, now
            self._read = None
        if self._read is None and now - self._read_at >= node_timeout:
            self._read, self._read_at = self.disk.submit(lambda: status_stamp(self.layout)), now
        return now - max(heard_at, self.changed_at) > self.rejoin_timeout + 2 * node_timeout
