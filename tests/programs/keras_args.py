"""A small Keras fit whose procsv.keras.BackupAndRestore gets Keras' arguments as a user switching over
would pass them: ``python keras_args.py`` fits 2 epochs of 8 batches with
``save_before_preemption=False`` (the callback is made twice: the warning is said once).
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import procsv.keras  # noqa: E402

x = np.random.default_rng(0).random((64, 8), dtype=np.float32)
y = x.sum(axis=1, keepdims=True)
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
model.compile(keras.optimizers.SGD(0.01), "mse")
procsv.keras.BackupAndRestore(save_before_preemption=False)
callback = procsv.keras.BackupAndRestore(save_freq=4, save_before_preemption=False)
history = model.fit(x, y, batch_size=8, epochs=2, callbacks=[callback], verbose=0)
print(f"fit returned after {len(history.history['loss'])} epoch(s)", flush=True)
