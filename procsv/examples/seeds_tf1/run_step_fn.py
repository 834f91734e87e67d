"""``MonitoredSession.run_step_fn``'s example (the MonitoredSession page), as a TF1 graph program under procsv.

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

Run: ``procsv launch procsv.examples.seeds_tf1.run_step_fn --logdir DIR -- --steps 1000``. Only
the import differs from the same program under TensorFlow's own ``tf.compat.v1.train`` classes.
The seed's graph stops at its first step and saves nothing; to train, what the step function
reads through ``step_context.session`` (the raw session: no hooks) is the global step, it stops at
``--steps``, else it runs the model's train op through the hooks; the session restores from and
saves to the logdir (a ``CheckpointSaverHook`` every ``--save-checkpoint-steps`` steps).
"""

from __future__ import annotations

import sys
from typing import Any, Optional, Sequence

import tensorflow as tf

from procsv.examples.seeds_tf1 import model
from procsv.train import CheckpointSaverHook, ChiefSessionCreator, MonitoredSession


def main(argv: Optional[Sequence[str]] = None) -> int:
    tf.compat.v1.disable_eager_execution()
    FLAGS = model.flags(__doc__, argv)
    with tf.Graph().as_default():
        m = model.build(FLAGS.step_delay)

        def step_fn(step_context: Any) -> Any:
            a = step_context.session.run(fetches=m.global_step)
            if a >= FLAGS.steps:
                step_context.request_stop()
            return step_context.run_with_hooks(fetches=m.train_op)

        creator = ChiefSessionCreator(checkpoint_dir=FLAGS.logdir, master=FLAGS.master)
        saver_hook = CheckpointSaverHook(FLAGS.logdir, save_steps=FLAGS.save_checkpoint_steps)
        with MonitoredSession(session_creator=creator, hooks=[saver_hook]) as session:
            while not session.should_stop():
                a = session.run_step_fn(step_fn)
    print("run_step_fn: finished", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
