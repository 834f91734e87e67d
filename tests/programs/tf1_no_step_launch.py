"""A TF1 graph program without a global step, for ``procsv launch``: ``python tf1_no_step_launch.py N``.

Each run adds 1 to ``v`` (one run is one step: procsv counts the runs of a graph without a global
step), a few ms apart, until ``v`` is ``N``; the Supervisor checkpoints every 0.2 s, so its one
checkpoint ``model.ckpt`` is rewritten all the time. Prints ``start at v=K`` and ``finished at v=N``.
"""

from __future__ import annotations

import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import tensorflow as tf  # noqa: E402

import procsv  # noqa: E402

tf.compat.v1.disable_eager_execution()
N = int(sys.argv[1])
with tf.Graph().as_default():
    v = tf.compat.v1.get_variable("v", initializer=0.0)
    inc = v.assign_add(1.0)
    sv = procsv.Supervisor(summary_op=None, save_model_secs=0.2)
    with sv.managed_session() as sess:
        x = float(sess.run(inc))  # (no run that only reads v: every run is one step, so procsv's count is v)
        print(f"start at v={x - 1:g}", flush=True)
        while x < N and not sv.should_stop():
            x = float(sess.run(inc))
            time.sleep(0.005)
        print(f"finished at v={x:g}", flush=True)
