"""Issue 40, "Eager mode: never silently less than TF": an eager program gets TF's meaning or one
clear error, never a quiet difference. Real services (a plain-python Supervisor starts its own),
real TensorFlow, checkpoints and events read back with TensorFlow's and TensorBoard's readers."""

from __future__ import annotations

import os

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


def test_an_eager_monitored_sessions_second_close_calls_every_hooks_end_with_no_session_then_raises(logdir):
    """As TF's ``_close_internal`` (the graph-mode twin is compared with TF's own class in
    test_graph_tf_sessions.py): the hooks' ``end(None)``, then ``RuntimeError``, whatever it raised."""
    import tensorflow as tf

    from procsv import train

    w = tf.Variable(0.0)
    seen: list[object] = []

    class Ends(train.SessionRunHook):
        def end(self, session):  # type: ignore[no-untyped-def]
            seen.append(None if session is None else "session")
            if session is None:
                raise AttributeError("'NoneType' object has no attribute 'run'")

    sess = train.SingularMonitoredSession(hooks=[Ends()], checkpoint_dir=logdir,
                                          scaffold=train.Scaffold(checkpoint={"w": w}))
    sess.run(lambda: w.assign_add(1.0))
    sess.close()
    with pytest.raises(RuntimeError, match="Session is already closed"):
        sess.close()
    assert seen == ["session", None]


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
    assert off._keeper is None and "Supervisor(checkpoint=None): nothing will be saved" in capsys.readouterr().err
    assert procsv.Supervisor(logdir=logdir, saver=None)._keeper is None
    assert procsv.Supervisor(logdir=logdir, saver={"w": tf.Variable(1.0)})._keeper is not None


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
    code, out, err = finish(launch(logdir, target=program, opts=("--standby", "fork")), 120)
    assert code == 1, err
    assert "procsv: giving up: the trainer cannot start: UsageError (a restart would fail the same way)." in err
    assert "UsageError: nothing to save was passed: pass checkpoint=tf.train.Checkpoint(" in err
    assert "ran " not in out
    spawns = [e for e in lifecycle(logdir) if e["event"] == "spawned" and e["role"] == "trainer"]
    assert len(spawns) == 1 and committed_steps(logdir) == []
    code, out, err = finish(launch(logdir, "--opt-out", target=program, opts=("--standby", "fork")), 120)
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
    assert sv.logdir is None and sv.save_path is None and sv._keeper is None and sv.summary_writer is None
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


# ----------------------------------------------------------------- point 4: sv.saver and sv.summary_writer
def test_sv_saver_saves_through_the_service_restores_and_lists_as_tf1s_saver(logdir, tmp_path):
    import os
    import threading

    import tensorflow as tf

    import procsv
    from conftest import committed_steps

    w = tf.Variable(0.0)
    sv = procsv.Supervisor(logdir=logdir, checkpoint={"w": w}, save_model_secs=None)
    assert sv.saver is sv.saver and sv.saver.w is w  # one object; the saved Checkpoint's attributes
    with sv.managed_session() as sess:
        for _ in range(3):
            sess.run(lambda: w.assign_add(1.0))
        prefix = sv.saver.save(sess, sv.save_path, global_step=sv.global_step)
        assert prefix == os.path.join(os.path.abspath(logdir), "model.ckpt-3")  # TF's return: the prefix
        assert committed_steps(logdir) == [3] and tf.train.latest_checkpoint(logdir) == prefix  # committed now
        back = tf.Variable(-1.0)
        tf.train.Checkpoint(w=back).restore(prefix).expect_partial()
        assert float(back.numpy()) == 3.0 and sv.saver.last_checkpoints == [prefix]
        with pytest.raises(procsv.UsageError, match=r"global_step=7\) at step 3"):
            sv.saver.save(sess, sv.save_path, 7)
        # a path of the program's own: written there as TF's Saver would, with its folder's state file
        elsewhere = sv.saver.save(sess, os.path.join(str(tmp_path), "elsewhere"), global_step=9)
        assert elsewhere == os.path.join(str(tmp_path), "elsewhere-9") == tf.train.latest_checkpoint(str(tmp_path))
        tf.train.Checkpoint(w=back).restore(elsewhere).expect_partial()
        assert float(back.numpy()) == 3.0 and committed_steps(logdir) == [3]  # the run's: step 3, already committed
        refused: list[BaseException] = []

        def from_a_thread() -> None:
            try:
                sv.saver.save(sess, sv.save_path)
            except procsv.UsageError as exc:
                refused.append(exc)

        t = threading.Thread(target=from_a_thread)
        t.start()
        t.join()
        assert refused and "only on the thread" in str(refused[0])
        sess.run(lambda: w.assign_add(1.0))
        sess.run(lambda: w.assign_add(1.0))
        sv.saver.restore(sess, prefix)  # back to the committed step 3, verified against its manifest
        assert float(w.numpy()) == 3.0 and sv.step == 3 and int(sv.global_step.numpy()) == 3
        sess.run(lambda: w.assign_add(1.0))
    assert committed_steps(logdir) == [3, 4]  # the final checkpoint follows the restored history
    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(logdir))
    assert reader.get_tensor("w/.ATTRIBUTES/VARIABLE_VALUE") == 4.0
    with sv.managed_session() as sess:  # a session again: it restored step 4, the newest
        with pytest.raises(procsv.UsageError, match="whose newest checkpoint is step 4"):
            sv.saver.restore(sess, prefix)  # going back to 3 would fork the run's history
        assert sv.step == 4 and float(w.numpy()) == 4.0
    with pytest.raises(procsv.UsageError, match="needs an open session"):
        sv.saver.save(None, sv.save_path)

    # a warm start from a plain TF checkpoint, as TF1 programs did in init_fn
    plain = tf.train.Checkpoint(w=tf.Variable(10.0), global_step=tf.Variable(20, dtype=tf.int64))
    warm = plain.write(str(tmp_path / "pretrained" / "ckpt"))
    v = tf.Variable(0.0)
    other = str(tmp_path / "run2")
    sv2 = procsv.Supervisor(logdir=other, checkpoint={"w": v}, save_model_secs=None,
                            init_fn=lambda sess: sv2.saver.restore(sess, warm))
    with sv2.managed_session() as sess:
        assert float(v.numpy()) == 10.0 and sv2.step == 20
        sess.run(lambda: v.assign_add(1.0))
    assert committed_steps(other) == [21]


def test_sv_summary_writer_has_tf_filewriters_methods_written_by_the_service(logdir):
    import tensorflow as tf
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    import procsv

    def summary(tag: str, value: float) -> object:
        return tf.compat.v1.Summary(value=[tf.compat.v1.Summary.Value(tag=tag, simple_value=value)])

    def scalars() -> dict[str, list[tuple[int, float]]]:
        acc = EventAccumulator(logdir)
        acc.Reload()
        return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}

    w = tf.Variable(0.0)
    sv = procsv.Supervisor(logdir=logdir, checkpoint={"w": w}, save_model_secs=None, save_summaries_secs=None)
    writer = sv.summary_writer
    assert writer is sv.summary_writer and writer.get_logdir() == sv.logdir
    with sv.managed_session() as sess:
        sess.run(lambda: w.assign_add(1.0))
        writer.add_summary(summary("a", 1.5), 1)
        writer.add_event(tf.compat.v1.Event(step=1, summary=summary("b", 2.5)))
        writer.add_session_log(tf.compat.v1.SessionLog(status=tf.compat.v1.SessionLog.CHECKPOINT,
                                                       checkpoint_path="x"), 1)
        writer.flush()  # written by the summary service when flush returns
        assert scalars() == {"a": [(1, 1.5)], "b": [(1, 2.5)]}
        writer.close()
        writer.add_summary(summary("after_close", 1.0), 1)  # dropped, as TF's closed writer does
        writer.reopen()
        writer.add_summary(summary("reopened", 3.0), 1)
        with pytest.raises(procsv.UsageError, match="summaries and session logs"):
            writer.add_event(tf.compat.v1.Event(step=1, graph_def=b""))
    found = scalars()
    assert found["reopened"] == [(1, 3.0)] and "after_close" not in found


def test_a_passed_summary_writer_is_used_in_the_logdir_and_refused_elsewhere(logdir, tmp_path):
    import os

    import tensorflow as tf

    import procsv

    os.makedirs(logdir)
    with tf.Graph().as_default():  # TF1's FileWriter exists only in graph mode
        here = tf.compat.v1.summary.FileWriter(logdir)
        there = tf.compat.v1.summary.FileWriter(str(tmp_path / "elsewhere"))
    try:
        sv = procsv.Supervisor(logdir=logdir, checkpoint={"w": tf.Variable(1.0)}, summary_writer=here)
        assert sv.summary_writer.get_logdir() == os.path.abspath(logdir)  # the service writes there
        with pytest.raises(procsv.UsageError, match="is not the logdir") as err:
            procsv.Supervisor(logdir=logdir, checkpoint={"w": tf.Variable(1.0)}, summary_writer=there)
        assert "\n" not in str(err.value) and "summary service writes a run's event files into its logdir" in str(
            err.value)
        with pytest.raises(procsv.UsageError, match="without a logdir.*pass logdir="):
            procsv.Supervisor(checkpoint={"w": tf.Variable(1.0)}, summary_writer=there)
        v2 = tf.summary.create_file_writer(logdir)
        with pytest.raises(procsv.UsageError, match="whose directory TensorFlow 2 does not tell"):
            procsv.Supervisor(logdir=logdir, checkpoint={"w": tf.Variable(1.0)}, summary_writer=v2)
        v2.close()
    finally:
        here.close()
        there.close()


def test_keras_backup_and_restore_without_a_backup_dir_in_plain_python_is_still_refused(tmp_path, monkeypatch):
    """No logdir means "save nothing" for a Supervisor (point 3), never for BackupAndRestore, whose
    whole point is the backup (Keras' own refuses an empty backup_dir too)."""
    import keras
    import numpy as np

    import procsv
    import procsv.keras

    monkeypatch.chdir(tmp_path)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile(optimizer="sgd", loss="mse")
    x, y = np.zeros((8, 4), np.float32), np.zeros((8, 2), np.float32)
    with pytest.raises(procsv.UsageError, match="needs backup_dir=...: without one nothing would be backed up"):
        model.fit(x, y, epochs=1, verbose=0, callbacks=[procsv.keras.BackupAndRestore()])
    assert os.listdir(tmp_path) == []


# found by an attack on 525fd70: the state file named the checkpoint relative to the working directory,
# so tf.train.latest_checkpoint of its own folder found nothing
def test_an_eager_save_to_a_relative_path_of_its_own_is_found_by_latest_checkpoint(logdir, tmp_path, monkeypatch):
    import tensorflow as tf

    import procsv

    for side in ("tf", "procsv"):
        os.makedirs(tmp_path / side / "ckpt")
    monkeypatch.chdir(tmp_path / "tf")
    v = tf.Variable(3.0)
    theirs = tf.compat.v1.train.Saver([v]).save(None, "ckpt/model", global_step=3)  # TF's Saver, eager
    assert theirs == "ckpt/model-3" and tf.train.latest_checkpoint("ckpt") == "ckpt/model-3"

    monkeypatch.chdir(tmp_path / "procsv")
    w = tf.Variable(0.0)
    sv = procsv.Supervisor(logdir=logdir, checkpoint={"w": w}, save_model_secs=None)
    with sv.managed_session() as sess:
        for _ in range(3):
            sess.run(lambda: w.assign_add(1.0))
        ours = sv.saver.save(sess, "ckpt/model", global_step=sv.global_step)
    assert ours == theirs
    assert tf.train.latest_checkpoint("ckpt") == "ckpt/model-3"  # was None: the state file says "ckpt/model-3"
    assert open("ckpt/checkpoint").read() == open(tmp_path / "tf" / "ckpt" / "checkpoint").read()
