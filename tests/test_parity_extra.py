"""Two seed items docs/parity.md lists that had no test of their own: ``Supervisor.stop(close_summary_writer=False)``
and ``StepCounterHook``'s log line.

Real TensorFlow and a real Supervisor (its checkpoint and summary services run as child processes
of the test); event files are read back with TensorBoard's own reader.
"""

from __future__ import annotations

import glob
import logging
import os
import re
import time

import pytest

# each test is a new program for procsv.train (conftest's fresh_train_api)
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("fresh_train_api")]


def _scalars(logdir):
    from tensorboard.backend.event_processing import event_accumulator as ea

    acc = ea.EventAccumulator(logdir, size_guidance={ea.SCALARS: 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def _session_logs(logdir):
    """Every ``SessionLog`` of the logdir's event files, oldest file first: [(step, status name)]."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.compat.proto import event_pb2

    found = []
    for path in sorted(glob.glob(os.path.join(logdir, "events.out.tfevents.*")), key=os.path.getmtime):
        for event in EventFileLoader(path).Load():
            if event.HasField("session_log"):
                found.append((event.step, event_pb2.SessionLog.SessionStatus.Name(event.session_log.status)))
    return found


# ------------------------------------------------------------------ Supervisor.stop(close_summary_writer=False)
def test_stop_without_closing_the_summary_writer_writes_no_session_stop_and_keeps_what_is_logged_after_it(logdir):
    """TF: ``stop(close_summary_writer=False)`` leaves the writer open: no ``SessionLog STOP`` is
    written, and summaries can still be written after the stop. procsv (docs/parity.md): no
    ``SessionLog STOP``; what is logged after the stop is kept and written when the same
    Supervisor opens its next session (the default stop then writes the STOP)."""
    import tensorflow as tf
    from tensorboard.compat.proto import summary_pb2

    import procsv

    w = tf.Variable(0.0)
    sv = procsv.Supervisor(logdir=logdir, checkpoint={"w": w}, save_model_secs=None, save_summaries_secs=None)
    sess = sv.prepare_or_wait_for_session()
    for _ in range(3):
        sess.run(lambda: w.assign_add(1.0))
        sv.summary_computed(sess, {"before_stop": float(w.numpy())})
    # summary_computed's other forms (the seed's): a Summary proto, and its serialized bytes
    proto = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag="proto", simple_value=0.5)])
    sv.summary_computed(sess, proto)
    sv.summary_computed(sess, proto.SerializeToString(), global_step=2)
    sv.stop(close_summary_writer=False)
    scalars = _scalars(logdir)  # flushed by the stop
    assert scalars["before_stop"] == [(1, 1.0), (2, 2.0), (3, 3.0)] and sorted(scalars["proto"]) == [(2, 0.5), (3, 0.5)]
    assert "STOP" not in [status for _, status in _session_logs(logdir)]

    sv.summary_computed(sess, {"after_stop": 9.0}, global_step=3)  # the writer was not closed: no RuntimeError
    sv.summary_writer.add_summary({"after_stop_writer": 8.0}, 3)
    sess = sv.prepare_or_wait_for_session()  # the same Supervisor again (TF's retry loop)
    sess.run(lambda: w.assign_add(1.0))
    sv.stop()  # close_summary_writer=True, the default
    scalars = _scalars(logdir)
    assert scalars["after_stop"] == [(3, 9.0)] and scalars["after_stop_writer"] == [(3, 8.0)]
    assert scalars["before_stop"] == [(1, 1.0), (2, 2.0), (3, 3.0)]
    assert [(step, status) for step, status in _session_logs(logdir) if status == "STOP"] == [(4, "STOP")]


def test_stop_without_closing_the_writer_says_that_later_summaries_wait_for_the_next_session(logdir, caplog):
    """TF kept the writer open after ``stop(close_summary_writer=False)``; procsv's summary service is
    a process the stop disconnects from, so it says, once, where a later summary goes (the previous
    test shows it written by the next session) instead of dropping it without a word."""
    import tensorflow as tf

    import procsv

    caplog.set_level(logging.WARNING)
    w = tf.Variable(0.0)
    sv = procsv.Supervisor(logdir=logdir, checkpoint={"w": w}, save_model_secs=None, save_summaries_secs=None)
    for _ in range(2):
        sess = sv.prepare_or_wait_for_session()
        sess.run(lambda: w.assign_add(1.0))
        sv.stop(close_summary_writer=False)
    assert caplog.text.count("stop(close_summary_writer=False)") == 1
    assert "written only when this Supervisor opens its next session" in caplog.text
    sv.summary_computed(sess, {"after_stop": 9.0})  # no error: kept for a next session


# ------------------------------------------------------------------ StepCounterHook's log line
def test_step_counter_hook_logs_a_positive_global_step_per_sec_at_its_interval(logdir, caplog):
    """TF's StepCounterHook logs ``global_step/sec: %g`` (logging.info) every ``every_n_steps``:
    counted from the session's first step, so 10 steps every 3 give lines at steps 3, 6 and 9."""
    import tensorflow as tf

    from procsv import train

    caplog.set_level(logging.INFO, logger="tensorflow")  # the hooks log through tf.compat.v1.logging, as TF's
    w = tf.Variable(0.0)
    hook = train.StepCounterHook(every_n_steps=3)
    creator = train.ChiefSessionCreator(train.Scaffold(checkpoint={"w": w}), checkpoint_dir=logdir)
    with train.MonitoredSession(creator, hooks=[hook]) as sess:
        for _ in range(10):
            sess.run(lambda: w.assign_add(1.0))
    lines = [r.getMessage() for r in caplog.records if r.name == "tensorflow" and r.levelno == logging.INFO
             and r.getMessage().startswith("global_step/sec")]
    assert len(lines) == 3, lines
    rates = []
    for line in lines:
        match = re.fullmatch(r"global_step/sec: (\S+)", line)
        assert match, line
        rates.append(float(match.group(1)))
    assert all(rate > 0 for rate in rates) and rates[-1] == pytest.approx(hook.last_rate, rel=1e-5)
    assert [step for step, _ in _scalars(logdir)["global_step/sec"]] == [3, 6, 9]  # the summary, at the same steps


# ------------------------------------------------------------------ seed items no other test calls directly
def test_supervisor_loop_with_kwargs_and_no_interval_and_wait_for_stop(logdir):
    """``sv.loop(None, target, args, kwargs)`` calls ``target(*args, **kwargs)`` repeatedly until a
    stop; ``sv.wait_for_stop()`` returns once one was requested (no session needed for either)."""
    import tensorflow as tf

    import procsv
    from procsv.train import LooperThread

    sv = procsv.Supervisor(logdir=logdir, checkpoint={"w": tf.Variable(1.0)})
    calls = []

    def target(a, b=None):
        calls.append((a, b))
        if len(calls) == 3:
            sv.request_stop()

    looper = sv.loop(None, target, (1,), {"b": 2})
    sv.wait_for_stop()
    looper.join(10)
    assert isinstance(looper, LooperThread) and not looper.is_alive()
    assert calls == [(1, 2)] * 3 and sv.should_stop()
    sv.coord.join(stop_grace_period_secs=1)  # the looper was registered with the coordinator (sv.stop() joins it)


def test_the_supervisor_properties_of_the_seeds_have_their_tf2_meaning(logdir, caplog):
    import tensorflow as tf

    import procsv

    w = tf.Variable(1.0)
    sv = procsv.Supervisor(logdir=logdir, checkpoint={"w": w})
    assert sv.save_summaries_secs == 120 and sv.save_model_secs == 600 and sv.is_chief  # TF's defaults
    assert sv.save_path == os.path.join(os.path.abspath(logdir), "model.ckpt")
    assert isinstance(sv.saver.checkpoint, tf.train.Checkpoint) and sv.saver.w is w  # TF1's Saver over what is saved
    assert isinstance(sv.global_step, tf.Variable) and sv.saver.global_step is sv.global_step
    assert sv.summary_op is None  # USE_DEFAULT and no summary_fn: no periodic summaries to compute
    assert sv.session_manager is None and sv.graph is None
    assert isinstance(sv.coord, procsv.Coordinator) and callable(sv.summary_writer.add_summary)
    fn = lambda: {"w": 1.0}  # noqa: E731
    assert procsv.Supervisor(logdir=logdir, checkpoint={"w": w}, summary_op=fn).summary_op is fn
    with pytest.raises(RuntimeError, match="^Queues are not compatible with eager execution"):  # as TF's
        sv.start_queue_runners(None, [object()])


def test_init_fn_checkpoint_basename_and_a_periodic_summary_op_in_a_real_session(logdir):
    """``init_fn(sess)`` runs when nothing was restored (and not after a restore), checkpoints are
    named ``<checkpoint_basename>-<step>``, and a callable ``summary_op`` is written every
    ``save_summaries_secs`` at the step it was computed after."""
    import tensorflow as tf

    import procsv

    w = tf.Variable(0.0)
    inits = []

    def init_fn(sess):
        inits.append(sess)
        w.assign(10.0)

    sv = procsv.Supervisor(logdir=logdir, checkpoint={"w": w}, checkpoint_basename="m.ckpt", save_model_secs=None,
                           init_fn=init_fn, save_summaries_secs=0.05, summary_op=lambda: {"w": float(w.numpy())})
    with sv.managed_session() as sess:
        assert inits == [sess] and w.numpy() == 10.0
        for _ in range(5):
            sess.run(lambda: w.assign_add(1.0))
            time.sleep(0.06)
    assert tf.train.latest_checkpoint(logdir) == os.path.join(os.path.abspath(logdir), "m.ckpt-5")
    written = _scalars(logdir)["w"]
    assert len(written) >= 2 and all(value == 10.0 + step for step, value in written), written
    inits.clear()
    w.assign(0.0)
    with sv.managed_session():  # the same Supervisor again: restored, so no init_fn
        assert w.numpy() == 15.0 and not inits


def test_prepare_or_wait_for_session_warns_once_about_master_config_and_start_standard_services_false_holds_back_checkpoints(
        logdir, caplog):
    """Eager: master and config are warned about once. start_standard_services() raises TF's
    RuntimeError for a worker and returns None without a logdir. start_standard_services=False is TF's: the
    every-step checkpoints wait for sv.start_standard_services(sess), called after step 3 (steps 1
    and 2 are never saved; step 3 may be, at the next boundary, as TF's checkpoint thread saved
    when it started), then run; the stop's checkpoint is kept."""
    import tensorflow as tf

    import procsv
    from conftest import committed_steps

    w = tf.Variable(0.0)
    sv = procsv.Supervisor(logdir=logdir, checkpoint={"w": w}, save_model_secs=None, save_checkpoint_steps=1,
                           max_to_keep=10)
    sess = sv.prepare_or_wait_for_session("grpc://x:1", config=object(), start_standard_services=False)
    for _ in range(3):
        sess.run(lambda: w.assign_add(1.0))
    assert sv.start_standard_services(sess) == []
    for _ in range(2):
        sess.run(lambda: w.assign_add(1.0))
    sv.stop()
    assert caplog.text.count("master and config have no TF2 meaning") == 1
    assert "start_standard_services=False" not in caplog.text  # no longer "has no effect"
    assert int(sv.global_step.numpy()) == 5
    steps = committed_steps(logdir)
    assert steps and min(steps) >= 3 and steps[-1] == 5, steps
    # TF's checks, as in graph mode: a worker raises, no logdir warns and returns None
    with pytest.raises(RuntimeError, match="^Only chief supervisor can start standard services"):
        procsv.Supervisor(logdir=logdir, is_chief=False, checkpoint=None).start_standard_services(None)
    assert procsv.Supervisor(logdir=None, checkpoint=None).start_standard_services(None) is None


def test_managed_session_warns_once_about_master_and_config_as_prepare_does(logdir, caplog):
    import tensorflow as tf

    import procsv

    w = tf.Variable(0.0)
    sv = procsv.Supervisor(logdir=logdir, checkpoint={"w": w}, save_model_secs=None)
    with sv.managed_session("grpc://x:1", config=object()) as sess:
        sess.run(lambda: w.assign_add(1.0))
    assert "master and config have no TF2 meaning" in caplog.text


def test_a_monitored_session_closed_without_a_with_block_and_tf1_run_arguments(logdir, caplog):
    """``close()`` outside a ``with`` block calls ``end()`` and saves; a run after it is an error.
    ``scaffold.finalize()`` comes between the hooks' ``begin()`` and ``after_create_session()``.
    ``graph`` is None; ``run(..., options=, run_metadata=)`` and a creator's ``config`` are warned
    about once and ignored (no TF2 meaning)."""
    import tensorflow as tf

    from conftest import committed_steps
    from procsv import train

    caplog.set_level(logging.WARNING, logger="procsv.train")
    w = tf.Variable(0.0)
    ended = []

    class Ends(train.SessionRunHook):
        def end(self, session):
            ended.append(int(session.global_step.numpy()))

    class Finalized(train.SessionRunHook):  # TF's order: begin(), scaffold.finalize(), create, after_create_session()
        def begin(self):
            ended.append(("begin", scaffold.finalized))

        def after_create_session(self, session, coord):
            ended.append(("after_create_session", scaffold.finalized))

    scaffold = train.Scaffold(checkpoint={"w": w})
    creator = train.ChiefSessionCreator(scaffold, config=object(), checkpoint_dir=logdir)
    sess = train.MonitoredSession(creator, hooks=[Finalized(), Ends()])
    assert ended == [("begin", False), ("after_create_session", True)]
    ended.clear()
    assert sess.graph is None
    assert sess.run(lambda: w.assign_add(1.0).numpy(), options=object(), run_metadata=object()) == 1.0
    assert sess.run(lambda: w.assign_add(1.0).numpy(), options=object()) == 2.0
    sess.close()
    assert ended == [2] and committed_steps(logdir) == [2]
    with pytest.raises(RuntimeError, match="closed"):
        sess.run(lambda: w.assign_add(1.0))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert sum("options=..." in m for m in warnings) == 1 and sum("run_metadata=..." in m for m in warnings) == 1
    assert sum("config=..." in m for m in warnings) == 1
