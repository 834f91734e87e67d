"""``with sess:`` on the sessions a TF1 program gets: ``python tf1_with_session.py LOGDIR [--tf]`` prints
``result <json>`` (``--tf``: TensorFlow's own Supervisor and SingularMonitoredSession instead).

TF's ``Session.__enter__`` makes the session the default one (and its graph the default graph), so
``op.run()`` and ``tensor.eval()`` inside the block run through it; the block's end closes it.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import tensorflow as tf  # noqa: E402

tf.compat.v1.disable_eager_execution()
LOGDIR = sys.argv[1]
if "--tf" in sys.argv:
    Supervisor, SMS = tf.compat.v1.train.Supervisor, tf.compat.v1.train.SingularMonitoredSession
else:
    import procsv

    Supervisor, SMS = procsv.Supervisor, procsv.train.SingularMonitoredSession

seen: list[object] = []
with tf.Graph().as_default():
    gs = tf.compat.v1.train.get_or_create_global_step()
    step = tf.compat.v1.assign_add(gs, 1)
    # no service threads: TF's step counter thread (save_summaries_secs) runs on the session this block
    # closes, and its CancelledError then comes out of TF's own sv.stop() when it loses the race
    sv = Supervisor(logdir=LOGDIR, summary_op=None, save_model_secs=0, save_summaries_secs=0)
    sess = sv.prepare_or_wait_for_session("")
    with sess as entered:
        step.op.run()
        step.op.run()
        seen += [entered is sess, tf.compat.v1.get_default_session() is sess, int(gs.eval())]
    seen.append(tf.compat.v1.get_default_session() is None)
    sv.stop()
with tf.Graph().as_default():
    gs = tf.compat.v1.train.get_or_create_global_step()
    step = tf.compat.v1.assign_add(gs, 1)
    with SMS() as ms:
        with ms.raw_session() as raw:
            seen += [tf.compat.v1.get_default_session() is raw, int(step.eval())]
        try:
            raw.run(gs)
            seen.append("ran after the block")
        except RuntimeError as exc:
            seen.append(str(exc))
print("result " + json.dumps(seen), flush=True)
