"""A small TF1 graph MLP for the graph-mode tests, and its uninterrupted plain-session reference.

``build()`` makes the graph (variables from ``tf.compat.v1.get_variable``, ``tf.matmul``,
``MomentumOptimizer.minimize(global_step=...)``, summaries of the loss and a weight); ``batch(step)``
is the batch of a global step (fixed data, so every run feeds the same batch at the same step).
Run as ``python tf1_mlp.py --steps N --out FILE.npz`` it trains N steps in a plain
``tf.compat.v1.Session`` loop and saves every global variable by name: what a supervised run,
however often killed, must end with bit for bit.
"""

from __future__ import annotations

import argparse
import os
import sys
from types import SimpleNamespace
from typing import Any

import numpy as np

N, BATCH, FEATURES, HIDDEN, CLASSES = 256, 16, 12, 24, 4


def setup_tf() -> Any:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf

    tf.compat.v1.disable_eager_execution()
    tf.config.experimental.enable_op_determinism()
    return tf


def data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(7)
    x = rng.normal(size=(N, FEATURES)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64) + 2 * (x[:, 1] > 0).astype(np.int64)
    return x, y


def batch(step: int) -> tuple[np.ndarray, np.ndarray]:
    x, y = data()
    i = (step * BATCH) % N
    return x[i:i + BATCH], y[i:i + BATCH]


def build(tf: Any) -> SimpleNamespace:
    """The model in the default graph."""
    tf.compat.v1.set_random_seed(3)
    x = tf.compat.v1.placeholder(tf.float32, [None, FEATURES], name="x")
    y = tf.compat.v1.placeholder(tf.int64, [None], name="y")
    w1 = tf.compat.v1.get_variable("w1", [FEATURES, HIDDEN])
    b1 = tf.compat.v1.get_variable("b1", [HIDDEN], initializer=tf.compat.v1.zeros_initializer())
    w2 = tf.compat.v1.get_variable("w2", [HIDDEN, CLASSES])
    b2 = tf.compat.v1.get_variable("b2", [CLASSES], initializer=tf.compat.v1.zeros_initializer())
    logits = tf.matmul(tf.nn.relu(tf.matmul(x, w1) + b1), w2) + b2
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
    gs = tf.compat.v1.train.get_or_create_global_step()
    train_op = tf.compat.v1.train.MomentumOptimizer(0.05, 0.9).minimize(loss, global_step=gs)
    tf.compat.v1.summary.scalar("loss", loss)
    tf.compat.v1.summary.histogram("w2", w2)
    # a forward value (a direct read of a variable the same run updates may see either value: TF
    # orders nothing between them)
    mean_logits = tf.reduce_mean(logits, axis=0)
    return SimpleNamespace(x=x, y=y, w1=w1, b1=b1, w2=w2, b2=b2, loss=loss, gs=gs, train_op=train_op,
                           mean_logits=mean_logits)


def variables(tf: Any, sess: Any) -> dict[str, np.ndarray]:
    """Every global variable's value, by its graph name (the TF1 checkpoint key)."""
    return sess.run({v.op.name: v for v in tf.compat.v1.global_variables()})


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    tf = setup_tf()
    m = build(tf)
    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        step = int(sess.run(m.gs))
        while step < args.steps:
            bx, by = batch(step)
            sess.run(m.train_op, feed_dict={m.x: bx, m.y: by})
            step += 1
        np.savez(args.out, **variables(tf, sess))
    return 0


if __name__ == "__main__":
    sys.exit(main())
