"""A TF1 graph program in the shape of TensorFlow's CIFAR-10 tutorial (``cifar10_train.py``), under
``procsv.train.MonitoredTrainingSession``, TensorFlow's own, or the same graph in a plain loop.

The tutorial's shape, on a small MLP whose batch is sliced in-graph from constants by the global step
(its input queues are left out: their threads' order is not deterministic), with
``enable_op_determinism``: a learning rate ``exponential_decay``-ed in stairs and logged as a scalar;
weight decay added to the ``losses`` collection and summed with ``add_n``; the losses' moving averages
(``ExponentialMovingAverage``) before the gradients, histograms of the variables and gradients; the
train op the trainable variables' moving averages after ``apply_gradients(global_step=...)``. ``--mode
procsv``: ``procsv.train.MonitoredTrainingSession(checkpoint_dir=..., hooks=[StopAtStepHook(last_step),
NanTensorHook(loss), _LoggerHook()], config=ConfigProto(...))`` with ``while not
mon_sess.should_stop(): mon_sess.run(train_op)``, as the tutorial's ``train()``, and the test's own hooks:
one subclassing TensorFlow's ``SessionRunHook`` that fetches the loss, and ``FinalOpsHook`` reading every
global variable at the end; ``--mode tf``: the same under TensorFlow's own ``MonitoredTrainingSession``
and hooks; ``--mode plain``: ``tf.compat.v1.Session`` for ``--steps`` runs of the train op.
All three write every global variable to ``--out`` (npz, keys ``name`` with ``/`` as ``__``).
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
parser.add_argument("--mode", choices=("procsv", "tf", "plain"), default="procsv")
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
    hidden = tf.nn.relu(tf.matmul(x, w1) + b1)
    tf.compat.v1.summary.histogram("hidden/activations", hidden)
    logits = tf.matmul(hidden, w2) + b2
    # cifar10.loss(): the cross entropy and the weight decay in the 'losses' collection, summed
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
    tf.compat.v1.add_to_collection("losses", loss)
    tf.compat.v1.add_to_collection("losses", tf.multiply(tf.nn.l2_loss(w1), 0.0004, name="weight_loss"))
    total_loss = tf.add_n(tf.compat.v1.get_collection("losses"), name="total_loss")
    # cifar10.train(): the learning rate decayed in stairs, the losses' moving averages first
    lr = tf.compat.v1.train.exponential_decay(0.1, gs, 100, 0.5, staircase=True)
    tf.compat.v1.summary.scalar("learning_rate", lr)
    loss_averages = tf.compat.v1.train.ExponentialMovingAverage(0.9, name="avg")
    losses = tf.compat.v1.get_collection("losses")
    loss_averages_op = loss_averages.apply(losses + [total_loss])
    for one in losses + [total_loss]:
        tf.compat.v1.summary.scalar(one.op.name + "_raw", one)
    tf.compat.v1.summary.scalar("loss", loss)  # the Scaffold's default summary_op (merge_all) writes it
    with tf.control_dependencies([loss_averages_op]):
        opt = tf.compat.v1.train.MomentumOptimizer(lr, 0.9)
        grads = opt.compute_gradients(total_loss)
    apply_gradient_op = opt.apply_gradients(grads, global_step=gs)
    for grad, var in grads:
        tf.compat.v1.summary.histogram(var.op.name + "/gradients", grad)
    variable_averages = tf.compat.v1.train.ExponentialMovingAverage(0.9999, gs)
    with tf.control_dependencies([apply_gradient_op]):
        train_op = variable_averages.apply(tf.compat.v1.trainable_variables())
    return total_loss, train_op


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

    if args.mode == "tf":
        train = tf.compat.v1.train
    else:
        from procsv import train

    class _LoggerHook(tf.compat.v1.train.SessionRunHook):
        """cifar10_train.py's: logs the loss and the speed every log_frequency runs."""

        def begin(self):  # type: ignore[no-untyped-def]
            self._step = -1
            self._start_time = time.time()

        def before_run(self, run_context):  # type: ignore[no-untyped-def]
            self._step += 1
            return tf.compat.v1.train.SessionRunArgs(loss)

        def after_run(self, run_context, run_values):  # type: ignore[no-untyped-def]
            if self._step % 100 == 0:
                current_time = time.time()
                duration, self._start_time = current_time - self._start_time, current_time
                print(f"step {self._step}, loss = {run_values.results:.2f} "
                      f"({100 * 32 / max(duration, 1e-9):.1f} examples/sec)", flush=True)

    final = train.FinalOpsHook(variables)
    losses = LossHook(loss)
    hooks = [train.StopAtStepHook(last_step=args.steps), train.NanTensorHook(loss), _LoggerHook(), losses, final]
    with train.MonitoredTrainingSession(checkpoint_dir=args.logdir, hooks=hooks,
                                        save_checkpoint_secs=args.save_checkpoint_secs,
                                        save_summaries_steps=50, log_step_count_steps=100,
                                        config=tf.compat.v1.ConfigProto(log_device_placement=False)) as mon_sess:
        while not mon_sess.should_stop():
            mon_sess.run(train_op)
    values = final.final_ops_values
    print(f"graph_monitored_train: finished at step {int(values['global_step'])} after {losses.seen} runs "
          f"in this process", flush=True)
    write(values)
    return 0


if __name__ == "__main__":
    sys.exit(main())
