"""A TF1 graph program that logs a scalar with ``sv.log_scalar`` after every run (the Supervisor has
frozen the graph by then, as TF's does): ``python graph_log_scalar.py LOGDIR``."""

from __future__ import annotations

import sys

import tensorflow as tf

tf.compat.v1.disable_eager_execution()

import procsv  # noqa: E402

gs = tf.compat.v1.train.get_or_create_global_step()
w = tf.compat.v1.get_variable("w", initializer=1.0)
train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(w * w, global_step=gs)
sv = procsv.Supervisor(logdir=sys.argv[1], summary_op=None)
with sv.managed_session() as sess:
    for i in range(3):
        sess.run(train_op)
        sv.log_scalar("my/scalar", float(i))
print(f"graph_log_scalar: finalized={tf.compat.v1.get_default_graph().finalized}", flush=True)
