"""The Supervisor page's "Launching additional services": ``sv.loop(60, print_loss, (sess,))``, as a TF1 graph program.

The seed::

    ...
    sv = Supervisor(logdir='/tmp/mydir')
    with sv.managed_session(FLAGS.master) as sess:
      sv.loop(60, print_loss, (sess, ))
      while not sv.should_stop():
        sess.run(my_train_op)

Run: ``procsv launch procsv.examples.seeds_tf1.loop --logdir DIR -- --loop-secs 60``. Only the
import differs from the same program under TensorFlow's own ``tf.compat.v1.train.Supervisor``.
``print_loss`` runs in the looper thread: its ``sess.run(loss)`` changes no global step, so it is
no step. The loop also ends at ``--steps``.
"""

from __future__ import annotations

import sys
from typing import Any, Optional, Sequence

import tensorflow as tf

from procsv import Supervisor
from procsv.examples.seeds_tf1 import model


def main(argv: Optional[Sequence[str]] = None) -> int:
    tf.compat.v1.disable_eager_execution()
    p = model.parser(__doc__)
    p.add_argument("--loop-secs", type=float, default=60, help="sv.loop's interval (the seed's 60)")
    FLAGS = p.parse_args(argv)
    with tf.Graph().as_default():
        m = model.build(FLAGS.step_delay)

        def print_loss(sess: Any) -> None:
            print(f"print_loss: loss {float(sess.run(m.loss)):.6f}", flush=True)

        sv = Supervisor(logdir=FLAGS.logdir, save_model_secs=FLAGS.save_model_secs)
        with sv.managed_session(FLAGS.master) as sess:
            sv.loop(FLAGS.loop_secs, print_loss, (sess, ))
            while not sv.should_stop() and sess.run(m.global_step) < FLAGS.steps:
                sess.run(m.train_op)
            print(f"loop: finished at step {sess.run(m.global_step)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
