"""``MonitoredSession.run_step_fn``'s example, ported to TF2 with ``procsv.train``.

The seed::

    with tf.Graph().as_default():
      c = tf.compat.v1.placeholder(dtypes.float32)
      v = tf.add(c, 4.0)
      w = tf.add(c, 0.5)
      def step_fn(step_context):
        a = step_context.session.run(fetches=v, feed_dict={c: 0.5})
        if a <= 4.5:
          step_context.request_stop()
        return step_context.run_with_hooks(fetches=w, feed_dict={c: 0.1})

      with tf.MonitoredSession() as session:
        while not session.should_stop():
          a = session.run_step_fn(step_fn)

Run: ``procsv launch procsv.examples.seeds.run_step_fn --logdir DIR -- --steps 1000``. What the
step function reads through ``step_context.session`` (the raw session: no hooks, and reading a
variable is no step) is the global step; it stops at ``--steps``, else it runs a training step
through the hooks. The session saves the ``Scaffold``'s ``checkpoint``, every
``--save-checkpoint-steps`` steps by its ``CheckpointSaverHook``.
"""

from __future__ import annotations

import sys
from typing import Any, Optional, Sequence

import procsv.train
from procsv.examples.seeds import model


def main(argv: Optional[Sequence[str]] = None) -> int:
    FLAGS = model.flags(__doc__, argv)
    m = model.build(FLAGS.step_delay)
    global_step = procsv.train.get_or_create_global_step()

    def step_fn(step_context: Any) -> Any:
        a = step_context.session.run(fetches=global_step)
        if a >= FLAGS.steps:
            step_context.request_stop()
        return step_context.run_with_hooks(fetches=m.train_op)

    creator = procsv.train.ChiefSessionCreator(procsv.train.Scaffold(checkpoint=m.checkpoint),
                                               checkpoint_dir=FLAGS.logdir)
    saver_hook = procsv.train.CheckpointSaverHook(FLAGS.logdir, save_steps=FLAGS.save_checkpoint_steps)
    with procsv.train.MonitoredSession(creator, hooks=[saver_hook]) as session:
        while not session.should_stop():
            session.run_step_fn(step_fn)
    print(f"run_step_fn: finished at step {int(global_step.numpy())}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
