"""``MonitoredTrainingSession``, the session the seeds recommend instead of the Supervisor, as a TF1 graph program.

The seed pages point to ``MonitoredTrainingSession`` "for an example usage based on chief or
worker"; this is TensorFlow's own one (the "Distributed TensorFlow" guide)::

    # The StopAtStepHook handles stopping after running given steps.
    hooks=[tf.train.StopAtStepHook(last_step=1000000)]

    # The MonitoredTrainingSession takes care of session initialization,
    # restoring from a checkpoint, saving to a checkpoint, and closing when done
    # or an error occurs.
    with tf.train.MonitoredTrainingSession(master=server.target,
                                           is_chief=(FLAGS.task_index == 0),
                                           checkpoint_dir="/tmp/train_logs",
                                           hooks=hooks) as mon_sess:
      while not mon_sess.should_stop():
        mon_sess.run(train_op)

Run: ``procsv launch procsv.examples.seeds_tf1.monitored_training --logdir DIR -- --steps 1000``.
Only the import differs from the same program under TensorFlow's own ``tf.compat.v1.train``
classes (spelled ``StopAtStepHook`` and ``MonitoredTrainingSession``, imported, where the guide
wrote ``tf.train.``). It builds TF's standard hooks (step counter, ``SummarySaverHook`` over
``merge_all``, ``CheckpointSaverHook``). One launch runs one trainer, the chief, in-process
(``--master ''``); the checkpoint interval is a flag (``save_checkpoint_steps``).
"""

from __future__ import annotations

import sys
from typing import Optional, Sequence

import tensorflow as tf

from procsv.examples.seeds_tf1 import model
from procsv.train import MonitoredTrainingSession, StopAtStepHook


def main(argv: Optional[Sequence[str]] = None) -> int:
    tf.compat.v1.disable_eager_execution()
    FLAGS = model.flags(__doc__, argv)
    with tf.Graph().as_default():
        train_op = model.build(FLAGS.step_delay).train_op
        # The StopAtStepHook handles stopping after running given steps.
        hooks = [StopAtStepHook(last_step=FLAGS.steps)]

        # The MonitoredTrainingSession takes care of session initialization,
        # restoring from a checkpoint, saving to a checkpoint, and closing when done
        # or an error occurs.
        with MonitoredTrainingSession(master=FLAGS.master,
                                      is_chief=True,
                                      checkpoint_dir=FLAGS.logdir,
                                      save_checkpoint_steps=FLAGS.save_checkpoint_steps,
                                      hooks=hooks) as mon_sess:
            while not mon_sess.should_stop():
                mon_sess.run(train_op)
    print("monitored_training: finished", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
