"""Checkpoints never stop silently: a stuck checkpoint service (SIGSTOP) is replaced while training goes on."""

from __future__ import annotations

import os
import signal

import pytest

from conftest import PROGRAMS, committed_steps, finish, launch, lifecycle, quiet_env, raw_status, role_pid, wait_for
from procsv.common import env

pytestmark = pytest.mark.slow
TINY = os.path.join(PROGRAMS, "tiny_train.py")


def test_a_stopped_checkpoint_service_is_replaced_and_the_next_checkpoint_commits(logdir):
    proc = launch(logdir, "--steps", "100000", "--step-delay", "0.01", "--save-model-secs", "1", target=TINY)
    try:
        wait_for(lambda: len(committed_steps(logdir)) >= 2, 90, what="two checkpoints")
        stuck = role_pid(logdir, "checkpoint")
        os.kill(stuck, signal.SIGSTOP)  # like a service blocked on an fsync to a dead NFS server
        newest = max(committed_steps(logdir))
        at_stop = raw_status(logdir)["step"]
        stall = wait_for(lambda: [e for e in lifecycle(logdir) if e["event"] == "checkpoint_stalled"], 60,
                         what="the watchdog to notice that checkpoints stopped")
        assert stall[0]["pid"] == stuck and "no checkpoint committed" in stall[0]["reason"]
        wait_for(lambda: max(committed_steps(logdir)) > newest, 60,
                 what="a checkpoint committed by the replacement service")
        # training never waited for the stuck service: it went on through the whole stall
        stalled_at = raw_status(logdir)["step"]
        assert stalled_at - at_stop > 300  # ~10 s of 10 ms steps, with room for a slow machine
        # status.json is refreshed at most every 0.5 s: the replacement can commit before it shows
        wait_for(lambda: role_pid(logdir, "checkpoint") not in (None, stuck), 10,
                 what="status.json to name the replacement checkpoint service")
        assert "checkpoint service stalled" in (raw_status(logdir)["last_error"] or "")
    finally:
        proc.send_signal(signal.SIGTERM)
        code, out, err = finish(proc)
    assert code == 128 + signal.SIGTERM, err
    assert "checkpoints stalled" in err


def test_a_snapshot_past_its_deadline_gets_the_checkpoint_service_replaced_before_the_stall_rule(logdir):
    # a step schedule: the trainer itself sends snapshots to the stopped service. Its deadline
    # (floor 3 s here) passes long before the watchdog's own stall rule (10 s floor) would fire.
    proc = launch(logdir, "--steps", "100000", "--step-delay", "0.01", "--save-steps", "25",
                  target=TINY, env=quiet_env(**{env.SAVE_DEADLINE: "3"}))
    try:
        wait_for(lambda: len(committed_steps(logdir)) >= 2, 90, what="two checkpoints")
        stuck = role_pid(logdir, "checkpoint")
        os.kill(stuck, signal.SIGSTOP)
        newest = max(committed_steps(logdir))
        stall = wait_for(lambda: [e for e in lifecycle(logdir) if e["event"] == "checkpoint_stalled"], 60,
                         what="the trainer's overdue snapshot to reach the watchdog")
        assert stall[0]["pid"] == stuck
        assert "had no result within 3.0 s" in stall[0]["reason"], stall[0]
        wait_for(lambda: max(committed_steps(logdir)) > newest, 60,
                 what="the lost snapshot retaken and committed by the replacement service")
        # status.json is refreshed at most every 0.5 s: the replacement can commit before it shows
        wait_for(lambda: role_pid(logdir, "checkpoint") not in (None, stuck), 10,
                 what="status.json to name the replacement checkpoint service")
    finally:
        proc.send_signal(signal.SIGTERM)
        code, out, err = finish(proc)
    assert code == 128 + signal.SIGTERM, err
    with open(os.path.join(logdir, "logs", "trainer.1.log")) as fh:  # the trainer's own line
        assert f"checkpoint at step {stall[0]['reason'].split()[4]} failed: no result from the checkpoint service " \
               "within 3.0 s" in fh.read()


def test_a_snapshot_in_flight_to_a_stopped_service_at_the_end_gets_it_replaced_and_the_final_checkpoint_commits(logdir):
    # the program ends while its snapshot waits on a stopped service: the final checkpoint waits
    # for that snapshot only until its deadline, the watchdog replaces the service, and the final
    # one commits there, instead of giving up after stop_grace_secs and exiting as if it had
    proc = launch(logdir, "--steps", "600", "--step-delay", "0.01", "--save-steps", "25",
                  target=TINY, env=quiet_env(**{env.SAVE_DEADLINE: "3"}))
    try:
        wait_for(lambda: (raw_status(logdir) or {}).get("step", 0) >= 450, 120, what="step 450")
        stuck = role_pid(logdir, "checkpoint")
        os.kill(stuck, signal.SIGSTOP)
        code, out, err = finish(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 0, err
    stall = [e for e in lifecycle(logdir) if e["event"] == "checkpoint_stalled"]
    assert stall and stall[0]["pid"] == stuck, lifecycle(logdir)
    assert max(committed_steps(logdir)) == 600
    import tensorflow as tf

    assert tf.train.latest_checkpoint(logdir) == os.path.join(logdir, "model.ckpt-600")
    with open(os.path.join(logdir, "logs", "trainer.1.log")) as fh:
        log = fh.read()
    assert "within 3.0 s" in log and "final checkpoint committed at step 600" in log, log


def test_snapshots_refused_under_on_nonfinite_continue_never_get_the_checkpoint_service_killed(logdir):
    """Issue 51, point 5: once the state is non-finite, --on-nonfinite continue refuses every snapshot
    (procsv never commits a poisoned state), so nothing commits; the stall rule SIGKILLed the healthy
    checkpoint service every three save intervals (here: 30 steps and the 10 s floor), forever. The
    trainer says why nothing commits, and the stall rule counts from its last refusal."""
    proc = launch(logdir, "--how", "return", "--nan-at", "25", "--steps", "1500", "--save-steps", "10",
                  "--step-delay", "0.02", target=os.path.join(PROGRAMS, "nan_train.py"),
                  opts=("--on-nonfinite", "continue", "--standby", "off"))
    code, out, err = finish(proc, 300)
    assert code == 0, err[-3000:]
    events = lifecycle(logdir)
    assert not [e for e in events if e["event"] == "checkpoint_stalled"], err[-3000:]
    assert len([e for e in events if e["event"] == "spawned" and e["role"] == "checkpoint"]) == 1
    refused = [e for e in events if e["event"] == "nonfinite_detected"]
    assert len(refused) > 100 and max(committed_steps(logdir)) < 25  # a refusal every 10 steps, from step 30
    said = out + err
    assert "no checkpoint commits: the snapshot of step" in said and "snapshots refused since step 25" in said, said[-3000:]
