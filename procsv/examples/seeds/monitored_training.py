"""``MonitoredTrainingSession``, the session the seeds recommend instead of the Supervisor, in TF2.

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

Run: ``procsv launch procsv.examples.seeds.monitored_training --logdir DIR -- --steps 1000``. It
builds TF's standard hooks (step counter, ``SummarySaverHook``, ``CheckpointSaverHook``), which
save through procsv's services. One launch runs one trainer, the chief; TF2 has no master. The
state to save and the summaries are the ``Scaffold``'s.
"""

from __future__ import annotations

import sys
from typing import Optional, Sequence

import procsv.train
from procsv.examples.seeds import model


def main(argv: Optional[Sequence[str]] = None) -> int:
    FLAGS = model.flags(__doc__, argv)
    m = model.build(FLAGS.step_delay)
    scaffold = procsv.train.Scaffold(checkpoint=m.checkpoint, summary_op={"loss": m.loss})
    # The StopAtStepHook handles stopping after running given steps.
    hooks = [procsv.train.StopAtStepHook(last_step=FLAGS.steps)]

    # The MonitoredTrainingSession takes care of session initialization,
    # restoring from a checkpoint, saving to a checkpoint, and closing when done
    # or an error occurs.
    with procsv.train.MonitoredTrainingSession(is_chief=True,
                                               checkpoint_dir=FLAGS.logdir,
                                               scaffold=scaffold,
                                               save_checkpoint_steps=FLAGS.save_checkpoint_steps,
                                               hooks=hooks) as mon_sess:
        while not mon_sess.should_stop():
            mon_sess.run(m.train_op)
    print(f"monitored_training: finished at step {int(procsv.train.get_global_step().numpy())}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
