"""The Supervisor page's "Launching fewer services": ``summary_op=None`` and a summary every 100 steps, in TF2.

The seed::

    # Create a Supervisor with no automatic summaries.
    sv = Supervisor(logdir='/tmp/mydir', is_chief=is_chief, summary_op=None)
    # As summary_op was None, managed_session() does not start the
    # summary thread.
    with sv.managed_session(FLAGS.master) as sess:
      for step in range(1000000):
        if sv.should_stop():
          break
        if is_chief and step % 100 == 0:
          # Create the summary every 100 chief steps.
          sv.summary_computed(sess, sess.run(my_summary_op))
        else:
          # Train normally
          sess.run(my_train_op)

Run: ``procsv launch procsv.examples.seeds.manual_summaries --logdir DIR -- --steps 1000``. In TF2
``my_summary_op`` is what to read, ``{tag: variable}``: ``sess.run`` of tensors or variables reads
them (no step), and ``summary_computed`` writes ``{tag: value}`` as scalars at the global step. The
loop counts global steps from the restored one (the seed's ``step`` restarted at 0 with the
program), and every iteration trains: the seed's ``else`` made a summary iteration no step, so its
``step`` drifted from the global step.
"""

from __future__ import annotations

import sys
from typing import Optional, Sequence

from procsv.examples.seeds import model
from procsv.train import Supervisor


def main(argv: Optional[Sequence[str]] = None) -> int:
    FLAGS = model.flags(__doc__, argv)
    m = model.build(FLAGS.step_delay)
    is_chief = True  # a procsv launch runs one trainer: the chief
    my_summary_op = {"loss": m.loss}
    # Create a Supervisor with no automatic summaries.
    sv = Supervisor(logdir=FLAGS.logdir, is_chief=is_chief, summary_op=None, checkpoint=m.checkpoint,
                    save_checkpoint_steps=FLAGS.save_checkpoint_steps)
    # As summary_op was None, managed_session() computes no periodic summaries.
    with sv.managed_session() as sess:
        for step in range(sv.step, FLAGS.steps):
            if sv.should_stop():
                break
            if is_chief and step % 100 == 0:
                # Create the summary every 100 chief steps.
                sv.summary_computed(sess, sess.run(my_summary_op))
            # Train normally
            sess.run(m.train_op)
    print(f"manual_summaries: finished at step {sv.step}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
