"""Issue #11 section 5: the Supervisor page's examples (procsv/examples/seeds/: basic, loop,
manual_summaries, retry) under a real ``procsv launch``, with a SIGKILL of the trainer: the same
final step, the weights of an uninterrupted run, and a checkpoint plain TensorFlow restores. (The
MonitoredSession examples are in test_monitored.py.)"""

from __future__ import annotations


import pytest

from conftest import launch_and_kill_trainer_once, seed_example_restores, status_json

pytestmark = pytest.mark.slow
STEPS = 300


@pytest.mark.parametrize("example,extra", [
    ("basic", ()),
    ("loop", ("--loop-secs", "0.5")),
    ("manual_summaries", ()),
    ("retry", ("--abort-at-step", "170")),
])
def test_the_supervisor_examples_survive_a_sigkill_and_restore_with_plain_tf(logdir, example, extra):
    code, out, err = launch_and_kill_trainer_once(logdir, "--steps", str(STEPS), "--save-checkpoint-steps", "50",
                                                  "--step-delay", "0.01", *extra,
                                                  target=f"procsv.examples.seeds.{example}")
    assert code == 0, err
    assert f"{example}: finished at step {STEPS}" in out
    st = status_json(logdir)
    assert st["restarts"] == 1 and st["step"] == STEPS
    seed_example_restores(logdir, STEPS)
    if example == "loop":
        assert "print_loss: loss " in out  # the sv.loop thread read the loss (no step, no socket)
    if example == "manual_summaries":  # summary_op=None: only the summaries computed by hand, every 100 steps
        from tensorboard.backend.event_processing import event_accumulator as ea

        acc = ea.EventAccumulator(logdir, size_guidance={ea.SCALARS: 0})
        acc.Reload()
        assert [e.step for e in acc.Scalars("loss")] == [0, 100, 200]
    if example == "retry":
        assert "retry: aborted at step 170; retrying" in out
