"""The stacks of the members on other hosts, asked of their node agents (issue 69).

Runs in the watchdog of node 0 (the master). :class:`StackAsks` sends each host's agent a
:class:`~procsv.ipc.stack_messages.StacksAsked` through the job's link (:class:`NodeLink`), and gathers
the :class:`~procsv.ipc.stack_messages.StacksTaken` answers (the launcher hands each one over as it
comes, :meth:`StackAsks.answered`) in an :class:`Ask`: complete once every host answered for each of its
processes, or at its deadline. What a host did not answer by then is named missing, and why: its agent
not connected, silent, or without that member (failures as data). An :class:`Ask` is waited for, bounded,
by the capture thread of a hang's stacks (:meth:`Ask.wait`: :mod:`procsv.watchdog.stacks.artifact`) or
read by the loop once :meth:`Ask.ready` (for ``procsv stacks``): both under its lock.

:class:`StacksDesk` is the ``stacks.sock`` ROUTER in the master's private runtime directory, where a
``procsv stacks`` on node 0's host asks for the other hosts' members (the status file names it); it
answers with one ``StacksTaken`` per process, within the asker's bound.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Callable, Optional

import zmq

from procsv.ipc.codec import ProtocolError, decode
from procsv.ipc.stack_messages import ProcessStacks, StacksAsked, StacksTaken
from procsv.ipc.transport import ReceiveTimeout, bind_private, make_socket, recv, send
from procsv.watchdog.multihost.nodes import NodeLink
from procsv.watchdog.rules import group
from procsv.watchdog.rules.state import RunView

Members = dict[int, tuple[str, list[tuple[str, int]]]]  # node -> (its host, its members' (slot, pid))
DESK_SECS = 1.5  # the longest a procsv stacks waits for the other hosts (its answer comes within 2 s)


def remote_members(view: RunView) -> Members:
    """The live trainer processes of the run on other hosts (a group's members, ``--ps`` workers), by node."""
    out: Members = {}
    for c in view.trainers() + group.workers(view):
        if c.node != 0 and c.live and c.pid:
            node = view.nodes.get(c.node)
            out.setdefault(c.node, (node.host if node is not None else f"node {c.node}", []))[1].append((c.slot, c.pid))
    return out


def agent_secs(timeout: float) -> float:
    """How long an agent's own reading may take, for an answer due within ``timeout``: a margin for the way back."""
    return max(0.2, timeout - min(1.0, timeout / 3))


class Ask:
    """One ask of the other hosts' stacks: what each host answered so far, and what is missing."""

    def __init__(self, members: Members, unsent: dict[int, str], timeout: float, deadline: float) -> None:
        self.members, self.unsent, self.timeout, self.deadline = members, unsent, timeout, deadline
        self._cond = threading.Condition()
        self._got: dict[int, list[ProcessStacks]] = {}  # node -> the processes it answered for
        self._of: dict[int, int] = {}  # node -> how many its answer holds

    def add(self, node: int, msg: StacksTaken) -> None:
        with self._cond:
            self._of[node] = msg.of
            if msg.stacks is not None:
                self._got.setdefault(node, []).append(msg.stacks)
            self._cond.notify_all()

    def _complete(self) -> bool:
        return all(n in self.unsent or (n in self._of and len(self._got.get(n, [])) >= self._of[n]) for n in self.members)

    def ready(self, now: float) -> bool:
        """Whether every host answered, or ``now`` is past the deadline (for the loop: it never waits)."""
        with self._cond:
            return self._complete() or now >= self.deadline

    def wait(self, secs: float) -> tuple[list[ProcessStacks], list[str]]:
        """Wait at most ``secs`` seconds for every host's answer (a capture thread's): :meth:`result` then."""
        with self._cond:
            self._cond.wait_for(self._complete, max(0.0, secs))
        return self.result()

    def result(self) -> tuple[list[ProcessStacks], list[str]]:
        """The processes read, in node order (each naming its host), those missing with why in their
        ``error``, and one line per host whose stacks are missing."""
        out: list[ProcessStacks] = []
        missing: list[str] = []
        with self._cond:
            for node, (host, procs) in sorted(self.members.items()):
                got = {s.pid: s for s in self._got.get(node, [])}
                if node in self.unsent:
                    why = f"node {node}'s agent ({host}) {self.unsent[node]}"
                elif node not in self._of:
                    why = f"node {node}'s agent ({host}) did not answer within {self.timeout:g} s"
                else:
                    why = ""
                if why:
                    missing.append(f"the stacks of node {node} ({host}) are missing: {why}")
                for slot, pid in procs:
                    stacks = got.pop(pid, None)
                    out.append(stacks if stacks is not None else ProcessStacks(
                        slot, pid, host=host, error=why or f"node {node}'s agent ({host}) has no live {slot} (pid {pid})"))
                out.extend(got.values())  # (one its agent read that the master does not know: said all the same)
        return out, missing


class StackAsks:
    """Node 0's asks of its agents for their members' stacks; one per launch with ``--nnodes`` > 1."""

    def __init__(self, link: NodeLink, clock: Callable[[], float]) -> None:
        self.link, self.clock = link, clock
        self._last = 0
        self._open: dict[int, Ask] = {}

    def ask(self, members: Members, native: bool, timeout: float) -> Ask:
        """Ask every host of ``members`` for them, each answer due within ``timeout`` seconds."""
        now = self.clock()
        for key in [k for k, a in self._open.items() if now > a.deadline + 10 * a.timeout]:
            del self._open[key]  # (a late answer to an old ask is dropped)
        self._last += 1
        unsent: dict[int, str] = {}
        for node, (_, procs) in members.items():
            msg = StacksAsked(self._last, [slot for slot, _ in procs], native, agent_secs(timeout))
            if not self.link.send(node, msg):
                unsent[node] = "is not connected: its stacks were not asked for"
        ask = self._open[self._last] = Ask(members, unsent, timeout, now + timeout)
        return ask

    def answered(self, node: int, msg: StacksTaken) -> None:
        """One answer of ``node``'s agent (the launcher's, as it comes)."""
        ask = self._open.get(msg.ask)
        if ask is not None and node in ask.members:
            ask.add(node, msg)


class StacksDesk:
    """The ROUTER a ``procsv stacks`` on node 0's host asks for the other hosts' members (``stacks.sock``)."""

    def __init__(self, zctx: "zmq.Context[Any]", runtime_dir: str, asks: StackAsks, view: RunView) -> None:
        self.endpoint = f"ipc://{os.path.join(runtime_dir, 'stacks.sock')}"
        self.sock = make_socket(zctx, zmq.ROUTER)
        bind_private(self.sock, self.endpoint)
        self.asks, self.view = asks, view
        self._waiting: list[tuple[bytes, int, Ask]] = []  # (the asker's route, its ask, ours)

    def receive(self) -> None:
        """Take the asks that came in: each asks every other host, bounded by :data:`DESK_SECS`."""
        for _ in range(100):
            try:
                frames = recv(self.sock, 0)
            except ReceiveTimeout:
                return
            try:
                msg, _ = decode(frames[1:], frozenset({StacksAsked}))
            except ProtocolError:
                continue
            assert isinstance(msg, StacksAsked)
            self._waiting.append((frames[0], msg.ask,
                                  self.asks.ask(remote_members(self.view), msg.native, min(msg.timeout, DESK_SECS))))

    def reply(self, now: float) -> None:
        """Answer the asks whose hosts all answered, or whose bound passed: one ``StacksTaken`` per process."""
        for waiting in [w for w in self._waiting if w[2].ready(now)]:
            self._waiting.remove(waiting)
            route, ask, ours = waiting
            procs, _ = ours.result()
            try:
                for p in list[Optional[ProcessStacks]](procs) or [None]:
                    send(self.sock, StacksTaken(ask, len(procs), p), prefix=[route])
            except zmq.ZMQError:
                pass  # (the asker is gone)

    def close(self) -> None:
        self.sock.close(0)


__all__ = ["Ask", "StackAsks", "StacksDesk", "remote_members", "agent_secs"]
