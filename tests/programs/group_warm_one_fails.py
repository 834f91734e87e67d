"""A MultiWorkerMirroredStrategy loop whose ``sv.warm_up`` arguments differ by member (each passes a
batch of its own) and whose step checks its input: worker 1's warm-up batch holds a NaN, so its step
fails on it (an ``Assert`` on it, before the step's collective) while the chief's reaches the
collective. Real batches are finite: the program trains normally.

    --steps N       train to step N
    --step-delay S  sleep S seconds per step

The batch of step n is a function of n and the member's rank alone; each member prints every step.
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
p.add_argument("--steps", type=int, default=400)
p.add_argument("--step-delay", type=float, default=0.02)
args = p.parse_args()

keras.utils.set_random_seed(0)
tf.config.experimental.enable_op_determinism()
strategy = tf.distribute.MultiWorkerMirroredStrategy()
rank = procsv.cluster.rank()
with strategy.scope():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)])
    optimizer = keras.optimizers.SGD(0.05, momentum=0.9)
    optimizer.build(model.trainable_variables)
sv = procsv.Supervisor(checkpoint=tf.train.Checkpoint(model=model, optimizer=optimizer), save_model_secs=600)


@tf.function
def train(x, y):  # type: ignore[no-untyped-def]
    def replica(x, y):  # type: ignore[no-untyped-def]
        finite = tf.debugging.Assert(tf.reduce_all(tf.math.is_finite(x)), ["a non-finite input"])  # (Assert: no
        with tf.control_dependencies([finite]):  # state of its own, so a standby runs the step on shadows)
            x = tf.identity(x)
        with tf.GradientTape() as tape:
            loss = tf.nn.compute_average_loss(tf.square(model(x, training=True) - y)[:, 0], global_batch_size=16)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    return {"loss": strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(replica, args=(x, y)), axis=None)}


def batch(s: int) -> tuple[np.ndarray, np.ndarray]:
    xs = np.sin(np.arange(32, dtype=np.float32) * 0.37 + s * 1.3 + rank * 0.7).reshape(8, 4).astype(np.float32)
    return xs, xs.sum(axis=1, keepdims=True) * 0.5 + 0.1


warm_x, warm_y = batch(0)
if rank == 1:
    warm_x = warm_x.copy()
    warm_x[0, 0] = np.nan  # this member's warm-up batch: its step fails on it, before the collective
sv.warm_up(train, warm_x, warm_y)

with sv.managed_session() as sess:
    while not sv.should_stop() and sv.step < args.steps:
        out = sess.run(lambda: train(*batch(sv.step)))
        time.sleep(args.step_delay)
        print(f"group_warm_one_fails: step {sv.step} loss {float(out['loss']):.5f}", flush=True)
print(f"group_warm_one_fails: ended at step {sv.step}", flush=True)
