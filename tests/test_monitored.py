"""procsv.train's MonitoredSession family, after TensorFlow's monitored_session_test.py where it applies.

In-process tests use real TensorFlow and a real Supervisor (its services run as child processes of
the test); the last two run `procsv launch` and SIGKILL the trainer.
"""

from __future__ import annotations

import logging
import signal

import pytest

from conftest import (committed_steps, finish, launch, launch_and_kill_trainer_once, lifecycle,
                      seed_example_restores, status_json, wait_for)

from procsv.trainer.monitored import hooks as api

# each test is a new program for procsv.train (conftest's fresh_train_api)
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("fresh_train_api")]


def _recorder(calls):
    from procsv import train

    class Recorder(train.SessionRunHook):
        def begin(self):
            calls.append("begin")

        def after_create_session(self, session, coord):
            calls.append(("after_create_session", int(session.global_step.numpy())))

        def before_run(self, run_context):
            calls.append(("before_run", int(train.get_global_step().numpy())))
            return train.SessionRunArgs({"step": train.get_global_step(), "twice": lambda: 2 * w_of(run_context)})

        def after_run(self, run_context, run_values):
            calls.append(("after_run", run_values.results["step"], run_values.results["twice"],
                          run_values.step_result))

        def end(self, session):
            calls.append("end")

    return Recorder()


_state = {}


def w_of(_ctx):
    return _state["w"]


def test_hooks_are_called_in_tensorflows_order_and_see_their_fetches_after_the_step(logdir):
    import tensorflow as tf

    from procsv import train

    calls = []
    w = _state["w"] = tf.Variable(0.0)
    scaffold = train.Scaffold(checkpoint={"w": w}, init_fn=lambda scaffold, session: calls.append("init_fn"),
                              local_init_fn=lambda session: calls.append("local_init_fn"))
    sess = train.MonitoredSession(train.ChiefSessionCreator(scaffold=scaffold, checkpoint_dir=logdir),
                                  hooks=[_recorder(calls)])
    with sess:
        assert sess.run(lambda: w.assign_add(1.0).numpy() * 10) == 10.0  # the step's own return value
        assert sess.run(lambda x, y=0: w.assign_add(x + y).numpy(), 2, y=1) == 4.0
    assert calls == ["begin", "init_fn", "local_init_fn", ("after_create_session", 0),
                     ("before_run", 0), ("after_run", 1, 2.0, 10.0),
                     ("before_run", 1), ("after_run", 2, 8.0, 4.0), "end"]
    assert committed_steps(logdir) == [2]  # the final checkpoint of the Supervisor

    # a second session in the same logdir restores: no init_fn, local_init_fn again
    api.set_global_step(None)
    calls.clear()
    w = _state["w"] = tf.Variable(0.0)
    scaffold = train.Scaffold(checkpoint={"w": w}, init_fn=lambda scaffold, session: calls.append("init_fn"),
                              local_init_fn=lambda session: calls.append("local_init_fn"))
    with train.MonitoredSession(train.ChiefSessionCreator(scaffold=scaffold, checkpoint_dir=logdir),
                                hooks=[_recorder(calls)]):
        pass
    assert calls == ["begin", "local_init_fn", ("after_create_session", 2), "end"] and w.numpy() == 4.0


def test_a_hook_stop_ends_the_loop_and_a_further_run_is_a_runtime_error(logdir):
    import tensorflow as tf

    from procsv import train

    w = tf.Variable(0.0)

    class StopAtTwo(train.SessionRunHook):
        def after_run(self, run_context, run_values):
            if run_values.step_result >= 2:
                run_context.request_stop()

    with train.MonitoredSession(train.ChiefSessionCreator(train.Scaffold(checkpoint={"w": w}), checkpoint_dir=logdir),
                                hooks=[StopAtTwo()]) as sess:
        while not sess.should_stop():
            sess.run(lambda: w.assign_add(1.0).numpy())
        with pytest.raises(RuntimeError, match="Run called even after should_stop requested"):
            sess.run(lambda: w.assign_add(1.0))
        with pytest.raises(TypeError, match="takes a step function"):
            sess.run(w)
    assert w.numpy() == 2.0 and committed_steps(logdir) == [2]


def test_an_error_in_the_block_skips_end_and_is_re_raised_out_of_range_is_a_clean_stop(logdir):
    import tensorflow as tf

    from procsv import train

    w = tf.Variable(0.0)
    calls = []
    _state["w"] = w
    with pytest.raises(ValueError, match="bad batch"):
        with train.MonitoredSession(train.ChiefSessionCreator(train.Scaffold(checkpoint={"w": w}),
                                                              checkpoint_dir=logdir), hooks=[_recorder(calls)]) as sess:
            sess.run(lambda: w.assign_add(1.0))
            raise ValueError("bad batch")
    assert "end" not in calls and committed_steps(logdir) == []

    api.set_global_step(None)
    calls.clear()
    w = _state["w"] = tf.Variable(0.0)

    def exhausted():
        raise tf.errors.OutOfRangeError(None, None, "input exhausted")

    with train.MonitoredSession(train.ChiefSessionCreator(train.Scaffold(checkpoint={"w": w}),
                                                          checkpoint_dir=logdir), hooks=[_recorder(calls)]) as sess:
        sess.run(lambda: w.assign_add(1.0))
        sess.run(exhausted)
    assert calls[-1] == "end" and committed_steps(logdir) == [1]


def test_an_error_recorded_by_another_thread_lets_the_runs_go_ahead_calls_end_and_is_re_raised(logdir):
    import threading

    import tensorflow as tf

    from procsv import train

    w = _state["w"] = tf.Variable(0.0)
    calls = []
    with pytest.raises(KeyError, match="from a thread"):
        with train.MonitoredSession(train.ChiefSessionCreator(train.Scaffold(checkpoint={"w": w}),
                                                              checkpoint_dir=logdir), hooks=[_recorder(calls)]) as sess:
            sess.run(lambda: w.assign_add(1.0))
            t = threading.Thread(target=lambda: sess.supervisor.request_stop(KeyError("from a thread")))
            t.start()
            t.join()
            assert sess.should_stop()
            # the next runs go ahead, as TF's (its test_regular_exception_reported_to_coord_pass_through_run);
            # the error leaves the block at its end
            sess.run(lambda: w.assign_add(1.0))
            sess.run(lambda: w.assign_add(1.0))
    # as TF's close: the hooks' end() (the block ended cleanly), then the error; the Supervisor's stop commits no
    # checkpoint after it (a CheckpointSaverHook's end() would: tests/test_monitored_thread_errors.py)
    assert calls[-1] == "end" and committed_steps(logdir) == [] and w.numpy() == 3.0


def test_run_step_fn_request_stop_raises_stop_iteration_and_the_block_ends_cleanly(logdir):
    import tensorflow as tf

    from procsv import train

    w = tf.Variable(0.0)
    calls = []
    _state["w"] = w
    sess = train.SingularMonitoredSession(hooks=[_recorder(calls)], scaffold=train.Scaffold(checkpoint={"w": w}),
                                          checkpoint_dir=logdir)

    def step_fn(step_context):
        before = step_context.session.run(w)  # a read through the raw session: no hooks, not a step
        value = step_context.run_with_hooks(lambda: w.assign_add(1.0).numpy())
        if before >= 2:
            step_context.request_stop()
        return value

    with pytest.raises(ValueError, match="step_context"):
        sess.run_step_fn(lambda ctx: None)
    with sess:
        assert sess.run_step_fn(step_fn) == 1.0
        raw = sess.raw_session()
        assert raw.run(lambda: w.assign_add(10.0).numpy()) == 11.0  # a step without hooks
        assert int(raw.run(train.get_global_step())) == 2
        while not sess.should_stop():
            sess.run_step_fn(step_fn)
        pytest.fail("request_stop() must raise StopIteration out of run_step_fn")
    assert sess.should_stop()
    assert [c[0] for c in calls if isinstance(c, tuple) and c[0] == "before_run"] == ["before_run"] * 2
    assert calls[-1] == "end" and w.numpy() == 12.0 and committed_steps(logdir) == [3]


def test_scaffold_checks_ready_fn_and_warns_once_about_graph_arguments(logdir, caplog):
    import tensorflow as tf

    from procsv import train

    caplog.set_level(logging.WARNING, logger="procsv.train")
    train.Scaffold(init_op=object(), saver=object())
    train.Scaffold(init_op=object())
    warnings = [r.getMessage() for r in caplog.records]
    assert sum("init_op" in m for m in warnings) == 1 and any("checkpoint=tf.train.Checkpoint" in m for m in warnings)

    w = tf.Variable(0.0)
    scaffold = train.Scaffold(checkpoint={"w": w}, ready_fn=lambda session: ["w"])
    with pytest.raises(RuntimeError, match="did not make model ready"):
        train.MonitoredSession(train.ChiefSessionCreator(scaffold, checkpoint_dir=logdir, master="grpc://x:1"))
    assert any("master" in r.getMessage() for r in caplog.records)
    assert committed_steps(logdir) == []


def test_checkpoint_filename_with_path_is_restored_when_the_logdir_has_no_checkpoint(logdir, tmp_path):
    import tensorflow as tf

    from procsv import train

    w = tf.Variable(5.0)
    step = tf.Variable(30, dtype=tf.int64)
    path = tf.train.Checkpoint(w=w, global_step=step).write(str(tmp_path / "plain" / "ckpt"))
    w.assign(0.0)
    api.set_global_step(None)
    init_calls = []
    scaffold = train.Scaffold(checkpoint={"w": w}, init_fn=lambda scaffold, session: init_calls.append(1))
    with train.SingularMonitoredSession(scaffold=scaffold, checkpoint_dir=logdir,
                                        checkpoint_filename_with_path=path) as sess:
        assert w.numpy() == 5.0 and int(train.get_global_step().numpy()) == 30 and not init_calls
        sess.run(lambda: w.assign_add(1.0))
    assert committed_steps(logdir) == [31]


def test_feeds_reach_the_step_function_and_conflicting_feeds_are_an_error(logdir):
    import tensorflow as tf

    from procsv import train

    w = tf.Variable(0.0)
    got = []

    def step(feed_dict):
        got.append(dict(feed_dict))

    with train.MonitoredSession(train.ChiefSessionCreator(train.Scaffold(checkpoint={"w": w}), checkpoint_dir=logdir),
                                hooks=[train.FeedFnHook(lambda: {"lr": 0.5})]) as sess:
        sess.run(step, feed_dict={"x": 1})
        with pytest.raises(RuntimeError, match="fed by a SessionRunHook and user"):
            sess.run(step, feed_dict={"lr": 1})
    assert got == [{"x": 1, "lr": 0.5}]


def test_monitored_training_session_defaults_follow_tensorflows_use_default_rules():
    from procsv.trainer.monitored.session import USE_DEFAULT as D
    from procsv.trainer.monitored.session import save_intervals

    assert save_intervals(D, D, D, D) == (600, None, 100, None)
    assert save_intervals(D, 50, D, 30) == (None, 50, None, 30)
    assert save_intervals(60, D, 10, D) == (60, None, 10, None)
    assert save_intervals(None, D, None, D) == (None, None, None, None)  # None turns it off


def test_monitored_training_session_builds_tensorflows_hooks_in_order_and_saves_through_the_services(logdir):
    import tensorflow as tf
    from tensorboard.backend.event_processing import event_accumulator as ea

    from procsv import train

    w = tf.Variable(0.0)
    first, last = train.SessionRunHook(), train.SessionRunHook()
    sess = train.MonitoredTrainingSession(checkpoint_dir=logdir, checkpoint={"w": w}, chief_only_hooks=[first],
                                          hooks=[last], save_checkpoint_steps=3, save_summaries_steps=2,
                                          log_step_count_steps=2, scaffold=train.Scaffold(summary_op={"w": w}))
    assert [type(h).__name__ for h in sess._hooks] == ["SessionRunHook", "StepCounterHook", "SummarySaverHook",
                                                        "CheckpointSaverHook", "SessionRunHook"]
    assert sess._hooks[0] is first and sess._hooks[-1] is last
    assert sess.supervisor.save_checkpoint_steps == 3 and sess.supervisor.save_model_secs is None
    with sess:
        for _ in range(4):
            sess.run(lambda: w.assign_add(1.0))
    assert committed_steps(logdir)[0] == 0 and committed_steps(logdir)[-1] == 4
    acc = ea.EventAccumulator(logdir, size_guidance={ea.SCALARS: 0})
    acc.Reload()
    assert [e.step for e in acc.Scalars("w")] == [1, 3] and [e.step for e in acc.Scalars("global_step/sec")] == [2, 4]


def test_two_hooks_feeding_one_key_is_an_error_and_hooks_see_the_callers_arguments():
    from fake_session import FakeCreator

    from procsv import train

    seen = []

    class Feeds(train.SessionRunHook):
        def before_run(self, run_context):
            seen.append(run_context.original_args)
            return train.SessionRunArgs(None, feed_dict={"lr": 1})

    def step(feed_dict=None):
        return feed_dict

    with train.MonitoredSession(FakeCreator(), [Feeds()]) as sess:
        assert sess.run(step, feed_dict={"x": 2}) == {"x": 2, "lr": 1}
        assert seen == [train.SessionRunArgs(step, {"x": 2})]
    with train.MonitoredSession(FakeCreator(), [Feeds(), Feeds()]) as sess:
        with pytest.raises(RuntimeError, match="fed by two hooks"):
            sess.run(step)


# ------------------------------------------------------------------ real launches
# no hot standby (--standby fork: a restart forks the pre-warmed trainer) where the test is not about one: it
# waited unused to the end. The seed examples' SIGKILL keeps the default: their restart promotes the standby
NO_STANDBY = ("--standby", "fork")


def test_stop_at_step_num_steps_is_exact_after_a_sigkill_of_the_trainer(logdir):
    from conftest import PROGRAMS

    code, out, err = launch_and_kill_trainer_once(logdir, "--num-steps", "150", "--step-delay", "0.02",
                                                  "--save-steps", "20", target=f"{PROGRAMS}/monitored_train.py",
                                                  opts=NO_STANDBY)
    assert code == 0, err
    st = status_json(logdir)
    assert st["restarts"] == 1 and st["step"] == 150 and st["restored_step"] > 0
    assert "monitored_train: done at step 150, weights 150" in out
    assert "stops at 150" in out.split("starts at step " + str(st["restored_step"]))[1]  # the restarted attempt
    assert max(committed_steps(logdir)) == 150
    assert [e["step"] for e in lifecycle(logdir) if e["event"] == "finished"] == [150]


@pytest.mark.parametrize("example", ["monitored_training", "monitored_session", "run_step_fn"])
def test_the_monitored_session_examples_survive_a_sigkill_and_restore_with_plain_tf(logdir, example):
    """procsv/examples/seeds/: MonitoredTrainingSession, MonitoredSession with its saver and
    summary hooks, run_step_fn: a SIGKILL of the trainer changes neither the end nor the weights."""
    code, out, err = launch_and_kill_trainer_once(logdir, "--steps", "400", "--save-checkpoint-steps", "50",
                                                  "--step-delay", "0.01", target=f"procsv.examples.seeds.{example}")
    assert code == 0, err
    assert f"{example}: finished at step 400" in out
    st = status_json(logdir)
    assert st["restarts"] == 1 and st["step"] == 400
    seed_example_restores(logdir, 400)


def test_sigterm_to_the_launch_commits_the_last_step_through_the_checkpoint_saver_hook(logdir):
    from conftest import PROGRAMS, raw_status

    proc = launch(logdir, "--last-step", "100000", "--step-delay", "0.005", "--save-steps", "100000",
                  target=f"{PROGRAMS}/monitored_train.py", opts=NO_STANDBY)
    try:
        wait_for(lambda: (raw_status(logdir) or {}).get("step", 0) > 20, 90, what="training to start")
        proc.send_signal(signal.SIGTERM)
    finally:
        code, out, err = finish(proc)
    assert code == 128 + signal.SIGTERM, err
    st = status_json(logdir)
    assert st["state"] == "stopped" and st["step"] > 20
    assert committed_steps(logdir) == [0, st["step"]]  # at session creation, as TF; then the emergency one
    reasons = [e["reason"] for e in lifecycle(logdir) if e["event"] == "checkpoint_committed"]
    assert reasons[-1] == "preempted"


def test_a_nan_loss_fails_the_launch_without_a_restart(logdir):
    from conftest import PROGRAMS

    # TF's NanTensorHook behaviour: kept unless procsv rolls the NaN back itself (the default, issue 41)
    proc = launch(logdir, "--num-steps", "1000", "--nan-at-step", "60", "--step-delay", "0.01", "--save-steps", "20",
                  target=f"{PROGRAMS}/monitored_train.py", opts=("--on-nonfinite", "stop", *NO_STANDBY))
    code, out, err = finish(proc)
    assert code == 1, err
    assert "NanLossDuringTrainingError: a failure of the program, not of the process" in err
    st = status_json(logdir)
    assert st["state"] == "failed" and st["restarts"] == 0
    assert not [e for e in lifecycle(logdir) if e["event"] in ("restarting", "restarted")]
    assert max(committed_steps(logdir)) < 62  # nothing was saved once the loss was NaN
