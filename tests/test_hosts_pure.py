"""A job over hosts (``--nnodes``) without launching one: what node 0 says of each member, and what
another host's agent relays of its members' reports.

In-process: the status record (:func:`~procsv.watchdog.publish.statusfile.status_record`) and
``procsv status``'s view of it, built from a view the watchdog's own observations made; and the
relay of a member's reports through the real sockets, the agent's PULL (a member's PUSH, as a
trainer's), its CURVE DEALER and node 0's ROUTER (:class:`~procsv.watchdog.multihost.nodes.NodeLink`),
with this test process as the member. The real two-host launches are in ``test_hosts.py``.
"""

from __future__ import annotations

import json
import os
import socket
import time
from typing import Any, Callable, Optional

import zmq

from conftest import wait_for
from procsv.common.layout import Layout
from procsv.ipc.messages import MemberStarted, NodeHello, Progress, Relayed, RestoreSource, TrainerReady
from procsv.ipc.transport import Endpoints, bind_private, make_socket, send
from procsv.status import render
from procsv.trainer.nonfinite import notices
from procsv.watchdog import observe
from procsv.watchdog.config import LaunchConfig
from procsv.common import curve
from procsv.watchdog.multihost.agent import NodeAgent
from procsv.watchdog.multihost.nodes import NodeLink
from procsv.watchdog.prewarm import PendingFork
from procsv.watchdog.publish.events import Event
from procsv.watchdog.publish.statusfile import status_record
from procsv.watchdog.rules.hang import HangLimits
from procsv.watchdog.rules.limits import Limits
from procsv.watchdog.rules.state import TRAINER, WORKER, RunView

HOST1 = "10.0.0.2"


def group_view(nodes: int) -> RunView:
    """A running group of two: the chief on node 0 and worker1 on node ``nodes - 1`` (its agent
    joined from HOST1 when that is 1), each past its first step, as the watchdog observes them."""
    view = RunView(launch_start=0.0)
    observe.spawned(view, TRAINER, TRAINER, 1, 101, 1.0, "zygote")
    if nodes > 1:
        observe.node_hello(view, NodeHello(1, 1, HOST1, 77, [f"{HOST1}:4001"]), 1.0)
        observe.spawned(view, "worker1", WORKER, 1, 202, 1.5, "node1")
        view.children["worker1"].node = 1  # (RemoteMembers.started)
    else:
        observe.spawned(view, "worker1", WORKER, 1, 202, 1.5, "zygote")
    view.restart_at = None
    observe.heard(view, Progress(101, 40, 0.0, stepped=True), 3.0)
    observe.heard(view, Progress(202, 39, 0.0, stepped=True), 3.0, slot="worker1" if nodes > 1 else None)
    return view


def members(record: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {p["role"]: p for p in record["processes"] if p["role"] in (TRAINER, "worker1")}


def test_each_member_of_a_group_over_two_hosts_has_its_rank_node_and_host_as_on_one_host(tmp_path) -> None:
    """``--nproc 1 --nnodes 2`` is a group of two as ``--nproc 2`` is. Before: its status record
    had no ``group`` and its members no ``rank``, ``node``, ``host`` or ``step``."""
    layout = Layout(str(tmp_path / "run"))
    here = socket.gethostname()
    one_host = status_record(group_view(1), LaunchConfig("t", [], layout.logdir, nproc=2), layout, 4.0, 4.0, 0.0,
                             None)
    two_hosts = status_record(group_view(2), LaunchConfig("t", [], layout.logdir, nproc=1, nnodes=2), layout, 4.0,
                              4.0, 0.0, None)
    where = {role: (p.get("rank"), p.get("node"), p.get("host"), p.get("step"))
             for role, p in members(two_hosts).items()}
    assert where == {TRAINER: (0, 0, here, 40), "worker1": (1, 1, HOST1, 39)}
    assert two_hosts["group"] == {"nproc": 1, "nnodes": 2, "state": "running", "ps": 0, "nodes": [0, 1],
                                  "min_nodes": 2, "membership_changes": 0,
                                  "hosts": [{"node": 1, "host": HOST1, "connected": True, "ready": True}]}
    assert one_host["group"] == {"nproc": 2, "nnodes": 1, "state": "running", "ps": 0, "nodes": [0],
                                 "min_nodes": 1, "membership_changes": 0, "hosts": []}
    assert {role: (p["rank"], p["node"], p["host"]) for role, p in members(one_host).items()} == {
        TRAINER: (0, 0, here), "worker1": (1, 0, here)}
    assert [sorted(p) for p in members(two_hosts).values()] == [sorted(p) for p in members(one_host).values()]
    text = render(two_hosts, layout.logdir)
    assert "  trainer group of 2 (1 on each of 2 hosts): running" in text.splitlines()
    worker_line = next(line for line in text.splitlines() if line.lstrip().startswith("worker1"))
    assert worker_line.endswith(f"rank 1 on node 1 ({HOST1}), step 39"), worker_line
    assert f"rank 0 on node 0 ({here}), step 40" in text
    assert "  trainer group of 2: running" in render(one_host, layout.logdir).splitlines()
    alone = status_record(group_view(1), LaunchConfig("t", [], layout.logdir), layout, 4.0, 4.0, 0.0, None)
    assert alone["group"] is None and "rank" not in members(alone)[TRAINER]  # one trainer: no group


class ThisProcess:
    """The member the agent runs: this test process, which reports as a trainer does."""

    pid = os.getpid()

    def poll(self) -> Optional[int]:
        return None


class AnsweredZygote:
    """The agent's zygote, its answer naming the member (this process) already on its pipe."""

    def pump(self) -> list[Any]:
        return []

    def answer(self, attempt: int, rank: int = 0) -> ThisProcess:
        return ThisProcess()


class TwoNodes:
    """Node 0's ROUTER (:class:`NodeLink`) and node 1's agent on real CURVE sockets over localhost, the
    agent's key filed for the launch: what the tests of the master's channel share. ``connect()`` is
    the agent's own (re)connect, ``connect_again()`` a second socket with its key (a connection it made
    while the first was still open); every socket made here or handed to ``own`` is closed at
    ``close``, before the contexts."""

    def __init__(self, short_tmp: str) -> None:
        from test_metrics import free_port

        self.layout = Layout(os.path.join(short_tmp, "run"))
        self.layout.create()
        self.addr = f"127.0.0.1:{free_port()}"
        self.view = RunView(launch_start=0.0)
        self.master_ctx: zmq.Context[Any] = zmq.Context()
        self.agent_ctx: zmq.Context[Any] = zmq.Context()
        self.sockets: list[Any] = []
        self.link = NodeLink(self.master_ctx, self.layout, self.addr, time.monotonic, self.view,
                             Limits(hang=HangLimits(None, None), nnodes=2))
        self.agent = NodeAgent(LaunchConfig("procsv.examples.digits", [], self.layout.logdir, nnodes=2, node_rank=1,
                                            master_addr=self.addr))
        self.read = self.agent.disk.submit(self.agent._read_job)  # the agent files its key for the launch
        wait_for(lambda: self.read.done, 30, what="the agent's key filed")

    def own(self, sock: Any) -> Any:
        self.sockets.append(sock)
        return sock

    def connect(self) -> Any:
        """The agent's connection, as its loop makes it (link 1 of these tests)."""
        sock = self.agent._reconnect(self.agent_ctx, None, self.read)
        assert sock is not None
        return self.own(sock)

    def connect_again(self) -> Any:
        """Another connection with the agent's key, the first left open."""
        job = self.read.result.job if self.read.result is not None else None
        assert job is not None
        sock = self.own(make_socket(self.agent_ctx, zmq.DEALER))
        curve.connect_as_agent(sock, self.agent.keys, job)
        sock.connect(f"tcp://{self.addr}")
        return sock

    def hello(self, n: int) -> NodeHello:
        """Node 1's hello on its link ``n``."""
        return NodeHello(1, 1, self.agent.host, os.getpid(), self.agent.addresses, [], link=n)

    def heard_on(self, sock: Any, n: int) -> bool:
        """Say link ``n``'s hello on ``sock``: True once node 0 read one (sent again until the handshake is done)."""
        send(sock, self.hello(n))
        return any(isinstance(msg, NodeHello) and msg.link == n for _, msg, _ in self.link.receive())

    def close(self) -> None:
        for sock in self.sockets:
            sock.close(0)
        self.link.close()
        self.agent.disk.close()
        curve.unfile_agent_key(self.agent.key_file)
        self.agent_ctx.term()
        self.master_ctx.term()


def test_an_agent_relays_its_members_non_finite_reports_to_node_0_as_they_sent_them(short_tmp) -> None:
    """A member on host 1 tells its agent of a non-finite loss, a rollback and a skipped step
    (issue 41), then its progress. Before: the agent's PULL took only ``Progress`` and
    ``TrainerReady`` (the three were refused there as unexpected kinds) and node 0 decoded only
    those two from a ``Relayed``: node 0 heard only the progress, and its events, ``skipped_steps``
    and ``rollbacks`` missed the skip."""
    nodes = TwoNodes(short_tmp)
    layout, view, link, agent = nodes.layout, nodes.view, nodes.link, nodes.agent
    try:
        endpoint = Endpoints(short_tmp).watchdog
        pull = nodes.own(make_socket(nodes.agent_ctx, zmq.PULL))  # the agent's, as in NodeAgent.run
        bind_private(pull, endpoint)
        member = nodes.own(make_socket(nodes.agent_ctx, zmq.PUSH))  # the member's, to its agent
        member.connect(endpoint)
        dealer = nodes.connect()

        wait_for(lambda: nodes.heard_on(dealer, 1), 30, what="node 1 to join node 0")  # its hello: its claim
        # the member's ready message, read before the agent read the zygote's answer naming its pid (its
        # fork still pending): the agent reads the zygote's pipe first, where that answer is (a fork runs
        # only once it is written: procsv.zygote), and relays the message (before: dropped, so node 0
        # never heard its restore)
        agent.forks[(1, 1)] = PendingFork("worker1", 1, {}, layout.attempt_log("worker1", 1), None, WORKER, 1)
        agent.zygote = AnsweredZygote()  # type: ignore[assignment]
        ready = TrainerReady(os.getpid(), 1, 20, "/run/model.ckpt-20", 0.1, [], None, None)
        assert send(member, ready)
        wait_for(lambda: (agent.relay(pull, dealer), "worker1.1" in agent.members)[1], 30, what="the answer read")
        agent.zygote = None
        assert not agent.forks
        observe.spawned(view, "worker1", WORKER, 1, os.getpid(), 1.0, "node1")
        view.children["worker1"].node = 1
        sent = [notices.detected(25, "the loss of step 25 is NaN or infinite"),
                notices.rolled_back(25, 20, RestoreSource.MEMORY, "/dev/shm/arena#slot1", True, 0.02),
                notices.skipped(25, 1),
                Progress(os.getpid(), 26, time.time(), stepped=True)]
        for msg in sent:
            assert send(member, msg)
        heard: list[tuple[int, Any, list[Any]]] = []
        started: list[Any] = []

        def relayed() -> bool:
            agent.relay(pull, dealer)
            for got in link.receive():
                if isinstance(got[1], MemberStarted):
                    started.append(got[1])
                elif not isinstance(got[1], NodeHello):  # (late hellos)
                    heard.append(got)
            return any(isinstance(payload[0], Progress) for _, _, payload in heard if payload)

        wait_for(relayed, 30, what="the member's progress relayed to node 0")
        assert [(m.slot, m.attempt, m.pid) for m in started] == [("worker1", 1, os.getpid())]
        assert [(node, type(msg), msg.slot) for node, msg, _ in heard] == [(1, Relayed, "worker1")] * 5
        assert [payload[0] for _, _, payload in heard] == [ready] + sent  # each as the member sent it
        reports = [r for _, msg, payload in heard for r in observe.heard(view, payload[0], 2.0, slot=msg.slot)]
    finally:
        nodes.close()
    # node 0 observes them as the launcher's _on_nodes does: the events, the counts status.json shows
    assert [r.event for r in reports if r.event] == [Event.WORKER_READY, Event.NONFINITE_DETECTED, Event.ROLLED_BACK,
                                                     Event.STEP_SKIPPED]
    # the worker's restore is a record of its own (before: none, only its trained record at its end, so the time
    # from a group's hello to its first step had no worker's restore to be told by)
    assert reports[0].fields == {"role": "worker1", "attempt": 1, "pid": os.getpid(), "step": 20,
                                 "path": "/run/model.ckpt-20", "secs": 0.1, "prepared_at": None, "warm_secs": 0.0,
                                 "source": None}
    assert (view.findings.nonfinite, view.rollbacks, view.skipped_steps) == (1, 1, [25])
    assert view.children["worker1"].ready_at == 2.0  # its restore, heard through the ready message read first
    record = status_record(view, LaunchConfig("t", [], layout.logdir, nnodes=2), layout, 3.0, 3.0, 0.0, None)
    assert (record["skipped_steps"], record["rollbacks"]) == ([25], 1)


def test_a_late_hello_of_a_connection_the_agent_replaced_does_not_take_its_route(short_tmp) -> None:
    """The hang CI met once in the three hosts' elastic run, reduced: node 1's agent reconnects after a
    partition (a new socket, link 2); what its old socket had queued reaches node 0 late, once the link is
    back, after the new connection's hello. Node 0 routed each node by the last message it heard, so the
    late hello of link 1 took the route, and the StartMembers of the group that took node 1 back went down
    the dead connection: the chief waited in its first collective for a worker1 never started (300 s, no
    output, until the test gave up). Now a hello routes only if it comes on the holder's newest link: the
    start reaches the new socket, and the old one hears nothing. Real sockets, real CURVE."""
    nodes = TwoNodes(short_tmp)
    link, agent, hello, heard_on = nodes.link, nodes.agent, nodes.hello, nodes.heard_on
    try:
        old = nodes.connect()  # link 1
        wait_for(lambda: heard_on(old, 1), 30, what="node 1's hello on link 1")
        # the reconnect: a second socket of the same agent (its key), the old one kept open to play its
        # kernel's late delivery (the agent closes it; its queued bytes still arrive)
        new = nodes.connect_again()
        wait_for(lambda: heard_on(new, 2), 30, what="node 1's hello on link 2")
        assert send(old, hello(1))  # the late delivery
        got: list[Any] = []
        until = time.monotonic() + 1.0
        while time.monotonic() < until:  # node 0's loop reading meanwhile
            got += [msg for _, msg, _ in link.receive() if not (isinstance(msg, NodeHello) and msg.link == 2)]
            time.sleep(0.05)
        assert got == []  # the late hello was read and dropped: not news, and not a route
        assert link.start(1, 3, [1], [f"{agent.host}:1", f"{agent.host}:2"], {})
        starts = wait_for(lambda: _drained(new), 10, interval=0.05, what="the start on the new link")
        assert [type(m).__name__ for m in starts] == ["StartMembers"], starts
        assert starts[0].attempt == 3
        time.sleep(0.3)
        assert _drained(old) == []  # the old connection carried nothing
    finally:
        nodes.close()


class NoReads:
    """A RemoteMembers' logdir reader that reads nothing (its error files and key files are not these tests')."""

    def submit(self, work: Any) -> None:
        return None


def _drained(sock: Any) -> list[Any]:
    """What the master sent on ``sock`` (an agent's DEALER) so far, beats left out."""
    from procsv.ipc.messages import MasterBeat
    from procsv.ipc.transport import drain

    return [got.msg for got in drain(sock, limit=100)
            if not isinstance(got, Exception) and not isinstance(got.msg, MasterBeat)]


def test_a_start_sent_down_a_connection_the_agent_replaced_before_its_new_one_said_hello_is_sent_again(
        short_tmp) -> None:
    """The other order of the same partition: what node 1's old socket queued reaches node 0 BEFORE any
    hello of the connection that replaced it (the new one's connect is still held by the partition, or the
    old kernel simply retransmits first). Node 0 has heard no newer link, so the late hello of link 1 is
    the newest it knows: node 1 is back (its live members are gone), the group takes it back and the
    StartMembers goes down link 1, which the agent closed long ago: it is lost. Before, node 0 waited for
    the members of that start forever (``RemoteMembers.pending``: the view forking, no restart and no stop
    could come) while node 1 kept saying hello on link 2. Now a start still waited for is sent again down
    the node's new route once a hello of a newer connection moves it; the agent starts a member of a given
    attempt once, however often it is asked."""
    from test_metrics import free_port

    from procsv.watchdog.diskjobs import DiskJobs
    from procsv.watchdog.multihost.remote import RemoteMembers

    nodes = TwoNodes(short_tmp)
    link, view, agent, heard_on = nodes.link, nodes.view, nodes.agent, nodes.heard_on
    reader = DiskJobs("test-reader")
    remote = RemoteMembers(link, view, nodes.layout, 1, lambda reports: None, time.monotonic, reader)
    try:
        old = nodes.connect()  # link 1
        wait_for(lambda: heard_on(old, 1), 30, what="node 1's hello on link 1")
        # the partition heals: link 1's late hello is read (the newest link node 0 knows) and the group takes
        # node 1 back at once, down link 1; the agent had closed that socket: what reaches it is dropped
        remote.start(3, [f"127.0.0.1:{free_port()}", f"{agent.host}:1"], {}, (0, 1))
        assert remote.pending == {"worker1": (3, 1)}
        time.sleep(0.3)
        old.close(0)
        # link 2 (made during the partition) connects at last and says hello
        new = nodes.connect_again()
        got: list[Any] = []

        def start_on_new() -> bool:
            heard_on(new, 2)
            remote.resend(link.take_rerouted())  # (the launcher's _on_nodes, after each read)
            got.extend(_drained(new))
            return bool(got)

        wait_for(start_on_new, 10, interval=0.1, what="the start sent again on the new link")
        assert [(type(m).__name__, m.attempt, m.ranks) for m in got] == [("StartMembers", 3, [1])], got
        # a second move of the route sends nothing more once the agent said it started the member
        send(new, MemberStarted("worker1", 3, 1234))
        wait_for(lambda: [remote.started(n, m.slot, m.attempt, m.pid) for n, m, _ in link.receive()
                          if isinstance(m, MemberStarted)] != [], 10, what="the member's start heard")
        assert remote.pending == {}
        remote.resend({1})
        time.sleep(0.3)
        assert _drained(new) == []
    finally:
        reader.close()
        nodes.close()

def test_a_promotion_sent_down_a_connection_the_agent_replaced_is_sent_again_and_its_member_not_killed(
        short_tmp) -> None:
    """Issue 70's promotion over a partition: node 0 promotes the standby group while node 1's link is down (its
    members still waiting; a partition shorter than --node-timeout), and its PromoteMember goes down the
    connection the agent then replaces. On the new link the agent says its waiting member ``standby1`` started
    again. Before, node 0 took that for a stale start and killed it (its end then ended the promoted group: a
    second restart, forked) and never sent the promotion again (had the member lived, the group's chief would
    have waited for it in its first collective). Now node 0 knows the member as the worker it promoted, and sends
    the promotion again down the new route while the agent's hellos list the member unpromoted; no more once
    they list it as the worker. Real sockets, real CURVE."""
    from procsv.common.bootstrap import Resume
    from procsv.ipc.messages import PromoteMember, SignalMember
    from procsv.watchdog.diskjobs import DiskJobs
    from procsv.watchdog.multihost.remote import RemoteMembers

    nodes = TwoNodes(short_tmp)
    link, view, agent = nodes.link, nodes.view, nodes.agent
    reader = DiskJobs("test-reader")
    remote = RemoteMembers(link, view, nodes.layout, 1, lambda reports: None, time.monotonic, reader)

    def hello(n: int, live: list[str]) -> NodeHello:
        return NodeHello(1, 1, agent.host, os.getpid(), agent.addresses, live, link=n)

    def read() -> None:  # node 0's _on_nodes: the hellos and starts observed, then the resends
        for n, msg, _ in link.receive():
            if isinstance(msg, NodeHello):
                observe.node_hello(view, msg, time.monotonic())
            elif isinstance(msg, MemberStarted):
                remote.started(n, msg.slot, msg.attempt, msg.pid)
        remote.resend(link.take_rerouted())

    try:
        old = nodes.connect()  # link 1
        wait_for(lambda: send(old, hello(1, ["standby1.3"])) and (read() or 1 in view.nodes), 30,
                 what="node 1's hello on link 1")
        observe.spawned(view, "worker1", WORKER, 3, 1234, 2.0, "node1")  # standby1 promoted by node 0 (bookkeeping)
        view.children["worker1"].node = 1
        remote.promote(1, "standby1", 3, Resume((70,), 71, 0))
        time.sleep(0.3)
        old.close(0)  # the agent replaced the connection: what it carried is lost
        new = nodes.connect_again()
        got: list[Any] = []

        def promotion_on_new() -> bool:
            send(new, hello(2, ["standby1.3"]))
            send(new, MemberStarted("standby1", 3, 1234))  # (started_again: the agent's first hello on link 2)
            read()
            got.extend(_drained(new))
            return any(isinstance(m, PromoteMember) for m in got)

        wait_for(promotion_on_new, 10, interval=0.1, what="the promotion sent again on the new link")
        assert not any(isinstance(m, SignalMember) for m in got), got  # the waiting member is not killed
        assert [m for m in got if isinstance(m, PromoteMember)][0] == PromoteMember("standby1", 3, [70], 71, 0)
        # once the agent's hellos list it as the worker, a move of the route sends nothing more
        wait_for(lambda: send(new, hello(2, ["worker1.3"])) and (read() or remote.promoting == {}), 10,
                 what="the promotion forgotten")
        _drained(new)
        remote.resend({1})
        time.sleep(0.3)
        assert _drained(new) == []
    finally:
        reader.close()
        nodes.close()


def _agent_recording_starts(short_tmp: str, record: Callable[[Any], tuple[Any, ...]]) -> tuple[NodeAgent, list[Any]]:
    """Node 1's agent, never connected (node 0 at 127.0.0.1:1), whose members' starts are recorded by ``record`` of
    each pending member instead of being reported to node 0."""
    layout = Layout(os.path.join(short_tmp, "run"))
    layout.create()
    agent = NodeAgent(LaunchConfig("procsv.examples.digits", [], layout.logdir, nnodes=2, node_rank=1,
                                   master_addr="127.0.0.1:1", prewarm=False))
    asked: list[Any] = []
    agent._started = lambda dealer, pending, proc: asked.append(record(pending))  # type: ignore[method-assign]
    agent.runtime = short_tmp
    return agent, asked


def test_an_agent_starts_a_member_of_an_attempt_once_however_often_node_0_asks(short_tmp) -> None:
    """Node 0 sends a start again down a node's new route while it is still waited for (the first may have
    gone down a connection the agent replaced): if the first did arrive, the second starts nothing."""
    from procsv.ipc.messages import StartMembers

    agent, asked = _agent_recording_starts(short_tmp, lambda pending: (pending.slot, pending.attempt))
    try:
        start = StartMembers(3, [1, 2], ["a:1", "b:1", "b:2"], {})
        agent._start(None, start)  # type: ignore[arg-type]
        agent._start(None, start)  # type: ignore[arg-type]
        assert asked == [("worker1", 3), ("worker2", 3)]
        agent._start(None, StartMembers(4, [1], ["a:1", "b:1"], {}))  # type: ignore[arg-type]
        assert asked[-1] == ("worker1", 4) and len(asked) == 3
    finally:
        agent.disk.close()


def test_an_agent_starts_its_share_of_a_standby_group_and_promotes_each_member_node_0_names(short_tmp) -> None:
    """Issue 70: a StartMembers with ``standby`` starts the host's members of a standby group (slots ``standby<R>``,
    forked as standbys, writing the next attempt's ``worker<R>`` log; asked again, started once); a PromoteMember
    re-keys the member as ``worker<R>``, writes its Promotion where the member reads it and wakes it with SIGUSR1
    from the agent (a real child here, waiting for that signal); a member gone is not promoted."""
    import signal
    import subprocess
    import sys

    from procsv.common.layout import promotion_file
    from procsv.ipc.codec import decode
    from procsv.ipc.messages import PromoteMember, Promotion, StartMembers
    from procsv.watchdog.children import ChildProcess
    from procsv.watchdog.multihost.standbys import promote

    agent, asked = _agent_recording_starts(short_tmp, lambda pending: (
        pending.slot, pending.attempt, pending.role, os.path.basename(pending.log_path), pending.env["PROCSV_STANDBY"]))
    waiting = subprocess.Popen([sys.executable, "-c", "import signal; signal.pthread_sigmask(signal.SIG_BLOCK, "
                                "[signal.SIGUSR1]); print('waiting', flush=True); signal.sigwait([signal.SIGUSR1]); "
                                "print('woken', flush=True)"], stdout=subprocess.PIPE, text=True)
    try:
        start = StartMembers(3, [1], ["a:1", "b:1"], {"PROCSV_STANDBY": "1"}, standby=True)
        agent._start(None, start)  # type: ignore[arg-type]
        agent._start(None, start)  # type: ignore[arg-type]
        assert asked == [("standby1", 3, "standby", "worker1.3.log", "1")]
        assert waiting.stdout is not None and waiting.stdout.readline() == "waiting\n"
        members = {"standby1.3": ChildProcess("standby1", "worker1", 3, waiting, "worker1.3.log")}  # type: ignore[arg-type]
        assert promote(members, short_tmp, PromoteMember("standby1", 3, [70], 71, 0))
        assert list(members) == ["worker1.3"] and members["worker1.3"].slot == "worker1"
        assert waiting.stdout.readline() == "woken\n" and waiting.wait(10) == 0
        with open(promotion_file(short_tmp, 3, 1), "rb") as fh:
            assert decode([fh.read()], accept={Promotion})[0] == Promotion(3, [70], 71, 0)
        assert not promote(members, short_tmp, PromoteMember("standby1", 3, [], None, None))  # re-keyed: no such member
        members["standby1.4"] = members.pop("worker1.3")  # (a member that ended before its promotion)
        assert not promote(members, short_tmp, PromoteMember("standby1", 4, [], None, None))
        assert not os.path.exists(promotion_file(short_tmp, 4, 1))
    finally:
        if waiting.poll() is None:
            waiting.send_signal(signal.SIGKILL)
            waiting.wait()
        agent.disk.close()


def test_an_agent_starts_a_standby_member_again_for_the_same_attempt_once_the_one_before_it_ended_unpromoted(
        short_tmp) -> None:
    """Issue 70, a standby group broken before its promotion (a member SIGKILLed, on either host): node 0 prepares
    the next one, after the backoff, for the same attempt (the trainer's next), and asks node 1 for ``standby1`` of
    that attempt again. Before, the agent took it for a repeat of the first request (its slot and attempt asked
    already) and started nothing: node 0 waited for that member for good, its view forking, so the group's next
    death restarted nothing and a SIGTERM stopped nothing (measured, two hosts: node 0's standby prepared again,
    node 1's never; worker1 then SIGKILLed, no attempt 2; the launch still there 40 s after its SIGTERM). Now the
    agent forgets a standby member's request at its reap: asked again, it starts one anew (a live one still not)."""
    import signal
    import subprocess

    from procsv.ipc.messages import StartMembers
    from procsv.watchdog.children import ChildProcess

    agent, asked = _agent_recording_starts(short_tmp, lambda pending: (pending.slot, pending.attempt))
    member = subprocess.Popen(["sleep", "60"])
    try:
        start = StartMembers(3, [1], ["a:1", "b:1"], {"PROCSV_STANDBY": "1"}, standby=True)
        agent._start(None, start)  # type: ignore[arg-type]
        agent.members["standby1.3"] = ChildProcess("standby1", "worker1", 3, member, "worker1.3.log")  # type: ignore
        said: list[Any] = []

        class Dealer:  # (what the agent says node 0 down its connection)
            def send_multipart(self, frames: list[bytes], *args: Any, **kwargs: Any) -> None:
                said.append(frames)

        agent._start(Dealer(), start)  # type: ignore[arg-type]  # (a repeat while it lives: not started again,
        assert asked == [("standby1", 3)] and len(said) == 1  # said started again)
        member.send_signal(signal.SIGKILL)
        member.wait()
        assert agent._reap(None) and agent.members == {}  # type: ignore[arg-type]
        agent._start(None, start)  # type: ignore[arg-type]  # the next standby group, for the same attempt
        assert asked == [("standby1", 3), ("standby1", 3)]
    finally:
        if member.poll() is None:
            member.kill()
            member.wait()
        agent.disk.close()


def test_a_start_whose_send_failed_is_sent_again_until_it_goes_out_and_only_while_it_is_waited_for(short_tmp) -> None:
    """``NodeLink.send`` says False when the node's route is not connected or its queue is full: the start
    did not go out. Before, nobody looked (the members stayed pending, the view forking, for ever while the
    host kept saying hello); now each read of the agents (``resend``) sends it again until it goes out, and
    no more once its members are heard of."""
    from procsv.watchdog.multihost.remote import RemoteMembers

    class Link:
        job = "j"

        def __init__(self) -> None:
            self.up, self.sent, self.tried = False, [], 0

        def start(self, node: int, attempt: int, ranks: list[int], cluster: list[str], env: dict[str, str],
                  standby: bool = False) -> bool:
            self.tried += 1
            if self.up:
                self.sent.append((node, attempt, ranks))
            return self.up

    layout = Layout(os.path.join(short_tmp, "run"))
    view = RunView(launch_start=0.0)
    said: list[str] = []
    link = Link()
    remote = RemoteMembers(link, view, layout, 1, lambda reports: said.extend(r.say for r in reports),  # type: ignore
                           lambda: 1.0, NoReads())  # type: ignore[arg-type]
    remote.start(2, ["a:1", "b:1", "c:1"], {}, (0, 1, 2))
    assert link.tried == 2 and link.sent == [] and len(said) == 2, said
    remote.resend(set())
    assert link.tried == 4 and len(said) == 2  # (said once)
    link.up = True
    remote.resend(set())
    assert link.sent == [(1, 2, [1]), (2, 2, [2])]
    remote.resend(set())
    assert len(link.sent) == 2  # out: not again unless its route moves
    remote.resend({2})
    assert link.sent[-1] == (2, 2, [2]) and len(link.sent) == 3
    remote.ended("worker2", 2, 0, 1, 0.0)  # (its end heard: an agent started it)
    remote.pending.pop("worker1")  # (its start heard)
    remote.resend({1, 2})
    assert len(link.sent) == 3 and remote.asked == {}


def _agent_linked(short_tmp: str, name: str) -> tuple[NodeAgent, "zmq.Context[Any]", Any, Any]:
    """Node 1's agent (no pre-warmed trainer) in a fresh logdir, and a PAIR of sockets standing for its link to
    node 0: (agent, context, the agent's end, node 0's end)."""
    layout = Layout(os.path.join(short_tmp, "run"))
    layout.create()
    agent = NodeAgent(LaunchConfig("procsv.examples.digits", [], layout.logdir, nnodes=2, node_rank=1,
                                   master_addr="127.0.0.1:1", prewarm=False))
    ctx: zmq.Context[Any] = zmq.Context()
    dealer, master = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    master.bind(f"inproc://{name}")
    dealer.connect(f"inproc://{name}")
    return agent, ctx, dealer, master


def test_a_member_started_already_is_said_started_again_when_asked_again_and_node_0_takes_the_repeat_as_known(
        short_tmp) -> None:
    """The reply's half of a lost start: the agent started worker1 and said so, but its MemberStarted went down
    the connection it was replacing, so node 0 asks again down the new one (``resend``). Before, the agent
    ignored the repeat and node 0 waited for the member for ever (the view forking); now the agent says the
    running member started again, and node 0 takes a MemberStarted of a member it already knows (same
    attempt, pid and host) as known: it kills only a stale one, as before."""
    import subprocess

    from procsv.ipc.messages import SignalMember, StartMembers
    from procsv.ipc.transport import drain
    from procsv.watchdog.children import ChildProcess
    from procsv.watchdog.multihost.remote import RemoteMembers

    agent, ctx, dealer, master = _agent_linked(short_tmp, "node0")
    layout = Layout(agent.cfg.logdir)
    member = subprocess.Popen(["sleep", "30"])
    try:
        start = StartMembers(3, [1], ["a:1", "b:1"], {})
        def started(d: Any, pending: Any, proc: Any) -> None:  # the member: this test's sleep
            agent.members[f"{pending.slot}.{pending.attempt}"] = ChildProcess(pending.slot, pending.slot,
                                                                              pending.attempt, member, "/dev/null")

        agent._started = started  # type: ignore[method-assign]
        agent.runtime = short_tmp
        agent._start(dealer, start)  # the first: started (its MemberStarted, here, never sent: lost)
        assert list(agent.members) == ["worker1.3"]
        agent._start(dealer, start)  # asked again
        said = [got.msg for got in drain(master, first_timeout_ms=1000, limit=10)]
        assert said == [MemberStarted("worker1", 3, member.pid)], said
        assert list(agent.members) == ["worker1.3"]  # started once
    finally:
        member.kill()
        member.wait()
        dealer.close(0)
        master.close(0)
        ctx.term()
        agent.disk.close()

    class Link:
        job = "j"

        def __init__(self) -> None:
            self.signals: list[Any] = []

        def start(self, node: int, attempt: int, ranks: list[int], cluster: list[str], env: dict[str, str],
                  standby: bool = False) -> bool:
            return True

        def signal(self, node: int, slot: str, attempt: int, sig: int, kill: bool = False) -> bool:
            self.signals.append(SignalMember(slot, attempt, sig, kill))
            return True

    view = RunView(launch_start=0.0)
    link = Link()
    remote = RemoteMembers(link, view, layout, 1, lambda reports: None, lambda: 1.0, NoReads())  # type: ignore
    remote.start(3, ["a:1", "b:1"], {}, (0, 1))
    remote.started(1, "worker1", 3, 4242)
    assert remote.pending == {} and (view.children["worker1"].attempt, view.children["worker1"].pid) == (3, 4242)
    remote.started(1, "worker1", 3, 4242)  # the repeat: known, not killed
    assert link.signals == [] and view.children["worker1"].pid == 4242
    remote.started(1, "worker1", 2, 4100)  # a stale attempt's start: killed, as before
    assert [(s.slot, s.attempt, s.kill) for s in link.signals] == [("worker1", 2, True)]


def test_an_ask_of_the_other_hosts_stacks_names_each_host_that_did_not_answer_and_why():
    """Issue 69: node 0's ask of its agents for their members' stacks (pure: a link that sends to node 1
    only). Node 1 answers for one of its two members; node 2 is not connected; node 3 never answers. By
    the deadline: node 1's member read as its agent read it, its other member "has no live" (the agent
    answered without it), and one line for each host whose stacks are missing, with why."""
    from procsv.ipc.stack_messages import ProcessStacks, StacksAsked, StacksTaken
    from procsv.watchdog.multihost.stackasks import StackAsks

    sent: list[tuple[int, StacksAsked]] = []

    class Link:
        def send(self, node: int, msg: StacksAsked) -> bool:
            sent.append((node, msg))
            return node != 2

    now = [100.0]
    asks = StackAsks(Link(), lambda: now[0])  # type: ignore[arg-type]
    ask = asks.ask({1: ("10.0.0.2", [("worker1", 11), ("worker2", 12)]), 2: ("10.0.0.3", [("worker3", 13)]),
                    3: ("10.0.0.4", [("worker4", 14)])}, False, 9.5)
    assert [(n, m.slots, m.timeout) for n, m in sent] == [(1, ["worker1", "worker2"], 8.5), (2, ["worker3"], 8.5),
                                                          (3, ["worker4"], 8.5)]
    asks.answered(1, StacksTaken(sent[0][1].ask, 1, ProcessStacks("worker1", 11, host="10.0.0.2", stopped=True)))
    assert not ask.ready(now[0] + 9.0) and ask.ready(now[0] + 9.5)
    procs, missing = ask.wait(0.0)
    assert [(p.role, p.stopped, p.error) for p in procs] == [
        ("worker1", True, ""),
        ("worker2", False, "node 1's agent (10.0.0.2) has no live worker2 (pid 12)"),
        ("worker3", False, "node 2's agent (10.0.0.3) is not connected: its stacks were not asked for"),
        ("worker4", False, "node 3's agent (10.0.0.4) did not answer within 9.5 s")]
    assert missing == ["the stacks of node 2 (10.0.0.3) are missing: node 2's agent (10.0.0.3) is not connected: "
                       "its stacks were not asked for",
                       "the stacks of node 3 (10.0.0.4) are missing: node 3's agent (10.0.0.4) did not answer within 9.5 s"]
    assert all(p.host for p in procs)


def test_procsv_stacks_names_every_member_of_another_host_no_agent_answered_for():
    """Issue 69, an attack: after node 1 was found lost, node 0 asked no agent (no member it thinks alive) and
    procsv stacks printed nothing and exited 0, while status.json still listed worker1; it is named now."""
    from procsv.stacks_command import unanswered

    away = [{"role": "worker1", "host": "10.0.0.2"}, {"role": "worker2", "host": "10.0.0.3"},
            {"role": "worker3", "host": "10.0.0.4"}]
    lines = unanswered(away, read={"worker2"}, missing=["node 3's agent did not answer for worker3 within 1.5 s"])
    assert lines == ["worker1 on host 10.0.0.2: no stacks came back for it (its host may be lost, or it is restarting)"]
    assert unanswered(away[:1], read=set(), missing=[]) and not unanswered(away[:1], read={"worker1"}, missing=[])


def test_a_group_over_hosts_is_judged_stuck_from_its_agents_looks_at_its_member():
    """Issue 69 over hosts: node 1's agent looks at worker1 from its host's /proc once a second and tells node 0
    (MemberLooked): the chief and worker1 quiet for --stuck-secs is a stuck group, as on one host. Before, no
    look of a member on another host ever came, and the stuck rule judged no member of such a group, the chief
    on node 0 included: --hang-timeout (600 s) alone."""
    from procsv.ipc.messages import MemberLooked
    from procsv.watchdog.rules.actions import TakeStacks
    from procsv.watchdog.rules.hang import hang_actions
    from procsv.watchdog.rules.state import Activity

    limits = HangLimits(600.0, 1800.0, stuck_secs=10.0, stacks_secs=10.0)
    judged = {}
    for looks in (False, True):
        view = group_view(2)
        for i in range(13):
            observe.looked_at(view, TRAINER, 1, Activity(3.0 + i, 1.0, 1000, 50, "S", "futex", 0.0, 0), limits)
            if looks:
                observe.member_looked(view, MemberLooked("worker1", 1, 2.0, 2000, 60, "S", "futex", 0.0, 0), 3.0 + i,
                                      limits)
        judged[looks] = hang_actions(view, view.children[TRAINER], 15.0, limits)
    assert judged[False] == []
    (take,) = judged[True]
    assert isinstance(take, TakeStacks) and take.reason.startswith("stuck for 12.0 s (--stuck-secs 10)") and \
        "(its group's members too)" in take.reason, take


def test_a_node_agent_looks_at_each_live_member_once_a_second_and_tells_node_0():
    """The agent's side: a real member process read from /proc, a MemberLooked sent down a real socket, at most
    once a second; none for a member that ended."""
    import subprocess
    import types

    from procsv.ipc.codec import decode
    from procsv.ipc.messages import MemberLooked
    from procsv.ipc.transport import recv
    from procsv.watchdog.children import ChildProcess

    proc = subprocess.Popen(["sleep", "60"])
    zctx: "zmq.Context[Any]" = zmq.Context()
    out, into = zctx.socket(zmq.PAIR), zctx.socket(zmq.PAIR)
    try:
        out.bind("inproc://looks")
        into.connect("inproc://looks")
        member = ChildProcess("worker1", "worker1", 2, proc, os.devnull)

        def asleep() -> bool:  # (a loaded machine: its exec may still be running)
            with open(f"/proc/{proc.pid}/stat") as fh:
                return fh.read().rpartition(")")[2].split()[0] == "S"

        wait_for(asleep, 30, what="the member asleep")
        fake = types.SimpleNamespace(members={"worker1.2": member})
        for at in (100.0, 100.5, 101.2):  # a look, none within the second, another
            NodeAgent._look(fake, out, at)  # type: ignore[arg-type]
        got = [decode(recv(into, 1000), frozenset({MemberLooked}))[0] for _ in range(2)]
        assert all(isinstance(m, MemberLooked) and m.slot == "worker1" and m.attempt == 2 and m.state == "S"
                   for m in got), got
        assert not into.poll(100)
        proc.kill()
        proc.wait()
        NodeAgent._look(fake, out, 105.0)
        assert not into.poll(100)  # (ended: not looked at)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        out.close(0)
        into.close(0)
        zctx.term()


def test_a_member_whose_host_was_lost_before_it_started_it_is_said_never_started_not_killed() -> None:
    """RemoteMembers.lost adds a member asked of a lost host and never started as started with pid 0, so that the
    host's loss ends it (HostLost) and breaks its group; its line said "worker1 attempt 3 (pid 0) was killed by
    SIGKILL: HostLost" (helper-103's attack: a link flapping 1 s down, 1 s up). Nothing killed it: it never started."""
    import signal

    from procsv.watchdog.rules.failures import ChildError, Failure

    lost = ChildError("HostLost", "node 1 (h1) went silent for 0.5 s", "", "run")
    never = Failure("worker1", 3, 0, -signal.SIGKILL, 0.0, "/l/logs/worker1.3.log", lost)
    assert never.headline() == "worker1 attempt 3 never started: HostLost: node 1 (h1) went silent for 0.5 s"
    started = Failure("worker1", 3, 4242, -signal.SIGKILL, 0.0, "/l/logs/worker1.3.log", lost)
    assert started.headline() == ("worker1 attempt 3 (pid 4242) was killed by SIGKILL: HostLost: node 1 (h1) went "
                                  "silent for 0.5 s")


def test_a_node_agents_lost_pre_warmed_trainer_is_started_again_after_node_0s_backoff_and_retries() -> None:
    """An agent's zygote given up on (a fork it answered past the 10 s bound, or killed): before, the agent never
    started another, and every member of that host was started fresh for the rest of the run (measured, a group over
    two hosts: node 1's member of the next restart 5.9 s from its spawn to the first step, against 1.2-1.8 s forked in the same session).
    Now node 0's rule 13 with its limits: again 10 s after a loss, doubled per loss in a row, none after 5 in a row,
    and one that stayed ready 600 s starts the count again."""
    from procsv.watchdog.multihost.zygoteagain import ZygoteLosses
    from procsv.watchdog.rules.limits import Limits

    limits = Limits()
    z = ZygoteLosses()
    assert not z.due(0.0, limits)  # the first one lives
    z.ready(5.0)
    assert z.lost(100.0, limits) == 10.0
    assert not z.due(109.9, limits) and z.due(110.0, limits)
    assert z.started() == 2 and not z.due(110.0, limits)
    assert z.lost(120.0, limits) == 20.0  # (never ready: a loss in a row)
    assert not z.due(139.9, limits) and z.due(140.0, limits)
    assert z.started() == 3
    z.ready(150.0)
    assert z.lost(150.0 + 600.0, limits) == 10.0  # stayed ready 600 s: the count starts again
    assert z.due(760.0, limits) and z.started() == 4
    for n in range(2, 5):
        assert z.lost(1000.0 * n, limits) == 10.0 * 2 ** (n - 1)
        z.started()
    assert z.lost(9000.0, limits) is None  # the 5th in a row: none again
    assert not z.due(1e9, limits)


def test_an_agents_lines_are_written_by_a_thread_so_a_stalled_stderr_never_holds_its_beats(short_tmp, monkeypatch) -> None:
    """The agent's stderr may be a file on a stalled filesystem (a Slurm output file on NFS). Before, each line was
    printed by its loop, which beats to node 0: measured (scripts/bench_host_loss.py, 30 min of an agent SIGSTOPped
    10 s every 30 s beside the logdir's filesystem frozen 10 s every 30 s, the agent's stderr on it), its "this agent
    was stopped" line met a freeze 9 times in 60 stops, the loop blocked in the write up to 10 s more, and node 0 found
    the host lost by --node-timeout 15 (0 of 599 short stops, 0 of 60 freezes alone). Now a thread writes them: the
    loop only queues a line, and every line is written once the stream takes it."""
    import io
    import sys
    import threading

    gate = threading.Event()

    class Stalled(io.StringIO):
        def write(self, s: str) -> int:
            gate.wait(30)
            return super().write(s)

    stalled = Stalled()
    monkeypatch.setattr(sys, "stderr", stalled)
    agent, _ = _agent_recording_starts(short_tmp, lambda pending: pending.slot)
    try:
        began = time.monotonic()
        for _ in range(3):
            agent.say("this agent was stopped for 10.0 s (SIGSTOP, then SIGCONT: a suspended job?)")
        assert time.monotonic() - began < 0.5
    finally:
        gate.set()
        agent.terminal.close()
    assert stalled.getvalue().count("procsv node 1: this agent was stopped for 10.0 s") == 3, stalled.getvalue()


def test_an_agents_loop_waits_for_node_0s_word_instead_of_a_blind_tick_and_keeps_its_hellos_pace(short_tmp) -> None:
    """Issue 70 (the group back within a second of the hello): the agent's loop turned every 50 ms, so a
    StartMembers waited up to a tick before its fork was asked, and the fork's answer as long again before its
    MemberStarted. Now a turn waits on node 0's socket and its pre-warmed trainer's pipe: a word ends the wait.
    The wait (``beat_wait``, pure) lasts up to a tick from the turn's start and never past the next hello's due
    time, so a turn woken early (node 0's beats) neither delays a hello nor sends one early. A hello its connection
    did not take (a redial's, not up yet: node 0 holds this host's start until it hears it there) is sent once the
    connection comes up, not a tick later."""
    import threading

    from procsv.common.spawn import free_ports
    from procsv.ipc.messages import MasterBeat
    from procsv.watchdog.multihost.agent import AGENT_BEAT_SECS, TICK, beat_wait

    def free_port() -> int:
        return free_ports(1, "127.0.0.1")[0]

    assert abs(beat_wait(10.0, 10.0, 10.001) - (TICK - 0.001)) < 1e-9  # a hello just sent: a tick from the turn
    assert abs(beat_wait(10.07, 10.0, 10.071) - (10.0 + AGENT_BEAT_SECS - 10.071)) < 1e-9  # the next hello's due
    assert abs(beat_wait(10.2, 10.0, 10.201) - (TICK - 0.001)) < 1e-9  # a hello overdue (not up): a turn later
    assert beat_wait(10.0, 9.0, 10.3) == 0.0  # a long turn: no wait at all
    agent, ctx, dealer, master = _agent_linked(short_tmp, "node0-idle")
    try:
        t0 = time.monotonic()
        agent._idle(dealer, 0.3)  # nothing said: the whole wait
        assert time.monotonic() - t0 >= 0.25
        send(master, MasterBeat("j", 15.0))
        t0 = time.monotonic()
        agent._idle(dealer, 60.0)  # a word waiting: the turn comes at once (before, a blind tick whatever came)
        assert time.monotonic() - t0 < 30.0
        agent._idle(None, 0.01)  # (no connection yet: a plain wait)
        # a redial's hello not taken (its connection not up): the connection coming up ends the wait, not the tick
        redial = ctx.socket(zmq.DEALER)
        redial.setsockopt(zmq.IMMEDIATE, 1)
        port = free_port()
        redial.connect(f"tcp://127.0.0.1:{port}")
        t0 = time.monotonic()
        agent._idle(redial, 0.3, True)  # node 0 not there: the whole wait
        assert time.monotonic() - t0 >= 0.25
        router = ctx.socket(zmq.ROUTER)
        threading.Timer(0.2, lambda: router.bind(f"tcp://127.0.0.1:{port}")).start()
        t0 = time.monotonic()
        agent._idle(redial, 60.0, True)
        assert time.monotonic() - t0 < 30.0
        redial.close(0)
        router.close(0)
    finally:
        dealer.close(0)
        master.close(0)
        ctx.term()
        agent.disk.close()


def test_a_groups_worker_waits_for_its_chiefs_server_to_listen_before_its_program_and_no_longer_than_the_bound() -> None:
    """Issue 70: a worker whose program started before its chief's connected to a chief's server not listening yet,
    and gRPC waited out its reconnect backoff: both strategies up about a second late (the worker forked first by
    its host's agent). The worker now waits for the chief's address (its ``TF_CONFIG``'s) to take a connection
    (real sockets: refused until the chief's listener binds), and never longer than its bound."""
    import socket as sk
    import threading

    from procsv.common.spawn import free_ports
    from procsv.trainer.group.chief_listening import chief_address, wait_listening

    assert chief_address({"cluster": {"worker": ["10.0.0.1:4001", "10.0.0.2:4002"]}, "task": {"index": 1}}) == \
        "10.0.0.1:4001"
    assert chief_address({"cluster": {"chief": ["c:1"], "worker": ["w:2"]}}) == "c:1"
    assert chief_address({}) is None and chief_address({"cluster": {"worker": []}}) is None
    port = free_ports(1)[0]
    t0 = time.monotonic()
    assert not wait_listening(f"127.0.0.1:{port}", bound=0.3)  # no chief: the bound, then the program runs
    assert 0.25 <= time.monotonic() - t0 < 10.0
    chief = sk.socket()
    chief.setsockopt(sk.SOL_SOCKET, sk.SO_REUSEADDR, 1)
    threading.Timer(0.2, lambda: (chief.bind(("127.0.0.1", port)), chief.listen())).start()
    try:
        t0 = time.monotonic()
        assert wait_listening(f"127.0.0.1:{port}", bound=60.0)  # its chief's server up: at once, not the bound
        assert 0.15 <= time.monotonic() - t0 < 30.0
    finally:
        chief.close()


_ORDER = """
import sys
from procsv.trainer import __main__ as trainer
from procsv.trainer.group import chief_listening, heartbeat_bound
said = []
configure, wait = heartbeat_bound.configure, chief_listening.wait_listening
heartbeat_bound.configure = lambda place: said.append("import") or False  # (TensorFlow's import, seconds when fresh)
chief_listening.wait_listening = lambda address, *a, **k: said.append("wait " + address) or wait(address, bound=10.0)
sys.argv = ["procsv.trainer", sys.argv[1]]
code = trainer.main()
print(" | ".join(said), code, sep=" ; ")
"""


def test_a_fresh_workers_tensorflow_import_comes_before_its_wait_for_its_chief(tmp_path) -> None:
    """Issue 70, the worker's wait for its chief's server: a fresh worker (its own interpreter: ``--no-prewarm``,
    the first start before the pre-warmed trainer is ready, a ``--ps`` worker's) imports TensorFlow before its program
    (its coordination service's heartbeat bound, :mod:`procsv.trainer.group.heartbeat_bound`: seconds), and that
    import waited for the chief's server to listen, after the chief's own import and strategy: the two imports one
    after the other, not side by side. A real trainer process (``python -m procsv.trainer``, task 1 of a group of two)
    whose chief's address this test listens on, the import's step recorded instead of run; the chief's task (0) and a
    parameter-server cluster's worker wait for none."""
    import subprocess
    import sys

    from procsv.common.spawn import free_ports

    program = tmp_path / "program.py"
    program.write_text("print('program', flush=True)\n")
    chief = socket.socket()
    chief.bind(("127.0.0.1", 0))
    chief.listen()
    addresses = [f"127.0.0.1:{chief.getsockname()[1]}", f"127.0.0.1:{free_ports(1)[0]}"]
    try:
        for rank, more, want in ((1, {}, f"import | wait {addresses[0]} ; 0"), (0, {}, "import ; 0"),
                                 (1, {"PROCSV_PS": "1"}, "import ; 0")):
            env = {k: v for k, v in os.environ.items()  # (the quick tier's guard's variable kept)
                   if not (k.startswith("PROCSV_") and not k.startswith("PROCSV_TEST_")) and k != "TF_CONFIG"}
            env.update(PROCSV_RANK=str(rank), PROCSV_NPROC="2", TF_CONFIG=json.dumps(
                {"cluster": {"worker": addresses}, "task": {"type": "worker", "index": rank}}), **more)
            got = subprocess.run([sys.executable, "-c", _ORDER, str(program)], env=env, cwd=str(tmp_path),
                                 capture_output=True, text=True, timeout=60)
            assert got.stdout.splitlines()[-2:] == ["program", want], (rank, more, got.stdout, got.stderr[-2000:])
    finally:
        chief.close()
