"""The Supervisor page's "Launching fewer services": ``summary_op=None`` and a summary every 100 steps, as a TF1 graph program.

The seed::

    # Create a Supervisor with no automatic summaries.
    sv = Supervisor(logdir='/tmp/mydir', is_chief=is_chief, summary_op=None)
    # As summary_op was None, managed_session() does not start the
    # summary thread.
    with sv.managed_session(FLAGS.master) as sess:
      for step in xrange(1000000):
        if sv.should_stop():
          break
        if is_chief and step % 100 == 0:
          # Create the summary every 100 chief steps.
          sv.summary_computed(sess, sess.run(my_summary_op))
        else:
          # Train normally
          sess.run(my_train_op)

Run: ``procsv launch procsv.examples.seeds_tf1.manual_summaries --logdir DIR -- --steps 1000``.
Only the import differs from the same program under TensorFlow's own
``tf.compat.v1.train.Supervisor``. ``my_summary_op`` is the model's scalar summary of the loss.
The loop counts global steps from the restored one (the seed's ``step`` restarted at 0 with the
program, so after a restart its summaries would no longer fall on every 100th global step), and
every iteration trains: the seed's ``else`` made a summary iteration no step, so its ``step``
drifted from the global step.
"""

from __future__ import annotations

import sys
from typing import Optional, Sequence

import tensorflow as tf

from procsv import Supervisor
from procsv.examples.seeds_tf1 import model


def main(argv: Optional[Sequence[str]] = None) -> int:
    tf.compat.v1.disable_eager_execution()
    FLAGS = model.flags(__doc__, argv)
    with tf.Graph().as_default():
        m = model.build(FLAGS.step_delay)
        is_chief = True  # a procsv launch runs one trainer: the chief
        my_summary_op, my_train_op = m.summary_op, m.train_op
        # Create a Supervisor with no automatic summaries.
        sv = Supervisor(logdir=FLAGS.logdir, is_chief=is_chief, summary_op=None,
                        save_model_secs=FLAGS.save_model_secs)
        # As summary_op was None, managed_session() does not start the
        # summary thread.
        with sv.managed_session(FLAGS.master) as sess:
            for step in range(sess.run(m.global_step), FLAGS.steps):
                if sv.should_stop():
                    break
                if is_chief and step % 100 == 0:
                    # Create the summary every 100 chief steps.
                    sv.summary_computed(sess, sess.run(my_summary_op))
                # Train normally
                sess.run(my_train_op)
            print(f"manual_summaries: finished at step {sess.run(m.global_step)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
