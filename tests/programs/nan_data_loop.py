"""A custom training loop as users write it: a ``tf.function`` step over a ``tf.data`` iterator the
checkpoint tracks, whose batch at given steps is NaN (issue 52, attacked as a user's program).

    --bind B              inside: the step function takes its batch itself (``next(it)`` inside the
                          ``tf.function``); args: the loop takes it (``x, y = next(it)``) and passes it,
                          ``sess.run(step, x, y)``
    --optimizer O         sgd: SGD with momentum 0.9; adam: Adam with an exponential-decay learning rate
    --batchnorm           the model has a BatchNormalization layer (non-trainable moving statistics)
    --nan-at N            the batch step N takes (element N of the data set) is NaN (repeatable)
    --skip-at N           step N takes its batch and applies nothing (repeatable): the plain run that never
                          applied step N
    --steps N             train to step N
    --save-steps K        a checkpoint every K steps
    --step-delay S        seconds each step sleeps besides its work
    --wait-commit N       after step N + 1, wait (at most 400 s) until the checkpoint of step N is committed: the
                          checkpoint service loads TensorFlow for the iterator's state at its first commit
                          (seconds at load), and the snapshots that follow wait for it; this keeps the
                          next snapshot at its cadence (the lag forced, not left to chance)
    --logdir DIR          for a plain `python nan_data_loop.py` run
    --final-checkpoint P  for a plain run without --logdir: at the end, write the checkpoint's state (model,
                          optimizer, data) to the prefix P and the step (``global_step``, as procsv's)
                          with TF's own ``tf.train.Checkpoint.write``; no procsv
                          service is started (the checkpoint service of a run with --logdir loads TensorFlow for
                          the iterator's state: about 3 s of CPU a run)

The data set is element n (n = 1, 2, ...) for step n in a run that skips nothing, a function of n
alone: a plain run with ``--skip-at`` is the twin of a run that skipped those steps.
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
p.add_argument("--bind", choices=["inside", "args"], default="inside")
p.add_argument("--optimizer", choices=["sgd", "adam"], default="sgd")
p.add_argument("--batchnorm", action="store_true")
p.add_argument("--nan-at", type=int, action="append", default=[])
p.add_argument("--skip-at", type=int, action="append", default=[])
p.add_argument("--steps", type=int, default=60)
p.add_argument("--save-steps", type=int, default=10)
p.add_argument("--step-delay", type=float, default=0.0)
p.add_argument("--wait-commit", type=int, default=None)
p.add_argument("--logdir", default=None)
p.add_argument("--final-checkpoint", default=None)
args = p.parse_args()

keras.utils.set_random_seed(0)
n = args.steps + 50
xs = np.sin((np.arange(n * 32, dtype=np.float32)) * 0.37).reshape(n, 8, 4).astype(np.float32)
ys = xs.sum(axis=2, keepdims=True) * 0.5 + 0.1
for s in args.nan_at:
    xs[s - 1, 0, 0] = np.nan  # element s - 1 (0-based) is the batch of step s
it = iter(tf.data.Dataset.from_tensor_slices((xs, ys)))

layers = [keras.Input((4,)), keras.layers.Dense(8, activation="tanh")]
if args.batchnorm:
    layers.append(keras.layers.BatchNormalization())
model = keras.Sequential([*layers, keras.layers.Dense(1)])
if args.optimizer == "sgd":
    optimizer = keras.optimizers.SGD(0.05, momentum=0.9)
else:
    optimizer = keras.optimizers.Adam(keras.optimizers.schedules.ExponentialDecay(0.01, 10, 0.9))
optimizer.build(model.trainable_variables)
sv = procsv.Supervisor(logdir=args.logdir, checkpoint=tf.train.Checkpoint(model=model, optimizer=optimizer, data=it),
                       save_model_secs=600, save_checkpoint_steps=args.save_steps)


@tf.function
def train_on(x, y):  # type: ignore[no-untyped-def]
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model(x, training=True) - y))
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return loss


@tf.function
def train_next():  # type: ignore[no-untyped-def]
    x, y = next(it)
    return train_on(x, y)


def step_inside():  # type: ignore[no-untyped-def]
    if sv.step in args.skip_at:
        next(it)
        return None
    out = train_next()
    if args.step_delay:
        time.sleep(args.step_delay)
    return out


def step_args(x, y, s):  # type: ignore[no-untyped-def]
    if s in args.skip_at:
        return None
    out = train_on(x, y)
    if args.step_delay:
        time.sleep(args.step_delay)
    return out


with sv.managed_session() as sess:
    while not sv.should_stop() and sv.step < args.steps:
        if args.bind == "args":
            x, y = next(it)
            sess.run(step_args, x, y, sv.step + 1)
        else:
            sess.run(step_inside)
        if args.wait_commit is not None and sv.logdir and sv.step == args.wait_commit + 1:  # (its snapshot: before step N + 1)
            index = os.path.join(sv.logdir, f"model.ckpt-{args.wait_commit}.index")
            deadline = time.monotonic() + 400
            while not os.path.exists(index) and time.monotonic() < deadline:
                time.sleep(0.05)
if args.final_checkpoint:  # what procsv's final checkpoint holds: the state and the step (its global_step)
    tf.train.Checkpoint(model=model, optimizer=optimizer, data=it, global_step=tf.Variable(sv.step, dtype=tf.int64)).write(args.final_checkpoint)
print(f"nan_data_loop: ended at step {sv.step}", flush=True)
