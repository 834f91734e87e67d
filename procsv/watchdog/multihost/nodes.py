"""The master's end of a job that spans hosts: the CURVE-secured ROUTER its node agents connect to.

Runs in the watchdog of node 0 (``procsv launch --nnodes M --node-rank 0 --master-addr HOST:PORT``).
:class:`NodeLink` binds the ROUTER on ``--master-addr`` (TCP, CURVE: :mod:`procsv.watchdog.multihost.curve`
writes the job's fresh keys to the shared logdir first), receives what the agents send
(:mod:`procsv.ipc.node_messages`) and turns it into observations of the view, and carries the
executor's starts and signals of remote members to their agent. It beats every
:data:`BEAT_SECS` so that an agent notices a master that is gone.
"""

from __future__ import annotations

import os
from typing import Any, Callable

import zmq

from procsv.common.layout import Layout
from procsv.ipc.codec import ProtocolError, decode
from procsv.ipc.messages import (MasterBeat, MemberEnded, MemberStarted, Message, NodeHello, NodeStop, Progress,
                                 Relayed, SignalMember, StartMembers, TrainerReady)
from procsv.ipc.transport import drain, make_socket, send
from procsv.watchdog.multihost import curve

STOP_DRAIN_SECS = 0.5  # how long the master reads on after telling the agents the job is over
BEAT_SECS = 0.5  # both ways: heartbeats; a peer silent for Limits.node_timeout is lost
ACCEPT = frozenset({NodeHello, MemberStarted, MemberEnded, Relayed})
RELAYED = frozenset({Progress, TrainerReady})  # what an agent may relay from its members


def node_identity(node: int) -> bytes:
    return f"node{node}".encode()


class NodeLink:
    """The ROUTER of the master; one per launch with ``--nnodes`` > 1."""

    def __init__(self, zctx: "zmq.Context[Any]", layout: Layout, master_addr: str, clock: Callable[[], float]) -> None:
        self.keys = curve.create_job_keys(layout)
        self.sock = make_socket(zctx, zmq.ROUTER)
        self.auth = curve.serve(zctx, self.sock, self.keys)
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a send to a node not connected fails (it is lost)
        self.sock.bind(f"tcp://{master_addr}")
        self.clock = clock
        self.known: set[int] = set()
        self._beat_at = float("-inf")

    @property
    def job(self) -> str:
        return self.keys.job

    def receive(self) -> list[tuple[int, Message, list[Any]]]:
        """What the agents sent: ``(node, message, payload)``; a relayed member report is decoded
        here (its payload is the member's own frames). Malformed messages are dropped."""
        out: list[tuple[int, Message, list[Any]]] = []
        for got in drain(self.sock, routed=True, accept=ACCEPT, limit=1000):
            if isinstance(got, ProtocolError) or got.identity is None:
                continue
            name = got.identity.decode(errors="replace")
            if not name.startswith("node") or not name[4:].isdigit():
                continue
            node = int(name[4:])
            if isinstance(got.msg, NodeHello) and got.msg.node != node:
                continue  # an agent claims another node than its socket's identity
            if isinstance(got.msg, Relayed):
                try:
                    inner, _ = decode(got.payload, RELAYED)
                except ProtocolError:
                    continue
                out.append((node, got.msg, [inner]))
                continue
            self.known.add(node)
            out.append((node, got.msg, got.payload))
        return out

    def send(self, node: int, msg: Message) -> bool:
        """Send to ``node``'s agent; False if it is not connected (or its queue is full)."""
        try:
            return send(self.sock, msg, prefix=[node_identity(node)])
        except zmq.ZMQError:  # EHOSTUNREACH: not connected (ROUTER_MANDATORY)
            return False

    def start(self, node: int, attempt: int, ranks: list[int], cluster: list[str], env: dict[str, str]) -> bool:
        return self.send(node, StartMembers(attempt, ranks, cluster, env))

    def signal(self, node: int, slot: str, attempt: int, sig: int, kill: bool = False) -> bool:
        return self.send(node, SignalMember(slot, attempt, sig, kill))

    def beat(self) -> None:
        """Tell every agent the job is alive, every :data:`BEAT_SECS`."""
        now = self.clock()
        if now - self._beat_at < BEAT_SECS:
            return
        self._beat_at = now
        for node in self.known:
            self.send(node, MasterBeat(self.job))

    def stop_all(self, exit_code: int) -> None:
        """The job is over: every agent stops its members and exits."""
        for node in self.known:
            self.send(node, NodeStop(exit_code))
        # keep reading a moment: a socket closed with unread data is reset, and the reset can make
        # an agent's kernel drop the NodeStop it has not read yet
        until = self.clock() + STOP_DRAIN_SECS
        while self.known and self.clock() < until:
            if self.sock.poll(50, zmq.POLLIN):
                self.receive()

    def close(self) -> None:
        self.sock.close(linger=500)  # the NodeStop messages still get out
        self.auth.stop()


def host_ip(master_addr: str) -> str:
    """This host's address on the route to ``master_addr`` (what its members listen on)."""
    import socket

    host, _, port = master_addr.rpartition(":")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((host, int(port or 1)))  # UDP: no packet is sent
        return str(s.getsockname()[0])
