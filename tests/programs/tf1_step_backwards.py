"""A TF1 graph program whose global step goes backwards: ``python tf1_step_backwards.py LOGDIR``.

Under a Supervisor saving every 0.2 s with a passed ``Saver(max_to_keep=1)``: 60 runs that advance
the global step (and add 1 to ``v``), 150 that only add to ``v``, 60 that advance again, one
``assign`` that sets the global step 30 back, then 80 runs that only add to ``v``. Prints
``result <json>`` with ``v`` and the global step at close. TensorFlow's Supervisor saves
``model.ckpt-<step at close>`` at the stop, holding ``v`` at close, and its Saver keeps that one.
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
LOGDIR = sys.argv[1]
with tf.Graph().as_default():
    step = tf.compat.v1.train.get_or_create_global_step()
    v = tf.compat.v1.get_variable("v", initializer=0.0)
    ops = {"advance": tf.group(v.assign_add(1.0), step.assign_add(1)), "train": v.assign_add(1.0),
           "back": step.assign(tf.maximum(step - 30, 0))}
    sv = procsv.Supervisor(logdir=LOGDIR, summary_op=None, save_model_secs=0.2,
                           saver=tf.compat.v1.train.Saver(max_to_keep=1))
    with sv.managed_session() as sess:
        for kind, n in (("advance", 60), ("train", 150), ("advance", 60), ("back", 1), ("train", 80)):
            for _ in range(n):
                sess.run(ops[kind])
                time.sleep(0.005)
        end = {"v": float(sess.run(v)), "step": int(sess.run(step))}
print("result " + json.dumps(end), flush=True)
