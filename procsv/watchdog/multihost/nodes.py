"""The master's end of a job that spans hosts: the CURVE-secured ROUTER its node agents connect to.

Runs in the watchdog of node 0 (``procsv launch --nnodes M --node-rank 0 --master-addr HOST:PORT``).
:class:`NodeLink` binds the ROUTER on ``--master-addr`` (TCP, CURVE: :mod:`procsv.common.curve`
makes the launch's server keys, keeps the secret in memory and admits only agent keys filed for the
launch), receives what the agents send (:mod:`procsv.ipc.node_messages`) and turns it into
observations of the view, and carries the executor's starts and signals of remote members to their
agent. Which agent speaks for which node is its CURVE key (ZeroMQ's ``User-Id`` of every frame), not
anything it says or its socket's name: a key holds the node rank it first claims in a launch
(:func:`~procsv.watchdog.rules.hosts.claim_node` decides); another key's claim of that rank is
refused (:class:`~procsv.ipc.node_messages.NodeRefused`) and logged once (``node_refused``). It beats
every :data:`BEAT_SECS` (each beat carries node 0's ``--node-timeout``, which the agents use for it)
so that an agent notices a master that is gone, probes the hosts whose agents' beats are late, or whose agents say
they hear nothing from node 0 (:meth:`NodeLink.probe`, :mod:`.probes`: rule 12 tells a slow agent from a silent host,
and finds a one-way cut of node 0's frames, by them), and removes
the keys folder when the launch ends.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import zmq

from procsv.common.errors import UsageError
from procsv.common.layout import Layout
from procsv.ipc.codec import ProtocolError, decode
from procsv.ipc.messages import (RELAYABLE, MasterBeat, MemberEnded, MemberLooked, MemberStarted, Message, NodeHello, NodeRefused,
                                 NodeStop, PromoteMember, Relayed, SignalMember, StacksTaken, StartMembers)
from procsv.ipc.transport import ReceiveTimeout, make_socket, recv, send
from procsv.common import curve
from procsv.watchdog import observe
from procsv.watchdog.multihost.probes import POLL_MS, Prober
from procsv.watchdog.publish.events import Event, Report
from procsv.watchdog.rules.hosts import AGENT_BEAT_SECS, OWN_STALL_SECS, PROBE_WINDOW, Claim, claim_node, probes_due, suspect_after
from procsv.watchdog.rules.limits import Limits
from procsv.watchdog.rules.state import RunView

STOP_DRAIN_SECS = 0.5  # how long the master reads on after telling the agents the job is over
# node 0's heartbeats to its agents, as often as theirs (each agent finds a silent master as node 0 finds a silent
# agent: rules.hosts.master_lost); before 0.5 s, when only --node-timeout applied
BEAT_SECS = AGENT_BEAT_SECS
BEAT_EARLY = 0.02  # a round this much before the beat is due beats (node 0's rounds come every ~0.1 s)
ACCEPT = frozenset({NodeHello, MemberStarted, MemberEnded, MemberLooked, Relayed, StacksTaken})
RELAYED = RELAYABLE  # what an agent may relay from its members (progress, restore, non-finite training)


class NodeLink:
    """The ROUTER of the master; one per launch with ``--nnodes`` > 1."""

    def __init__(self, zctx: "zmq.Context[Any]", layout: Layout, master_addr: str, clock: Callable[[], float],
                 view: RunView, limits: Limits) -> None:
        self.layout = layout
        self.keys = curve.create_job(layout)
        self.sock = make_socket(zctx, zmq.ROUTER)
        self.auth = curve.serve(zctx, self.sock, layout, self.keys)
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a send to a node not connected fails (it is lost)
        self.sock.bind(f"tcp://{master_addr}")
        self.clock = clock
        self.view = view
        self.limits = limits
        self.holders: dict[int, str] = {}  # node -> the public key (Z85) that speaks for it in this launch
        self.routes: dict[int, bytes] = {}  # node -> the routing id of its holder's newest connection (the nodes known)
        self.links: dict[int, int] = {}  # node -> the newest of its holder's connections (NodeHello.link) heard
        self.rerouted: set[int] = set()  # nodes whose route moved to another connection since take_rerouted
        self.refusals: list[Report] = []  # refused claims not reported yet (the launcher takes them)
        self._refused: set[tuple[str, int]] = set()  # (key, node) already reported
        self._beat_at = float("-inf")
        self._round_at = clock()  # node 0's last round (probe): one OWN_STALL_SECS late ends a stall of its own
        self.prober = Prober(clock)  # its probes of the hosts whose beats are late (rule 12)

    @property
    def job(self) -> str:
        return self.keys.job

    def receive(self) -> list[tuple[int, Message, list[Any]]]:
        """What the agents sent: ``(node, message, payload)``; a relayed member report is decoded
        here (its payload is the member's own frames). Malformed messages, and messages from a key
        that holds no node, are dropped; a refused claim is answered and queued in :attr:`refusals`."""
        out: list[tuple[int, Message, list[Any]]] = []
        for _ in range(1000):
            try:
                frames = recv(self.sock, 0, copy=False)
            except ReceiveTimeout:
                break
            if len(frames) < 2:
                continue
            try:
                route, key = frames[0].bytes, str(frames[1].get("User-Id"))
                msg, payload = decode(frames[1:], ACCEPT)
            except (ProtocolError, zmq.ZMQError):
                continue
            node = self._speaker(route, key, msg)
            if node is None:
                continue
            if isinstance(msg, Relayed):
                try:
                    inner, _ = decode(payload, RELAYED)
                except ProtocolError:
                    continue
                payload = [inner]
            out.append((node, msg, payload))
        return out

    def _speaker(self, route: bytes, key: str, msg: Message) -> Optional[int]:
        """The node ``key`` speaks for (a ``NodeHello`` is its claim), or None: drop the message.

        Only a hello routes: the node's route is the connection its holder's newest hello came on. A
        hello of an older connection of the same holder is dropped: an agent that reconnected during a
        partition closed its old socket, but its kernel still holds what that socket queued and delivers
        it once the link is back, after the new connection's hello. Routed by it (as by any message,
        before), the node's next StartMembers went down the dead connection, and the group it was for
        waited in its first collective for a member never started (the chief silent until --hang-timeout)."""
        if not isinstance(msg, NodeHello):
            return next((n for n, k in self.holders.items() if k == key), None)
        if self.holders.get(msg.node) == key and msg.link < self.links.get(msg.node, 0):
            return None  # a late hello of a connection its agent replaced: its news is older than the route's
        verdict, reason = claim_node(self.view, self.limits, msg.node, self.holders, key)
        if verdict is Claim.REFUSED:
            if (key, msg.node) not in self._refused:
                self._refused.add((key, msg.node))
                fingerprint = curve.fingerprint(key.encode())
                self.refusals.append(Report(Event.NODE_REFUSED, {"node": msg.node, "host": msg.host, "pid": msg.pid,
                                                                 "key": fingerprint, "reason": reason},
                                            say=f"procsv: refused an agent claiming node {msg.node} (at {msg.host}, "
                                                f"pid {msg.pid}, key {fingerprint}): {reason}", err=True))
            try:
                send(self.sock, NodeRefused(msg.node, reason, self.limits.node_timeout), prefix=[route])
            except zmq.ZMQError:
                pass
            return None
        self.holders[msg.node] = key
        if self.routes.get(msg.node, route) != route:
            self.rerouted.add(msg.node)  # what went down the old connection may be lost (RemoteMembers.resend)
        self.routes[msg.node] = route
        self.links[msg.node] = msg.link
        return msg.node

    def take_rerouted(self) -> set[int]:
        """The nodes whose route moved to another connection since the last call: a start sent down the
        old one may never have reached the agent (its connection was one the agent had replaced, or closed)."""
        out, self.rerouted = self.rerouted, set()
        return out

    def take_refusals(self) -> list[Report]:
        """The refused claims not reported yet, as lifecycle records."""
        out, self.refusals = self.refusals, []
        return out

    def send(self, node: int, msg: Message) -> bool:
        """Send to ``node``'s agent; False if it is not connected (or its queue is full)."""
        route = self.routes.get(node)
        if route is None:
            return False
        try:
            return send(self.sock, msg, prefix=[route])
        except zmq.ZMQError:  # EHOSTUNREACH: not connected (ROUTER_MANDATORY)
            return False

    def start(self, node: int, attempt: int, ranks: list[int], cluster: list[str], env: dict[str, str],
              standby: bool = False) -> bool:
        return self.send(node, StartMembers(attempt, ranks, cluster, env, standby))

    def promote(self, node: int, msg: PromoteMember) -> bool:
        return self.send(node, msg)

    def signal(self, node: int, slot: str, attempt: int, sig: int, kill: bool = False) -> bool:
        return self.send(node, SignalMember(slot, attempt, sig, kill))

    def beat(self) -> None:
        """Tell every agent the job is alive, every :data:`BEAT_SECS`."""
        now = self.clock()
        if now - self._beat_at < BEAT_SECS - BEAT_EARLY:
            return
        self._beat_at = now
        for node in self.routes:
            self.send(node, MasterBeat(self.job, self.limits.node_timeout))

    def probe(self) -> None:
        """Look at the probes out and observe what the look saw, then send those due (rule 12's :func:`probes_due`);
        each round, before the decision, so that an answer that came is never counted missing (and a probe
        unanswered counts only as long as it was out at the look, however late the decision comes)."""
        now = self.clock()
        if now - self._round_at >= OWN_STALL_SECS:  # (node 0 blocked or descheduled: rule 12's bound counts from now;
            # a stop is no gap here: the watched clock left it out)
            observe.resumed(self.view, now)
        self._round_at = now
        looked_at, answers = self.prober.answers()
        observe.probes_looked(self.view, looked_at, answers)
        for node in [n for n in self.prober.out if self.view.nodes[n].lost_at is not None]:
            self.prober.forget(node)
        for node in probes_due(self.view, self.clock()):
            observe.probe_sent(self.view, node, self.prober.send(node, self.view.nodes[node].probe))

    def poll_ms(self, tick_ms: int) -> int:
        """How long node 0's loop may wait for a message: ``POLL_MS`` while a probe sent within twice
        ``PROBE_WINDOW`` is out (its answer, or its lack, is read soon), else ``tick_ms``, or less: until the
        first host's beats are late enough to probe it (its probes start on time)."""
        now = self.clock()
        if any(now - sent < 2 * PROBE_WINDOW for flying in self.prober.out.values() for _, sent in flying):
            return POLL_MS
        due = [n.last_beat + suspect_after(n.gaps) - now for n in self.view.nodes.values()
               if n.probe_ok and n.last_beat is not None and n.lost_at is None]
        return max(POLL_MS, min([tick_ms, *(int(d * 1000) + 1 for d in due)]))

    def stop_all(self, exit_code: int) -> None:
        """The job is over: every agent stops its members and exits."""
        for node in self.routes:
            self.send(node, NodeStop(exit_code))
        # keep reading a moment: a socket closed with unread data is reset, and the reset can make
        # an agent's kernel drop the NodeStop it has not read yet
        until = self.clock() + STOP_DRAIN_SECS
        while self.routes and self.clock() < until:
            if self.sock.poll(50, zmq.POLLIN):
                self.receive()

    def close(self) -> None:
        """Close the socket and remove the launch's keys (not from a logdir that was moved away)."""
        self.sock.close(linger=500)  # the NodeStop messages still get out
        self.prober.close()
        self.auth.stop()
        if self.view.logdir_lost is None:
            curve.remove_job(self.layout)


def host_ip(master_addr: str, node: int = 1) -> str:
    """This host's address on the route to ``master_addr`` (what its members listen on), for node agent ``node``.
    Raises :class:`~procsv.common.errors.UsageError` with one line when there is none: a name that does not resolve,
    or no route to it (``ENETUNREACH``: no route at all; ``EHOSTUNREACH``, ``EACCES``, ``EINVAL``: an ``unreachable``,
    ``prohibit`` or ``blackhole`` route). Before, the agent ended with a Python traceback."""
    import socket

    host, _, port = master_addr.rpartition(":")
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((host, int(port or 1)))  # UDP: no packet is sent
            return str(s.getsockname()[0])
    except socket.gaierror as exc:
        raise UsageError(f"node {node} cannot resolve node 0's --master-addr {master_addr} ({exc.strerror}): give "
                         "node 0's address as `procsv launch --node-rank 0` prints it (\"waiting for the other hosts "
                         "at HOST:PORT\")") from None
    except OSError as exc:
        raise UsageError(f"node {node} has no route to node 0's --master-addr {master_addr} "
                         f"({exc.strerror or exc}): check the address (node 0's `procsv launch --node-rank 0` prints "
                         f"\"waiting for the other hosts at HOST:PORT\") and this host's routes (`ip route get "
                         f"{host}`)") from None
