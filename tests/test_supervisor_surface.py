"""The Supervisor's public surface as a program uses it, beyond calling a method on an instance:
a subclass's override (with ``super()``), a method called through the class, and the settings a
program changes after construction (``sv.summary_fn``, ``sv.save_summaries_secs``). The
Supervisor forwards many public names to its collaborators (``procsv.trainer.tf1_surface.Forward``);
these keep what a plain method or attribute of the Supervisor did before it had collaborators.

Runs in the test's process: a plain-python Supervisor with a logdir starts its two services as child
processes (real ZeroMQ); the summaries are read back from the event files with TensorBoard's reader.
"""

from __future__ import annotations

import os
import time

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("fresh_train_api")]


def test_a_subclass_override_calling_super_stays_in_force_and_the_session_asks_it(logdir):
    import tensorflow as tf

    import procsv

    calls: list[str] = []

    class StopAtFive(procsv.Supervisor):  # a program's subclass: stop after 5 steps; prefix its scalars
        def should_stop(self) -> bool:
            calls.append("should_stop")
            return super().should_stop() or self.step >= 5

        def log_scalar(self, tag, value, step=None):  # type: ignore[no-untyped-def]
            calls.append("log_scalar")
            super().log_scalar("sub/" + tag, value, step)

    v = tf.Variable(1.0)
    sv = StopAtFive(logdir=logdir, checkpoint={"v": v}, save_summaries_secs=None, save_model_secs=None)
    assert sv.should_stop() is False and sv.should_stop() is False
    sv.log_scalar("a", 1.0)
    sv.log_scalar("b", 2.0)
    assert calls == ["should_stop", "should_stop", "log_scalar", "log_scalar"]  # the override, every time
    calls.clear()
    steps = 0
    with sv.managed_session() as sess:
        while not sess.should_stop() and steps < 20:  # the session's should_stop is the Supervisor's
            sess.run(lambda: v.assign_add(1.0))
            steps += 1
    assert steps == 5, steps
    assert calls.count("should_stop") == 6  # five steps run, the sixth look stops


def test_forwarded_methods_called_through_the_class_act_on_the_instance_given(logdir):
    import tensorflow as tf

    import procsv

    from tensorboard.backend.event_processing import event_accumulator as ea

    v = tf.Variable(1.0)
    sv = procsv.Supervisor(logdir=logdir, checkpoint={"v": v}, save_summaries_secs=None, save_model_secs=None)
    procsv.Supervisor.warm_up(sv, tf.function(lambda x: x + 1), tf.constant(1.0))  # an unbound call
    with sv.managed_session() as sess:
        sess.run(lambda: v.assign_add(1.0))
        procsv.Supervisor.log_scalar(sv, "through/class", 1.0, step=1)
        assert procsv.Supervisor.should_stop(sv) is False
        procsv.Supervisor.request_stop(sv)
        assert sv.should_stop() is True and procsv.Supervisor.ShouldStop(sv) is True
    assert procsv.Supervisor.log_scalar.__doc__ == sv.log_scalar.__doc__  # help() shows the method's own doc
    acc = ea.EventAccumulator(logdir)
    acc.Reload()
    assert [e.step for e in acc.Scalars("through/class")] == [1]


def test_summary_settings_changed_after_construction_are_the_ones_used(logdir):
    import tensorflow as tf
    from tensorboard.backend.event_processing import event_accumulator as ea

    import procsv

    v = tf.Variable(1.0)
    sv = procsv.Supervisor(logdir=logdir, checkpoint={"v": v}, summary_fn=lambda: {"first_fn": 1.0},
                           save_summaries_secs=None, save_model_secs=None)
    sv.summary_fn = lambda: {"late_fn": 7.0}  # plain attributes: a program may set them before its session
    sv.save_summaries_secs = 0.05
    with sv.managed_session() as sess:
        t_end = time.monotonic() + 1.0
        while time.monotonic() < t_end:  # a second of steps: about 20 periods of 0.05 s
            sess.run(lambda: v.assign_add(1.0))
            time.sleep(0.005)
    acc = ea.EventAccumulator(logdir)
    acc.Reload()
    tags = acc.Tags()["scalars"]
    assert "first_fn" not in tags, tags
    assert "late_fn" in tags and len(acc.Scalars("late_fn")) >= 3, tags
    assert os.path.exists(os.path.join(logdir, "checkpoint"))


def test_graph_mode_the_sessions_should_stop_is_the_supervisors_a_subclass_override_too(logdir):
    import tensorflow as tf

    import procsv

    class StopAtFive(procsv.Supervisor):
        def should_stop(self) -> bool:
            return super().should_stop() or self.step >= 5

    with tf.Graph().as_default():
        w = tf.compat.v1.get_variable("w", initializer=1.0)
        gs = tf.compat.v1.train.get_or_create_global_step()
        train = tf.compat.v1.train.GradientDescentOptimizer(0.01).minimize(tf.square(w), global_step=gs)
        sv = StopAtFive(logdir=logdir, save_summaries_secs=None, save_model_secs=None)
        runs = 0
        with sv.managed_session() as sess:
            while not sess.should_stop() and runs < 20:  # TF1's loop: the session asks the Supervisor
                sess.run(train)
                runs += 1
    assert runs == 5 and sv.step == 5, (runs, sv.step)


def test_the_stop_commits_through_sv_commit_checkpoint_a_subclass_override_too(logdir):
    import tensorflow as tf

    import procsv

    commits: list[bool] = []

    class Logged(procsv.Supervisor):  # a program's subclass that logs each commit it asks for
        def commit_checkpoint(self, deadline=None):  # type: ignore[no-untyped-def]
            done = super().commit_checkpoint(deadline)
            commits.append(done)
            return done

    v = tf.Variable(1.0)
    sv = Logged(logdir=logdir, checkpoint={"v": v}, save_summaries_secs=None, save_model_secs=None)
    with sv.managed_session() as sess:
        for _ in range(3):
            sess.run(lambda: v.assign_add(1.0))
    assert commits == [True]  # the final checkpoint, through the override
    assert tf.train.latest_checkpoint(logdir).endswith("model.ckpt-3")


def test_a_subclass_keeps_its_own_logdir_and_graph_attributes_as_under_tf_and_tfs_properties_stay_read_only(logdir):
    """A subclass written for TF's Supervisor may keep attributes named ``logdir`` or ``graph`` (TF's has
    no public one of either name) before and after ``super().__init__``; TF's own properties
    (``save_path``, ``init_op``, ...) are read-only, as TF's; every live setting says what it is."""
    import tensorflow as tf

    import procsv

    for cls in (tf.compat.v1.train.Supervisor, procsv.Supervisor):
        class Mine(cls):  # type: ignore[misc, valid-type]
            def __init__(self, logdir: str, **kwargs: object) -> None:
                self.logdir = logdir + "/mine"  # the program's own attribute, set before the base's __init__
                self.graph = "its own"
                super().__init__(logdir=logdir, **kwargs)

        kwargs = {"checkpoint": {"v": tf.Variable(1.0)}} if cls is procsv.Supervisor else {}
        if cls is tf.compat.v1.train.Supervisor:
            with tf.Graph().as_default():
                tf.compat.v1.train.get_or_create_global_step()
                sv = Mine(logdir, save_model_secs=0, save_summaries_secs=0)
        else:
            sv = Mine(logdir, save_model_secs=0, save_summaries_secs=0, **kwargs)
        assert (sv.logdir, sv.graph) == (logdir + "/mine", "its own"), cls
        for name in ("save_path", "init_op", "saver", "summary_writer", "ready_op"):
            with pytest.raises(AttributeError):
                setattr(sv, name, None)
        if cls is procsv.Supervisor:
            sv.stop()
    for name in ("save_summaries_secs", "summary_fn", "stop_grace_secs", "recovery_wait_secs", "init_fn",
                 "checkpoint_basename", "save_path", "graph", "logdir"):
        assert getattr(procsv.Supervisor, name).__doc__, name
