"""TF1 patterns that TensorFlow's own Supervisor tests use, run on procsv's Supervisor in a graph program.

Runs in the test's process (a graph program inside ``tf.Graph().as_default()``); a plain-python
Supervisor with a logdir starts its two services as child processes (real ZeroMQ), and what it
committed is read back with TensorFlow's own readers.

* ``sess.close()`` then ``sv.stop()`` (TF's documented order, ``supervisor_test.testBasics``): the
  stop does not raise, and the final checkpoint holds the state the session had when it closed.
* ``Supervisor(logdir='')`` is TF's "no logdir" (``if logdir:``): nothing is written anywhere, and
  ``summary_computed`` raises TF's "requires a summary writer".
* a worker's Supervisor (``is_chief=False``) refuses a ref variable without a device, TF's
  ``ValueError`` (``testSetupFail``);
* the Saver ``import_meta_graph`` returns (a SaverDef's, with no variable list) restores and saves
  the graph's variables (``testRestoreFromMetaGraph``).
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


def test_a_worker_supervisor_refuses_unplaced_variables_as_tf_and_takes_placed_ones(logdir):
    import tensorflow as tf

    import procsv

    with tf.Graph().as_default():
        tf.compat.v1.Variable([1.0, 2.0], name="v", use_resource=False)  # a ref variable: TF's check is on those
        with pytest.raises(ValueError, match="must have their device set"):
            procsv.Supervisor(logdir=logdir, is_chief=False)
    with tf.Graph().as_default(), tf.compat.v1.device("/job:ps"):
        tf.compat.v1.Variable([1.0, 2.0], name="v", use_resource=False)
        assert procsv.Supervisor(logdir=logdir, is_chief=False).is_chief is False


def test_the_saver_import_meta_graph_returns_restores_and_saves_the_graphs_variables(logdir):
    import tensorflow as tf

    import procsv

    with tf.Graph().as_default():
        v = tf.compat.v1.Variable(5, dtype=tf.int64, name="v0", use_resource=False)  # "v0:0" is its value
        step = tf.compat.v1.train.get_or_create_global_step()
        train = tf.group(v.assign_add(2), step.assign_add(1))
        sv = procsv.Supervisor(logdir=logdir, save_model_secs=None, save_summaries_secs=None)
        sess = sv.prepare_or_wait_for_session("")
        for _ in range(3):
            sess.run(train)
        prefix = sv.saver.save(sess, sv.save_path)
        sv.stop()
    assert prefix.endswith("model.ckpt-3") and os.path.exists(prefix + ".meta")

    with tf.Graph().as_default():
        saver = tf.compat.v1.train.import_meta_graph(prefix + ".meta")  # a Saver of a SaverDef: no var_list
        sv = procsv.Supervisor(logdir=logdir, saver=saver, save_model_secs=None, save_summaries_secs=None)
        sess = sv.prepare_or_wait_for_session("")
        assert sess.run("v0:0") == 11 and sv.restored_from is not None  # crashed: 'NoneType' is not iterable
        train = tf.compat.v1.get_default_graph().get_operation_by_name(train.name)
        sess.run(train)
        again = sv.saver.save(sess, sv.save_path)
        sv.stop()
    assert again.endswith("model.ckpt-4")
    assert int(tf.train.load_checkpoint(again).get_tensor("v0")) == 13
