"""A TF1 graph program that saves with ``sv.saver.save`` after every run, then runs once more unsaved
(the stop's final checkpoint takes that step): ``python graph_saves.py STEPS`` under ``procsv launch``.
Prints ``saved N`` for each save and ``finished at step N``."""

from __future__ import annotations

import sys

import tensorflow as tf

tf.compat.v1.disable_eager_execution()

import procsv  # noqa: E402

steps = int(sys.argv[1])
gs = tf.compat.v1.train.get_or_create_global_step()
w = tf.compat.v1.get_variable("w", initializer=1.0)
train = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(w * w, global_step=gs)
sv = procsv.Supervisor(summary_op=None, max_to_keep=1000)
with sv.managed_session() as sess:
    for _ in range(steps):
        sess.run(train)
        print("saved " + sv.saver.save(sess, sv.save_path, global_step=gs).rsplit("-", 1)[-1], flush=True)
    sess.run(train)
    print(f"finished at step {int(sess.run(gs))}", flush=True)
