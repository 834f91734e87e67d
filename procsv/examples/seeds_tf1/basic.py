"""The Supervisor page's "Use for a single program", as a TF1 graph program under procsv.

The seed::

    with tf.Graph().as_default():
      ...add operations to the graph...
      # Create a Supervisor that will checkpoint the model in '/tmp/mydir'.
      sv = Supervisor(logdir='/tmp/mydir')
      # Get a TensorFlow session managed by the supervisor.
      with sv.managed_session(FLAGS.master) as sess:
        # Use the session to train the graph.
        while not sv.should_stop():
          sess.run(<my_train_op>)

Run: ``procsv launch procsv.examples.seeds_tf1.basic --logdir DIR -- --steps 1000``. Only the
import differs from the same program under TensorFlow's own ``tf.compat.v1.train.Supervisor``.
What makes the seed a program: the graph is :mod:`.model`'s, ``FLAGS`` are flags, the checkpoint
interval is a flag (``save_model_secs``, TF's default 600), and the loop also ends at ``--steps``.
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
        m = model.build(FLAGS.step_delay)  # ...add operations to the graph...
        # Create a Supervisor that will checkpoint the model in FLAGS.logdir.
        sv = Supervisor(logdir=FLAGS.logdir, save_model_secs=FLAGS.save_model_secs)
        # Get a TensorFlow session managed by the supervisor.
        with sv.managed_session(FLAGS.master) as sess:
            # Use the session to train the graph.
            while not sv.should_stop() and sess.run(m.global_step) < FLAGS.steps:
                sess.run(m.train_op)
            print(f"basic: finished at step {sess.run(m.global_step)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
