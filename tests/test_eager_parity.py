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
