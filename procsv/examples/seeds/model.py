"""The model every seed port trains: the seeds' "...add operations to the graph...".

Runs in the trainer process, imported by the ports of this package. Two variables, ``w`` and
``b``, fitted by plain gradient descent to y = 3x + 2 on one fixed batch of five points. The batch
never changes, so the weights after global step ``s`` depend on ``s`` only: a run killed and
resumed from a checkpoint ends with the weights of a run that was not (:func:`weights_after`).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from typing import Any, Optional, Sequence

LEARNING_RATE = 0.002  # small: the weights still move at every step, so weights that do not match the step show
XS = (-1.0, -0.5, 0.0, 0.5, 1.0)


def parser(description: str) -> argparse.ArgumentParser:
    """The flags every port takes; a port adds its own before ``parse_args()``."""
    p = argparse.ArgumentParser(description=description.splitlines()[0])
    p.add_argument("--steps", type=int, default=1000, help="end at this global step (the seeds loop until stopped)")
    p.add_argument("--save-checkpoint-steps", type=int, default=100, help="checkpoint every N steps")
    p.add_argument("--step-delay", type=float, default=0.0, help="sleep this long per step (a slower model)")
    p.add_argument("--logdir", default=None, help="only when run without `procsv launch`")
    return p


def flags(description: str, argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    return parser(description).parse_args(argv)


@dataclass
class Model:
    """``w``, ``b``; ``loss``, the last step's loss (a variable: other threads and summaries read it);
    ``checkpoint``, what to save (TF1's Saver saved every variable of the graph; TF2 names them)."""

    w: Any
    b: Any
    loss: Any
    checkpoint: Any
    step_delay: float = 0.0

    def train_op(self) -> Any:
        """One step of gradient descent (TF1's ``my_train_op``); returns the loss before it."""
        import tensorflow as tf

        xs = tf.constant(XS)
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(self.w * xs + self.b - (3.0 * xs + 2.0)))
        grad_w, grad_b = tape.gradient(loss, [self.w, self.b])
        self.w.assign_sub(LEARNING_RATE * grad_w)
        self.b.assign_sub(LEARNING_RATE * grad_b)
        self.loss.assign(loss)
        if self.step_delay:
            time.sleep(self.step_delay)
        return loss


def build(step_delay: float = 0.0) -> Model:
    import tensorflow as tf

    w = tf.Variable(0.0, name="w")
    b = tf.Variable(0.0, name="b")
    loss = tf.Variable(0.0, trainable=False, name="loss")
    return Model(w, b, loss, tf.train.Checkpoint(w=w, b=b), step_delay)


def weights_after(steps: int) -> tuple[float, float]:
    """(w, b) after ``steps`` steps from zero, as an uninterrupted run computes them."""
    m = build()
    for _ in range(steps):
        m.train_op()
    return float(m.w.numpy()), float(m.b.numpy())
