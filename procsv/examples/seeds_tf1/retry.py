"""``managed_session``'s "retry the training loop in case of preemption", as a TF1 graph program.

The seed (``Supervisor.managed_session``; TF's docstring has the retry loop the seed page names)::

    def train():
      sv = tf.compat.v1.train.Supervisor(...)
      with sv.managed_session() as sess:
        for step in xrange(..):
          if sv.should_stop():
            break
          sess.run(<my training op>)
          ...do other things needed at each training step...

    def main(...):
      while True
        try:
          train()
        except tf.errors.Aborted:
          pass

Run: ``procsv launch procsv.examples.seeds_tf1.retry --logdir DIR -- --abort-at-step 170``. Only
the import differs from the same program under TensorFlow's own ``tf.compat.v1.train.Supervisor``
(spelled ``Supervisor``, imported, where the seed wrote it out). ``--abort-at-step K``: the
"other things" of step K raise ``AbortedError``, once per process (a simulated preemption); the new
Supervisor (on the same graph) restores the newest checkpoint and training goes on. ``train()``
returning ends the retries (the seed's loop never ended).
"""

from __future__ import annotations

import sys
from typing import Optional, Sequence

import tensorflow as tf

from procsv import Supervisor
from procsv.examples.seeds_tf1 import model


def main(argv: Optional[Sequence[str]] = None) -> int:
    tf.compat.v1.disable_eager_execution()
    p = model.parser(__doc__)
    p.add_argument("--abort-at-step", type=int, default=0, help="AbortedError after this step, once")
    FLAGS = p.parse_args(argv)
    m = model.build(FLAGS.step_delay)
    aborted: list[int] = []

    def train() -> None:
        sv = Supervisor(logdir=FLAGS.logdir, save_model_secs=FLAGS.save_model_secs)
        with sv.managed_session() as sess:
            for step in range(sess.run(m.global_step), FLAGS.steps):
                if sv.should_stop():
                    break
                sess.run(m.train_op)
                # ...do other things needed at each training step...
                if step + 1 == FLAGS.abort_at_step and not aborted:
                    aborted.append(step + 1)
                    raise tf.errors.AbortedError(None, None, "preempted (simulated)")
            print(f"retry: finished at step {sess.run(m.global_step)}", flush=True)

    while True:
        try:
            train()
        except tf.errors.AbortedError:
            print(f"retry: aborted at step {aborted[-1]}; retrying", flush=True)
            continue
        break
    return 0


if __name__ == "__main__":
    sys.exit(main())
