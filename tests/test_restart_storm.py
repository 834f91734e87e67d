"""The same failure again is no reason to restart again (issue 67, point 2).

A program with a deterministic error after its training (TensorFlow's PTB tutorial under ``procsv
launch``: the program counts its epochs, not the global step, so every attempt trains its epochs again
from where it restored and fails the same way). Each attempt's in-memory snapshot is persisted after its
death, which counts as progress: before, the watchdog restarted it at once, dozens of times a minute
(75 restarts in 90 s here). Real processes: a launch, its zygote-forked trainers, SIGCHLD and the error
files they wrote.
"""

from __future__ import annotations

import os

import pytest
import tensorflow as tf

from conftest import PROGRAMS, committed_steps, finish, launch, lifecycle, status_json

pytestmark = pytest.mark.slow

FAILS_AFTER_TRAINING = os.path.join(PROGRAMS, "fails_after_training.py")


def test_a_deterministic_error_after_training_ends_the_run_after_three_attempts_keeping_its_checkpoints(logdir):
    code, out, err = finish(launch(logdir, target=FAILS_AFTER_TRAINING), 240)
    said = out + err
    assert code == 1, said
    place = f"{FAILS_AFTER_TRAINING}:27 in evaluate"
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
