"""A group's worker waits, before its program runs, until its chief's address takes a connection.

Runs in the trainer (:mod:`procsv.trainer.__main__`), before the program and after the trainer's TensorFlow import
(:mod:`.heartbeat_bound`'s: a fresh worker's import then runs beside its chief's, not after its chief's server listens),
in a worker (rank > 0) of a ``--nproc`` or ``--nnodes`` group. ``MultiWorkerMirroredStrategy`` connects each worker to
the coordination service its chief serves at its ``TF_CONFIG`` address, and the chief's strategy comes up only once
every worker registered there. A worker that connects before the chief's server listens is refused, and gRPC waits out
its reconnect backoff (1 s at first) before it tries again: both members' strategies came up about a second late. It
happens whenever a worker's program starts before its chief's: a group over hosts whose other host's agent forked its
member before node 0's pre-warmed trainer forked the chief (measured, ``scripts/bench_host_loss.py --only regroup``:
each member's strategy up in 1.08-1.16 s in two of three regroups whose worker started first, 0.12-0.35 s in the
others). A connection to the chief's port, tried every :data:`POLL` s, tells when it listens; the program starts then,
or after :data:`BOUND` s in any case (a chief that never comes up is the group's failure, found as before).
"""

from __future__ import annotations

import socket
import time
from typing import Any, Callable, Optional

BOUND = 5.0  # seconds a worker waits for its chief's server at most
POLL = 0.01  # seconds between tries (a refused one returns at once)


def chief_address(tf_config: dict[str, Any]) -> Optional[str]:
    """The chief's ``host:port`` in a parsed ``TF_CONFIG`` (its ``chief`` task, else ``worker`` task 0), or None."""
    cluster = tf_config.get("cluster")
    if not isinstance(cluster, dict):
        return None
    for job in ("chief", "worker"):
        tasks = cluster.get(job)
        if isinstance(tasks, list) and tasks and isinstance(tasks[0], str) and ":" in tasks[0]:
            return tasks[0]
    return None


def wait_listening(address: str, bound: float = BOUND, clock: Callable[[], float] = time.monotonic,
                   sleep: Callable[[float], None] = time.sleep) -> bool:
    """Until a TCP connection to ``address`` (``host:port``) completes (then closed at once), at most ``bound``
    seconds; True if one did."""
    host, _, port = address.rpartition(":")
    end = clock() + bound
    while True:
        left = end - clock()
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=max(0.05, min(1.0, left))):
                return True
        except (OSError, ValueError):
            pass
        if clock() + POLL >= end:
            return False
        sleep(POLL)


__all__ = ["BOUND", "POLL", "chief_address", "wait_listening"]
