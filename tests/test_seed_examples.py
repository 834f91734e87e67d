"""Issue #11 section 5: the Supervisor page's examples (procsv/examples/supervised.py) under a real
``procsv launch``, with a SIGKILL of the trainer: the same final step, and a checkpoint plain
TensorFlow restores. (The MonitoredSession examples are in test_monitored.py.)"""

from __future__ import annotations

import os

import pytest

from conftest import launch_and_kill_trainer_once, status_json

pytestmark = pytest.mark.slow
STEPS = 300


def _restores_with_plain_tf(logdir: str, step: int) -> None:
    import keras
    import tensorflow as tf

    latest = tf.train.latest_checkpoint(logdir)
    assert latest == os.path.join(logdir, f"model.ckpt-{step}")
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(10)])
    optimizer = keras.optimizers.Adam(1e-3)
    optimizer.build(model.trainable_variables)
    gs = tf.Variable(0, dtype=tf.int64)
    tf.train.Checkpoint(model=model, optimizer=optimizer, global_step=gs).restore(latest).assert_consumed()
    assert int(gs.numpy()) == step


@pytest.mark.parametrize("mode,extra", [
    ("basic", ()),
    ("loop", ("--loop-secs", "0.5")),
    ("summaries", ("--summary-every", "100")),
    ("retry", ("--abort-at-step", "170")),
])
def test_the_supervisor_examples_survive_a_sigkill_and_restore_with_plain_tf(logdir, mode, extra):
    code, out, err = launch_and_kill_trainer_once(logdir, "--mode", mode, "--steps", str(STEPS),
                                                  "--save-checkpoint-steps", "50", "--step-delay", "0.01", *extra,
                                                  target="procsv.examples.supervised")
    assert code == 0, err
    assert f"supervised: finished at step {STEPS}" in out
    st = status_json(logdir)
    assert st["restarts"] == 1 and st["step"] == STEPS
    _restores_with_plain_tf(logdir, STEPS)
    if mode == "loop":
        assert "supervised: loss " in out  # the sv.loop thread read the loss (no step, no socket)
    if mode == "summaries":  # summary_op=None: only the summaries computed by hand, every 100 steps
        from tensorboard.backend.event_processing import event_accumulator as ea

        acc = ea.EventAccumulator(logdir, size_guidance={ea.SCALARS: 0})
        acc.Reload()
        assert [e.step for e in acc.Scalars("loss")] == [0, 100, 200]
    if mode == "retry":
        assert "supervised: aborted at step 170; retrying" in out
