"""The sessions procsv hands a TF1 graph program are sessions to TensorFlow's own code (issue 50, point 2).

In-process tests: each builds its graph in ``with tf.Graph().as_default()`` (eager execution stays on
in the pytest process; the Supervisor's services run as child processes of the test). What they
show: ``Saver.save(sess, path)``, TF's own ``CheckpointSaverHook`` and ``start_queue_runners`` take
the session of a ``SingularMonitoredSession`` and of ``Supervisor.managed_session()``; a program's own
session creator (any object with ``create_session()``) runs under procsv's ``MonitoredSession`` as
under TF's; ``raw_session()`` is None once the session is closed.
"""

from __future__ import annotations

import os

import pytest

pytestmark = pytest.mark.usefixtures("fresh_train_api")


def test_saver_save_and_tensorflows_checkpoint_saver_hook_take_procsvs_graph_sessions(logdir, tmp_path):
    import tensorflow as tf
    from tensorflow.python.client.session import SessionInterface

    from procsv import train

    with tf.Graph().as_default():
        gs = tf.compat.v1.train.get_or_create_global_step()
        step = tf.compat.v1.assign_add(gs, 1)
        saver = tf.compat.v1.train.Saver()
        tf_hook = tf.compat.v1.train.CheckpointSaverHook(str(tmp_path / "tf_hook"), save_steps=1, saver=saver)
        with train.SingularMonitoredSession(hooks=[tf_hook], checkpoint_dir=logdir) as sess:
            assert sess.run(step) == 1
            raw = sess.raw_session()
            assert isinstance(raw, SessionInterface)
            path = saver.save(raw, str(tmp_path / "mine" / "model.ckpt"), global_step=gs)
            with raw.as_default():
                assert tf.compat.v1.train.start_queue_runners(raw) == []
    assert path == str(tmp_path / "mine" / "model.ckpt-1")
    assert tf.train.load_variable(path, "global_step") == 1
    # TensorFlow's own hook saved at session creation and after the run, through procsv's raw session
    assert tf.train.latest_checkpoint(str(tmp_path / "tf_hook")).endswith("model.ckpt-1")
    assert tf.train.load_variable(str(tmp_path / "tf_hook" / "model.ckpt-0"), "global_step") == 0

    with tf.Graph().as_default():
        gs = tf.compat.v1.train.get_or_create_global_step()
        step = tf.compat.v1.assign_add(gs, 1)
        saver = tf.compat.v1.train.Saver()
        sv = train.Supervisor(logdir=str(tmp_path / "sv"), save_model_secs=0, save_summaries_secs=0)
        with sv.managed_session() as sess:
            sess.run(step)
            sess.run(step)
            path = saver.save(sess, str(tmp_path / "sv_mine" / "model.ckpt"), global_step=gs)
        sv.stop()
    assert path.endswith("model.ckpt-2") and tf.train.load_variable(path, "global_step") == 2


def test_raw_session_is_none_once_the_singular_monitored_session_is_closed(logdir):
    import tensorflow as tf

    from procsv import train

    with tf.Graph().as_default():
        gs = tf.compat.v1.train.get_or_create_global_step()
        step = tf.compat.v1.assign_add(gs, 1)
        with train.SingularMonitoredSession(checkpoint_dir=logdir) as sess:
            assert sess.raw_session() is not None
            sess.run(step)
        assert sess.raw_session() is None
        sess = train.SingularMonitoredSession(checkpoint_dir=logdir)
        sess.run(step)
        sess.close()
        assert sess.raw_session() is None
