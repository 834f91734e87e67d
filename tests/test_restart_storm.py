"""The same failure again is no reason to restart again (issue 67, point 2).

A program with a deterministic error after its training (TensorFlow's PTB tutorial under ``procsv
launch``: the program counts its epochs, not the global step, so every attempt trains its epochs again
from where it restored and fails the same way). Each attempt's in-memory snapshot is persisted after its
death, which counts as progress: before, the watchdog restarted it at once, dozens of times a minute
(75 restarts in 90 s here). Real processes: a launch, its zygote-forked trainers, SIGCHLD and the error
files they wrote. The same failure is the exception's type, its message with numbers blanked, its place and
the steps of the attempt; an attempt whose own checkpoint committed before it failed is never one (a run
that crashes the same way after every checkpoint trains to its end).
"""

from __future__ import annotations

import os
import time

import pytest
import tensorflow as tf

from conftest import PROGRAMS, committed_steps, finish, launch, lifecycle, status_json

pytestmark = pytest.mark.slow

FAILS_AFTER_TRAINING = os.path.join(PROGRAMS, "fails_after_training.py")
STREAM_DROPS = os.path.join(PROGRAMS, "stream_drops.py")
# the storms restart a program that fails again at once: their restarts fork from the pre-warmed trainer (no
# standby, which was killed unready at each); what is asked is the restart policy, not how a restart starts
NO_STANDBY = ("--standby", "fork")


def test_a_deterministic_error_after_training_ends_the_run_after_three_attempts_keeping_its_checkpoints(logdir):
    code, out, err = finish(launch(logdir, target=FAILS_AFTER_TRAINING, opts=NO_STANDBY), 240)
    said = out + err
    assert code == 1, said
    with open(FAILS_AFTER_TRAINING) as fh:
        line = next(n for n, text in enumerate(fh, 1) if "raise ValueError" in text)
    place = f"{FAILS_AFTER_TRAINING}:{line} in evaluate"
    assert ("procsv: giving up: the trainer failed the same way 3 times in a row (ValueError: the evaluation set is "
            f"empty at {place}, 20 steps after each start): a restart would fail again; fix the program and relaunch "
            "(its checkpoints are kept)") in said, said
    starts = [e for e in lifecycle(logdir) if e["event"] == "spawned" and e["role"] == "trainer"]
    assert len(starts) == 3, starts
    assert status_json(logdir)["state"] == "failed"
    latest = tf.train.latest_checkpoint(logdir)  # what the attempts trained is kept, and restorable
    assert latest is not None and committed_steps(logdir) and latest.endswith(f"model.ckpt-{committed_steps(logdir)[-1]}")
    w = tf.Variable(tf.zeros([4]))
    tf.train.Checkpoint(w=w).read(latest).assert_existing_objects_matched()
    assert float(w.numpy()[0]) == committed_steps(logdir)[-1]


# found by the attack on the rule (helper-21): a false positive (a run that trains further each attempt,
# saving its own checkpoints) and a false negative (the storm, with the step in the error message)
def test_a_run_that_trains_further_each_attempt_and_fails_the_same_way_each_time_trains_to_its_end(logdir):
    # 100 steps, 20 per attempt (the stream's quota), a checkpoint every 10: five attempts, each further
    code, out, err = finish(launch(logdir, "--steps", "100", "--save-steps", "10", "--batches-per-connection", "20",
                                   target=STREAM_DROPS), 300)
    said = out + err
    starts = [e for e in lifecycle(logdir) if e["event"] == "spawned" and e["role"] == "trainer"]
    assert "the trainer failed the same way" not in said, (committed_steps(logdir), said)
    assert code == 0 and "stream_drops: done at step 100" in out, said
    assert len(starts) >= 5, starts


def test_a_deterministic_error_whose_message_names_the_step_is_no_restart_storm(logdir):
    proc = launch(logdir, "--step-in-message", target=FAILS_AFTER_TRAINING, opts=NO_STANDBY)
    deadline = time.monotonic() + 150
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(1)
    still = proc.poll() is None
    if still:
        os.killpg(proc.pid, 9)
    out, err = proc.communicate()
    starts = [e for e in lifecycle(logdir) if e["event"] == "spawned" and e["role"] == "trainer"]
    # the same ValueError at the same line after 20 steps of every attempt; only its number grows
    assert not still and proc.returncode == 1, (f"still restarting after 150 s: {len(starts)} attempts",
                                                 (out + err)[-3000:])
    assert len(starts) <= 4, starts
