"""Elastic groups (``--min-nodes``, rule 15) as a cluster runs them: three hosts (a third network namespace on
``test_hosts.py``'s bridge) losing one, then another, and taking the first back. Real processes, real
TensorFlow collectives."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from typing import Any, Iterator, Optional

import pytest

from conftest import finish, launch, quiet_env, wait_for
from test_hosts import (ARGS, BRIDGE, NS, PREFIX, VETH, events, host_pids, hosts, ip,  # noqa: F401 (a fixture)
                        master_addr)

NS3, VETH3, HOST2_IP = f"{NS}c", f"{VETH}c", f"{PREFIX}.12"
ELASTIC = ("--nnodes", "3", "--min-nodes", "1", "--node-timeout", "3", "--rejoin-timeout", "2",
           "--group-grace-secs", "0")


@pytest.fixture
def third(hosts: None) -> Iterator[None]:
    ip("netns", "del", NS3, check=False)
    wait_for(lambda: ip("link", "show", VETH3, check=False).returncode != 0, 120, interval=0.5,
             what=f"an earlier run's {VETH3} to be gone")
    ip("netns", "add", NS3)
    ip("link", "add", VETH3, "type", "veth", "peer", "name", f"{VETH3}p")
    ip("link", "set", f"{VETH3}p", "netns", NS3)
    ip("link", "set", VETH3, "master", BRIDGE, "up")
    ip("netns", "exec", NS3, "ip", "addr", "add", f"{HOST2_IP}/24", "dev", f"{VETH3}p")
    ip("netns", "exec", NS3, "ip", "link", "set", f"{VETH3}p", "up")
    ip("netns", "exec", NS3, "ip", "link", "set", "lo", "up")
    try:
        yield
    finally:
        for pid in pids3():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        ip("netns", "del", NS3, check=False)


def pids3() -> list[int]:
    return [int(p) for p in ip("netns", "pids", NS3, check=False).stdout.split()]


def agent_on(ns: str, node: int, logdir: str, addr: str, *target_args: str,
             env: Optional[dict[str, str]] = None, opts: tuple[str, ...] = ("--nnodes", "3")) -> subprocess.Popen[str]:
    cmd = ["ip", "netns", "exec", ns, sys.executable, "-m", "procsv", "launch", "procsv.examples.digits",
           "--logdir", logdir, "--node-rank", str(node), "--master-addr", addr, *opts, "--", *target_args]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env or quiet_env(),
                            start_new_session=True)


def memberships(logdir: str) -> list[tuple[list[int], int]]:
    return [(r["nodes"], r["world"]) for r in events(logdir, "membership")]


def kill_all(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


STEPS = 1500


def test_three_hosts_lose_one_then_another_and_the_first_is_taken_back(third, logdir):
    addr = master_addr()
    args = (*ARGS, "--steps", str(STEPS), "--step-delay", "0.02")
    env = {**quiet_env(), "PROCSV_GROUP_SNAPSHOT_STEPS": "10"}
    master = launch(logdir, *args, opts=(*ELASTIC, "--master-addr", addr), env=env)
    a1 = agent_on(NS, 1, logdir, addr, *args, env=env)
    a2 = agent_on(NS3, 2, logdir, addr, *args, env=env)
    back: Any = None
    try:
        wait_for(lambda: events(logdir, "checkpoint_committed"), 120, what="a commit of the group of three")
        kill_all(host_pids())
        a1.wait(10)
        wait_for(lambda: memberships(logdir), 60, what="the group restarted without node 1")
        assert memberships(logdir) == [([0, 2], 2)]
        n = len(events(logdir, "checkpoint_committed"))
        wait_for(lambda: len(events(logdir, "checkpoint_committed")) > n + 1, 120, what="commits of the group of two")
        kill_all(pids3())
        a2.wait(10)
        wait_for(lambda: len(memberships(logdir)) == 2, 60, what="the group restarted without node 2")
        n = len(events(logdir, "checkpoint_committed"))
        wait_for(lambda: len(events(logdir, "checkpoint_committed")) > n + 1, 120, what="commits of node 0 alone")
        back = agent_on(NS, 1, logdir, addr, *args, env=env)
        wait_for(lambda: len(memberships(logdir)) == 3, 120, what="node 1 taken back")
    finally:
        code, out, err = finish(master, timeout=300)
    bcode, bout, berr = finish(back, timeout=30) if back is not None else (None, "", "")
    print(err[-6000:])
    assert code == 0, err
    assert bcode == 0, berr
    assert memberships(logdir) == [([0, 2], 2), ([0], 1), ([0, 1], 2)], err
    assert events(logdir, "finished")[-1]["step"] == STEPS

