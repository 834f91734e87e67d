"""procsv.train's standard hooks, after TensorFlow's basic_session_run_hooks_test.py where it applies.

Real TensorFlow and a real Supervisor (its checkpoint and summary services run as child processes
of the test), except the pure timer and argument tests at the top.
"""

from __future__ import annotations

import logging
import math
import time
import os

import pytest

from conftest import committed_steps

from procsv.trainer.monitored import hooks as api


pytestmark = pytest.mark.usefixtures("fresh_train_api")  # each test is a new program (conftest)


def _session(logdir, hooks, state=None, **creator):
    from procsv import train

    scaffold = train.Scaffold(checkpoint=state)  # None: checkpoints off
    return train.MonitoredSession(train.ChiefSessionCreator(scaffold=scaffold, checkpoint_dir=logdir, **creator),
                                  hooks=hooks)


# ------------------------------------------------------------------ pure
def test_second_or_step_timer_triggers_first_then_every_n_steps_or_secs():
    from procsv.train import SecondOrStepTimer

    now = [100.0]
    steps = SecondOrStepTimer(every_steps=3, clock=lambda: now[0])
    assert steps.should_trigger_for_step(1)  # the first call always triggers
    assert steps.update_last_triggered_step(1) == (None, None)
    assert not steps.should_trigger_for_step(1)  # never twice for one step
    assert [s for s in range(2, 8) if steps.should_trigger_for_step(s)] == [4, 5, 6, 7]
    now[0] = 102.5
    assert steps.update_last_triggered_step(4) == (2.5, 3)
    secs = SecondOrStepTimer(every_secs=10, clock=lambda: now[0])
    secs.update_last_triggered_step(0)
    now[0] += 9.9
    assert not secs.should_trigger_for_step(5)
    now[0] += 0.1
    assert secs.should_trigger_for_step(5) and not secs.should_trigger_for_step(0)
    with pytest.raises(ValueError):
        SecondOrStepTimer()
    with pytest.raises(ValueError):
        SecondOrStepTimer(every_secs=1, every_steps=1)


def test_hook_arguments_are_checked_as_tensorflow_checks_them():
    from procsv import train

    with pytest.raises(ValueError, match="One of num_steps or last_step"):
        train.StopAtStepHook()
    with pytest.raises(ValueError, match="Only one of num_steps or last_step"):
        train.StopAtStepHook(num_steps=1, last_step=2)
    with pytest.raises(ValueError, match="exactly one of every_n_iter and every_n_secs"):
        train.LoggingTensorHook({"a": 1})
    with pytest.raises(ValueError, match="invalid every_n_iter"):
        train.LoggingTensorHook({"a": 1}, every_n_iter=0)
    with pytest.raises(ValueError, match="tensor names"):
        train.LoggingTensorHook(["loss:0"], every_n_iter=1)
    train.LoggingTensorHook({"a": 1}, at_end=True)  # at_end alone is enough
    with pytest.raises(ValueError, match="Exactly one of scaffold or summary_op"):
        train.SummarySaverHook(save_steps=1)
    with pytest.raises(ValueError, match="Exactly one of scaffold or summary_op"):
        train.SummarySaverHook(save_steps=1, scaffold=train.Scaffold(), summary_op=lambda: {})
    with pytest.raises(ValueError, match="every_secs or every_steps"):
        train.CheckpointSaverHook("/tmp/x")
    with pytest.raises(ValueError, match="both saver and scaffold"):
        train.CheckpointSaverHook("/tmp/x", save_steps=1, saver=object(), scaffold=train.Scaffold())
    with pytest.raises(ValueError, match="exactly one of every_n_steps and every_n_secs"):
        train.StepCounterHook(every_n_steps=None)
    assert str(train.NanLossDuringTrainingError()) == "NaN loss during training."
    assert issubclass(train.NanLossDuringTrainingError, RuntimeError)


def test_hooks_that_need_the_global_step_refuse_to_begin_without_one():
    from procsv import train

    with pytest.raises(RuntimeError, match="Global step should be created to use StopAtStepHook"):
        train.StopAtStepHook(num_steps=1).begin()


# ------------------------------------------------------------------ real sessions
pytestmark_slow = pytest.mark.slow


@pytestmark_slow
def test_stop_at_step_stops_at_exactly_that_global_step_also_when_resumed(logdir):
    import tensorflow as tf

    from procsv import train

    w = tf.Variable(0.0)
    runs = []
    with _session(logdir, [train.StopAtStepHook(last_step=7)], {"w": w}) as sess:
        while not sess.should_stop():
            runs.append(sess.run(lambda: w.assign_add(1.0)))
    assert len(runs) == 7 and int(train.get_global_step().numpy()) == 7 and committed_steps(logdir) == [7]

    api.set_global_step(None)
    w = tf.Variable(0.0)
    hook = train.StopAtStepHook(num_steps=5)  # counts from the restored step (no launch: this process's start)
    with _session(logdir, [hook], {"w": w}) as sess:
        assert int(train.get_global_step().numpy()) == 7 and w.numpy() == 7.0
        while not sess.should_stop():
            sess.run(lambda: w.assign_add(1.0))
    assert hook.last_step == 12 and int(train.get_global_step().numpy()) == 12 and w.numpy() == 12.0

    api.set_global_step(None)
    w = tf.Variable(0.0)
    with _session(logdir, [train.StopAtStepHook(last_step=12)], {"w": w}) as sess:
        assert sess.should_stop()  # restored at the last step already: not one step more (TF ran one)
        with pytest.raises(RuntimeError, match="Run called even after should_stop requested"):
            sess.run(lambda: w.assign_add(1.0))
    assert w.numpy() == 12.0 and committed_steps(logdir) == [7, 12]


@pytestmark_slow
def test_nan_loss_fails_the_run_skips_end_and_saves_nothing(logdir, monkeypatch):
    # TF's NanTensorHook behaviour, which procsv keeps unless it rolls the NaN back itself (issue 41:
    # under the default --on-nonfinite rollback procsv watches the hook's tensor instead)
    monkeypatch.setenv("PROCSV_ON_NONFINITE", "stop")
    import tensorflow as tf

    from procsv import train

    loss = tf.Variable(1.0)
    ended = []

    class Ends(train.SessionRunHook):
        def end(self, session):
            ended.append(True)

    def step():
        loss.assign(float("nan") if int(train.get_global_step().numpy()) == 2 else 0.5)  # inside step 3

    with pytest.raises(train.NanLossDuringTrainingError):
        with _session(logdir, [train.NanTensorHook(loss), Ends()], {"loss": loss}) as sess:
            while not sess.should_stop():
                sess.run(step)
    assert int(train.get_global_step().numpy()) == 3 and not ended
    assert committed_steps(logdir) == []  # a failed run keeps no state of the failure


@pytestmark_slow
def test_nan_loss_without_fail_requests_a_stop_and_the_run_ends_cleanly(logdir, caplog, monkeypatch):
    # TF's behaviour, kept under --on-nonfinite continue (rollback watches the hook's tensor instead;
    # stop would end the run with exit 4 when the final checkpoint finds step 4's NaN loss)
    monkeypatch.setenv("PROCSV_ON_NONFINITE", "continue")
    import tensorflow as tf

    from procsv import train

    w = tf.Variable(0.0)
    with _session(logdir, [train.NanTensorHook(None, fail_on_nan_loss=False)], {"w": w}) as sess:
        while not sess.should_stop():
            # None: the step's own return value is the loss
            sess.run(lambda: math.nan if w.assign_add(1.0).numpy() >= 4 else 1.0)
    assert int(train.get_global_step().numpy()) == 4
    assert "Model diverged with loss = NaN." in caplog.text
    # the step's own return value is the loss procsv watches (issue 41): the state of step 4, whose
    # loss is NaN, is not committed as the final checkpoint (it was, before)
    assert committed_steps(logdir) == []


@pytestmark_slow
def test_checkpoint_listeners_are_called_in_order_and_after_save_only_once_committed(logdir):
    import tensorflow as tf

    from procsv import train

    w = tf.Variable(0.0)
    calls = []

    class Listener(train.CheckpointSaverListener):
        def begin(self):
            calls.append(("begin",))

        def before_save(self, session, step):
            calls.append(("before_save", step))

        def after_save(self, session, step):
            calls.append(("after_save", step, step in committed_steps(logdir)))

        def end(self, session, step):
            calls.append(("end", step))

    hook = train.CheckpointSaverHook(logdir, save_steps=5, listeners=[Listener()])
    step = 0
    with _session(logdir, [hook], {"w": w}) as sess:
        while sum(1 for c in calls if c[0] == "after_save" and c[1] > 0) < 2:  # two saves of the every-5 trigger
            assert step < 3000, f"the every-5-steps trigger saved fewer than twice in 3000 steps: {calls}"
            sess.run(lambda: w.assign_add(1.0))
            step += 1
            time.sleep(0.01)
    assert calls[0] == ("begin",) and calls[-1] == ("end", step)
    assert calls[1] == ("before_save", 0)  # a checkpoint at session creation, as TF
    middle = calls[1:-1]
    for i in range(0, len(middle), 2):  # before_save/after_save pairs of the same step
        assert middle[i][0] == "before_save" and middle[i + 1] == ("after_save", middle[i][1], True)
    assert middle[-1] == ("after_save", step, True)
    saved = committed_steps(logdir)
    assert set(saved) == {c[1] for c in middle}
    # each save between the first and the final one follows an every-5 trigger since the save
    # before it: taken at the trigger's step, or (one snapshot is in flight at most) at the first
    # step after the one in flight committed
    for prev, cur in zip(saved, saved[1:-1]):
        assert any(m % 5 == 0 for m in range(prev + 1, cur + 1)), saved


@pytestmark_slow
def test_a_listener_returning_true_from_after_save_stops_training(logdir):
    import tensorflow as tf

    from procsv import train

    w = tf.Variable(0.0)

    class StopAfterFirst(train.CheckpointSaverListener):
        def after_save(self, session, step):
            return True

    with _session(logdir, [train.CheckpointSaverHook(logdir, save_steps=100, listeners=[StopAfterFirst()])],
                  {"w": w}) as sess:
        import time

        deadline = time.monotonic() + 90
        while not sess.should_stop() and time.monotonic() < deadline:
            sess.run(lambda: w.assign_add(1.0))
            time.sleep(0.01)
    assert time.monotonic() < deadline and 0 in committed_steps(logdir)


@pytestmark_slow
def test_summaries_and_step_rate_go_through_the_summary_service(logdir):
    import tensorflow as tf
    from tensorboard.backend.event_processing import event_accumulator as ea

    from procsv import train

    w = tf.Variable(0.0)
    hooks = [train.SummarySaverHook(save_steps=2, summary_op={"w": w, "w_twice": lambda: 2 * w}),
             train.StepCounterHook(every_n_steps=2)]
    with _session(logdir, hooks, {"w": w}) as sess:
        for _ in range(6):
            sess.run(lambda: w.assign_add(1.0))
    acc = ea.EventAccumulator(logdir, size_guidance={ea.SCALARS: 0})
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("w")] == [(1, 1.0), (3, 3.0), (5, 5.0)]
    assert [e.step for e in acc.Scalars("w_twice")] == [1, 3, 5]
    assert [e.step for e in acc.Scalars("global_step/sec")] == [2, 4, 6]
    assert hooks[1].last_rate is not None and hooks[1].last_rate > 0


@pytestmark_slow
def test_logging_final_ops_feed_fn_waiter_and_profiler_hooks(logdir, caplog):
    import tensorflow as tf

    from procsv import train

    caplog.set_level(logging.INFO, logger="tensorflow")  # the hooks log through tf.compat.v1.logging, as TF's
    w = tf.Variable(0.0)
    fed = []
    logging_hook = train.LoggingTensorHook({"w": w}, every_n_iter=2, at_end=True)
    formatted = train.LoggingTensorHook([w], every_n_iter=3, formatter=lambda v: f"custom {sorted(v)}")
    final = train.FinalOpsHook({"w": w, "twice": lambda: 2 * w})
    feeder = train.FeedFnHook(lambda: {"lr": 0.1 * len(fed)})
    profiler = train.ProfilerHook(save_steps=3)
    hooks = [logging_hook, formatted, final, feeder, train.GlobalStepWaiterHook(wait_until_step=0), profiler]

    def step(feed_dict):
        fed.append(feed_dict["lr"])
        w.assign_add(1.0)

    with _session(logdir, hooks, {"w": w}) as sess:
        for _ in range(5):
            sess.run(step)
    lines = [r.getMessage() for r in caplog.records if r.name == "tensorflow"]
    assert [line.split(" (")[0] for line in lines if line.startswith("w = ")] == ["w = 1.0", "w = 3.0", "w = 5.0",
                                                                                   "w = 5.0"]
    assert sum(line.startswith("custom ['Variable") for line in lines) == 2  # runs 1 and 4
    assert final.final_ops_values["w"] == 5.0 and final.final_ops_values["twice"] == 10.0
    assert fed == pytest.approx([0.0, 0.1, 0.2, 0.3, 0.4])
    assert profiler.traced_steps == [2, 5]  # not the first run, as TF; then every 3 steps
    assert os.listdir(os.path.join(logdir, "plugins", "profile"))


# ------------------------------------------------------------------ fast, on a fake Supervisor (no services)
def test_global_step_waiter_hook_starts_at_once_at_its_step_and_refuses_a_wait_that_could_never_end():
    """Eager: a global step already at wait_until_step (a restored one) starts at once, as TF; one
    below it would never get there (only this process's runs advance it): a UsageError naming both
    at the first run, before any step ran (TF's hook would poll forever)."""
    from fake_session import FakeCreator

    from procsv import train
    from procsv.common.errors import UsageError

    creator = FakeCreator()
    creator.global_step().assign(5)  # as restored
    ran = []
    with train.MonitoredSession(creator, [train.GlobalStepWaiterHook(wait_until_step=5)]) as sess:
        for _ in range(2):
            sess.run(lambda: ran.append(1))
    assert len(ran) == 2 and int(creator.global_step().numpy()) == 7
    creator = FakeCreator()
    creator.global_step().assign(2)
    with pytest.raises(UsageError, match=r"wait_until_step=3\): the global step is 2, .* could never end"):
        with train.MonitoredSession(creator, [train.GlobalStepWaiterHook(wait_until_step=3)]) as sess:
            sess.run(lambda: ran.append(2))
    assert ran == [1, 1] and int(creator.global_step().numpy()) == 2


def test_summaries_by_seconds_and_the_step_rate_read_the_supervisors_clock():
    from fake_session import FakeCreator

    from procsv import train

    creator = FakeCreator(secs_per_step=1.0)  # each step takes one second of the fake clock
    hooks = [train.SummarySaverHook(save_secs=3, summary_op=lambda: {"loss": 0.5}),
             train.StepCounterHook(every_n_steps=None, every_n_secs=2)]
    with train.MonitoredSession(creator, hooks) as sess:
        for _ in range(8):
            sess.run(lambda: None)
    sv = creator.supervisor
    assert [s for tag, _, s in sv.scalars if tag == "loss"] == [1, 4, 7]  # the first step, then every 3 s
    assert [(v, s) for tag, v, s in sv.scalars if tag == "global_step/sec"] == [(1.0, 2), (1.0, 4), (1.0, 6),
                                                                                (1.0, 8)]
    assert sv.stopped


def test_logging_by_seconds_and_at_end_only():
    from fake_session import FakeCreator

    from procsv import train

    lines = []
    every = train.LoggingTensorHook({"step": train.get_or_create_global_step()}, every_n_secs=2.5,
                                    formatter=lambda v: f"step={v['step']}")
    at_end = train.LoggingTensorHook({"step": train.get_or_create_global_step()}, at_end=True,
                                     formatter=lambda v: f"end={v['step']}")
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())
    tf_logger = logging.getLogger("tensorflow")  # the hooks log through tf.compat.v1.logging, as TF's
    level = tf_logger.level
    tf_logger.addHandler(handler)
    tf_logger.setLevel(logging.INFO)
    try:
        with train.MonitoredSession(FakeCreator(secs_per_step=1.0), [every, at_end]) as sess:
            for _ in range(6):
                sess.run(lambda: None)
    finally:
        tf_logger.removeHandler(handler)
        tf_logger.setLevel(level)
    # run 1 triggers (the first); the trigger is recorded when the line is logged, after the step
    # (t=1001, as TF), so the next is the first run starting >= 2.5 s after that: run 5 (t=1004)
    assert lines == ["step=1", "step=5", "end=6"]
