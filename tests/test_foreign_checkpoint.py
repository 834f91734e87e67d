"""A logdir whose checkpoint procsv did not write: a plain ``tf.train.CheckpointManager`` run's ``ckpt-3``,
saved at step 30,000. procsv resumes at the step stored in it (its root's ``global_step``, else its
``step`` variable), never at the 3 in its name, or fails at once with one line saying why.
"""

from __future__ import annotations

import os

import pytest

from conftest import PROGRAMS, finish, launch, quiet_env, status_json
from procsv.common.errors import MismatchedCheckpoint
from procsv.trainer.checkpoint.restore import foreign_step

TINY = os.path.join(PROGRAMS, "tiny_train.py")
STEP = 30000
NO_STANDBY = ("--standby", "fork")  # the launches restart nothing: no hot standby prepared beside the trainer


def _plain_manager_run(logdir: str, step_name: str | None) -> str:
    """What a plain TF program leaves: three CheckpointManager saves, the last at step 30,000 with
    every weight 30,000 (tiny_train adds one per step); ``step_name``: the step variable's name."""
    import tensorflow as tf

    weights = tf.Variable(tf.zeros([4]))
    state = {"weights": weights}
    if step_name is not None:
        state[step_name] = tf.Variable(0, dtype=tf.int64)
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(**state), logdir, max_to_keep=5)
    for step in (10000, 20000, STEP):
        weights.assign(tf.fill([4], float(step)))
        if step_name is not None:
            state[step_name].assign(step)
        manager.save()
    assert manager.latest_checkpoint == os.path.join(logdir, "ckpt-3")
    return manager.latest_checkpoint


@pytest.mark.slow
@pytest.mark.parametrize("step_name", ["global_step", "step"])
def test_a_plain_checkpoint_manager_checkpoint_resumes_at_its_stored_step(logdir, step_name):
    import tensorflow as tf

    os.makedirs(logdir)
    _plain_manager_run(logdir, step_name)
    code, out, err = finish(launch(logdir, "--steps", str(STEP + 5), "--step-delay", "0", target=TINY,
                                   opts=NO_STANDBY, env=quiet_env(PROCSV_MEMORY_SNAPSHOTS="0")), timeout=300)
    assert code == 0, err
    assert f"tiny: attempt 1 starts at step {STEP}" in out
    assert f"stored in its {step_name!r} variable, {STEP}" in out
    latest = tf.train.latest_checkpoint(logdir)
    assert latest == os.path.join(logdir, f"model.ckpt-{STEP + 5}")
    weights, global_step = tf.Variable(tf.zeros([4])), tf.Variable(0, dtype=tf.int64)
    tf.train.Checkpoint(weights=weights, global_step=global_step).restore(latest).assert_existing_objects_matched()
    assert int(global_step.numpy()) == STEP + 5 and float(weights.numpy()[0]) == STEP + 5
    st = status_json(logdir)
    assert st is not None and st["state"] == "succeeded" and st["restored_step"] == STEP


@pytest.mark.slow
def test_a_plain_checkpoint_without_a_step_fails_at_once_with_one_line(logdir):
    import tensorflow as tf

    os.makedirs(logdir)
    path = _plain_manager_run(logdir, None)
    code, out, err = finish(launch(logdir, "--steps", str(STEP + 5), "--step-delay", "0", target=TINY,
                                   opts=NO_STANDBY), timeout=300)
    assert code != 0
    lines = [line for line in (out + err).splitlines() if "cannot tell which step" in line]
    assert lines and f"which step {path} holds: procsv did not write it" in lines[0]
    assert "counts saves, not steps" in lines[0]
    assert "the trainer cannot start: MismatchedCheckpoint (a restart would fail the same way)" in err
    st = status_json(logdir)
    assert st is not None and st["state"] == "failed" and st["restarts"] == 0
    assert tf.train.latest_checkpoint(logdir) == path  # nothing written, nothing moved


def test_foreign_step_reads_global_step_then_step_and_never_the_name():
    assert foreign_step("/l/ckpt-3", {"global_step": STEP, "step": 7}) == ("global_step", STEP)
    assert foreign_step("/l/ckpt-3", {"step": STEP}) == ("step", STEP)
    assert foreign_step("/l/ckpt-3", {"global_step": -1, "step": STEP}) == ("step", STEP)
    with pytest.raises(MismatchedCheckpoint) as raised:
        foreign_step("/l/ckpt-3", {})
    message = str(raised.value)
    assert "\n" not in message and "'ckpt-3'" in message and "'global_step'" in message and "'step'" in message


def test_the_checkpoint_service_leaves_a_plain_runs_state_file_for_the_trainer(tmp_path):
    """The service's start-up repair (CheckpointStore.recover) used to delete the `checkpoint` file of
    a logdir with nothing committed, so under procsv launch a plain run's ckpt-3 was never seen and
    the run started again from step 0, silently. A file naming a checkpoint that is not there is
    still removed (test_bad_input's test_17 covers one naming a missing one beside committed ones)."""
    from procsv.common.layout import Layout
    from procsv.services.checkpoint.store import CheckpointStore

    layout = Layout(str(tmp_path / "run"))
    layout.create()
    _plain_manager_run(layout.logdir, "step")
    with open(layout.state_file) as fh:
        before = fh.read()
    notes = CheckpointStore(layout).recover()
    with open(layout.state_file) as fh:
        assert fh.read() == before
    assert any("'ckpt-3', which procsv did not write: left for the trainer" in n for n in notes), notes
    for name in os.listdir(layout.logdir):
        if name.startswith("ckpt-3."):
            os.unlink(os.path.join(layout.logdir, name))
    CheckpointStore(layout).recover()
    assert not os.path.exists(layout.state_file)
