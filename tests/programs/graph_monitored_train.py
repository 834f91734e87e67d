"""A TF1 graph program under procsv.train.MonitoredTrainingSession, or the same graph in a plain loop.

A small MLP (``tf.compat.v1.get_variable``, ``tf.matmul``, ``MomentumOptimizer``) whose batch is
sliced in-graph from constants by the global step, with ``enable_op_determinism``. ``--mode
procsv``: ``procsv.train.MonitoredTrainingSession`` with ``StopAtStepHook``, a hook subclassing
TensorFlow's own ``SessionRunHook`` that fetches the loss, and ``FinalOpsHook`` reading every global
variable at the end; ``--mode plain``: ``tf.compat.v1.Session`` for ``--steps`` runs of the train op.
Both write every global variable to ``--out`` (npz, keys ``name`` with ``/`` as ``__``).
``--mode plain --plain-at N1,N2,...``: one plain loop of max(N) runs, writing the variables after
each N's run to ``--out`` with ``{steps}`` replaced by N (several references, one TensorFlow import).
``--abort-at N``: the loss hook raises ``AbortedError`` from ``after_run`` of this process's N-th
run, once: after the train op changed the variables, as a session aborted mid-run (what TF's
MonitoredSession recovers from in-process: a new session restored from the newest checkpoint).
A real AbortedError comes from a distributed runtime (a preempted parameter server), which cannot
be made here; a ``py_func`` raising one reaches the program as ``UnknownError``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import tensorflow as tf

tf.compat.v1.disable_eager_execution()
tf.config.experimental.enable_op_determinism()

parser = argparse.ArgumentParser()
parser.add_argument("--mode", choices=("procsv", "plain"), default="procsv")
parser.add_argument("--steps", type=int, default=300)
parser.add_argument("--out", required=True)
parser.add_argument("--step-delay", type=float, default=0.0)
parser.add_argument("--abort-at", type=int, default=-1)
parser.add_argument("--save-checkpoint-secs", type=float, default=1.0)
parser.add_argument("--logdir", default=None, help="checkpoint_dir (default: the launch's --logdir)")
parser.add_argument("--plain-at", default="", help="--mode plain: step counts N1,N2,... (--out holds {steps})")
args = parser.parse_args()

def build() -> tuple[tf.Tensor, tf.Operation]:
    rng = np.random.RandomState(0)
    xs = tf.constant(rng.randn(512, 64).astype(np.float32))
    ys = tf.constant(rng.randint(0, 10, size=512).astype(np.int64))
    gs = tf.compat.v1.train.get_or_create_global_step()
    start = tf.cast(tf.math.floormod(gs, 16) * 32, tf.int32)
    x, y = xs[start:start + 32], ys[start:start + 32]
    init = tf.compat.v1.glorot_uniform_initializer(seed=1)
    w1 = tf.compat.v1.get_variable("w1", [64, 32], initializer=init)
    b1 = tf.compat.v1.get_variable("b1", [32], initializer=tf.compat.v1.zeros_initializer())
    w2 = tf.compat.v1.get_variable("w2", [32, 10], initializer=init)
    b2 = tf.compat.v1.get_variable("b2", [10], initializer=tf.compat.v1.zeros_initializer())
    logits = tf.matmul(tf.nn.relu(tf.matmul(x, w1) + b1), w2) + b2
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
    train_op = tf.compat.v1.train.MomentumOptimizer(0.05, 0.9).minimize(loss, global_step=gs)
    tf.compat.v1.summary.scalar("loss", loss)  # the Scaffold's default summary_op (merge_all) writes it
    return loss, train_op


def write(values: dict[str, np.ndarray], path: str = "") -> None:
    path = path or args.out
    tmp = path + ".tmp.npz"
    np.savez(tmp, **{k.replace("/", "__"): v for k, v in values.items()})
    os.replace(tmp, path)


class LossHook(tf.compat.v1.train.SessionRunHook):
    """TensorFlow's own hook class: fetches the loss with every run."""

    def __init__(self, loss: tf.Tensor) -> None:
        self.loss = loss
        self.seen = 0
        self.aborted = False

    def before_run(self, run_context):  # type: ignore[no-untyped-def]
        return tf.compat.v1.train.SessionRunArgs(self.loss)

    def after_run(self, run_context, run_values):  # type: ignore[no-untyped-def]
        assert np.isfinite(run_values.results)
        self.seen += 1
        if self.seen == args.abort_at and not self.aborted:
            self.aborted = True
            step = int(run_context.session.run(tf.compat.v1.train.get_global_step()))
            print(f"graph_monitored_train: AbortedError after the run that reached step {step}", flush=True)
            raise tf.errors.AbortedError(None, None, "the session was aborted")
        if args.step_delay:
            time.sleep(args.step_delay)


def main() -> int:
    loss, train_op = build()
    variables = {v.op.name: v for v in tf.compat.v1.global_variables()}
    if args.mode == "plain":
        at = sorted({int(n) for n in args.plain_at.split(",")}) if args.plain_at else []
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for run in range(1, (at[-1] if at else args.steps) + 1):
                sess.run(train_op)
                if run in at:
                    write(sess.run(variables), args.out.format(steps=run))
            if not at:
                write(sess.run(variables))
        return 0

    from procsv import train

    final = train.FinalOpsHook(variables)
    losses = LossHook(loss)
    hooks = [train.StopAtStepHook(last_step=args.steps), losses, final]
    with train.MonitoredTrainingSession(checkpoint_dir=args.logdir, hooks=hooks,
                                        save_checkpoint_secs=args.save_checkpoint_secs,
                                        save_summaries_steps=50, log_step_count_steps=100) as sess:
        while not sess.should_stop():
            sess.run(train_op)
    values = final.final_ops_values
    print(f"graph_monitored_train: finished at step {int(values['global_step'])} after {losses.seen} runs "
          f"in this process", flush=True)
    write(values)
    return 0


if __name__ == "__main__":
    sys.exit(main())
