"""A group's in-memory tier over two "hosts" (issue 54, point 2): the members of host 1 hand their
snapshots to node 0's checkpoint service over CURVE (their peer copies), so that a member of host 1
SIGKILLed, or the whole host SIGKILLed and its agent relaunched, restores the group's pinned step
from memory; a damaged peer copy falls through to disk, saying so in one line.

Two hosts as in tests/test_hosts.py (network namespaces on a veth bridge, one logdir, real
TensorFlow collectives over the bridge, real SIGKILLs). Needs root; skipped otherwise.
"""

from __future__ import annotations

import os
import signal
from typing import Any

import numpy as np

from conftest import finish, launch, quiet_env, role_pid, wait_for, wait_role_pid
from test_group import (K, SLOW, clean_group, final_weights_of, group_started, member_restores, printed_steps,
                        restores_with_plain_tf, sigkill_mid_interval)
from test_hosts import HOST1_IP, agent, events, host_pids, hosts, master_addr

__all__ = ["clean_group", "hosts"]  # fixtures, used by name


def two_hosts(logdir: str, *args: str, env: dict[str, str] | None = None,
              agent_env: dict[str, str] | None = None) -> tuple[Any, Any, str]:
    """Node 0's launch (``env``) and node 1's agent (``agent_env``) of one job (``--nproc 1 --nnodes 2``:
    worker1 on node 1)."""
    addr = master_addr()
    opts = ("--nnodes", "2", "--master-addr", addr, "--node-timeout", "4", "--group-grace-secs", "0")
    master = launch(logdir, *args, opts=opts, env=env)
    return master, agent(logdir, addr, *args, env=agent_env), addr


def restored_from_memory(logdir: str, attempt: int, record: dict[str, Any], seen: int) -> None:
    """``record`` (attempt ``attempt``'s restore) is the group's in-memory snapshot of a K-th step at
    most one interval behind ``seen`` (the last step a member printed before the kill), the same step
    on every member, and host 1's member restored it from its peer copy."""
    assert record["source"] == "peer" and record["step"] % K == 0, record
    assert record["path"] == f"the group's in-memory snapshot of step {record['step']}"
    assert 0 < seen + 1 - record["step"] <= K + 1, (seen, record)
    assert member_restores(logdir, attempt) == [record["step"]] * 2  # every member the same step
    with open(os.path.join(logdir, "logs", f"worker1.{attempt}.log")) as fh:
        assert f"procsv: member 1 restored step {record['step']} from its peer copy on node 0" in fh.read()


def test_a_member_of_host_1_then_the_whole_host_sigkilled_restore_the_group_from_the_peer_copies_bit_equal(
        hosts, logdir, clean_group):
    # before issue 54 point 2 a group over hosts took no in-memory snapshots (K = 0): each restart
    # restored the last disk checkpoint (none here before the end: step 0). Now node 0's checkpoint
    # service holds host 1's member's copies: worker1 SIGKILLed mid-interval, then host 1 (its agent
    # and its member) SIGKILLed mid-interval and a new agent launched: each restarted group restores a
    # K-th step from memory on both members, host 1's from its peer copy, and the run ends bit-equal
    # to an uninterrupted group
    master, first, addr = two_hosts(logdir, *SLOW, "--steps", "500")
    second = None
    kills = []
    try:
        group_started(logdir, 1)
        kills.append(sigkill_mid_interval(logdir, "worker1", "worker1.1", 150))
        group_started(logdir, 2)
        again = wait_for(lambda: events(logdir, "restored") or events(logdir, "initialized")[1:], 60,
                         what="attempt 2's restore")[-1]["step"]

        def mid_interval() -> int:
            steps = printed_steps(logdir, "worker1.2")
            return steps[-1] if steps and steps[-1] >= again + 60 and 10 <= steps[-1] % K <= 25 else 0

        kills.append(wait_for(mid_interval, 180, interval=0.02, what="worker1.2 mid-interval"))
        for pid in host_pids():  # the whole host goes: its agent and its member
            os.kill(pid, signal.SIGKILL)
        first.wait(10)
        wait_for(lambda: events(logdir, "node_lost"), 30, what="the host to be found lost")
        second = agent(logdir, addr, *SLOW, "--steps", "500")
    finally:
        code, out, err = finish(master)
    acode, aout, aerr = finish(second, timeout=30) if second is not None else (None, "", "")
    assert code == 0, err
    assert acode == 0, aerr
    restored = events(logdir, "restored")
    assert len(restored) == 2, restored
    preempted = [r["step"] for r in events(logdir, "checkpoint_committed") if r["reason"] == "preempted"]
    for attempt, (seen, record) in enumerate(zip(kills, restored), start=2):
        if record["source"] == "disk":  # the chief committed its last step on its way out (SIGTERM first)
            assert preempted and record["step"] == preempted[attempt - 2 if len(preempted) > 1 else 0], record
            continue
        restored_from_memory(logdir, attempt, record, seen)
    assert [r["source"] for r in restored].count("peer") >= 1, restored
    assert {(r["node"], r["host"]) for r in events(logdir, "node_joined")} == {(1, HOST1_IP)}
    assert {r["reason"] for r in events(logdir, "checkpoint_committed")} <= {"final", "preempted"}  # none from memory
    final = final_weights_of(logdir)
    assert final.keys() == clean_group.keys() and final
    for name in clean_group:
        assert np.array_equal(final[name], clean_group[name]), name


def test_a_damaged_peer_copy_makes_the_group_restore_from_disk_saying_so_in_one_line(hosts, logdir):
    # every copy node 0's service holds for host 1's member is damaged after its checksum was taken:
    # the chief, SIGKILLed past a disk save (every 100 steps; the in-memory ones every 50, so the
    # newest in-memory step is newer), finds member 1's peer copy damaged and the group restores its
    # newest disk checkpoint, saying why in one line
    env = quiet_env(PROCSV_FAULT="checkpoint:group_peer_corrupt:1-100000")
    master, first, _ = two_hosts(logdir, *SLOW, "--save-checkpoint-steps", "100", "--steps", "330", env=env)
    try:
        group_started(logdir, 1)

        def past_a_disk_save() -> int:
            steps = printed_steps(logdir, "trainer.1")
            return steps[-1] if steps and steps[-1] >= 160 and 60 <= steps[-1] % 100 <= 75 else 0

        wait_for(past_a_disk_save, 180, interval=0.02, what="the chief past a disk save, before the next")
        os.kill(wait_role_pid(logdir, "trainer"), signal.SIGKILL)
    finally:
        code, out, err = finish(master)
    acode, aout, aerr = finish(first, timeout=30)
    assert code == 0, err
    assert acode == 0, aerr
    restored = events(logdir, "restored")
    assert len(restored) == 1 and restored[0]["source"] == "disk" and restored[0]["step"] % 100 == 0, restored
    assert member_restores(logdir, 2) == [restored[0]["step"]] * 2
    with open(os.path.join(logdir, "logs", "trainer.2.log")) as fh:
        lines = [line for line in fh.read().splitlines() if "restores from disk" in line]
    assert len(lines) == 1 and "member 1's peer copy of step" in lines[0] and "is damaged" in lines[0], lines
    assert restores_with_plain_tf(logdir) == 330


def service_killed_then_worker1(logdir: str, after: int) -> tuple[int, int]:
    """SIGKILL node 0's checkpoint service once worker1 is past ``after`` mid-interval, wait for the
    watchdog's new service to take node 1's copies back, then SIGKILL worker1 mid-interval; the
    steps worker1 had printed at each kill."""
    at_service = sigkill_mid_interval(logdir, "checkpoint", "worker1.1", after)
    old = role_pid(logdir, "checkpoint")
    wait_for(lambda: role_pid(logdir, "checkpoint") not in (None, old), 60, what="a new checkpoint service")

    def taken_back() -> bool:
        path = os.path.join(logdir, "logs", "checkpoint.2.log")
        return os.path.exists(path) and "node 1's holder handed back" in open(path).read()

    wait_for(taken_back, 60, interval=0.02, what="node 1's holder to hand its copies back")
    seen = printed_steps(logdir, "worker1.1")[-1]
    return at_service, sigkill_mid_interval(logdir, "worker1", "worker1.1", seen + 1)


def test_node_0s_checkpoint_service_sigkilled_then_a_member_killed_restores_every_member_from_memory_bit_equal(
        hosts, logdir, clean_group):
    # before: node 0's members' copies (and host 1's peer copies) lived only in node 0's checkpoint
    # service, so its SIGKILL cost the steps since the last disk checkpoint (the next restart said
    # "restores from disk"). Now node 1's holder keeps a replica of every copy the service holds and
    # hands them back to the restarted service: worker1 SIGKILLed after it restores both members'
    # copies of the newest step whole before the service's death, from memory, and the run ends
    # bit-equal to an uninterrupted group
    master, first, _ = two_hosts(logdir, *SLOW, "--steps", "500")
    try:
        group_started(logdir, 1)
        at_service, at_member = service_killed_then_worker1(logdir, 2 * K + 10)
    finally:
        code, out, err = finish(master)
    acode, aout, aerr = finish(first, timeout=30)
    assert code == 0, err
    assert acode == 0, aerr
    restored = events(logdir, "restored")
    assert len(restored) == 1 and restored[0]["source"] == "peer", restored
    step = restored[0]["step"]
    # the newest step both members had handed over before the service died (or the one before it,
    # in flight at the kill); nothing newer of worker1 reached the new service (it sends to the old port)
    assert step % K == 0 and at_service // K * K - K <= step <= at_service < at_member, (step, at_service, at_member)
    assert restored[0]["path"] == f"the group's in-memory snapshot of step {step}"
    assert member_restores(logdir, 2) == [step] * 2  # every member the same step
    with open(os.path.join(logdir, "logs", "trainer.2.log")) as fh:
        assert "restores from disk" not in fh.read()
    final = final_weights_of(logdir)
    assert final.keys() == clean_group.keys() and final
    for name in clean_group:
        assert np.array_equal(final[name], clean_group[name]), name


def test_a_copy_damaged_on_node_1_makes_the_group_restore_from_disk_saying_so_in_one_line(hosts, logdir):
    # every copy node 1's holder keeps is damaged after node 0's service took its checksum: node 0's
    # checkpoint service SIGKILLed past a disk save (every 300 steps), the new service takes the
    # damaged copies back, worker1 SIGKILLed: the newest whole step (newer than the disk save) is
    # found damaged, and the group restores the disk checkpoint, saying why in one line
    env = quiet_env(PROCSV_FAULT="holder:replica_corrupt:1-100000")
    master, first, _ = two_hosts(logdir, *SLOW, "--save-checkpoint-steps", "300", "--steps", "600",
                                 agent_env=env)
    try:
        group_started(logdir, 1)
        service_killed_then_worker1(logdir, 300 + K + 10)
    finally:
        code, out, err = finish(master)
    acode, aout, aerr = finish(first, timeout=30)
    assert code == 0, err
    assert acode == 0, aerr
    restored = events(logdir, "restored")
    assert len(restored) == 1 and restored[0]["source"] == "disk" and restored[0]["step"] == 300, restored
    assert member_restores(logdir, 2) == [300] * 2
    with open(os.path.join(logdir, "logs", "trainer.2.log")) as fh:
        lines = [line for line in fh.read().splitlines() if "restores from disk" in line]
    assert len(lines) == 1 and "held on node 1 is damaged" in lines[0], lines
    assert restores_with_plain_tf(logdir) == 600
