"""A program with a deterministic error after its training, as TensorFlow's PTB tutorial can have one.

It counts its own epochs, not the global step: every attempt trains ``--epochs`` x ``--steps-per-epoch``
steps from wherever it restored, then evaluates, and the evaluation raises the same ``ValueError`` at the
same line every time (``--step-in-message``: its message names the global step, another each time;
tests/test_restart_storm.py)."""

import argparse
import time

import tensorflow as tf

import procsv

p = argparse.ArgumentParser()
p.add_argument("--epochs", type=int, default=2)
p.add_argument("--steps-per-epoch", type=int, default=10)
p.add_argument("--step-delay", type=float, default=0.01)
p.add_argument("--step-in-message", action="store_true", help="the error names the global step (another each time)")
args = p.parse_args()

w = tf.Variable(tf.zeros([4]))
sv = procsv.Supervisor(checkpoint={"w": w})  # TF's default save_model_secs=600: nothing commits in a short attempt


def evaluate() -> float:
    batches: list[float] = []  # the evaluation set the program forgot to fill
    if not batches:
        raise ValueError(f"the evaluation set is empty (evaluating the model of step {sv.step})" if args.step_in_message
                         else "the evaluation set is empty")
    return sum(batches) / len(batches)


with sv.managed_session() as sess:
    for epoch in range(args.epochs):
        for _ in range(args.steps_per_epoch):
            sess.run(lambda: w.assign_add(tf.ones([4])))
            time.sleep(args.step_delay)
        print(f"fails_after_training: epoch {epoch + 1} done at step {sv.step}", flush=True)
    print(f"fails_after_training: evaluation {evaluate()}", flush=True)
