"""A launch suspended as Slurm suspends a job (``scontrol suspend``: SIGSTOP to every process of it; ``scontrol
resume``: SIGCONT) for longer than its stall and hang limits is only stopped, not stuck: no service killed, no
trainer restarted, and the run ends with an uninterrupted run's weights.

Before the watched clock (procsv/common/clock/watched.py) the watchdog's first round after the resume found
"no checkpoint committed for 12.x s" and SIGKILLed the checkpoint service, and the trainer silent past
``--hang-timeout``; before the trainer's clock was one too, the trainer found the snapshot in flight overdue
("checkpoint at step 139 failed: no result from the checkpoint service within 6.0 s") and counted a failed commit.
The clock's arithmetic and a single process stopped by real signals: test_watched_clock.py.
"""

from __future__ import annotations

import os
import re
import signal
import time

import psutil
import pytest

from conftest import (PROGRAMS, committed_steps, final_weights, finish, launch, lifecycle, quiet_env, raw_status,
                      run_processes, wait_for, wait_role_pid)

pytestmark = pytest.mark.slow
PACED = os.path.join(PROGRAMS, "paced.py")
STEPS = "400"  # the shared uninterrupted group run's (test_group.CLEAN_STEPS)
STOP_SECS = 12.0  # longer than the stall rule's floor (10 s; 3 save intervals of 1 s) and --hang-timeout 5
SAVE_DEADLINE = 6.0  # the trainer's deadline for a snapshot's result (PROCSV_SAVE_DEADLINE): shorter than the stop
IN_FLIGHT_SECS = 2.5  # after the second commit: the third (1 s later) held, its snapshot in flight since


def _tree(root: int) -> list[psutil.Process]:
    """``root`` and every process below it (``root`` first)."""
    top = psutil.Process(root)
    return [top, *top.children(recursive=True)]


def _stop_all(root: int) -> list[psutil.Process]:
    """SIGSTOP every process of the launch, the watchdog first, until a look finds none new (as Slurm's
    ``scontrol suspend`` stops every process of the job): the processes stopped."""
    stopped: dict[int, psutil.Process] = {}
    while True:
        new = [p for p in _tree(root) if p.pid not in stopped]
        if not new:
            return list(stopped.values())
        for p in new:
            try:
                p.send_signal(signal.SIGSTOP)
                stopped[p.pid] = p
            except psutil.NoSuchProcess:
                pass


def test_a_launch_suspended_past_its_stall_and_hang_limits_is_resumed_without_a_restart(logdir, shared_result,
                                                                                           tmp_path):
    """A group (--nproc 2): TensorFlow's coordination service in its chief found every member's heartbeats 15 s old at
    the resume and aborted the group's collectives (worker1: 'UnavailableError: ... The following tasks are unhealthy
    (stopped sending heartbeats)', the whole group restarted) before procsv configured it
    (trainer/group/heartbeat_bound.py)."""
    from test_group import _clean_group_run

    fast, gate = str(tmp_path / "fast"), str(tmp_path / "gate")
    proc = launch(logdir, "--fast-after", fast, "--strategy", "multiworker", "--steps", STEPS, "--step-delay", "0.02",
                  "--save-model-secs", "1", "--print-every-steps", "100000",
                  target=PACED, opts=("--nproc", "2", "--standby", "fork", "--hang-timeout", "5"),
                  env=quiet_env(PROCSV_SAVE_DEADLINE=str(SAVE_DEADLINE), PROCSV_FAULT="checkpoint:commit_stall:3",
                                PROCSV_FAULT_GATE=gate))
    try:
        wait_for(lambda: len(committed_steps(logdir)) >= 2, 120, what="two checkpoints")
        # a snapshot in flight when the job is suspended: the service's third commit blocks before it writes a byte
        # (checkpoint:commit_stall:3, until the gate exists), as a suspension reaches a commit half-way
        service = psutil.Process(wait_role_pid(logdir, "checkpoint"))
        time.sleep(IN_FLIGHT_SECS)
        assert len(committed_steps(logdir)) == 2  # (the third commit is held)
        stopped = _stop_all(proc.pid)
        assert len(stopped) >= 5  # the watchdog, the checkpoint and summary services, the group's two members (its zygote)
        wait_for(lambda: all(p.status() == psutil.STATUS_STOPPED for p in stopped), 30, what="every process stopped")
        newest = max(committed_steps(logdir))
        time.sleep(STOP_SECS)  # (the suspension itself: nothing of the run runs meanwhile)
        # the watchdog continued first and alone (a resume reaches the processes one by one): its rounds see the
        # trainer silent and nothing committed for the whole suspension, until the rest is continued
        watchdog, rest = stopped[0], stopped[1:]
        watchdog.send_signal(signal.SIGCONT)
        judged = ("suspended", "checkpoint_stalled", "hang_detected")
        wait_for(lambda: [e for e in lifecycle(logdir) if e["event"] in judged], 60,
                 what="a round of the watchdog's after its resume")
        # the checkpoint service continued last, once the trainer stepped on past its snapshot's deadline on the raw
        # clock (before the watched clock, the trainer's first boundary after the resume found the snapshot in flight
        # overdue, 'no result within 6.0 s' after 14.7 s, 12 s of them stopped, counted a failed commit, and the
        # watchdog SIGKILLed the service as stalled; then the watchdog forgave it, the trainer still failed it)
        step = (raw_status(logdir) or {}).get("step", 0)
        for p in [p for p in rest if p.pid != service.pid] + [service]:
            if p.pid == service.pid:
                wait_for(lambda: (raw_status(logdir) or {}).get("step", 0) >= step + 20, 60,
                         what="the trainer's steps after the resume")
            try:
                p.send_signal(signal.SIGCONT)
            except psutil.NoSuchProcess:
                pass  # (killed by the watchdog meanwhile: the assertions below say so)
        open(gate, "w").close()  # the held commit goes on
        # the watchdog's rules ran after the resume, while a checkpoint committed since (its first round after it
        # is the one that found the service stalled and the trainer hung, before the watched clock)
        wait_for(lambda: max(committed_steps(logdir)) > newest, 60, what="a checkpoint after the resume")
        open(fast, "w").close()  # the steps left run at once
    finally:
        code, out, err = finish(proc)
        leftovers = run_processes(logdir)
        for p in leftovers:
            p.kill()
    events = lifecycle(logdir)
    # nothing was judged stuck: no service killed, no trainer restarted
    assert not [e for e in events if e["event"] in ("checkpoint_stalled", "summary_stalled", "hang_detected",
                                                    "restarting", "restarted", "node_lost")], err[-4000:]
    assert code == 0, err[-4000:]
    assert not leftovers
    # the watchdog said its stop once: from its last reading before it to the SIGCONT, STOP_SECS at least (it was
    # stopped before the sleep began and continued after it ended)
    said = [e for e in events if e["event"] == "suspended"]
    assert len(said) == 1 and said[0]["secs"] >= STOP_SECS and said[0]["total"] == said[0]["secs"], said
    assert "this launch was stopped for" in out + err
    # the snapshot in flight through the suspension: the trainer's wait for it, on its watched clock, never passed the
    # deadline (the stop left out): no failed commit, nothing overdue for the watchdog to forgive
    failed = re.findall(r"checkpoint at step \d+ failed: .*", out + err)
    assert not failed, failed
    assert "not overdue" not in out + err, err[-4000:]
    spawned = sorted(e["role"] for e in events if e["event"] == "spawned")
    assert spawned == ["checkpoint", "summary", "trainer", "worker1", "zygote"], spawned
    finished = [e for e in events if e["event"] == "finished"]
    assert finished and finished[0]["state"] == "succeeded" and finished[0]["step"] == int(STEPS)
    import tensorflow as tf

    assert tf.train.latest_checkpoint(logdir) == os.path.join(logdir, f"model.ckpt-{STEPS}")
    a, b = final_weights(_clean_group_run(shared_result)), final_weights(logdir)  # (an uninterrupted group's)
    assert a.keys() == b.keys() and len([k for k in a if "_trainable_variables" in k]) == 4
    for key in a:
        assert (a[key] == b[key]).all(), f"{key} differs after a suspension"
