"""A tiny training program whose input position is a tf.data iterator inside the tf.train.Checkpoint.

Run as ``python iterator_train.py --logdir DIR --steps N`` (a plain run: the Supervisor starts the
services itself). Each step takes the next batch of a shuffled, repeated dataset (the shuffle
buffer is part of the iterator's state), adds it to a counter and records the batch in a string
variable; it prints ``step S batch [...]`` so that a test can compare a resumed run with an
uninterrupted one. Checkpoints every 5 steps and at the end.
"""

from __future__ import annotations

import argparse
import os
import sys


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--logdir", required=True)
    p.add_argument("--steps", type=int, required=True)
    args = p.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf

    import procsv

    ds = tf.data.Dataset.range(10_000).shuffle(64, seed=7, reshuffle_each_iteration=True).repeat().batch(3)
    it = iter(ds)
    total = tf.Variable(0, dtype=tf.int64)
    last = tf.Variable(["none"])
    sv = procsv.Supervisor(logdir=args.logdir, checkpoint={"input": it, "total": total, "last": last},
                           save_model_secs=None, save_summaries_secs=None, save_checkpoint_steps=5)

    def step() -> list[int]:
        batch = next(it)
        total.assign_add(tf.reduce_sum(batch))
        values = batch.numpy().tolist()
        last.assign([" ".join(map(str, values))])
        return values

    with sv.managed_session() as sess:
        while not sv.should_stop() and sv.step < args.steps:
            values = sess.run(step)
            print(f"step {sv.step} batch {values}", flush=True)
    print(f"total {int(total.numpy())} last {last.numpy()[0].decode()}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
