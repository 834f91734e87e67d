"""A small Keras fit on a seeded tf.data shuffle (with a partial last batch) that reports when Keras'
train step was traced: ``python keras_warm.py OUT.npz [--no-callback] [--slow [--no-sleep]]`` (``--slow``: 24
epochs, 40 ms a batch, long enough to kill its trainer once a hot standby is ready; ``--no-sleep``:
the same 24 epochs without the 40 ms, for the plain reference fit, whose weights the sleep never changes).

Prints ``traced before the first batch: N`` (the traces of the step fit runs when the first batch
begins: Keras' ``multi_step_on_iterator``, or under procsv its step that keeps the batch,
:mod:`procsv.trainer.keras.replay`) and ``traced in all: N`` after fit, and writes the final weights to OUT.npz.
"""

import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from procsv.trainer.keras.step_warmup import free_variables  # noqa: E402

keras.utils.set_random_seed(0)
tf.config.experimental.enable_op_determinism()
x = np.random.default_rng(0).normal(size=(100, 8)).astype(np.float32)
y = (x[:, :4].argmax(axis=1)).astype(np.int64)
ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(100, seed=1, reshuffle_each_iteration=True).batch(16)
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(4)])
model.compile(keras.optimizers.Adam(1e-2), keras.losses.SparseCategoricalCrossentropy(from_logits=True),
              metrics=["accuracy"])


backup = None  # procsv's callback


def traces() -> int:
    replay = getattr(getattr(backup, "_rollback", None), "replay", None)  # (FitRollback's BatchReplay)
    if replay is not None and replay.traced is not None:  # the step procsv runs: Keras' own, its batch kept
        return int(replay.traced.experimental_get_tracing_count())
    fn = model.train_function  # inside fit, procsv's wrapper of Keras' own
    fn = getattr(getattr(fn, "__self__", None), "_original_train", fn)
    return int(free_variables(fn)["multi_step_on_iterator"].experimental_get_tracing_count())


class Report(keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        self.first = True

    def on_train_batch_begin(self, batch, logs=None):
        if self.first:
            self.first = False
            print(f"traced before the first batch: {traces()}", flush=True)


class Slow(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        time.sleep(0.04)


slow = "--slow" in sys.argv
callbacks = [Report()] + ([Slow()] if slow and "--no-sleep" not in sys.argv else [])
if "--no-callback" not in sys.argv:
    import procsv.keras

    backup = procsv.keras.BackupAndRestore()
    callbacks.insert(0, backup)
model.fit(ds, epochs=24 if slow else 3, callbacks=callbacks, verbose=0)
print(f"traced in all: {traces()}", flush=True)
np.savez(sys.argv[1], *[np.asarray(w) for w in model.weights])
