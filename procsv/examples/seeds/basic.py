"""The Supervisor page's "Use for a single program", ported to TF2 with ``procsv.train``.

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

Run: ``procsv launch procsv.examples.seeds.basic --logdir DIR -- --steps 1000``. TF2 has no graph
and no master: the model's variables are named in a ``checkpoint`` (TF1's default Saver saved
every variable of the graph), and the loop also ends at ``--steps``.
"""

from __future__ import annotations

import sys
from typing import Optional, Sequence

from procsv.examples.seeds import model
from procsv.train import Supervisor


def main(argv: Optional[Sequence[str]] = None) -> int:
    FLAGS = model.flags(__doc__, argv)
    m = model.build(FLAGS.step_delay)  # ...add operations to the graph...
    # Create a Supervisor that will checkpoint the model in FLAGS.logdir (default: the launch's --logdir).
    sv = Supervisor(logdir=FLAGS.logdir, checkpoint=m.checkpoint, save_checkpoint_steps=FLAGS.save_checkpoint_steps)
    # Get a TensorFlow session managed by the supervisor.
    with sv.managed_session() as sess:
        # Use the session to train the graph.
        while not sv.should_stop() and sv.step < FLAGS.steps:
            sess.run(m.train_op)
    print(f"basic: finished at step {sv.step}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
