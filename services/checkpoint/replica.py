"""Node 0's checkpoint service's side of node 1's replica of its group copies (issue 54, point 2).

Runs in node 0's checkpoint service of a ``procsv launch --nnodes M`` group (M >= 2). Every group
copy the service holds (node 0's members' in-memory copies and the peer copies of the members of
hosts 1..M-1: :mod:`.group`) is also sent to node 1's holder (:mod:`procsv.watchdog.multihost.holder`,
a thread of node 1's agent), over the peer link's CURVE socket (:mod:`.peers`), as a
:class:`~procsv.ipc.replica_messages.ReplicaCopy` with the checksum this service took when it first
copied it. This is done by the service's own loop after the member's copy is acknowledged: the
members' step path does not wait on it, and neither does the loop: a send that finds the holder's
queue full is not made. A holder that reads slowly or not at all (its link slow or lost, its agent
stopped) pins no more of this process's memory than the copies it holds at most: a copy is sent
only while fewer than ``keep`` copies per member are still queued for it (each frame tracked until
ZeroMQ lets go of it); the others are not sent (``skipped``), so node 1 holds older copies until it
reads again.

A service SIGKILLed and restarted by the watchdog holds nothing; node 1's holder sees the new
service's ``peer.json``, connects and hands back every copy it holds (:class:`ReplicaHello`, then
one :class:`ReplicaCopy` each), which this service holds again, marked as held on node 1
(``MemberCopy.node``): the next group restart then finds the newest step whole for every member
there, each copy checked against the checksum taken on node 0 (a copy damaged on node 1 is named as
such, and the group restores from disk). Node 0's whole launch lost (its host, or a SIGKILL of it all)
ends the run (node 0 runs the watchdog); node 0's launch started again has a new service, to which the
holder hands its copies back the same way (its agent joins the relaunched master only once it has,
:mod:`procsv.watchdog.multihost.agent`), and the relaunched group's first restore asks for them.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import zmq

from procsv.ipc.messages import Message
from procsv.ipc.replica_messages import ReplicaCopy, ReplicaHello
from procsv.ipc.transport import send
from procsv.services.checkpoint.peers import PEER_TAG, PeerLink

HOLDER_NODE = 1  # the buddy of node 0: the node whose holder keeps node 0's group copies


class Replica:
    """Who node 1's holder is on the peer link (its tagged identity, once it said hello), what is
    sent to it, and what it hands back to a restarted service. ``copies`` is the service's
    :class:`~procsv.services.checkpoint.group.GroupCopies`; ``copy_of(msg, frames)`` makes a held
    copy of a :class:`ReplicaCopy` (marked as held on node 1); ``keep``: the copies held per member."""

    def __init__(self, link: PeerLink, copies: Any, copy_of: Callable[[ReplicaCopy, list[Any]], Any],
                 say: Callable[[str], None], keep: int = 3) -> None:
        self.link, self.copies, self._copy_of, self.say, self.keep = link, copies, copy_of, say, keep
        self.holder: Optional[bytes] = None  # PEER_TAG + the holder's identity on the link
        self.sent = 0  # copies sent to the holder (handed to ZeroMQ)
        self.skipped = 0  # copies not sent: the holder's queue was full, or as many as held still queued
        self._queued: list[list[Any]] = []  # the trackers of each copy sent that ZeroMQ may still hold
        self.taken_back = 0  # copies the holder handed back to this service
        self._expected = 0  # copies the holder said it would hand back

    def forward(self, copy: Any) -> None:
        """Send a copy this service holds to node 1's holder (none connected yet: it gets every copy
        held when it says hello); a copy the holder handed back is not sent to it again."""
        if self.holder is None or copy.node is not None:
            return
        self._queued = [q for q in self._queued if not all(t.done for t in q)]
        if len(self._queued) >= self.keep * max(1, len(self.copies.by_rank)):
            self.skipped += 1
            return
        msg = ReplicaCopy(copy.rank, copy.attempt, copy.step, list(copy.specs), copy.crc)
        frames = [zmq.Frame(f, copy=False, track=True) for f in copy.frames]
        try:
            sent = send(self.link.sock, msg, frames, prefix=[self.holder[len(PEER_TAG):]])
        except zmq.ZMQError:  # the holder is gone (it says hello again when back)
            sent = False
        if sent:
            self.sent += 1
            self._queued.append([f.tracker for f in frames if f.tracker is not None])
        else:
            self.skipped += 1

    def handle(self, msg: Message, payload: list[Any], identity: bytes, node: int) -> None:
        """A message of node ``node``'s holder (the peer link checked its key was filed as a holder's)."""
        if node != HOLDER_NODE:
            return
        if isinstance(msg, ReplicaHello):
            self.holder, self._expected, self.taken_back = identity, msg.held, 0
            if msg.held:
                self.say(f"procsv checkpoint: node {node}'s holder (pid {msg.pid}) hands back {msg.held} group copies")
            for copies in list(self.copies.by_rank.values()):
                for copy in copies:
                    self.forward(copy)
        elif isinstance(msg, ReplicaCopy) and identity == self.holder:
            if self.copies.find(msg.rank, msg.step, msg.attempt) is None:
                self.copies.take_back(self._copy_of(msg, payload))
            self.taken_back += 1
            if self.taken_back == self._expected:
                self.say(f"procsv checkpoint: node {node}'s holder handed back {self.taken_back} group copies")

    def stats(self) -> dict[str, Any]:
        """What ``checkpoint_stats.json`` says of the replica (``group.replica``)."""
        return {"holder": self.holder is not None, "sent": self.sent, "skipped": self.skipped,
                "taken_back": self.taken_back}


__all__ = ["Replica", "HOLDER_NODE", "PEER_TAG"]
