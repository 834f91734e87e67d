"""A custom training loop of a Keras model whose state turns non-finite at given steps (issue 52).

    --optimizer O         sgd: SGD with momentum 0.9; adam: Adam
    --nan-at N            the input of step N is NaN (repeatable): its loss, gradients and update turn NaN
    --grad-nan-at N       step N adds a loss term whose value is 0 and whose gradient is NaN (repeatable):
                          the loss of step N is finite, the weights after it are not, the loss of N + 1 is NaN
    --skip-at N           step N does nothing (repeatable): the plain run that never applied step N
    --steps N             train to step N
    --save-steps K        a checkpoint every K steps
    --step-delay S        seconds each step sleeps besides its work
    --bind B              inside: the step function computes its batch from ``sv.step``; args: the loop
                          computes the batch of step ``sv.step + 1`` and passes it, ``sess.run(step, x, y)``
    --kill-after N        (with --kill-file F) the --kill-visit'th time step N ran in this process (default the
                          first), unless F exists: write this process's pid to F and wait (at most 120 s) to be killed
    --wait-commit N       after step N + 1, wait (at most 400 s) until the checkpoint of step N is committed:
                          the next snapshot is taken at its cadence (the lag ruled out, not left to chance)
    --logdir DIR          for a plain `python nan_keras_loop.py` run
    --final-checkpoint P  for a plain run without --logdir: at the end, write the checkpoint's state (model,
                          optimizer) to the prefix P and the step (``global_step``, as procsv's)
                          with TF's own ``tf.train.Checkpoint.write``; no procsv
                          service is started
    --schedule            the learning rate is an ExponentialDecay schedule of the optimizer's iterations
    --batchnorm           a BatchNormalization layer between the two Dense layers (moving statistics:
                          non-trainable variables the step updates)
    --loss-scale          mixed precision (mixed_float16) and a LossScaleOptimizer around the optimizer
                          (it skips its own steps whose scaled gradients overflow and lowers its scale)
    --overflow-at N       step N's loss is multiplied by 2**16 (finite; with --loss-scale its scaled gradients
                          overflow float16: the LossScaleOptimizer skips the step itself) (repeatable)

The input of step s is a function of s alone (the step ``sv.step`` says), so a run is reproducible
and its plain twin (``--skip-at``) computable. The step function returns the loss tensor.
"""

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import procsv  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--optimizer", choices=["sgd", "adam"], default="sgd")
p.add_argument("--nan-at", type=int, action="append", default=[])
p.add_argument("--grad-nan-at", type=int, action="append", default=[])
p.add_argument("--skip-at", type=int, action="append", default=[])
p.add_argument("--steps", type=int, default=60)
p.add_argument("--save-steps", type=int, default=10)
p.add_argument("--step-delay", type=float, default=0.0)
p.add_argument("--bind", choices=["inside", "args"], default="inside")
p.add_argument("--kill-after", type=int, default=None)
p.add_argument("--kill-file", default=None)
p.add_argument("--kill-visit", type=int, default=1)
p.add_argument("--wait-commit", type=int, default=None)
p.add_argument("--logdir", default=None)
p.add_argument("--final-checkpoint", default=None)
p.add_argument("--schedule", action="store_true")
p.add_argument("--batchnorm", action="store_true")
p.add_argument("--loss-scale", action="store_true")
p.add_argument("--overflow-at", type=int, action="append", default=[])
args = p.parse_args()

keras.utils.set_random_seed(0)
if args.loss_scale:
    keras.mixed_precision.set_global_policy("mixed_float16")
middle = [keras.layers.Dense(8), keras.layers.BatchNormalization(), keras.layers.Activation("tanh")] \
    if args.batchnorm else [keras.layers.Dense(8, activation="tanh")]
model = keras.Sequential([keras.Input((4,)), *middle, keras.layers.Dense(1, dtype="float32")])
rate = keras.optimizers.schedules.ExponentialDecay(0.05 if args.optimizer == "sgd" else 0.01, 10, 0.9) \
    if args.schedule else (0.05 if args.optimizer == "sgd" else 0.01)
optimizer = keras.optimizers.SGD(rate, momentum=0.9) if args.optimizer == "sgd" else keras.optimizers.Adam(rate)
if args.loss_scale:
    optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
optimizer.build(model.trainable_variables)
sv = procsv.Supervisor(logdir=args.logdir, checkpoint=tf.train.Checkpoint(model=model, optimizer=optimizer),
                       save_model_secs=600, save_checkpoint_steps=args.save_steps)


def batch(s: int) -> tuple[np.ndarray, np.ndarray]:
    x = np.sin((s * 32 + np.arange(32, dtype=np.float32)) * 0.37).reshape(8, 4).astype(np.float32)
    y = x.sum(axis=1, keepdims=True) * 0.5 + 0.1
    if s in args.nan_at:
        x[0, 0] = np.nan
    return x, y


@tf.function
def train(x, y, grad_nan, overflow=False):  # type: ignore[no-untyped-def]
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model(x, training=True) - y))
        if overflow:
            loss *= 65536.0
        if grad_nan:  # value 0, gradient NaN: the norm of a zero vector (x / |x| = 0 / 0)
            loss += tf.norm(model.trainable_variables[0] * 0.0)
        scaled = optimizer.scale_loss(loss) if args.loss_scale else loss
    grads = tape.gradient(scaled, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return loss


def step(x=None, y=None, s=None):  # type: ignore[no-untyped-def]
    s = sv.step if s is None else s
    if s in args.skip_at:
        return None
    if x is None:
        x, y = batch(s)
    loss = train(x, y, s in args.grad_nan_at, s in args.overflow_at)
    if args.step_delay:
        time.sleep(args.step_delay)
    return loss


visits = 0
with sv.managed_session() as sess:
    while not sv.should_stop() and sv.step < args.steps:
        if args.bind == "args":
            s = sv.step + 1
            sess.run(step, *batch(s), s)
        else:
            sess.run(step)
        if args.wait_commit is not None and sv.logdir and sv.step == args.wait_commit + 1:  # (its snapshot: before step N + 1)
            index = os.path.join(sv.logdir, f"model.ckpt-{args.wait_commit}.index")
            deadline = time.monotonic() + 400
            while not os.path.exists(index) and time.monotonic() < deadline:
                time.sleep(0.05)
        visits += sv.step == args.kill_after
        if args.kill_file and visits == args.kill_visit and sv.step == args.kill_after and not os.path.exists(args.kill_file):
            with open(args.kill_file + ".tmp", "w") as fh:
                fh.write(str(os.getpid()))
            os.replace(args.kill_file + ".tmp", args.kill_file)
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                time.sleep(0.05)
if args.final_checkpoint:  # what procsv's final checkpoint holds: the state and the step (its global_step)
    tf.train.Checkpoint(model=model, optimizer=optimizer, global_step=tf.Variable(sv.step, dtype=tf.int64)).write(args.final_checkpoint)
print(f"nan_keras_loop: ended at step {sv.step}", flush=True)
