"""Node 0's checkpoint service SIGKILLed in a two-host group (issue 54, point 2): node 1's holder
hands back its replica of every copy, and the next restart restores from memory, bit-equal (a copy
damaged on node 1 falls through to disk, saying so in one line); host 1's running member follows
the restarted service (peer.json), so a member killed intervals later restores from memory too.

Two hosts as in tests/test_hosts.py (network namespaces on a veth bridge, one logdir, real
TensorFlow collectives over the bridge, real SIGKILLs and SIGSTOPs). Needs root; skipped otherwise.
"""

from __future__ import annotations

import os
import signal

import psutil
import pytest

from conftest import finish, launch, quiet_env, role_pid, wait_for, wait_role_pid
from hosts_helpers import PACED, paced, two_hosts, two_hosts_ending_well, unpace
from test_group import (CLEAN_HALF, CLEAN_STEPS, K, SLOW, assert_bit_equal, clean_group, clean_group_half,
                        group_started, member_restores, printed_steps, restores_with_plain_tf, sigkill_mid_interval)
from test_hosts import events, hosts
from test_hosts_group_tier import restored_from_memory

pytestmark = pytest.mark.slow  # starts TensorFlow processes: not in the quick tier

__all__ = ["clean_group", "clean_group_half", "hosts"]  # fixtures, used by name


def service_killed_then_worker1(logdir: str, after: int, later: int = 0, attempt: int = 1,
                                service: int = 2) -> tuple[int, int]:
    """SIGKILL node 0's checkpoint service once worker1 (of group ``attempt``) is past ``after``
    mid-interval, wait for the watchdog's new service (its log ``checkpoint.<service>.log``) to take node
    1's copies back, then SIGKILL worker1; the steps worker1 had printed at each kill. ``later`` 0: worker1
    SIGSTOPped at the service's kill (the group makes no step until worker1's SIGKILL, so the newest step
    whole is one node 1 handed back); else worker1 runs on (its copies go to the new service) and is
    SIGKILLed mid-interval ``later`` steps on."""
    log = f"worker1.{attempt}"
    worker1 = wait_role_pid(logdir, "worker1")
    at_service = sigkill_mid_interval(logdir, "checkpoint", log, after)
    if not later:
        os.kill(worker1, signal.SIGSTOP)
    old = role_pid(logdir, "checkpoint")
    wait_for(lambda: role_pid(logdir, "checkpoint") not in (None, old), 60, what="a new checkpoint service")

    def taken_back() -> bool:
        path = os.path.join(logdir, "logs", f"checkpoint.{service}.log")
        return os.path.exists(path) and "node 1's holder handed back" in open(path).read()

    wait_for(taken_back, 60, interval=0.02, what="node 1's holder to hand its copies back")
    if not later:
        os.kill(worker1, signal.SIGKILL)
        return at_service, printed_steps(logdir, log)[-1]
    return at_service, sigkill_mid_interval(logdir, "worker1", log, at_service + later)


def test_node_0s_checkpoint_service_sigkilled_twice_a_member_of_host_1_follows_it_and_a_member_killed_after_either_restores_every_member_from_memory_bit_equal(  # noqa: E501
        hosts, logdir, tmp_path, clean_group):
    # one run, node 0's checkpoint service SIGKILLed in two groups of it (before, two runs of their own):
    # first, worker1 runs on: before, host 1's running member kept sending to the dead service's port
    # until the group's next attempt, so once node 0's chief had handed the new service KEEP (3) newer
    # copies, the copies node 1 handed back were pushed out, no step was whole and the restart restored
    # from disk. Now the member follows peer.json to the new service: worker1 SIGKILLed 3 intervals after
    # the service restores the newest step within one interval, from memory.
    # then, in the restarted group, worker1 SIGSTOPped at the service's kill: before, node 0's members'
    # copies (and host 1's peer copies) lived only in node 0's checkpoint service, so its SIGKILL cost
    # the steps since the last disk checkpoint (the next restart said "restores from disk"). Now node 1's
    # holder keeps a replica of every copy the service holds and hands them back to the restarted
    # service: worker1 SIGKILLed after it restores both members' copies of the newest step whole before
    # the service's death, from memory. The run ends bit-equal to an uninterrupted group
    gate, fast = paced(tmp_path)  # (paced until the third group's first step, then at once)
    # (clean_group's steps, 400: the first service's kill past step K + 10, the second's K + 10 past the second
    # group's restore, by step 325, 75 before the end as before: 500 steps, and 2K + 10 each, until clean_group's
    # run was cut to 400)
    with two_hosts_ending_well(logdir, *SLOW, "--steps", CLEAN_STEPS, *fast, target=PACED, gate=gate):
        group_started(logdir, 1)
        followed_service, followed_member = service_killed_then_worker1(logdir, K + 10, later=3 * K + 10)
        group_started(logdir, 2)
        again = wait_for(lambda: events(logdir, "restored"), 60, what="the second group's restore")[0]["step"]
        at_service, at_member = service_killed_then_worker1(logdir, again + K + 10, attempt=2, service=3)
        group_started(logdir, 3)
    restored = events(logdir, "restored")
    assert len(restored) == 2, restored
    # the member that followed the restarted service (group 1, restored by group 2)
    restored_from_memory(logdir, 2, restored[0], followed_member)
    assert restored[0]["step"] > followed_service + 2 * K, (restored, followed_service)
    with open(os.path.join(logdir, "logs", "worker1.1.log")) as fh:
        assert "procsv: node 0's checkpoint service was restarted" in fh.read()
    # the copies node 1's holder handed back (group 2, restored by group 3)
    assert restored[1]["source"] == "peer", restored
    step = restored[1]["step"]
    # the newest step both members had handed over before the service died (or the one before it,
    # in flight at the kill): worker1 stopped at the service's kill, nothing newer was whole
    assert step % K == 0 and at_service // K * K - K <= step <= at_service <= at_member, (step, at_service, at_member)
    assert restored[1]["path"] == f"the group's in-memory snapshot of step {step}"
    assert member_restores(logdir, 3) == [step] * 2  # every member the same step
    with open(os.path.join(logdir, "logs", "trainer.3.log")) as fh:
        assert "restores from disk" not in fh.read()
    assert_bit_equal(logdir, clean_group)


DISK = 100  # the damaged replica's run: its disk checkpoints, every DISK steps (the first before the service's kill)


def test_a_copy_damaged_on_node_1_makes_the_group_restore_from_disk_saying_so_in_one_line(hosts, logdir, tmp_path):
    # every copy node 1's holder keeps is damaged after node 0's service took its checksum: node 0's
    # checkpoint service SIGKILLed past a disk save (every DISK steps), the new service takes the
    # damaged copies back, worker1 SIGKILLed: the newest whole step (newer than the disk save) is
    # found damaged, and the group restores the disk checkpoint, saying why in one line (250 steps: the
    # service's kill comes at step 160-175, worker1 stopped there; the restarted group runs from 100 to the end.
    # Before, a save every 300 steps and 450: 200 more steps paced before the kill, the same 150 after the restore)
    env = quiet_env(PROCSV_FAULT="holder:replica_corrupt:1-100000")
    gate, fast = paced(tmp_path)  # (paced until the restarted group's first step, then at once)
    with two_hosts_ending_well(logdir, *SLOW, "--save-checkpoint-steps", str(DISK), "--steps", str(DISK + 150), *fast,
                               agent_env=env, target=PACED, gate=gate):
        group_started(logdir, 1)
        service_killed_then_worker1(logdir, DISK + K + 10)
        group_started(logdir, 2)
    restored = events(logdir, "restored")
    assert len(restored) == 1 and restored[0]["source"] == "disk" and restored[0]["step"] == DISK, restored
    assert member_restores(logdir, 2) == [DISK] * 2
    with open(os.path.join(logdir, "logs", "trainer.2.log")) as fh:
        lines = [line for line in fh.read().splitlines() if "restores from disk" in line]
    assert len(lines) == 1 and "held on node 1 is damaged" in lines[0], lines
    assert restores_with_plain_tf(logdir) == DISK + 150



def test_node_0_sigkilled_whole_and_relaunched_restores_the_group_from_node_1s_replica_bit_equal(
        hosts, logdir, tmp_path, clean_group_half):
    # issue 70, "the master is a host too": node 0's launch SIGKILLed with everything under it (its watchdog,
    # its checkpoint service and the group's chief) mid-interval, long after the last disk save (none before
    # the end), then started again with the same command. Node 1's agent finds its master gone within 0.5 s
    # (its address refuses the probes: the launch is gone; before, --node-timeout), stops worker1, keeps its
    # holder's replica of every copy, joins the relaunched master, and the holder hands the copies back to
    # the new checkpoint service. The relaunched group restores both members' copies of the newest step whole
    # from memory (before: a launch's first group never asked, and restored from disk: step 0 here), and the
    # run ends bit-equal to an uninterrupted group. (~25 CPU-s: one more launch of node 0 and its group)
    gate, fast = paced(tmp_path)  # (paced until the relaunched group's first step, then at once)
    # (CLEAN_HALF steps, 200, compared with clean_group_half: the kill at step 60-75, the relaunched group from the
    # newest snapshot before it to the end; before, CLEAN_STEPS, 400: 200 more steps of both members after it)
    args = (*SLOW, "--steps", str(CLEAN_HALF), *fast)
    master, agent, addr = two_hosts(logdir, *args, target=PACED)
    again = None
    try:
        group_started(logdir, 1)
        seen = sigkill_mid_interval_of(logdir, master.pid, K + 10)
        master.communicate()
        again = launch(logdir, *args, opts=("--nproc", "1", "--nnodes", "2", "--master-addr", addr, "--node-timeout",
                                            "4", "--group-grace-secs", "0"), target=PACED)
        record = wait_for(lambda: events(logdir, "restored"), 120, what="the relaunched group's restore")[0]
        unpace(gate)
        code, out, err = finish(again)
    finally:
        unpace(gate)
        for proc in (master, again):
            if proc is not None and proc.poll() is None:
                proc.kill()
    acode, aout, aerr = finish(agent, timeout=30)
    assert code == 0, err
    assert acode == 0, aerr
    # worker1 left the stale group: its agent stopped it once node 0 was found lost (its address refusing the
    # probes), or, on a quiet machine, its own collective failed first on the chief's reset connection (a SIGKILLed
    # launch's sockets close at once: "Collective ops is aborted by: recvmsg:Connection reset by peer"); a silent
    # master host, where none closes, is the agent's alone to find (tests/test_master_loss_pure.py, bench_host_loss)
    stopped = "node 0 is lost" in aerr and "stopping this host's trainers" in aerr
    failed_itself = os.path.exists(os.path.join(logdir, "logs", "launch-1", "worker1.1.error.json"))
    assert stopped or failed_itself, aerr
    restored_from_memory(logdir, 1, record, seen)
    with open(os.path.join(logdir, "logs", "trainer.1.log")) as fh:
        assert "restores from disk" not in fh.read()
    assert_bit_equal(logdir, clean_group_half)


def sigkill_mid_interval_of(logdir: str, pid: int, after: int) -> int:
    """SIGKILL the process ``pid`` and every process under it (node 0's launch: its watchdog, services, chief,
    standbys) once worker1's log shows a step past ``after`` mid-interval (:func:`sigkill_mid_interval`); the
    step seen."""
    def seen() -> int:
        steps = printed_steps(logdir, "worker1.1")
        return steps[-1] if steps and steps[-1] >= after and 10 <= steps[-1] % K <= 25 else 0

    step = wait_for(seen, 180, interval=0.02, what=f"worker1 past step {after}, mid-interval")
    top = psutil.Process(pid)
    for p in [top, *top.children(recursive=True)]:
        try:
            p.kill()
        except psutil.Error:
            pass
    return int(step)
