"""An elastic group over two hosts (``--nnodes 2 --min-nodes 1``, issue 55): network namespaces as in
``test_hosts.py``. Node 1's whole host is SIGKILLed: past ``--rejoin-timeout`` the group restarts on
node 0 alone and trains on; a new agent on node 1 is taken back at the next checkpoint; the run
finishes with exit 0 on both hosts. Real processes, real TensorFlow collectives, real SIGKILLs.
"""

from __future__ import annotations

import os
import signal
from typing import Any

from conftest import finish, launch, raw_status, wait_for
from test_hosts import ARGS, HOST1_IP, agent, events, host_pids, hosts, master_addr  # noqa: F401 (a fixture)

ELASTIC = ("--nnodes", "2", "--min-nodes", "1", "--node-timeout", "3", "--rejoin-timeout", "2",
           "--group-grace-secs", "0")
STEPS = 1500


def memberships(logdir: str) -> list[tuple[list[int], int]]:
    return [(r["nodes"], r["world"]) for r in events(logdir, "membership")]


def test_a_host_lost_for_good_leaves_the_group_training_on_one_host_and_a_new_agent_is_taken_back(hosts, logdir):
    addr = master_addr()
    args = (*ARGS, "--steps", str(STEPS), "--step-delay", "0.02")
    master = launch(logdir, *args, opts=(*ELASTIC, "--master-addr", addr))
    first = agent(logdir, addr, *args)
    second: Any = None
    try:
        wait_for(lambda: events(logdir, "checkpoint_committed"), 120, what="a commit of the group of two")
        for pid in host_pids():  # the whole host goes: its agent and its trainer
            os.kill(pid, signal.SIGKILL)
        first.wait(10)
        wait_for(lambda: memberships(logdir), 60, what="the group restarted without node 1")
        assert memberships(logdir) == [([0], 1)]
        lost_at = len(events(logdir, "first_step"))
        wait_for(lambda: len(events(logdir, "first_step")) > lost_at - 0 and (raw_status(logdir) or {}).get(
            "step", 0) > 0, 60, what="the smaller group's first step")
        second = agent(logdir, addr, *args)
        wait_for(lambda: len(memberships(logdir)) == 2, 120, what="node 1 taken back")
    finally:
        code, out, err = finish(master)
    acode, aout, aerr = finish(second, timeout=30) if second is not None else (None, "", "")
    assert code == 0, err
    assert acode == 0, aerr
    assert memberships(logdir) == [([0], 1), ([0, 1], 2)], err
    assert events(logdir, "finished")[-1]["step"] == STEPS
    assert "--min-nodes 1" in err and "ending the group at this checkpoint boundary" in err, err
    assert not host_pids()
