"""procsv.train's MonitoredSession family in graph mode (a TF1 program): Scaffold, session creators,
MonitoredSession / SingularMonitoredSession / MonitoredTrainingSession on the graph-mode
Supervisor, in-process recovery, and exactness across SIGKILLs under ``procsv launch``.

In-process tests build their graph in ``with tf.Graph().as_default()`` (eager execution stays on
in the pytest process; the Supervisor's services run as child processes of the test); the
program tests run ``tests/programs/graph_monitored_train.py`` (eager execution disabled) as plain
python or under ``procsv launch``.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from conftest import PROGRAMS, committed_steps, finish, launch, lifecycle, quiet_env, raw_status, wait_for

pytestmark = pytest.mark.usefixtures("fresh_train_api")

PROGRAM = os.path.join(PROGRAMS, "graph_monitored_train.py")


def _model(tf):
    gs = tf.compat.v1.train.get_or_create_global_step()
    w = tf.compat.v1.get_variable("w", initializer=1.0)
    loss = w * w
    tf.compat.v1.summary.scalar("loss", loss)
    train_op = tf.compat.v1.train.MomentumOptimizer(0.1, 0.9).minimize(loss, global_step=gs)
    return {"gs": gs, "w": w, "loss": loss, "train_op": train_op}


# ------------------------------------------------------------------ Scaffold (no session)
def test_scaffold_in_graph_mode_keeps_tensorflows_pieces_and_finalize_makes_the_defaults_and_freezes_the_graph():
    import tensorflow as tf

    from procsv import train

    with tf.Graph().as_default() as graph:
        _model(tf)
        start = tf.compat.v1.placeholder_with_default(1.0, [], name="start")
        v = tf.compat.v1.get_variable("v", initializer=start)
        calls = []
        fed = {start: 3.0}
        base = train.Scaffold(init_fn=lambda scaffold, session: calls.append(scaffold), init_feed_dict=fed)
        mine = tf.no_op(name="my_local_init")
        scaffold = train.Scaffold(copy_from_scaffold=base, local_init_op=mine)
        assert scaffold.init_feed_dict is fed and scaffold.local_init_op is mine and scaffold.init_op is None
        with pytest.raises(TypeError, match="copy_from_scaffold is not a Scaffold instance"):
            train.Scaffold(copy_from_scaffold=object())
        assert scaffold.finalize() is scaffold
        assert graph.finalized
        keys = tf.compat.v1.GraphKeys
        assert scaffold.init_op is tf.compat.v1.get_collection(keys.INIT_OP)[0]
        assert scaffold.ready_op is tf.compat.v1.get_collection(keys.READY_OP)[0]
        assert scaffold.ready_for_local_init_op is tf.compat.v1.get_collection(keys.READY_FOR_LOCAL_INIT_OP)[0]
        assert scaffold.local_init_op is mine and not tf.compat.v1.get_collection(keys.LOCAL_INIT_OP)
        assert scaffold.summary_op is tf.compat.v1.get_collection(keys.SUMMARY_OP)[0]
        assert isinstance(scaffold.saver, tf.compat.v1.train.Saver)
        assert scaffold.saver is tf.compat.v1.get_collection(keys.SAVERS)[0]
        with tf.compat.v1.Session(graph=graph) as sess:
            assert len(sess.run(scaffold.ready_op)) == 4  # global_step, w, w/Momentum, v
            sess.run(scaffold.init_op, feed_dict=scaffold.init_feed_dict)
            assert sess.run(scaffold.ready_op).size == 0 and sess.run(v) == 3.0
            scaffold.init_fn(sess)  # TF's init_fn(session), which calls the user's with the scaffold
            assert calls == [scaffold]
            tf.compat.v1.summary.FileWriterCache.clear()
        # a second finalize changes nothing; a collection holding two items is TF's error
        scaffold.finalize()
        graph._unsafe_unfinalize()
        tf.compat.v1.add_to_collection(keys.READY_OP, tf.constant([""]))
        with pytest.raises(RuntimeError, match='More than one item in the collection "ready_op"'):
            train.Scaffold().finalize()
