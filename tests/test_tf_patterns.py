"""TF1 patterns that TensorFlow's own Supervisor tests use, run on procsv's Supervisor in a graph program.

Runs in the test's process (a graph program inside ``tf.Graph().as_default()``); a plain-python
Supervisor with a logdir starts its two services as child processes (real ZeroMQ), and what it
committed is read back with TensorFlow's own readers.

* ``sess.close()`` then ``sv.stop()`` (TF's documented order, ``supervisor_test.testBasics``): the
  stop does not raise, and the final checkpoint holds the state the session had when it closed.
* ``Supervisor(logdir='')`` is TF's "no logdir" (``if logdir:``): nothing is written anywhere, and
  ``summary_computed`` raises TF's "requires a summary writer".
"""

from __future__ import annotations

import os

import pytest

pytestmark = pytest.mark.slow


def test_a_graph_session_closed_before_stop_keeps_its_last_state_and_the_stop_raises_nothing(logdir):
    import tensorflow as tf

    import procsv

    with tf.Graph().as_default():
        v = tf.compat.v1.Variable(0, dtype=tf.int64, name="v")
        step = tf.compat.v1.train.get_or_create_global_step()
        train = tf.group(v.assign_add(3), step.assign_add(1))
        sv = procsv.Supervisor(logdir=logdir, save_model_secs=None, save_summaries_secs=None)
        sess = sv.prepare_or_wait_for_session("")
        for _ in range(10):
            sess.run(train)
        sess.close()
        sv.stop()  # raised RuntimeError('Attempted to use a closed Session.') from its final checkpoint

    latest = tf.train.latest_checkpoint(logdir)
    assert latest is not None and latest.endswith("model.ckpt-10"), latest
    reader = tf.train.load_checkpoint(latest)
    assert int(reader.get_tensor("v")) == 30 and int(reader.get_tensor("global_step")) == 10


def test_an_empty_logdir_is_no_logdir_nothing_is_written_and_summaries_need_a_writer(tmp_path, monkeypatch):
    import tensorflow as tf

    import procsv

    monkeypatch.chdir(tmp_path)
    with tf.Graph().as_default():
        v = tf.compat.v1.Variable(1.0, name="v")
        tf.compat.v1.summary.scalar("v", v)
        summ = tf.compat.v1.summary.merge_all()
        add = v.assign_add(1.0)
        sv = procsv.Supervisor(logdir="")
        assert sv.logdir is None and sv.save_path is None and sv.saver is None and sv.summary_writer is None
        sess = sv.prepare_or_wait_for_session("")
        with pytest.raises(RuntimeError, match="requires a summary writer"):
            sv.summary_computed(sess, sess.run(summ))
        sess.run(add)
        sess.close()
        sv.stop()
    assert os.listdir(tmp_path) == []  # no checkpoint, event file, lock or runtime folder in the current directory
