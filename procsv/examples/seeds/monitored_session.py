"""The MonitoredSession page's example, ported to TF2 with ``procsv.train``.

The seed::

    saver_hook = CheckpointSaverHook(...)
    summary_hook = SummarySaverHook(...)
    with MonitoredSession(session_creator=ChiefSessionCreator(...),
                          hooks=[saver_hook, summary_hook]) as sess:
      while not sess.should_stop():
        sess.run(train_op)

Run: ``procsv launch procsv.examples.seeds.monitored_session --logdir DIR -- --steps 1000``. The
state to save is the ``Scaffold``'s ``checkpoint`` (TF2 has no graph to collect variables from), a
``summary_op`` is ``{tag: variable}``, and a ``StopAtStepHook`` ends the loop at ``--steps``.
"""

from __future__ import annotations

import sys
from typing import Optional, Sequence

from procsv.examples.seeds import model
from procsv.train import (CheckpointSaverHook, ChiefSessionCreator, MonitoredSession, Scaffold, StopAtStepHook,
                          SummarySaverHook, get_global_step)


def main(argv: Optional[Sequence[str]] = None) -> int:
    FLAGS = model.flags(__doc__, argv)
    m = model.build(FLAGS.step_delay)
    saver_hook = CheckpointSaverHook(FLAGS.logdir, save_steps=FLAGS.save_checkpoint_steps)
    summary_hook = SummarySaverHook(save_steps=100, summary_op={"loss": m.loss})
    creator = ChiefSessionCreator(Scaffold(checkpoint=m.checkpoint), checkpoint_dir=FLAGS.logdir)
    with MonitoredSession(session_creator=creator,
                          hooks=[saver_hook, summary_hook, StopAtStepHook(last_step=FLAGS.steps)]) as sess:
        while not sess.should_stop():
            sess.run(m.train_op)
    print(f"monitored_session: finished at step {int(get_global_step().numpy())}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
