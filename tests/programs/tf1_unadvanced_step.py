"""A TF1 graph program whose global step no run advances: ``python tf1_unadvanced_step.py LOGDIR N [--advance]``.

The graph has a global step (``get_or_create_global_step``), but its train op is an ``assign_add``
on ``v`` that leaves it at 0, as ``optimizer.minimize(loss)`` without ``global_step=`` does. ``N``
runs add 1 each, a few ms apart, under a Supervisor that saves every 0.2 s; prints ``start <v>``
once the session is prepared (restored or initialized) and ``result <json>`` with ``v`` at the
start and at close. TensorFlow's Supervisor rewrites ``model.ckpt-0`` at each save
(``saver.save(sess, path, global_step=0)`` overwrites the prefix), so it holds the trained ``v``.
``--advance``: the train op advances the global step too (``minimize(loss, global_step=...)``), and
after its last step the program only reads ``v`` (runs that change nothing) before it closes.
"""

from __future__ import annotations

import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import tensorflow as tf  # noqa: E402

import procsv  # noqa: E402

tf.compat.v1.disable_eager_execution()
LOGDIR, N = sys.argv[1], int(sys.argv[2])
ADVANCE = "--advance" in sys.argv[3:]
with tf.Graph().as_default():
    step = tf.compat.v1.train.get_or_create_global_step()
    v = tf.compat.v1.get_variable("v", initializer=0.0)
    inc = tf.group(v.assign_add(1.0), step.assign_add(1)) if ADVANCE else v.assign_add(1.0)
    sv = procsv.Supervisor(logdir=LOGDIR, summary_op=None, save_model_secs=0.2)
    with sv.managed_session() as sess:
        start = float(sess.run(v))
        print(f"start {start}", flush=True)
        for _ in range(N):
            sess.run(inc)
            time.sleep(0.005)
        end = float(sess.run(v))
        if ADVANCE:  # reads only, after the last step: nothing to save again
            for _ in range(50):
                sess.run(v)
                time.sleep(0.005)
print("result " + json.dumps({"start": start, "end": end}), flush=True)
