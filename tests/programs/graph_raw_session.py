"""A TF1 graph program that trains only through ``SingularMonitoredSession.raw_session()``.

``python graph_raw_session.py LOGDIR STEPS DELAY`` under ``procsv launch --logdir LOGDIR``: a
``SingularMonitoredSession`` with procsv's ``CheckpointSaverHook(save_steps=20)``, every training run
``raw_session().run(train_op)``, then the global step read (no hooked run at all), ``DELAY`` seconds after each,
until the global step reaches ``STEPS``. Prints whether the raw session is a ``tf.compat.v1.Session``,
then ``final global step N``.
"""

from __future__ import annotations

import sys
import time

import tensorflow as tf

tf.compat.v1.disable_eager_execution()

import procsv  # noqa: E402

logdir, steps, delay = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
gs = tf.compat.v1.train.get_or_create_global_step()
w = tf.compat.v1.get_variable("w", initializer=1.0)
train_op = tf.compat.v1.train.GradientDescentOptimizer(0.01).minimize(w * w, global_step=gs)
hook = procsv.train.CheckpointSaverHook(logdir, save_steps=20)

with procsv.train.SingularMonitoredSession(hooks=[hook], checkpoint_dir=logdir) as sess:
    raw = sess.raw_session()
    print(f"raw session is a tf.compat.v1.Session: {isinstance(raw, tf.compat.v1.Session)}", flush=True)
    step = int(raw.run(gs))
    while step < steps:
        raw.run(train_op)
        step = int(raw.run(gs))  # (read after the run: fetched beside train_op it may be the value before it)
        time.sleep(delay)
print(f"final global step {int(step)}", flush=True)
