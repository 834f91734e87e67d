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


def two_hosts(logdir: str, *args: str, env: dict[str, str] | None = None) -> tuple[Any, Any, str]:
    """Node 0's launch and node 1's agent of one job (``--nproc 1 --nnodes 2``: worker1 on node 1)."""
    addr = master_addr()
    opts = ("--nnodes", "2", "--master-addr", addr, "--node-timeout", "4", "--group-grace-secs", "0")
    master = launch(logdir, *args, opts=opts, env=env)
    return master, agent(logdir, addr, *args), addr


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


def test_node_0s_checkpoint_service_restarted_then_a_member_of_host_1_killed_restores_from_disk_bit_equal(
        hosts, logdir, clean_group):
    # docs/architecture.md and guarantees.md: a restarted node 0 checkpoint service binds a new port
    # and holds nothing; host 1's running member keeps sending to the old one, unacknowledged, so the
    # next restart finds no step whole for both members and restores from disk, saying why in one
    # line, and the run still ends bit-equal to an uninterrupted group (nothing hangs on the old port)
    master, first, _ = two_hosts(logdir, *SLOW, "--save-checkpoint-steps", "100", "--steps", "500")
    try:
        group_started(logdir, 1)
        wait_for(lambda: (printed_steps(logdir, "worker1.1") or [0])[-1] >= 2 * K + 10, 180, interval=0.02,
                 what="worker1.1 past two copies")
        old = wait_role_pid(logdir, "checkpoint")
        os.kill(old, signal.SIGKILL)
        wait_for(lambda: role_pid(logdir, "checkpoint") not in (None, old), 60, what="a new checkpoint service")
        seen = printed_steps(logdir, "worker1.1")[-1]
        sigkill_mid_interval(logdir, "worker1", "worker1.1", seen + 2 * K)
    finally:
        code, out, err = finish(master)
    acode, aout, aerr = finish(first, timeout=30)
    assert code == 0, err
    assert acode == 0, aerr
    restored = events(logdir, "restored")
    assert len(restored) == 1 and restored[0]["source"] == "disk", restored
    with open(os.path.join(logdir, "logs", "trainer.2.log")) as fh:
        lines = [line for line in fh.read().splitlines() if "restores from disk" in line]
    assert len(lines) == 1, lines
    final = final_weights_of(logdir)
    assert final.keys() == clean_group.keys() and final
    for name in clean_group:
        assert np.array_equal(final[name], clean_group[name]), name


def member_keys(logdir: str) -> list[dict[str, Any]]:
    """The bodies of the member key files filed in the launch's keys folder now."""
    import json

    folder = os.path.join(logdir, ".procsv", "curve")
    out = []
    for name in os.listdir(folder) if os.path.isdir(folder) else []:
        if name.startswith("member."):
            try:
                with open(os.path.join(folder, name)) as fh:
                    out.append(json.load(fh))
            except (OSError, ValueError):  # removed meanwhile
                continue
    return out


def test_the_key_files_of_sigkilled_members_of_host_1_are_removed_once_their_attempt_is_over(hosts, logdir):
    # a member of host 1 files a CURVE key for node 0's checkpoint service and removes it only at an
    # orderly exit: before, each SIGKILL left its file until the launch ended (one more per restart).
    # Now node 0 removes the files of the attempts that are over: after each of three kills of
    # worker1, once the next group runs, the folder holds at most the live member's file, of its attempt
    master, first, _ = two_hosts(logdir, *SLOW, "--steps", "500")
    counts = []
    try:
        group_started(logdir, 1)
        wait_for(lambda: len(member_keys(logdir)) == 1, 60, what="worker1.1's key filed")
        after, killed = 0, set()
        for attempt in range(1, 4):
            killed.add(wait_role_pid(logdir, "worker1"))
            seen = sigkill_mid_interval(logdir, "worker1", f"worker1.{attempt}", after + 60)
            group_started(logdir, attempt + 1)

            def only_the_live_members() -> list[dict[str, Any]]:
                keys = member_keys(logdir)
                return keys if len(keys) == 1 and keys[0].get("pid") not in killed else []

            [live] = wait_for(only_the_live_members, 60, what=f"only worker1.{attempt + 1}'s key filed "
                                                              f"(have {member_keys(logdir)}; killed {killed})")
            assert live["attempt"] == attempt + 1, live
            counts.append(len(member_keys(logdir)))
            after = seen
    finally:
        code, out, err = finish(master)
    acode, aout, aerr = finish(first, timeout=30)
    assert code == 0, err
    assert acode == 0, aerr
    assert counts == [1, 1, 1]


def test_a_peer_copy_beyond_node_0s_limit_is_refused_said_recorded_and_the_group_restores_from_disk(hosts, logdir):
    # node 0's checkpoint service holds no more of one member's peer copy than its limit (here a
    # small PROCSV_GROUP_PEER_MAX_BYTES; by default its own members' snapshot memory): host 1's
    # member's first copy is refused, with a lifecycle record, said once in that member's log (it takes
    # no more copies); the chief's copies are held, so no step is whole and worker1 SIGKILLed restarts the group from disk,
    # saying why in one line. Before, node 0 held any size (a 512 MiB copy: 558 MiB of RSS)
    env = quiet_env(PROCSV_GROUP_PEER_MAX_BYTES="4096")
    master, first, _ = two_hosts(logdir, *SLOW, "--save-checkpoint-steps", "100", "--steps", "330", env=env)
    try:
        group_started(logdir, 1)
        wait_for(lambda: events(logdir, "group_copy_refused"), 120, what="a refused peer copy's record")
        sigkill_mid_interval(logdir, "worker1", "worker1.1", 160)
    finally:
        code, out, err = finish(master)
    acode, aout, aerr = finish(first, timeout=30)
    assert code == 0, err
    assert acode == 0, aerr
    refused = events(logdir, "group_copy_refused")
    assert refused and all(r["rank"] == 1 and r["limit"] == 4096 < r["size"] and r["step"] % K == 0
                           for r in refused), refused
    # once refused, a member takes no more copies (each as large): one record per member process
    assert len({r["attempt"] for r in refused}) == len(refused), refused
    with open(os.path.join(logdir, "logs", "worker1.1.log")) as fh:
        said = [line for line in fh.read().splitlines() if "refused member 1's copy" in line]
    assert len(said) == 1 and "beyond the 4096 it holds for one member" in said[0], said
    restored = events(logdir, "restored")
    assert len(restored) == 1 and restored[0]["source"] == "disk", restored
    with open(os.path.join(logdir, "logs", "trainer.2.log")) as fh:
        lines = [line for line in fh.read().splitlines() if "restores from disk" in line]
    assert len(lines) == 1 and "held for all 2 members" in lines[0], lines
    assert restores_with_plain_tf(logdir) == 330
