"""The graph every TF1 seed example trains: the seeds' "...add operations to the graph...".

Runs in the trainer process (or a plain ``python``), imported by the examples of this package; it
imports TensorFlow only, never procsv, so an example's TensorFlow twin (the same file with the
procsv imports swapped back to ``tf.compat.v1.train``) builds the very same graph. Two variables,
``w`` (1x1) and ``b``, made with ``tf.compat.v1.get_variable`` and fitted with ``tf.matmul`` and
plain gradient descent to y = 3x + 2 on one fixed batch of five points; ``minimize`` increments the
graph's global step (``tf.compat.v1.train.get_or_create_global_step``). The batch never changes,
so the variables after global step ``s`` depend on ``s`` only: a run killed and resumed from a
checkpoint ends with the variables of a run that was not (:func:`variables_after`).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np

LEARNING_RATE = 0.002  # small: the variables still move at every step, so variables that do not match the step show
XS = (-1.0, -0.5, 0.0, 0.5, 1.0)


def parser(description: str) -> argparse.ArgumentParser:
    """The flags every example takes; an example adds its own before ``parse_args()``."""
    p = argparse.ArgumentParser(description=description.splitlines()[0])
    p.add_argument("--steps", type=int, default=1000, help="end at this global step (the seeds loop until stopped)")
    p.add_argument("--save-model-secs", type=float, default=600,
                   help="the Supervisor's save_model_secs (TF's default 600)")
    p.add_argument("--save-checkpoint-steps", type=int, default=100,
                   help="the MonitoredSession examples' checkpoint every N steps")
    p.add_argument("--step-delay", type=float, default=0.0, help="each train op also sleeps this long (a slower model)")
    p.add_argument("--master", default="", help="the TensorFlow master ('' is in-process, the only one used here)")
    p.add_argument("--logdir", default=None,
                   help="the logdir (under `procsv launch` it defaults to the launch's --logdir)")
    return p


def flags(description: str, argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    return parser(description).parse_args(argv)


@dataclass
class Model:
    """The graph's tensors and ops an example uses: ``train_op`` (TF1's ``my_train_op``: one step of
    gradient descent that increments ``global_step``), ``loss``, ``summary_op`` (a scalar summary of
    the loss, also in the graph's summaries collection, so ``merge_all`` finds it), ``w``, ``b``."""

    w: Any
    b: Any
    loss: Any
    global_step: Any
    train_op: Any
    summary_op: Any


def build(step_delay: float = 0.0) -> Model:
    """Add the model to the default graph (call after ``tf.compat.v1.disable_eager_execution()``,
    or inside ``with tf.Graph().as_default():``)."""
    import tensorflow as tf

    xs = tf.constant([[x] for x in XS], name="xs")
    ys = tf.constant([[3.0 * x + 2.0] for x in XS], name="ys")
    w = tf.compat.v1.get_variable("w", shape=[1, 1], initializer=tf.compat.v1.zeros_initializer())
    b = tf.compat.v1.get_variable("b", shape=[1], initializer=tf.compat.v1.zeros_initializer())
    loss = tf.reduce_mean(tf.square(tf.matmul(xs, w) + b - ys))
    global_step = tf.compat.v1.train.get_or_create_global_step()
    train_op = tf.compat.v1.train.GradientDescentOptimizer(LEARNING_RATE).minimize(loss, global_step=global_step)
    if step_delay:
        def sleep() -> np.ndarray:
            time.sleep(step_delay)
            return np.zeros((), np.float32)

        train_op = tf.group(train_op, tf.numpy_function(sleep, [], tf.float32, stateful=True), name="train_op")
    summary_op = tf.compat.v1.summary.scalar("loss", loss)
    return Model(w, b, loss, global_step, train_op, summary_op)


def variables_after(steps: int) -> dict[str, np.ndarray]:
    """``{name: value}`` of every global variable (``w``, ``b``, ``global_step``) after ``steps``
    steps from zero, as an uninterrupted plain ``tf.compat.v1.Session`` loop computes them."""
    import tensorflow as tf

    with tf.Graph().as_default():
        m = build()
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for _ in range(steps):
                sess.run(m.train_op)
            names = [v.op.name for v in tf.compat.v1.global_variables()]
            return dict(zip(names, sess.run(tf.compat.v1.global_variables())))


def checkpoint_variables(path: str) -> dict[str, np.ndarray]:
    """Every variable of the TF1 checkpoint ``path``, restored by a ``tf.compat.v1.train.Saver`` into
    a fresh graph of this model (what a TF1 program does with it), keyed by graph name."""
    import tensorflow as tf

    with tf.Graph().as_default():
        build()
        variables = tf.compat.v1.global_variables()
        with tf.compat.v1.Session() as sess:
            tf.compat.v1.train.Saver(variables).restore(sess, path)
            return dict(zip([v.op.name for v in variables], sess.run(variables)))
