"""Keras ``fit`` programs of the kinds users write, with a poisoned batch (issue 52's attack on rollback).

    --kind K            class_weight: a classifier fit with class_weight={0: 1, 1: 3} (Keras adds the sample
                        weights in its own input pipeline); validation: a regression fit with validation_data;
                        custom_step: a model subclass whose train_step is the Keras guide's (its own Mean loss
                        tracker, returned as logs["loss"]: the epoch's running mean)
    --nan-at I          the input of batch I (counted over the whole fit from 0) is NaN (repeatable)
    --drop-at I         batch I is left out of the stream, one batch fewer in fit (repeatable): the plain run
                        that never applied batch I (one epoch only; SGD without momentum at a constant rate: the iteration
                        it would have counted changes no weight)
    --epochs E, --batches N   fit(epochs=E, steps_per_epoch=N) over one stream of batches
    --early-stopping    keras.callbacks.EarlyStopping(monitor=args.monitor, patience=0)
    --adam-schedule     Adam with an ExponentialDecay learning rate (of the optimizer's iterations) instead of SGD
    --keras-version V   keras.__version__ reads V in this process (a Keras the replay is not tested with)
    --kill-after I      (with --kill-file F) after fit's batch I (counted from 0 over the fit), unless F exists:
                        write this process's pid to F and wait (at most 120 s) to be killed
    --no-callback       a plain fit, without procsv
    --weights-out F     write the final weights (.npz)

The input of batch I is a function of I alone, so a run is reproducible and its plain twin computable.
"""

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--kind", choices=["class_weight", "validation", "custom_step"], required=True)
p.add_argument("--nan-at", type=int, action="append", default=[])
p.add_argument("--drop-at", type=int, action="append", default=[])
p.add_argument("--epochs", type=int, default=1)
p.add_argument("--batches", type=int, default=30)
p.add_argument("--save-freq", type=int, default=8)
p.add_argument("--early-stopping", action="store_true")
p.add_argument("--monitor", default="loss")
p.add_argument("--keras-version", default=None)
p.add_argument("--adam-schedule", action="store_true")
p.add_argument("--kill-after", type=int, default=None)
p.add_argument("--kill-file", default=None)
p.add_argument("--no-callback", action="store_true")
p.add_argument("--weights-out", default=None)
args = p.parse_args()

keras.utils.set_random_seed(0)
poisoned = tf.constant(args.nan_at + [-1], dtype=tf.int64)
dropped = tf.constant(args.drop_at + [-1], dtype=tf.int64)
classes = args.kind == "class_weight"


def batch(i):  # type: ignore[no-untyped-def]
    x = tf.reshape(tf.sin(tf.cast(i * 32 + tf.range(32, dtype=tf.int64), tf.float32) * 0.37), [8, 4])
    y = tf.reduce_sum(x, axis=1, keepdims=True) * 0.5 + 0.1
    if classes:
        y = tf.cast(y > 0.3, tf.int64)
    x = tf.where(tf.reduce_any(tf.equal(poisoned, i)), tf.fill([8, 4], float("nan")), x)
    return x, y


total = args.epochs * args.batches
data = tf.data.Dataset.range(total).filter(lambda i: tf.logical_not(tf.reduce_any(tf.equal(dropped, i)))).map(batch)


class GuideModel(keras.Model):  # type: ignore[misc]
    """The Keras guide's custom train_step ("Customizing what happens in fit")."""

    def __init__(self, **kw):  # type: ignore[no-untyped-def]
        super().__init__(**kw)
        self.hidden = keras.layers.Dense(3, activation="tanh")
        self.out = keras.layers.Dense(1)
        self.loss_tracker = keras.metrics.Mean(name="loss")

    def call(self, x):  # type: ignore[no-untyped-def]
        return self.out(self.hidden(x))

    def train_step(self, data):  # type: ignore[no-untyped-def]
        x, y = data
        with tf.GradientTape() as tape:
            loss = keras.losses.mean_squared_error(y, self(x, training=True))
            loss = tf.reduce_mean(loss)
        grads = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply_gradients(zip(grads, self.trainable_variables))
        self.loss_tracker.update_state(loss)
        return {"loss": self.loss_tracker.result()}

    @property
    def metrics(self):  # type: ignore[no-untyped-def]
        return [self.loss_tracker]




def optimizer():  # type: ignore[no-untyped-def]
    if args.adam_schedule:
        return keras.optimizers.Adam(keras.optimizers.schedules.ExponentialDecay(0.01, 5, 0.8))
    return keras.optimizers.SGD(0.05)


if args.kind == "custom_step":
    model = GuideModel()
    model.build((None, 4))
    model.compile(optimizer())
elif classes:
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="tanh"),
                              keras.layers.Dense(2, activation="softmax")])
    model.compile(optimizer(), "sparse_categorical_crossentropy")
else:
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="tanh"), keras.layers.Dense(1)])
    model.compile(optimizer(), "mse")

if args.keras_version:
    keras.__version__ = args.keras_version
callbacks = []
if args.early_stopping:
    callbacks.append(keras.callbacks.EarlyStopping(monitor=args.monitor, patience=0))


class KillPoint(keras.callbacks.Callback):  # type: ignore[misc]
    epoch = 0

    def on_epoch_begin(self, epoch, logs=None):  # type: ignore[no-untyped-def]
        KillPoint.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):  # type: ignore[no-untyped-def]
        if KillPoint.epoch * args.batches + batch != args.kill_after or os.path.exists(args.kill_file):
            return
        with open(args.kill_file + ".tmp", "w") as fh:
            fh.write(str(os.getpid()))
        os.replace(args.kill_file + ".tmp", args.kill_file)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            time.sleep(0.05)


if args.kill_after is not None:
    callbacks.append(KillPoint())
if not args.no_callback:
    import procsv.keras

    callbacks.append(procsv.keras.BackupAndRestore(save_freq=args.save_freq))
extra = {}
if classes:
    extra["class_weight"] = {0: 1.0, 1: 3.0}
if args.kind == "validation":
    extra["validation_data"] = tf.data.Dataset.range(1000, 1004).map(batch)
steps = args.batches - (len(args.drop_at) if args.epochs == 1 else 0)  # --drop-at: one epoch only
history = model.fit(data, epochs=args.epochs, steps_per_epoch=steps, callbacks=callbacks, verbose=0, **extra)
if args.weights_out:
    np.savez(args.weights_out, *model.get_weights())
print(f"fit done: {int(model.optimizer.iterations.numpy())} iterations, history {history.history}", flush=True)
