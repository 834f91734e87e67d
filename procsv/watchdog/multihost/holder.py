"""Node 1's holder of node 0's group copies (issue 54, point 2): a thread of node 1's agent.

Runs in the ``procsv launch --nnodes M --node-rank 1`` process (the node agent of host 1, the buddy
of node 0), as a thread of its own: the agent's loop never waits on it. Node 0's checkpoint service
holds every in-memory group copy of the job (node 0's members' and the peer copies of the members
of hosts 1..M-1: :mod:`procsv.services.checkpoint.group`) and sends each one here as well
(:mod:`procsv.services.checkpoint.replica`), over its peer link: a CURVE socket whose endpoint and
public key are in ``.procsv/curve/peer.json``. This thread is a CURVE client of it (a DEALER) with a
key pair of its own (the secret stays in this process), filed for the launch as node 1's holder's
(:func:`procsv.common.curve.file_holder_key`): it speaks for no member.

It keeps the last :data:`KEEP` copies of each member, as node 0's service does, in this process's
memory, never on disk. When ``peer.json`` names a new service (node 0's checkpoint service
SIGKILLed and restarted by the watchdog: a new port, a new key), it connects to that one and hands
back every copy it holds (:class:`~procsv.ipc.replica_messages.ReplicaHello`, then a
:class:`~procsv.ipc.replica_messages.ReplicaCopy` each, with the checksum node 0 took): the
restarted service holds them again, and the next group restart restores from memory. Node 0's whole
launch relaunched (a new job) is the same to it: it keeps its copies and hands them back to the new
launch's service (``handed``: which launch it handed back to; its agent joins the relaunched master
only then, :mod:`.agent`), and the relaunched group's first restore asks for them. It checks
nothing itself: the copies are checked against that checksum before use, on node 0 and then by
each member. The agent SIGKILLed (host 1 lost) loses these copies: node 0's own are still there.
The logdir or the socket failing (a key not filed: the disk full) is said in one line and retried
every :data:`RETRY_SECS`, the copies held kept (before, the thread ended: no replica until the
launch ended).
"""

from __future__ import annotations

import os
import sys
import threading
from dataclasses import dataclass
from typing import Any, Optional

import zmq

from procsv.common import curve, faults
from procsv.common.layout import Layout
from procsv.ipc.codec import ProtocolError
from procsv.ipc.replica_messages import ReplicaCopy, ReplicaHello
from procsv.ipc.transport import CHECKPOINT_FRAME_MAX, drain, make_socket, send

KEEP = 3  # copies kept per member, as node 0's checkpoint service keeps
LOOK_SECS = 0.25  # how often it looks at peer.json for a new service (and waits for copies meanwhile)
HOLDER_NODE = 1  # node 0's buddy
RETRY_SECS = 2.0  # after the logdir or the socket failed, it tries again this much later (the copies kept)


@dataclass(frozen=True)
class HeldCopy:
    """One member's copy as node 0's service sent it: the message (with its checksum) and its frames."""

    msg: ReplicaCopy
    frames: tuple[bytes, ...]


class Holder:
    """The thread, its copies by rank, and the service it is connected to (``peer``)."""

    def __init__(self, layout: Layout, node: int) -> None:
        self.layout, self.node = layout, node
        self.copies: dict[int, list[HeldCopy]] = {}
        self.peer: Optional[curve.Peer] = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="procsv-holder", daemon=True)
        self._key_file: Optional[str] = None
        self.handed: Optional[str] = None  # the launch (job) whose checkpoint service it last handed its copies back to

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread (bounded) and remove its key file."""
        self._stop.set()
        self._thread.join(5.0)

    def held(self) -> list[HeldCopy]:
        return [c for copies in self.copies.values() for c in copies]

    def hold(self, msg: ReplicaCopy, frames: list[Any]) -> None:
        """Keep ``msg``'s copy (the last :data:`KEEP` of its member, oldest first)."""
        kept = tuple(bytes(f) for f in frames)
        if faults.fires("holder", "replica_corrupt") and kept and kept[0]:  # tests: a copy damaged on node 1
            kept = (bytes([kept[0][0] ^ 0xFF]) + kept[0][1:], *kept[1:])
        same = (msg.attempt, msg.step)
        others = [c for c in self.copies.get(msg.rank, []) if (c.msg.attempt, c.msg.step) != same]
        self.copies[msg.rank] = sorted(others + [HeldCopy(msg, kept)], key=lambda c: (c.msg.attempt, c.msg.step))[-KEEP:]

    def _connect(self, zctx: "zmq.Context[Any]", peer: curve.Peer) -> "zmq.Socket[Any]":
        """A socket to the service ``peer`` names, this holder's key filed for its job; says hello and
        hands back every copy held."""
        curve.unfile_agent_key(self._key_file)
        self._key_file = None
        keys = curve.AgentKeys.new()
        self._key_file = curve.file_holder_key(self.layout, peer.job, keys, self.node)
        sock = make_socket(zctx, zmq.DEALER, sndhwm=10000, max_frame=CHECKPOINT_FRAME_MAX)
        try:
            curve.connect_as_member(sock, keys, peer)
            sock.connect(peer.endpoint)
        except zmq.ZMQError:
            sock.close(0)
            raise
        held = self.held()
        send(sock, ReplicaHello(self.node, os.getpid(), len(held)))
        for copy in held:
            send(sock, copy.msg, copy.frames)
        self.handed = peer.job  # (its agent holds back its hellos to a relaunched master until then: agent.py)
        if held:
            print(f"procsv node {self.node}: handing {len(held)} group copies back to node 0's checkpoint service "
                  f"at {peer.endpoint}", file=sys.stderr, flush=True)
        return sock

    def _run(self) -> None:
        zctx: zmq.Context[Any] = zmq.Context()
        sock: Optional[zmq.Socket[Any]] = None
        try:
            while not self._stop.is_set():
                try:
                    sock = self._serve(zctx, sock)
                except (OSError, zmq.ZMQError) as exc:  # the logdir or the socket failed: retried, copies kept
                    print(f"procsv node {self.node}: node 0's group copies not replicated for now "
                          f"(retrying in {RETRY_SECS:g} s): {exc}", file=sys.stderr, flush=True)
                    if sock is not None:
                        sock.close(0)
                    sock, self.peer = None, None
                    self._stop.wait(RETRY_SECS)
        finally:
            if sock is not None:
                sock.close(0)
            zctx.term()
            curve.unfile_agent_key(self._key_file)

    def _serve(self, zctx: "zmq.Context[Any]", sock: Optional["zmq.Socket[Any]"]) -> Optional["zmq.Socket[Any]"]:
        """One look at ``peer.json`` (a new service: connect, hand back) and the copies sent meanwhile."""
        peer = curve.load_peer(self.layout)
        if peer is not None and peer != self.peer:
            if sock is not None:
                sock.close(0)
                sock = None
            sock, self.peer = self._connect(zctx, peer), peer
        if sock is None or not sock.poll(int(LOOK_SECS * 1000)):
            if sock is None:
                self._stop.wait(LOOK_SECS)
            return sock
        for got in drain(sock, limit=256, accept=frozenset({ReplicaCopy})):
            if not isinstance(got, ProtocolError) and isinstance(got.msg, ReplicaCopy):
                self.hold(got.msg, got.payload)
        return sock


def start_holder(layout: Layout, node: int) -> Optional[Holder]:
    """Node 1's holder, started (None on any other node)."""
    if node != HOLDER_NODE:
        return None
    holder = Holder(layout, node)
    holder.start()
    return holder
