"""fails_after_training.py with an error message that names the global step the model reached.

TensorFlow's PTB pattern again (the program counts its epochs, not the global step), but the evaluation's
error says at which step the model was evaluated, as a program's own error message often does: the same
deterministic error at the same line after as many steps of every attempt, only the number in its message
grows from attempt to attempt (tests/test_attack_restart.py)."""

import argparse
import time

import tensorflow as tf

import procsv

p = argparse.ArgumentParser()
p.add_argument("--epochs", type=int, default=2)
p.add_argument("--steps-per-epoch", type=int, default=10)
p.add_argument("--step-delay", type=float, default=0.01)
args = p.parse_args()

w = tf.Variable(tf.zeros([4]))
sv = procsv.Supervisor(checkpoint={"w": w})


def evaluate() -> float:
    batches: list[float] = []  # the evaluation set the program forgot to fill
    if not batches:
        raise ValueError(f"the evaluation set is empty (evaluating the model of step {sv.step})")
    return sum(batches) / len(batches)


with sv.managed_session() as sess:
    for epoch in range(args.epochs):
        for _ in range(args.steps_per_epoch):
            sess.run(lambda: w.assign_add(tf.ones([4])))
            time.sleep(args.step_delay)
        print(f"fails_naming_step: epoch {epoch + 1} done at step {sv.step}", flush=True)
    print(f"fails_naming_step: evaluation {evaluate()}", flush=True)
