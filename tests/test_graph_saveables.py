"""What a TF1 graph program's Saver saves beside plain variables: partitioned variables and a
``MutableHashTable`` (SaveableObjects) are checkpointed by procsv's checkpoint service as TF's Saver
writes them, restored by a plain ``tf.compat.v1.train.Saver`` in a fresh graph, and restored by the
next Supervisor. (Before: a partitioned variable stopped the Supervisor at construction with
``UnsupportedState``, a ``MutableHashTable`` crashed it with ``AttributeError``.)"""

from __future__ import annotations

import numpy as np

import pytest

from conftest import committed_steps

pytestmark = pytest.mark.slow  # starts TensorFlow processes: not in the quick tier


def _partitioned(tf):
    gs = tf.compat.v1.train.get_or_create_global_step()
    w = tf.compat.v1.get_variable("w", shape=[10, 4], partitioner=tf.compat.v1.fixed_size_partitioner(2),
                                  initializer=tf.compat.v1.ones_initializer())
    train = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(tf.reduce_sum(tf.square(w)), global_step=gs)
    return gs, w.as_tensor(), train  # (the whole variable's value: its parts concatenated)


def _table(tf):
    gs = tf.compat.v1.train.get_or_create_global_step()
    w = tf.compat.v1.get_variable("w", initializer=1.0)
    table = tf.lookup.experimental.MutableHashTable(tf.int64, tf.float32, default_value=-1.0)
    keys = tf.constant([1, 2], tf.int64)
    step = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(w * w, global_step=gs)
    with tf.control_dependencies([step]):
        train = table.insert(keys, tf.stack([w, w * 2.0]))
    return gs, table.lookup(keys), train


def test_a_partitioned_variable_is_checkpointed_whole_and_restored_by_tfs_saver_and_the_next_supervisor(logdir):
    import tensorflow as tf

    import procsv

    with tf.Graph().as_default():
        gs, w, train = _partitioned(tf)
        sv = procsv.Supervisor(logdir=logdir, summary_op=None, save_model_secs=None)
        with sv.managed_session() as sess:
            for _ in range(3):
                sess.run(train)
            trained = sess.run(w)
            sv.request_stop()
    assert np.allclose(trained, 0.8 ** 3)
    assert committed_steps(logdir) == [3]
    path = tf.train.latest_checkpoint(logdir)
    assert dict(tf.train.list_variables(path))["w"] == [10, 4]  # as TF's Saver writes it: the whole variable
    with tf.Graph().as_default():
        gs, w, _ = _partitioned(tf)
        with tf.compat.v1.Session() as plain:
            tf.compat.v1.train.Saver().restore(plain, path)
            assert plain.run(gs) == 3 and np.array_equal(plain.run(w), trained)
    with tf.Graph().as_default():
        gs, w, train = _partitioned(tf)
        sv = procsv.Supervisor(logdir=logdir, summary_op=None, save_model_secs=None)
        with sv.managed_session() as sess:
            assert sess.run(gs) == 3 and np.array_equal(sess.run(w), trained)
            sv.request_stop()


def test_a_mutable_hash_table_is_checkpointed_and_restored_by_tfs_saver_and_the_next_supervisor(logdir):
    import tensorflow as tf

    import procsv

    with tf.Graph().as_default():
        gs, lookup, train = _table(tf)
        sv = procsv.Supervisor(logdir=logdir, summary_op=None, save_model_secs=None)
        with sv.managed_session() as sess:
            for _ in range(3):
                sess.run(train)
            held = sess.run(lookup)
            sv.request_stop()
    assert np.allclose(held, [0.8 ** 3, 2 * 0.8 ** 3])
    assert committed_steps(logdir) == [3]
    path = tf.train.latest_checkpoint(logdir)
    with tf.Graph().as_default():
        gs, lookup, _ = _table(tf)
        with tf.compat.v1.Session() as plain:
            tf.compat.v1.train.Saver().restore(plain, path)
            assert plain.run(gs) == 3 and np.array_equal(plain.run(lookup), held)
    with tf.Graph().as_default():
        gs, lookup, train = _table(tf)
        sv = procsv.Supervisor(logdir=logdir, summary_op=None, save_model_secs=None)
        with sv.managed_session() as sess:
            assert sess.run(gs) == 3 and np.array_equal(sess.run(lookup), held)  # restored, not inserted again
            sv.request_stop()
