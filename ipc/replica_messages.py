"""The messages of node 1's replica of node 0's group copies (issue 54, point 2).

Node 1's holder (a thread of node 1's agent, :mod:`procsv.watchdog.multihost.holder`) is a CURVE
client (DEALER) of node 0's checkpoint service's peer link (:mod:`procsv.services.checkpoint.peers`,
a ROUTER). Up: :class:`ReplicaHello` (the holder is here; also sent again to a restarted service),
then a :class:`ReplicaCopy` for each copy it holds (a restarted service takes back what it lost).
Down: a :class:`ReplicaCopy` for each group copy the service holds (node 0's members' and the peer
copies of the members of other hosts), so that node 1 holds them too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from procsv.ipc.checkpoint_messages import TensorSpec
from procsv.ipc.message_base import Message


@dataclass(frozen=True)
class ReplicaHello(Message):
    """Node ``node``'s holder (in its agent, pid ``pid``) -> node 0's checkpoint service: send me
    every group copy you hold, and each one you hold from now on; ``held``: how many copies the
    holder holds (each follows as a :class:`ReplicaCopy`)."""

    KIND: ClassVar[str] = "replica_hello"
    node: int
    pid: int
    held: int


@dataclass(frozen=True)
class ReplicaCopy(Message):
    """One member's in-memory group copy, either way between node 0's checkpoint service and node
    1's holder: member ``rank``'s snapshot of ``step`` taken in ``attempt``, one frame per tensor
    (``tensors``, as in :class:`~procsv.ipc.checkpoint_messages.GroupCopy`), and the CRC-32C node 0's
    service took of those frames when it first copied them (``crc``: never recomputed on the way)."""

    KIND: ClassVar[str] = "replica_copy"
    rank: int
    attempt: int
    step: int
    tensors: list[TensorSpec]
    crc: int


__all__ = ["ReplicaHello", "ReplicaCopy"]
