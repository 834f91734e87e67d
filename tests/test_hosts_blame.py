"""Who broke a group over two hosts: a member of node 1 SIGKILLed, and what the records say of it.

Node 0's chief fails in its next collective once node 1's member is gone, and its exit often reaches
node 0's watchdog before node 1's agent's report of the kill. The records (``restarting``, or the
``breaker`` record that corrects it), ``procsv report`` and ``procsv status`` must name the member
that was killed, not the chief's collective error. Hosts as in tests/test_hosts.py (network
namespaces; needs root). The case where node 1's report reaches node 0 is one of the things of
``test_a_member_of_node_1_sigkilled_is_named_the_groups_breaker_and_its_agent_kills_and_reaps_what_it_left_behind``
in tests/test_hosts.py (one run for it and the agent's reaping).
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any, Optional

import pytest

from conftest import finish, launch, quiet_env, raw_status, wait_for
from procsv.common import env
from procsv.common.layout import Layout
from procsv.report import gather
from procsv.status import read_status
from test_hosts import HOST1_IP, PACED, agent, events, host_pids, hosts, master_addr, named_cause  # noqa: F401 (hosts: the fixture)

pytestmark = pytest.mark.slow  # starts TensorFlow processes: not in the quick tier


def test_a_host_lost_after_the_chiefs_collective_failure_is_named_the_groups_breaker(hosts, logdir):
    """Node 1's member (worker1) is SIGKILLed at step 30, and its agent's report of it never reaches node 0
    (``agent:member_ended_unsent``: as if the host had gone down with it): the chief fails in its next
    collective and its end is judged first. Then node 1's whole host is SIGKILLed (its agent), and node 0
    finds it lost 4 s later (--node-timeout 4). A ``breaker`` record then names worker1 lost with its host,
    and the report (``[host lost]``) and the status say so; a new agent joins and the group goes on.
    Before: the records named the chief's collective error. (The order is the test's premise, so the test
    makes it: with the whole host SIGKILLed at once, the chief fails at once only when a collective of
    its was in flight, else TensorFlow waits for its coordination heartbeat, and the host was found
    lost first in 1 of 6 runs beside four CPU hogs; that order is judged HostLost at once, with no breaker record.)"""
    addr = master_addr()
    args = (*PACED, "--steps", "1000000")
    master = launch(logdir, *args, opts=("--nnodes", "2", "--master-addr", addr, "--node-timeout", "4"))
    first = agent(logdir, addr, *args, env={**quiet_env(), env.FAULT: "agent:member_ended_unsent:1-99"})
    second: Optional[Any] = None
    code: Optional[int] = None
    try:
        wait_for(lambda: (raw_status(logdir) or {}).get("step", 0) >= 30, 180, what="step 30")
        member = next(p["pid"] for p in raw_status(logdir)["processes"] if p["role"] == "worker1")
        os.kill(member, signal.SIGKILL)
        judged = wait_for(lambda: events(logdir, "restarting"), 60, what="the chief's end to be judged")
        assert not events(logdir, "node_lost") and "worker1" not in str(judged[0]["error"]), judged
        for pid in host_pids():  # then the whole host goes: its agent
            os.kill(pid, signal.SIGKILL)
        first.wait(10)
        wait_for(lambda: events(logdir, "node_lost"), 60, what="node 1 to be found lost")
        wait_for(lambda: events(logdir, "breaker"), 10, what="the breaker record")
        st = wait_for(lambda: (lambda s: s if s and "HostLost" in str(s.get("last_error")) else None)(
            read_status(Layout(logdir))), 10, what="status.json's last_error to name the lost host")
        second = agent(logdir, addr, *args)
        wait_for(lambda: len(events(logdir, "first_step")) >= 2, 180, what="the restarted group's first step")
        master.send_signal(signal.SIGTERM)
        code, out, err = finish(master, timeout=120)
    finally:
        if code is None:
            for proc in (master, first, second):
                if proc is not None and proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
            print("node 0 said:", finish(master)[2], file=sys.stderr)
        if second is not None:
            finish(second, timeout=60)
    assert code == 143, err
    truth = f"worker1 attempt 1 (pid {member}) was killed by SIGKILL: HostLost: node 1 ({HOST1_IP}) went silent for "
    assert str(st["last_error"]).startswith(truth), st["last_error"]
    assert named_cause(logdir, 1).startswith(truth), named_cause(logdir, 1)
    rep = gather(Layout(logdir))
    assert rep is not None and rep.restarts[0].label == "host lost" and rep.restarts[0].cause.startswith(truth), rep
    assert f"procsv: {truth}" in err, err
