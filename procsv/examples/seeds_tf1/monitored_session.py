"""The MonitoredSession page's example, as a TF1 graph program under procsv.

The seed::

    saver_hook = CheckpointSaverHook(...)
    summary_hook = SummarySaverHook(...)
    with MonitoredSession(session_creator=ChiefSessionCreator(...),
                          hooks=[saver_hook, summary_hook]) as sess:
      while not sess.should_stop():
        sess.run(train_op)

Run: ``procsv launch procsv.examples.seeds_tf1.monitored_session --logdir DIR -- --steps 1000``.
Only the import differs from the same program under TensorFlow's own ``tf.compat.v1.train``
classes. The ``...`` are the logdir, the intervals and the model's summary op; a
``StopAtStepHook`` ends the loop at ``--steps``.
"""

from __future__ import annotations

import sys
from typing import Optional, Sequence

import tensorflow as tf

from procsv.examples.seeds_tf1 import model
from procsv.train import CheckpointSaverHook, ChiefSessionCreator, MonitoredSession, StopAtStepHook, SummarySaverHook


def main(argv: Optional[Sequence[str]] = None) -> int:
    tf.compat.v1.disable_eager_execution()
    FLAGS = model.flags(__doc__, argv)
    with tf.Graph().as_default():
        m = model.build(FLAGS.step_delay)
        train_op = m.train_op
        saver_hook = CheckpointSaverHook(FLAGS.logdir, save_steps=FLAGS.save_checkpoint_steps)
        summary_hook = SummarySaverHook(save_steps=100, output_dir=FLAGS.logdir, summary_op=m.summary_op)
        with MonitoredSession(session_creator=ChiefSessionCreator(checkpoint_dir=FLAGS.logdir, master=FLAGS.master),
                              hooks=[saver_hook, summary_hook, StopAtStepHook(last_step=FLAGS.steps)]) as sess:
            while not sess.should_stop():
                sess.run(train_op)
    print("monitored_session: finished", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
