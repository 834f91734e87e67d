"""A TF1 graph program that logs a scalar at every step through ``sv.summary_computed``, in a session
opened with ``start_standard_services=False`` (TF's Supervisor writes no ``SessionLog START`` there):
``python graph_summary_steps.py LOGDIR STEPS``. The scalar ``loss`` is ``w * w`` after the step."""

from __future__ import annotations

import sys

import tensorflow as tf

tf.compat.v1.disable_eager_execution()

import procsv  # noqa: E402

steps = int(sys.argv[2])
gs = tf.compat.v1.train.get_or_create_global_step()
w = tf.compat.v1.get_variable("w", initializer=1.0)
train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(w * w, global_step=gs)
tf.compat.v1.summary.scalar("loss", w * w)
summ = tf.compat.v1.summary.merge_all()
sv = procsv.Supervisor(logdir=sys.argv[1], summary_op=None)
with sv.managed_session(start_standard_services=False) as sess:
    step = int(sess.run(gs))
    while not sv.should_stop() and step < steps:
        sess.run(train_op)
        step = int(sess.run(gs))
        sv.summary_computed(sess, sess.run(summ), global_step=step)
