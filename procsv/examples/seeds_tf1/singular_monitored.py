"""``SingularMonitoredSession``'s example (TensorFlow's docstring of the class the MonitoredSession page's family names), as a TF1 graph program.

TensorFlow's example::

    saver_hook = CheckpointSaverHook(...)
    summary_hook = SummarySaverHook(...)
    with SingularMonitoredSession(hooks=[saver_hook, summary_hook]) as sess:
      while not sess.should_stop():
        sess.run(train_op)

Run: ``procsv launch procsv.examples.seeds_tf1.singular_monitored --logdir DIR -- --steps 1000``.
Only the import differs from the same program under TensorFlow's own ``tf.compat.v1.train``
classes. The ``...`` are the logdir, the intervals and the model's summary op; the session
restores from the logdir (``checkpoint_dir``), and a ``StopAtStepHook`` ends the loop at ``--steps``.
"""

from __future__ import annotations

import sys
from typing import Optional, Sequence

import tensorflow as tf

from procsv.examples.seeds_tf1 import model
from procsv.train import CheckpointSaverHook, SingularMonitoredSession, StopAtStepHook, SummarySaverHook


def main(argv: Optional[Sequence[str]] = None) -> int:
    tf.compat.v1.disable_eager_execution()
    FLAGS = model.flags(__doc__, argv)
    with tf.Graph().as_default():
        m = model.build(FLAGS.step_delay)
        train_op = m.train_op
        saver_hook = CheckpointSaverHook(FLAGS.logdir, save_steps=FLAGS.save_checkpoint_steps)
        summary_hook = SummarySaverHook(save_steps=100, output_dir=FLAGS.logdir, summary_op=m.summary_op)
        with SingularMonitoredSession(hooks=[saver_hook, summary_hook, StopAtStepHook(last_step=FLAGS.steps)],
                                      master=FLAGS.master, checkpoint_dir=FLAGS.logdir) as sess:
            while not sess.should_stop():
                sess.run(train_op)
    print("singular_monitored: finished", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
