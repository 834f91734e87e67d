"""``managed_session``'s "retry the training loop in case of preemption", in TF2.

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

Run: ``procsv launch procsv.examples.seeds.retry --logdir DIR -- --abort-at-step 170``:
``--abort-at-step K`` raises ``AbortedError`` in step K, once per process (a simulated preemption);
the new Supervisor restores the newest checkpoint and training goes on. ``train()`` returning ends
the retries (the seed's loop never ended). ``global_step`` is made once, so that the train op can
see which step it runs.
"""

from __future__ import annotations

import sys
from typing import Any, Optional, Sequence

import procsv.train
from procsv.examples.seeds import model


def main(argv: Optional[Sequence[str]] = None) -> int:
    import tensorflow as tf

    p = model.parser(__doc__)
    p.add_argument("--abort-at-step", type=int, default=0, help="AbortedError in this step, once")
    FLAGS = p.parse_args(argv)
    m = model.build(FLAGS.step_delay)
    global_step = procsv.train.get_or_create_global_step()
    aborted: list[int] = []

    def my_train_op() -> Any:
        if int(global_step.numpy()) + 1 == FLAGS.abort_at_step and not aborted:
            aborted.append(FLAGS.abort_at_step)
            raise tf.errors.AbortedError(None, None, "preempted (simulated)")
        return m.train_op()

    def train() -> None:
        sv = procsv.train.Supervisor(logdir=FLAGS.logdir, checkpoint=m.checkpoint, global_step=global_step,
                                     save_checkpoint_steps=FLAGS.save_checkpoint_steps)
        with sv.managed_session() as sess:
            for step in range(sv.step, FLAGS.steps):
                if sv.should_stop():
                    break
                sess.run(my_train_op)

    while True:
        try:
            train()
        except tf.errors.AbortedError:
            print(f"retry: aborted at step {aborted[-1]}; retrying", flush=True)
            continue
        break
    print(f"retry: finished at step {int(global_step.numpy())}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
