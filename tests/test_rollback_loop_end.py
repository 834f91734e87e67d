"""A training loop bounded by its own count of runs that ends inside a non-finite rollback's replay
(issue 68 area, found by an attack): the session's end finishes the replay up to the step the loop
had reached before the rollback, the pending retry handled on the way, so that the final checkpoint
holds what the loop would have had, not the earlier, restored step; where procsv cannot replay (a
TF1 graph program feeds its own batches) the steps lost are said in one line.

In-process (plain python, no launch): the Supervisor's services run as children of the test. Each loop
ends at its first run after which the global step it reads went back (the rollback restored an
earlier state): inside the replay, whatever the timing of the check that found the NaN, and whether
the in-memory snapshot or the disk was restored.
"""

from __future__ import annotations

import time

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("fresh_train_api")]


def _eager_loop_ending_inside_the_replay(kind: str, logdir: str) -> tuple[int, int, float]:
    """Step 6's loss is NaN whenever it runs (its retry too: it is skipped), every other step's finite;
    the step function reads its step itself. Returns the furthest step the loop saw, the step and the
    value of ``w`` of the final checkpoint."""
    import tensorflow as tf

    import procsv
    from procsv import train

    w = tf.Variable(1.0, name="w")
    seen = {"max": 0}
    deadline = time.monotonic() + 120  # (a bound for the test: the rollback comes at the first check after step 6)

    def ends(step: int) -> bool:  # the loop's own bound: its first run after which the step went back
        assert time.monotonic() < deadline, "no rollback within 120 s"
        seen["max"] = max(seen["max"], step)
        time.sleep(0.01)  # (a step's time: the checkpoint service starting beside the loop checks its snapshots)
        return step < seen["max"]

    if kind == "managed":
        sv = procsv.Supervisor(logdir=logdir, checkpoint={"w": w}, save_checkpoint_steps=2, save_summaries_secs=0)

        def managed_step() -> tf.Tensor:
            x = float("nan") if sv.step == 6 else 1.0  # (sv.step: the step running)
            w.assign_add(0.1 * x)
            return w * x

        with sv.managed_session() as sess:
            while True:
                sess.run(managed_step)
                if ends(sv.step):
                    break
    else:
        def monitored_step() -> tf.Tensor:
            x = float("nan") if int(train.get_global_step().numpy()) == 5 else 1.0
            w.assign_add(0.1 * x)
            return w * x

        with train.MonitoredTrainingSession(hooks=[train.NanTensorHook(None)], checkpoint_dir=logdir,
                                            checkpoint={"w": w}, save_checkpoint_steps=2,
                                            log_step_count_steps=None, save_summaries_steps=None) as msess:
            while True:
                msess.run(monitored_step)
                if ends(int(train.get_global_step().numpy())):
                    break
    latest = tf.train.latest_checkpoint(logdir)
    assert latest is not None
    return seen["max"], int(latest.rsplit("-", 1)[1]), float(tf.train.load_checkpoint(latest).get_tensor(
        "w/.ATTRIBUTES/VARIABLE_VALUE"))


@pytest.mark.parametrize("kind", ["managed", "monitored"])
def test_a_loop_that_ends_inside_a_rollbacks_replay_ends_at_the_step_it_had_reached_not_the_restored_one(
        tmp_path, capfd, kind: str) -> None:
    # before: the loop's end committed the restored step's replay as it stood (an earlier step than the
    # loop had reached), step 6's pending retry dropped, without a word. Now the replay is finished up to
    # the furthest step reached, step 6 is retried (NaN again) and skipped on the way: the final checkpoint
    # is that step's, w as a run that never applied step 6 has it
    reached, final, w = _eager_loop_ending_inside_the_replay(kind, str(tmp_path / kind))
    said = capfd.readouterr().err
    assert "retrying step 6 once" in said and "skipped step 6" in said, said
    assert reached >= 6 and final == reached, (reached, final, said)
    assert w == pytest.approx(1.0 + 0.1 * (reached - 1), abs=1e-4), (w, reached)


def test_a_graph_loop_that_ends_inside_a_rollbacks_replay_says_which_steps_are_lost(tmp_path, capfd) -> None:
    # a TF1 graph program feeds its own batches: procsv cannot replay its steps without its loop. Before:
    # nothing said; now one line names the steps lost and the retry not made, and nothing older than the
    # newest committed checkpoint is committed
    import tensorflow as tf

    from conftest import committed_steps
    from procsv import train

    logdir = str(tmp_path / "graph")
    reached, ended = 0, -1
    with tf.Graph().as_default():
        gs = tf.compat.v1.train.get_or_create_global_step()
        x = tf.compat.v1.placeholder(tf.float32, [])
        w = tf.compat.v1.get_variable("w", initializer=1.0)
        loss = w * x
        train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss, global_step=gs)
        with train.MonitoredTrainingSession(hooks=[train.NanTensorHook(loss)], checkpoint_dir=logdir,
                                            save_checkpoint_steps=2, log_step_count_steps=None,
                                            save_summaries_steps=None) as sess:
            deadline = time.monotonic() + 120  # (a bound for the test, as above)
            while time.monotonic() < deadline:
                time.sleep(0.01)
                before = sess.run_step_fn(lambda step_context: step_context.session.run(gs))
                sess.run(train_op, feed_dict={x: float("nan") if before == 5 else 1.0})
                reached = max(reached, before + 1)  # the step this run trained
                step = sess.run_step_fn(lambda step_context: step_context.session.run(gs))
                if step < reached:
                    ended = step
                    break
    said = capfd.readouterr().err
    assert 0 <= ended < reached, (ended, reached, said)
    one = reached == ended + 1
    lost = f"step {reached}, trained before the rollback, is" if one else \
        f"steps {ended + 1}-{reached}, trained before the rollback, are"
    assert (f"the training loop ended at step {ended}, inside the replay after a non-finite rollback: {lost} "
            "lost; step 6 is neither retried nor skipped") in said, said
    newest = tf.train.latest_checkpoint(logdir)
    assert newest is not None and int(newest.rsplit("-", 1)[1]) == max(committed_steps(logdir)) >= ended, said


def test_a_stop_at_step_hook_loop_with_a_nan_at_its_last_step_retries_it_and_ends_exactly_there(tmp_path, capfd) -> None:
    # TF's canonical loop (`while not mon_sess.should_stop()` with StopAtStepHook(last_step)): step 8's
    # NaN, once, is found when the loop ended. Before: the hook's stop request (made at step 8) was taken
    # as a refusal of every replayed run: the training ended at the restored step, steps 2-8 said lost,
    # exit 0. Now the replay runs through the hooks (StopAtStepHook asks again at 8), the retry is finite,
    # the final checkpoint is step 8's, not past it, and the hooks' end() sees step 8
    import tensorflow as tf

    from procsv import train

    logdir, w, nans, ended = str(tmp_path / "stop_at"), tf.Variable(1.0, name="w"), [0], [-1]

    class EndSees(train.SessionRunHook):
        def end(self, session: object) -> None:
            ended[0] = int(train.get_global_step().numpy())

    def step() -> tf.Tensor:
        x = 1.0
        if int(train.get_global_step().numpy()) == 7 and not nans[0]:  # (step 8 runs)
            nans[0], x = 1, float("nan")
        w.assign_add(0.1 * x)
        return w * x

    with train.MonitoredTrainingSession(hooks=[train.NanTensorHook(None), train.StopAtStepHook(last_step=8), EndSees()],
                                        checkpoint_dir=logdir, checkpoint={"w": w}, save_checkpoint_steps=4,
                                        log_step_count_steps=None, save_summaries_steps=None) as msess:
        while not msess.should_stop():
            msess.run(step)
    said = capfd.readouterr().err
    assert "loss of step 8 is NaN or infinite (found when the loop ended)" in said and "inside the replay after" not in said, said
    latest = tf.train.latest_checkpoint(logdir)
    assert latest is not None and latest.endswith("-8") and ended[0] == 8, (latest, ended, said)
    assert float(tf.train.load_checkpoint(latest).get_tensor("w/.ATTRIBUTES/VARIABLE_VALUE")) == pytest.approx(1.8, abs=1e-5)


def test_an_end_replay_whose_iterator_ran_out_stops_in_order_and_says_the_steps_lost(tmp_path, capfd) -> None:
    # `it = iter(dataset.take(8))`, `for _ in range(8): sess.run(lambda: step(next(it)))`: step 8's NaN is
    # found when the loop ended; its replay has no batch left. Before: next(it)'s StopIteration left the
    # block unstopped (no stop(), the program died with it); now the replay ends there, the steps lost said
    import tensorflow as tf

    import procsv

    logdir, w = str(tmp_path / "ran_out"), tf.Variable(1.0, name="w")
    sv = procsv.Supervisor(logdir=logdir, checkpoint={"w": w}, save_checkpoint_steps=2, save_summaries_secs=0)

    def body(batch: tf.Tensor) -> tf.Tensor:
        x = float("nan") if sv.step == 8 else 1.0
        w.assign_add(0.01 * x * float(batch))
        return w * x

    it = iter(tf.data.Dataset.range(1, 100).take(8))
    with sv.managed_session() as sess:
        for _ in range(8):
            sess.run(lambda: body(next(it)))
    said = capfd.readouterr().err
    assert "loss of step 8 is NaN or infinite (found when the loop ended)" in said, said
    assert f"the training loop ended at step {sv.step}, inside the replay after a non-finite rollback" in said, said
    assert sv.step < 8 and sv.should_stop(), (sv.step, said)


_PREEMPTED_IN_THE_END_REPLAY = """
import os, signal, sys, time
import tensorflow as tf
import procsv
w = tf.Variable(1.0, name="w")
sv = procsv.Supervisor(logdir=sys.argv[1], checkpoint={"w": w}, save_checkpoint_steps=2, save_summaries_secs=0)
seen = {"max": 0, "ended": False}
def step():
    if seen["ended"]:  # the first run of the end's replay: a preemption
        seen["ended"] = False
        print(f"SIGTERM at step {sv.step}", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGTERM)
    x = float("nan") if sv.step == 6 else 1.0
    w.assign_add(0.1 * x)
    return w * x
deadline = time.monotonic() + 120
with sv.managed_session() as sess:
    while time.monotonic() < deadline:
        sess.run(step)
        seen["max"] = max(seen["max"], sv.step)
        time.sleep(0.01)
        if sv.step < seen["max"]:
            seen["ended"] = True
            break
print(f"ended at step {sv.step}", file=sys.stderr, flush=True)
"""


def test_a_preemption_during_the_end_replay_commits_the_preempted_checkpoint(tmp_path) -> None:
    # a real SIGTERM during the replay the session's end makes (plain python, forked: ~1 CPU-s). Before:
    # the replayed run's TrainingStopped left the block with no stop(): no preempted checkpoint, exit 1
    # (under procsv launch: a crash, restarted); now the replay ends there and the stop commits that step
    import tensorflow as tf

    from conftest import quiet_env
    from pyfork import run_python

    logdir = str(tmp_path / "preempted")
    done = run_python(["-c", _PREEMPTED_IN_THE_END_REPLAY, logdir], env=quiet_env(), timeout=300)
    said = done.stderr
    assert done.returncode == 0 and "Traceback" not in said, said
    at = int(said.split("SIGTERM at step ", 1)[1].split()[0])
    assert f"ended at step {at}" in said, said
    latest = tf.train.latest_checkpoint(logdir)
    assert latest is not None and latest.endswith(f"-{at}"), (latest, said)
