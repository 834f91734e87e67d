"""A non-finite loss in a trainer group (``procsv launch --nproc 2``, MultiWorkerMirroredStrategy),
with real processes, real TensorFlow collectives and a real NaN in one step's batch.

Only the chief checks for non-finite values (at its checkpoint boundaries), and each member holds
its own copy of the variables: a chief that rolled back in place alone trained out of lock with
its worker (the worker trained on NaN weights to the end and exited 0, the chief's next collective
then failed, and the group restarted from the same checkpoint again and again). In a group
``rollback`` now stops the run in order with exit code 4 and says why.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from conftest import committed_steps, finish, launch, lifecycle, raw_status

ARGS = ("--strategy", "multiworker", "--save-model-secs", "600", "--save-checkpoint-steps", "10",
        "--step-delay", "0.004", "--print-every-steps", "10")


def events(logdir: str, name: str) -> list[dict[str, Any]]:
    return [r for r in lifecycle(logdir) if r.get("event") == name]


def finite_floats(prefix: str) -> int:
    """How many float tensors the checkpoint ``prefix`` holds, read back with plain TensorFlow;
    fails if any holds a NaN or an infinity."""
    import tensorflow as tf

    reader = tf.train.load_checkpoint(prefix)
    floats = 0
    for key in reader.get_variable_to_shape_map():
        value = np.asarray(reader.get_tensor(key))
        if np.issubdtype(value.dtype, np.floating):
            assert np.isfinite(value).all(), (prefix, key)
            floats += 1
    return floats


def test_a_nan_loss_in_a_group_with_rollback_stops_the_whole_group_in_order_with_exit_4(logdir):
    # --max-restarts 1: a run that restarted the group instead ends (exit 1) after one restart
    proc = launch(logdir, *ARGS, "--steps", "80", "--nan-at-steps", "40", opts=("--nproc", "2", "--max-restarts", "1"))
    code, out, err = finish(proc)
    assert code == 4, err
    # the chief's one line (in its log, shown on the launch's output): what it found, that it
    # stopped, why it did not roll back, what to do; the launch's giving-up line repeats it
    line = [s for s in out.splitlines() if s.startswith("[trainer.1] procsv: non-finite training at step 40")]
    assert len(line) == 1, out
    assert "--on-nonfinite rollback: stopping in order with exit code 4 (diverging)" in line[0]
    # commits are asynchronous, one in flight: at 4 ms a step under load the step-30 snapshot may still be
    # waiting behind step 20's commit at step 40 (seen in a fresh clone's CI); the line names the newest that is
    steps = committed_steps(logdir)
    assert steps and steps[-1] < 40, steps
    assert f"the newest committed checkpoint (step {steps[-1]}) is the newest finite one" in line[0], line[0]
    assert "rollback in place is not available in a trainer group (2 members" in line[0]
    assert "--on-nonfinite continue" in line[0] and "fix the input and relaunch" in line[0]
    assert "procsv: giving up: the trainer is diverging" in err and line[0].split("procsv: ", 1)[1] in err
    # found once, never rolled back in place, and the group was not restarted
    assert [r["step"] for r in events(logdir, "nonfinite_detected")] == [40]
    assert not events(logdir, "rolled_back") and not events(logdir, "step_skipped")
    assert not events(logdir, "restarting")
    spawned = sorted((r["role"], r["attempt"]) for r in events(logdir, "spawned") if r["role"] in ("trainer", "worker1"))
    assert spawned == [("trainer", 1), ("worker1", 1)]
    assert [r.get("code") for r in events(logdir, "exited") if r["role"] == "trainer"] == [4]
    # no member trained past the poisoned step: the worker did not run on alone to the end
    assert "[worker1.1] digits: step 50" not in out and "digits: finished" not in out, out
    assert (raw_status(logdir) or {}).get("exit_code") == 4
    # every committed checkpoint is finite; the newest is from before the poisoned step (above)
    assert committed_steps(logdir) == steps
    for step in steps:
        assert finite_floats(os.path.join(logdir, f"model.ckpt-{step}")) > 0
