"""A TF1 graph program whose global step is also advanced by a thread other than the session's.

Under ``procsv launch``: ``minimize(global_step=...)`` on the session's thread until the global
step reaches the one it started at plus ``--steps``; then another thread runs ``assign_add(gs,
1)`` through the same session (TF1 programs that train or count from threads do this), and the
session ends (the final checkpoint holds that last value). It prints ``start <step>`` (the global
step the session began at: what a restore set) and ``end <step>`` (its value at the end).

    --steps N      train steps on the session's thread (default 30)
    --bumps K      runs of the other thread's assign_add before the end (default 1)
"""

from __future__ import annotations

import argparse
import threading

import tf1_mlp

p = argparse.ArgumentParser()
p.add_argument("--logdir", default=None)
p.add_argument("--steps", type=int, default=30)
p.add_argument("--bumps", type=int, default=1)
args = p.parse_args()
tf = tf1_mlp.setup_tf()
from procsv import Supervisor  # noqa: E402

gs = tf.compat.v1.train.get_or_create_global_step()
w = tf.compat.v1.get_variable("w", shape=[], initializer=tf.compat.v1.constant_initializer(3.0))
train_op = tf.compat.v1.train.GradientDescentOptimizer(0.01).minimize(w * w, global_step=gs)
bump = tf.compat.v1.assign_add(gs, 1)

sv = Supervisor(logdir=args.logdir, summary_op=None, save_model_secs=600)
with sv.managed_session() as sess:
    start = int(sess.run(gs))
    print(f"start {start}", flush=True)
    for _ in range(args.steps):
        sess.run(train_op)
    for _ in range(args.bumps):
        t = threading.Thread(target=sess.run, args=(bump,))
        t.start()
        t.join()
    print(f"end {int(sess.run(gs))}", flush=True)
