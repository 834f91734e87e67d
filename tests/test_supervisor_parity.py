"""Issue #11 section 4: the Supervisor's and the Coordinator's TF1 arguments and methods.

Fast tests: no services are started unless a test says so (those are marked slow)."""

from __future__ import annotations

import sys
import threading
import time

import pytest

from procsv.common.errors import TrainingStopped
from procsv.trainer.coordinator import Coordinator, LooperThread

CLEAN = (StopIteration, TrainingStopped)


# ---------------------------------------------------------------------------------- Coordinator
def test_join_waits_for_healthy_threads_without_a_grace_period_when_no_stop_was_requested():
    coord = Coordinator(CLEAN)
    t = threading.Thread(target=time.sleep, args=(0.3,))
    t.start()
    coord.join([t], stop_grace_period_secs=0)  # TF: the grace starts only at a stop; no RuntimeError
    assert not t.is_alive() and coord.joined and not coord.should_stop()


def test_join_gives_the_grace_period_after_a_stop_then_names_the_live_threads():
    coord = Coordinator(CLEAN)
    release = threading.Event()
    t = threading.Thread(target=release.wait, name="stuck", daemon=True)
    t.start()
    coord.request_stop()
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="threads still running: stuck"):
        coord.join([t], stop_grace_period_secs=0.2)
    assert 0.15 < time.monotonic() - t0 < 5 and coord.joined
    coord.join([t], stop_grace_period_secs=0, ignore_live_threads=True)  # no error
    release.set()


def test_request_stop_accepts_an_exc_info_tuple_and_raise_requested_exception_raises_it():
    coord = Coordinator(CLEAN)
    try:
        raise ValueError("from exc_info")
    except ValueError:
        coord.request_stop(sys.exc_info())
    assert isinstance(coord.exception, ValueError)
    with pytest.raises(ValueError, match="from exc_info"):
        coord.raise_requested_exception()
    with pytest.raises(TypeError):
        coord.request_stop("not an exception")


def test_clear_stop_forgets_the_stop_and_the_exception():
    coord = Coordinator(CLEAN)
    coord.request_stop(ValueError("x"))
    coord.clear_stop()
    assert not coord.should_stop() and coord.exception is None and not coord.joined
    coord.raise_requested_exception()  # nothing


def test_a_looper_stops_at_a_stop_and_join_clears_the_registered_threads():
    coord = Coordinator(CLEAN)
    looper = LooperThread(coord, 0.01, lambda: None)
    looper.start()
    coord.request_stop()
    coord.join(stop_grace_period_secs=10)
    assert not looper.is_alive()
    coord.clear_stop()
    coord.join(stop_grace_period_secs=0)  # the old looper is not joined again


# ---------------------------------------------------------------------------------- Supervisor
def _sv(logdir, **kw):
    import procsv

    return procsv.Supervisor(logdir=logdir, **kw)


def test_every_tf1_constructor_argument_is_accepted_and_graph_era_ones_warn_once(logdir, caplog):
    import tensorflow as tf

    import procsv

    w = tf.Variable(1.0)
    sv = _sv(logdir, checkpoint={"w": w}, graph=object(), ready_op="r", ready_for_local_init_op="rl",
             init_op="i", init_feed_dict={"a": 1}, local_init_op="l", summary_op=procsv.Supervisor.USE_DEFAULT,
             saver=procsv.Supervisor.USE_DEFAULT, global_step=procsv.Supervisor.USE_DEFAULT,
             session_manager="sm", summary_writer=procsv.Supervisor.USE_DEFAULT, local_init_run_options="o",
             is_chief=True, save_summaries_secs=5, save_model_secs=7, recovery_wait_secs=1, stop_grace_secs=3,
             checkpoint_basename="m.ckpt", init_fn=lambda s: None)
    _sv(logdir, checkpoint={"w": w}, init_op="again")  # warned once per argument, not per Supervisor
    text = caplog.text
    for name in ("graph", "ready_op", "ready_for_local_init_op", "init_op", "init_feed_dict", "local_init_op",
                 "session_manager", "local_init_run_options"):
        assert text.count(f"Supervisor({name}=...)") == 1, name
    assert "init_fn(session)" in text  # names what to do instead
    assert sv.init_op == "i" and sv.ready_op == "r" and sv.ready_for_local_init_op == "rl"
    assert sv.init_feed_dict == {"a": 1} and sv.session_manager == "sm" and sv.graph is None
    assert sv.saver.checkpoint is sv.checkpoint and sv.summary_writer is not None  # TF1's Saver over it (issue 40)
    assert sv.save_model_secs == 7 and sv.save_path.endswith("m.ckpt") and sv.is_chief
    assert int(sv.global_step.numpy()) == 0


@pytest.mark.slow
def test_none_turns_the_services_off_as_tf(logdir, caplog):
    import tensorflow as tf

    from procsv.common.errors import UsageError

    sv = _sv(logdir, saver=None, summary_op=None)
    assert sv.saver is None and sv._keeper is None and sv.summary_op is None
    assert "saver=None" in caplog.text
    with pytest.raises(UsageError, match="saver=None"):
        _sv(logdir, saver=None, checkpoint={"w": tf.Variable(1.0)})
    fn = lambda: {"a": 1.0}  # noqa: E731
    assert _sv(logdir, checkpoint={"w": tf.Variable(1.0)}, summary_op=fn).summary_op is fn  # the TF2 summary_op
    ckpt = tf.train.Checkpoint(w=tf.Variable(1.0))
    assert _sv(logdir, saver=ckpt).saver.checkpoint is ckpt  # a tf.train.Checkpoint is the TF2 saver
    quiet = _sv(logdir, checkpoint={"w": tf.Variable(1.0)}, summary_writer=None, summary_fn=fn)
    assert quiet.summary_writer is None and quiet.summary_op is None
    with pytest.raises(RuntimeError, match="requires a summary writer"):
        quiet.summary_computed(None, {"a": 1.0})


def test_camel_case_aliases_and_queue_runners(logdir):
    import procsv

    sv = _sv(logdir, saver=None)
    for camel, snake in (("PrepareSession", "prepare_or_wait_for_session"), ("Stop", "stop"),
                         ("RequestStop", "request_stop"), ("Loop", "loop"), ("ShouldStop", "should_stop"),
                         ("StopOnException", "stop_on_exception"), ("WaitForStop", "wait_for_stop"),
                         ("SummaryComputed", "summary_computed"), ("StartQueueRunners", "start_queue_runners"),
                         ("StartStandardServices", "start_standard_services")):
        assert getattr(procsv.Supervisor, camel) is getattr(procsv.Supervisor, snake)
    assert sv.start_standard_services(None) == []
    with pytest.raises(RuntimeError, match="^Queues are not compatible with eager execution"):  # as TF's, eager
        sv.start_queue_runners(None)
    try:
        raise KeyError("k")
    except KeyError:
        sv.RequestStop(sys.exc_info())
    assert sv.ShouldStop() and isinstance(sv.coord.exception, KeyError)


# ------------------------------------------------------- with services (a standalone Supervisor)
@pytest.mark.slow
def test_a_program_that_counts_global_step_itself_is_not_double_counted_and_reuse_runs_steps_again(logdir):
    import tensorflow as tf

    import procsv
    from conftest import committed_steps

    gs = tf.Variable(0, dtype=tf.int64)  # like optimizer.iterations: the step advances it
    w = tf.Variable(0.0)

    def step() -> None:
        w.assign_add(1.0)
        gs.assign_add(1)

    sv = procsv.Supervisor(logdir=logdir, checkpoint={"w": w}, global_step=gs, save_model_secs=None)
    with sv.managed_session() as sess:
        for _ in range(3):
            sess.run(step)
        assert int(gs.numpy()) == 3 and sv.step == 3
    assert committed_steps(logdir) == [3]
    # a Supervisor used again after stop() (TF's retry loop) restores and runs steps again
    w.assign(100.0)
    with sv.managed_session() as sess:
        assert int(gs.numpy()) == 3 and float(w.numpy()) == 3.0 and sv.restored_from
        sess.run(step)
        assert not sv.should_stop()
    assert committed_steps(logdir)[-1] == 4 and int(gs.numpy()) == 4


@pytest.mark.slow
@pytest.mark.parametrize("increment", [None, True, False])
def test_increment_global_step_auto_always_or_never(logdir, increment):
    import tensorflow as tf

    import procsv

    gs = tf.Variable(0, dtype=tf.int64)
    w = tf.Variable(0.0)
    sv = procsv.Supervisor(logdir=logdir, checkpoint={"w": w}, global_step=gs, save_model_secs=None,
                           increment_global_step=increment)
    with sv.managed_session() as sess:
        for _ in range(4):
            sess.run(lambda: w.assign_add(1.0))  # the program never touches gs
    assert int(gs.numpy()) == (0 if increment is False else 4)


@pytest.mark.slow
def test_a_program_that_counts_itself_is_never_counted_twice(logdir):
    import tensorflow as tf

    import procsv

    gs = tf.Variable(0, dtype=tf.int64)
    w = tf.Variable(0.0)
    sv = procsv.Supervisor(logdir=logdir, checkpoint={"w": w}, global_step=gs, save_model_secs=None)
    with sv.managed_session() as sess:
        for _ in range(250):  # past the first checks and two re-checks (every 100 steps)
            sess.run(lambda: (w.assign_add(1.0), gs.assign_add(1)))
        assert sv.step == 250
    assert int(gs.numpy()) == 250 and float(w.numpy()) == 250.0


@pytest.mark.slow
def test_sess_run_from_another_thread_reads_values_and_refuses_steps(logdir):
    import tensorflow as tf

    import procsv

    w = tf.Variable(0.0)
    sv = procsv.Supervisor(logdir=logdir, checkpoint={"w": w}, save_model_secs=None)
    seen: dict = {}

    def print_loss(sess) -> None:  # the seed's sv.loop(60, print_loss, (sess,))
        seen.setdefault("values", []).append(float(sess.run(w)))
        try:
            sess.run(lambda: w.assign_add(100.0))
        except procsv.UsageError as exc:
            seen["refused"] = str(exc)
        sv.request_stop()

    with sv.managed_session() as sess:
        sess.run(lambda: w.assign_add(1.0))
        sv.loop(60, print_loss, (sess,))
        assert sv.coord.wait_for_stop(30)
    assert seen["values"] == [1.0] and "only on the thread" in seen["refused"]
    assert int(sv.global_step.numpy()) == 1 and float(w.numpy()) == 1.0


@pytest.mark.slow
def test_stop_re_raises_a_thread_error_and_names_live_threads_unless_ignored(logdir):
    import tensorflow as tf

    import procsv
    from conftest import committed_steps

    w = tf.Variable(0.0)
    sv = procsv.Supervisor(logdir=logdir, checkpoint={"w": w}, save_model_secs=None, stop_grace_secs=0.5)
    with pytest.raises(OSError, match="disk"):
        with sv.managed_session() as sess:
            sess.run(lambda: w.assign_add(1.0))
            with sv.stop_on_exception():
                raise OSError("disk full in a thread")
    assert committed_steps(logdir) == []  # an error: no final checkpoint
    release = threading.Event()
    stuck = threading.Thread(target=release.wait, name="stuck", daemon=True)
    stuck.start()
    sv.prepare_or_wait_for_session()
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="stuck"):
        sv.stop(threads=[stuck])
    assert 0.5 <= time.monotonic() - t0 < 15  # the grace waited (stop_grace_secs=0.5); one deadline for the rest
    sv.prepare_or_wait_for_session()
    sv.stop(threads=[stuck], ignore_live_threads=True)
    release.set()


def test_zero_or_none_save_model_secs_turns_periodic_checkpoints_off_and_the_writer_forwards(logdir):
    import tensorflow as tf

    for secs in (0, None):
        sv = _sv(logdir, checkpoint={"w": tf.Variable(1.0)}, save_model_secs=secs)
        assert sv._keeper is not None and sv._keeper.agent.policy.save_model_secs is None
    sv = _sv(logdir, checkpoint={"w": tf.Variable(1.0)})
    sv.summary_writer.add_summary({"a": 1.0}, 5)  # TF's writer.add_summary(summary, step) -> the service
    sv.summary_writer.flush()
    assert len(sv._summaries.buffer) == 1


def test_save_model_secs_zero_without_steps_keeps_no_in_memory_snapshot_for_a_restart_either(logdir):
    # the program asked for no checkpoint at all (TF's Supervisor(save_model_secs=0), a MonitoredTrainingSession
    # with neither save_checkpoint_secs nor save_checkpoint_steps): before, the in-memory tier still kept
    # snapshots that procsv launch persists when the trainer dies, so a restart resumed where TF's starts at 0
    import tensorflow as tf

    budgets = {}
    for name, kwargs in (("zero", {"save_model_secs": 0}), ("none", {"save_model_secs": None}),
                         ("zero_with_steps", {"save_model_secs": 0, "save_checkpoint_steps": 10})):
        sv = _sv(logdir, checkpoint={"w": tf.Variable(1.0)}, **kwargs)
        assert sv._keeper is not None
        budgets[name] = sv._keeper.agent.memory.budget
    assert budgets["zero"] == 0.0
    assert budgets["none"] > 0 and budgets["zero_with_steps"] > 0  # periodic saves off, the tier kept


@pytest.mark.slow
def test_a_reused_supervisor_keeps_a_signal_stop_in_force(logdir):
    import signal

    import tensorflow as tf

    import procsv

    w = tf.Variable(0.0)
    sv = procsv.Supervisor(logdir=logdir, checkpoint={"w": w}, save_model_secs=None)
    with sv.managed_session() as sess:
        sess.run(lambda: w.assign_add(1.0))
        sv.coord.request_stop_from_signal(signal.SIGTERM)  # what the SIGTERM handler does
        assert sv.should_stop()
    with sv.managed_session() as sess:  # preempted: the new block stops at once, cleanly
        assert sv.should_stop()
        sess.run(lambda: w.assign_add(1.0))  # TrainingStopped: a clean stop, swallowed by the block
    assert int(sv.global_step.numpy()) == 1


@pytest.mark.slow
def test_optimizer_iterations_as_global_step_is_read_not_incremented(logdir):
    import keras
    import tensorflow as tf

    import procsv
    from conftest import committed_steps

    w = tf.Variable([1.0, 2.0])
    opt = keras.optimizers.SGD(0.1)
    opt.build([w])

    def step() -> None:
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(w * w)
        opt.apply_gradients([(tape.gradient(loss, w), w)])

    sv = procsv.Supervisor(logdir=logdir, checkpoint={"w": w, "opt": opt}, global_step=opt.iterations,
                           save_model_secs=None)
    with sv.managed_session() as sess:
        for _ in range(5):
            sess.run(step)
    assert int(opt.iterations.numpy()) == 5 and sv.step == 5 and committed_steps(logdir) == [5]
