"""The Supervisor page's "Launching additional services": ``sv.loop(60, print_loss, (sess,))``, in TF2.

The seed::

    ...
    sv = Supervisor(logdir='/tmp/mydir')
    with sv.managed_session(FLAGS.master) as sess:
      sv.loop(60, print_loss, (sess, ))
      while not sv.should_stop():
        sess.run(my_train_op)

Run: ``procsv launch procsv.examples.seeds.loop --logdir DIR -- --loop-secs 60``. ``print_loss``
runs in the looper thread: there ``sess.run(variable)`` only reads the variable; it is no step
(a step function from another thread is refused: steps belong to the thread of the block).
"""

from __future__ import annotations

import sys
from typing import Any, Optional, Sequence

from procsv.examples.seeds import model
from procsv.train import Supervisor


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = model.parser(__doc__)
    p.add_argument("--loop-secs", type=float, default=60, help="sv.loop's interval (the seed's 60)")
    FLAGS = p.parse_args(argv)
    m = model.build(FLAGS.step_delay)

    def print_loss(sess: Any) -> None:
        print(f"print_loss: loss {float(sess.run(m.loss)):.6f}", flush=True)

    sv = Supervisor(logdir=FLAGS.logdir, checkpoint=m.checkpoint, save_checkpoint_steps=FLAGS.save_checkpoint_steps)
    with sv.managed_session() as sess:
        sv.loop(FLAGS.loop_secs, print_loss, (sess, ))
        while not sv.should_stop() and sv.step < FLAGS.steps:
            sess.run(m.train_op)
    print(f"loop: finished at step {sv.step}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
