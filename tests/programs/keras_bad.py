"""Keras fit programs procsv.keras.BackupAndRestore must refuse with a clear error.

``python keras_bad.py MODE``: ``infinite`` (a repeated dataset, no steps_per_epoch), ``uncompiled``
(fit on a model never compiled) or ``unbuilt`` (a compiled Sequential without an Input, never called).
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import procsv.keras  # noqa: E402

mode = sys.argv[1]
x = np.random.default_rng(0).random((64, 8), dtype=np.float32)
y = np.zeros((64, 1), np.float32)
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
callback = procsv.keras.BackupAndRestore()
if mode == "infinite":
    model.compile("sgd", "mse")
    model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(8).repeat(), epochs=2, callbacks=[callback], verbose=0)
elif mode == "uncompiled":
    model.fit(x, y, epochs=1, callbacks=[callback], verbose=0)
elif mode == "unbuilt":
    model = keras.Sequential([keras.layers.Dense(1)], name="no_input")
    model.compile("sgd", "mse")
    model.fit(x, y, epochs=1, callbacks=[callback], verbose=0)
print("fit returned", flush=True)
