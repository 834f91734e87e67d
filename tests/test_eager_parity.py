"""Issue 40, "Eager mode: never silently less than TF": an eager program gets TF's meaning or one
clear error, never a quiet difference. Real services (a plain-python Supervisor starts its own),
real TensorFlow, checkpoints and events read back with TensorFlow's and TensorBoard's readers."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("fresh_train_api")]

RUN_FORM = r"sess\.run\(step_fn, \*args\)"


# ----------------------------------------------------------------- point 2: fetches that are no step
def test_a_structure_holding_a_step_function_is_refused_never_called_outside_the_step(logdir):
    import tensorflow as tf

    import procsv

    w = tf.Variable(0.0)
    calls: list[int] = []

    def train_step() -> tf.Tensor:
        calls.append(1)
        return w.assign_add(1.0)

    sv = procsv.Supervisor(logdir=logdir, checkpoint={"w": w}, save_model_secs=None)
    with sv.managed_session() as sess:
        sess.run(train_step)
        for fetches in ([train_step, w], (w, train_step), {"step": train_step, "w": w}):
            with pytest.raises(procsv.UsageError, match=RUN_FORM) as err:
                sess.run(fetches)
            assert "train_step" in str(err.value) and "\n" not in str(err.value)
        for fetches in ("loss:0", ["loss:0"], 3):  # TF1's fetch by name, a number: nothing an eager session reads
            with pytest.raises(procsv.UsageError, match=RUN_FORM):
                sess.run(fetches)
        assert sess.run([w, {"gs": sv.global_step}]) == [1.0, {"gs": 1}]  # reads still work, and are no step
        assert sv.step == 1
    assert calls == [1] and float(w.numpy()) == 1.0 and int(sv.global_step.numpy()) == 1


def test_monitored_sessions_refuse_it_too_the_raw_session_included(logdir):
    import tensorflow as tf

    import procsv
    from procsv import train

    w = tf.Variable(0.0)
    calls: list[int] = []

    def train_step() -> tf.Tensor:
        calls.append(1)
        return w.assign_add(1.0)

    with train.SingularMonitoredSession(checkpoint_dir=logdir,
                                        scaffold=train.Scaffold(checkpoint={"w": w})) as sess:
        sess.run(train_step)
        with pytest.raises(TypeError, match=r"holding a step function \(train_step\).*" + RUN_FORM[:-6]):
            sess.run([train_step, w])
        with pytest.raises(procsv.UsageError, match=RUN_FORM):
            sess.raw_session().run([train_step, w])
        assert sess.raw_session().run([w]) == [1.0]
    assert calls == [1] and float(w.numpy()) == 1.0


# ----------------------------------------------------------------- point 1: nothing passed to save
def _nothing_to_save(err: object) -> None:
    text = str(err)
    assert "\n" not in text and "checkpoint=tf.train.Checkpoint(" in text and "checkpoint=None" in text, text


def test_a_supervisor_given_nothing_to_save_is_refused_at_construction(logdir, capsys):
    import os

    import tensorflow as tf

    import procsv

    with pytest.raises(procsv.UsageError, match="nothing to save was passed") as err:
        procsv.Supervisor(logdir=logdir)
    _nothing_to_save(err.value)
    with pytest.raises(procsv.UsageError, match="nothing to save was passed"):
        procsv.Supervisor(logdir=logdir, saver=procsv.Supervisor.USE_DEFAULT)
    saver = tf.compat.v1.train.Saver(var_list=[tf.Variable(1.0)])  # TF1's saver: nothing procsv can save with
    with pytest.raises(procsv.UsageError, match=r"saver=Saver\) cannot save .*nothing to save was passed"):
        procsv.Supervisor(logdir=logdir, saver=saver)
    assert not os.path.exists(logdir)  # refused before anything was created or started
    capsys.readouterr()
    off = procsv.Supervisor(logdir=logdir, checkpoint=None)  # the documented opt-out, with today's warning
    assert off._ckpt is None and "Supervisor(checkpoint=None): nothing will be saved" in capsys.readouterr().err
    assert procsv.Supervisor(logdir=logdir, saver=None)._ckpt is None
    assert procsv.Supervisor(logdir=logdir, saver={"w": tf.Variable(1.0)})._ckpt is not None


def test_monitored_sessions_given_nothing_to_save_are_refused_with_the_same_line(logdir):
    import os

    import tensorflow as tf

    import procsv
    from procsv import train

    makers = [lambda: train.MonitoredTrainingSession(checkpoint_dir=logdir),
              lambda: train.MonitoredSession(train.ChiefSessionCreator(checkpoint_dir=logdir)),
              lambda: train.MonitoredSession(train.ChiefSessionCreator(train.Scaffold(), checkpoint_dir=logdir)),
              lambda: train.SingularMonitoredSession(checkpoint_dir=logdir),
              lambda: train.MonitoredTrainingSession(checkpoint_dir=logdir, scaffold=train.Scaffold(init_fn=None))]
    for make in makers:
        with pytest.raises(procsv.UsageError, match="nothing to save was passed") as err:
            make()
        _nothing_to_save(err.value)
    assert not os.path.exists(os.path.join(logdir, "checkpoint"))
    w = tf.Variable(0.0)
    with train.MonitoredTrainingSession(checkpoint_dir=logdir, checkpoint=None) as sess:  # the opt-out runs
        sess.run(lambda: w.assign_add(1.0))
    assert float(w.numpy()) == 1.0 and not os.path.exists(os.path.join(logdir, "checkpoint"))


def test_under_procsv_launch_nothing_to_save_fails_once_with_that_line_and_is_not_restarted(logdir):
    import os

    from conftest import PROGRAMS, committed_steps, finish, launch, lifecycle

    program = os.path.join(PROGRAMS, "nothing_to_save.py")
    code, out, err = finish(launch(logdir, target=program, opts=("--no-prewarm",)), 120)
    assert code == 1, err
    assert "procsv: giving up: the trainer cannot start: UsageError (a restart would fail the same way)." in err
    assert "UsageError: nothing to save was passed: pass checkpoint=tf.train.Checkpoint(" in err
    assert "ran " not in out
    spawns = [e for e in lifecycle(logdir) if e["event"] == "spawned" and e["role"] == "trainer"]
    assert len(spawns) == 1 and committed_steps(logdir) == []
    code, out, err = finish(launch(logdir, "--opt-out", target=program, opts=("--no-prewarm",)), 120)
    assert code == 0 and "ran 5 steps" in out and "Supervisor(checkpoint=None): nothing will be saved" in out
    assert committed_steps(logdir) == []


# ----------------------------------------------------------------- point 3: logdir=None in plain python
def test_no_logdir_in_plain_python_runs_with_no_checkpoint_and_no_summary_as_tf(tmp_path, monkeypatch):
    import os

    import tensorflow as tf

    import procsv
    from procsv import train

    monkeypatch.chdir(tmp_path)  # anything written to "." would show here
    w = tf.Variable(0.0)
    sv = procsv.Supervisor(checkpoint={"w": w})  # a checkpoint given, but nowhere to save it: warned, not saved
    assert sv.logdir is None and sv.save_path is None and sv._ckpt is None and sv.summary_writer is None
    seen: list[float] = []

    def read_then_stop() -> None:  # the seed's sv.loop target: reads a value from another thread, then stops
        seen.append(float(sess.run(w)))
        sv.request_stop()

    with sv.managed_session() as sess:
        assert sv._own is None  # no service was started
        sess.run(lambda: w.assign_add(1.0))
        sv.loop(0.01, read_then_stop)
        while not sv.should_stop():
            sess.run(lambda: w.assign_add(1.0))
            sv.log_scalar("loss", 1.0)  # nowhere to write: kept by nobody
    steps = sv.step
    assert seen and steps >= 1 and float(w.numpy()) == steps and int(sv.global_step.numpy()) == steps
    with pytest.raises(RuntimeError, match="requires a summary writer"):
        sv.summary_computed(None, {"a": 1.0})
    with sv.managed_session() as sess:  # a session again: nothing was saved, so nothing is restored
        assert sv.restored_from is None and float(sess.run(w)) == steps
    assert os.listdir(tmp_path) == []
    v = tf.Variable(0.0)
    with train.MonitoredTrainingSession(hooks=[train.StopAtStepHook(last_step=2)]) as mon:  # TF's default: None
        while not mon.should_stop():
            mon.run(lambda: v.assign_add(1.0))
    assert float(v.numpy()) == 2.0 and os.listdir(tmp_path) == []
