"""The standard hooks as TensorFlow's own hooks behave, on a graph session that is not procsv's.

What TF 2.21's ``basic_session_run_hooks_test.py`` checks of TF's hooks, checked here on procsv's:
the hooks' lines go through ``tf.compat.v1.logging`` (the ``tensorflow`` logger), their timers read
TF's clock (``time.time``: a program that moves it moves them), ``StepCounterHook`` tags its rate
``<global step op name>/sec`` and warns when runs do not advance the step, ``_set_steps_per_run``
is honoured (``GlobalStepWaiterHook``'s wait: tests/test_graph_hooked.py), and
``CheckpointSaverHook`` on a plain ``tf.compat.v1.Session`` saves as TF's (``model.ckpt-0`` at
``after_create_session`` with its listeners, every N steps, at ``end()``; an ``after_save`` that
returns True stops right after that run). Each graph is built in a ``with tf.Graph().as_default()``
block and run by procsv's hooked run (:class:`GraphHookedSession`) over a raw session: no
Supervisor, no service. Checkpoints are read back with TF's checkpoint reader.
"""

from __future__ import annotations

import logging
import os
import time
from unittest import mock

import pytest

pytestmark = pytest.mark.usefixtures("fresh_train_api")


def _hooked(sess, hooks):
    from procsv.trainer.monitored.graph_hooked import GraphHookedSession

    return GraphHookedSession(sess, hooks)


def _saved_step(tf, directory):
    return int(tf.train.load_variable(directory, "global_step"))


class _Lines(logging.Handler):
    """The records of the ``tensorflow`` logger (TF's logging), at INFO and above."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture
def tf_lines():
    tf_logger = logging.getLogger("tensorflow")
    handler, level = _Lines(), tf_logger.level
    tf_logger.addHandler(handler)
    tf_logger.setLevel(logging.INFO)
    yield handler.lines
    tf_logger.removeHandler(handler)
    tf_logger.setLevel(level)


def test_logging_tensor_hook_logs_through_tensorflows_logger_on_tensorflows_clock(tf_lines):
    import tensorflow as tf

    from procsv import train

    now = [1484695987.0]
    with mock.patch.object(time, "time", lambda: now[0]), tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        t = tf.constant(42.0, name="foo")
        hook = train.LoggingTensorHook(tensors=[t.name], every_n_secs=1.0)
        hook.begin()
        hooked = _hooked(sess, [hook])
        hooked.run(tf.constant(3))  # the first run logs
        hooked.run(tf.constant(3))  # not a second later: no line
        now[0] += 1.0
        hooked.run(tf.constant(3))  # the clock TF's timers read moved a second: a line
    assert [line.split(" (")[0] for line in tf_lines if line.startswith("foo:0")] == ["foo:0 = 42.0"] * 2


def test_second_or_step_timer_reads_time_time_by_default():
    from procsv import train

    now = [1000.0]
    with mock.patch.object(time, "time", lambda: now[0]):
        timer = train.SecondOrStepTimer(every_secs=1.0)
        timer.update_last_triggered_step(1)
        assert not timer.should_trigger_for_step(2)
        now[0] += 1.0
        assert timer.should_trigger_for_step(2)


def test_step_counter_tags_the_global_steps_op_name_and_warns_when_runs_do_not_advance_it(tmp_path, tf_lines):
    import tensorflow as tf

    from procsv import train

    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        with tf.compat.v1.variable_scope("bar"):
            gs = tf.compat.v1.get_variable("foo", initializer=tf.constant(0, tf.int64), trainable=False,
                                           collections=[tf.compat.v1.GraphKeys.GLOBAL_STEP,
                                                        tf.compat.v1.GraphKeys.GLOBAL_VARIABLES])
        step = tf.compat.v1.assign_add(gs, 1)
        stay = tf.identity(gs)
        writer = tf.compat.v1.summary.FileWriter(str(tmp_path))
        hook = train.StepCounterHook(every_n_steps=1, summary_writer=writer)
        hook.begin()
        sess.run(tf.compat.v1.global_variables_initializer())
        hooked = _hooked(sess, [hook])
        for _ in range(3):
            hooked.run(step)
        hooked.run(stay)
        hooked.run(stay)  # the step seen before this run is the one seen before the last: a warning
        writer.close()
    events = os.path.join(str(tmp_path), os.listdir(str(tmp_path))[0])
    tags = {v.tag for e in tf.compat.v1.train.summary_iterator(events) for v in e.summary.value}
    assert tags == {"bar/foo/sec"}
    assert any(line.startswith("bar/foo/sec: ") for line in tf_lines)
    # the runs of `stay` do not advance the step: the second one warns, naming the step twice. (The
    # hook's fetch of the step runs beside the run's own ops with no order between them, in TF's hook
    # as here, so a run of `step` may read its step before or after its increment: under load, one
    # such run can read the same value as the run before it and warn too; the count is not fixed)
    assert any("has not been increased. Current value (could be stable): 3 vs previous value: 3" in line
               for line in tf_lines), tf_lines


def test_checkpoint_saver_hook_on_a_plain_session_saves_as_tensorflows(tmp_path):
    import tensorflow as tf

    from procsv import train

    calls = []

    class Listener(train.CheckpointSaverListener):
        def begin(self):
            calls.append(("begin",))

        def end(self, session, step):
            calls.append(("end", step))

        def before_save(self, session, step):
            calls.append(("before", step))

        def after_save(self, session, step):
            calls.append(("after", step))
            return step == 4

    ckpt_dir = str(tmp_path)
    with tf.Graph().as_default():
        gs = tf.compat.v1.train.get_or_create_global_step()
        train_op = tf.compat.v1.assign_add(gs, 1)
        # the graph's only Saver in its SAVERS collection (as a Scaffold's finalize() puts it): TF's hook finds it
        tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.SAVERS, tf.compat.v1.train.Saver())
        hook = train.CheckpointSaverHook(ckpt_dir, save_steps=2, listeners=[Listener()])
        hook.begin()
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            hook.after_create_session(sess, None)
            assert _saved_step(tf, ckpt_dir) == 0 and "graph.pbtxt" in os.listdir(ckpt_dir)  # model.ckpt-0
            hooked = _hooked(sess, [hook])
            seen = []
            while not hooked.should_stop():
                hooked.run(train_op)
                seen.append(_saved_step(tf, ckpt_dir))
            hook.end(sess)
    assert seen == [0, 2, 2, 4]  # every 2 steps; the listener's True after step 4 stops after that run
    assert calls == [("begin",), ("before", 0), ("after", 0), ("before", 2), ("after", 2), ("before", 4), ("after", 4),
                     ("end", 4)]
    assert os.path.basename(tf.train.latest_checkpoint(ckpt_dir)) == "model.ckpt-4"  # end(): step 4 already saved


def test_set_steps_per_run_for_checkpoints_and_the_step_rate(tmp_path):
    import tensorflow as tf

    from procsv import train

    ckpt_dir = str(tmp_path / "ckpt")
    now = [1484695987.0]
    with mock.patch.object(time, "time", lambda: now[0]), tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        gs = tf.compat.v1.train.get_or_create_global_step()
        train_op = tf.compat.v1.assign_add(gs, 5)  # a run of 5 steps
        tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.SAVERS, tf.compat.v1.train.Saver())
        saver_hook = train.CheckpointSaverHook(ckpt_dir, save_steps=10)
        saver_hook._set_steps_per_run(5)
        writer = tf.compat.v1.summary.FileWriter(str(tmp_path / "events"))
        rate_hook = train.StepCounterHook(every_n_steps=10, summary_writer=writer)
        rate_hook._set_steps_per_run(5)
        hooks = [saver_hook, rate_hook]
        for h in hooks:
            h.begin()
        sess.run(tf.compat.v1.global_variables_initializer())
        hooked = _hooked(sess, hooks)
        saved = []
        for _ in range(5):
            now[0] += 0.01
            hooked.run(train_op)
            saved.append(_saved_step(tf, ckpt_dir))
        writer.close()
    assert saved == [5, 5, 15, 15, 25]
    events = os.path.join(str(tmp_path / "events"), os.listdir(str(tmp_path / "events"))[0])
    assert [e.step for e in tf.compat.v1.train.summary_iterator(events) if e.summary.value] == [15, 25]


def test_final_ops_hook_warns_through_tensorflows_logger_when_a_final_op_reads_input(tf_lines):
    import tensorflow as tf

    from procsv import train

    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        read = tf.compat.v1.data.make_one_shot_iterator(tf.data.Dataset.range(1)).get_next()
        hook = train.FinalOpsHook(read)
        hook.begin()
        sess.run(read)
        with pytest.raises(tf.errors.OutOfRangeError):
            hook.end(sess)
    assert any("dependency back to some input source" in line for line in tf_lines)


def test_profiler_hook_adds_the_traced_runs_metadata_to_its_output_dirs_events(tmp_path):
    import tensorflow as tf

    from procsv import train

    out = str(tmp_path)
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        gs = tf.compat.v1.train.get_or_create_global_step()
        train_op = tf.compat.v1.assign_add(gs, 1)
        hook = train.ProfilerHook(save_steps=1, output_dir=out)
        hook.begin()
        sess.run(tf.compat.v1.global_variables_initializer())
        hook.after_create_session(sess, None)
        hooked = _hooked(sess, [hook])
        hooked.run(train_op)
        hooked.run(train_op)  # traced
        tf.compat.v1.summary.FileWriterCache.get(out).flush()
    events = [f for f in os.listdir(out) if "tfevents" in f]
    tags = [e.tagged_run_metadata.tag for f in events for e in tf.compat.v1.train.summary_iterator(os.path.join(out, f))
            if e.HasField("tagged_run_metadata")]
    assert tags == ["step_2"] and os.path.exists(os.path.join(out, "timeline-2.json"))


def test_the_timers_of_summaries_step_rate_and_profiling_in_graph_mode_read_time_time(tmp_path):
    """save_secs / every_n_secs in graph mode, as TF's test_save_secs_* tests: the first run
    counts (summaries: written; rate and profile: the start), then only a run after the clock TF's
    timers read (time.time, moved by the test) passed the interval."""
    import tensorflow as tf

    from procsv import train

    now = [1484695987.0]
    out = str(tmp_path / "profile")
    with mock.patch.object(time, "time", lambda: now[0]), tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        gs = tf.compat.v1.train.get_or_create_global_step()
        train_op = tf.compat.v1.assign_add(gs, 1)
        summary = tf.compat.v1.summary.scalar("gs", gs)
        writer = tf.compat.v1.summary.FileWriter(str(tmp_path / "events"))
        hooks = [train.SummarySaverHook(save_secs=9.0, summary_writer=writer, summary_op=summary),
                 train.StepCounterHook(every_n_steps=None, every_n_secs=9.0, summary_writer=writer),
                 train.ProfilerHook(save_secs=9.0, output_dir=out)]
        for h in hooks:
            h.begin()
        sess.run(tf.compat.v1.global_variables_initializer())
        for h in hooks:
            h.after_create_session(sess, None)
        hooked = _hooked(sess, hooks)
        for _ in range(8):
            hooked.run(train_op)
            now[0] += 3.1
        writer.close()
    events = os.path.join(str(tmp_path / "events"), os.listdir(str(tmp_path / "events"))[0])
    steps: dict[str, list[int]] = {}
    for e in tf.compat.v1.train.summary_iterator(events):
        for v in e.summary.value:
            steps.setdefault(v.tag, []).append(e.step)
    assert steps == {"gs": [1, 4, 7], "global_step/sec": [4, 7]}
    assert sorted(f for f in os.listdir(out) if f.startswith("timeline-")) == ["timeline-4.json", "timeline-7.json"]


@pytest.mark.slow
def test_in_procsvs_graph_session_step_0_is_saved_at_creation_and_a_listeners_stop_follows_the_run_that_saved(logdir):
    """procsv's own SingularMonitoredSession (a real Supervisor and checkpoint service): as TF's
    hook, a fresh session commits ``model.ckpt-0`` at ``after_create_session`` (listeners called,
    the checkpoint committed when ``after_save`` sees it), and an ``after_save`` that returns True
    stops the loop right after the run whose step was saved (TF's save is synchronous; here the
    run waits for the commit because the hook has listeners)."""
    import tensorflow as tf

    from conftest import committed_steps
    from procsv import train

    calls = []

    class Listener(train.CheckpointSaverListener):
        def before_save(self, session, step):
            calls.append(("before", step))

        def after_save(self, session, step):
            calls.append(("after", step, step in committed_steps(logdir)))
            return step == 2

    with tf.Graph().as_default():
        gs = tf.compat.v1.train.get_or_create_global_step()
        train_op = tf.compat.v1.assign_add(gs, 1)
        hook = train.CheckpointSaverHook(logdir, save_steps=1, listeners=[Listener()])
        seen = []
        with train.SingularMonitoredSession(hooks=[hook], checkpoint_dir=logdir) as sess:
            assert calls == [("before", 0), ("after", 0, True)]
            while not sess.should_stop() and len(seen) < 10:
                sess.run(train_op)
                seen.append(int(sess.raw_session().run(gs)))
    assert seen == [1, 2]
    assert calls == [("before", 0), ("after", 0, True), ("before", 1), ("after", 1, True), ("before", 2),
                     ("after", 2, True)]
    assert committed_steps(logdir) == [0, 1, 2]
