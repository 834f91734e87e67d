"""``fit`` again after an interrupted ``fit``, in one process (issue 67, point 3).

The pattern of TensorFlow's fault-tolerance migration guide: another callback raises at an epoch end,
the program catches it and calls ``fit`` again with a ``BackupAndRestore`` (the same object, or a new
one). Before, procsv kept the interrupted fit's services and the logdir's lock, and the second ``fit``
raised ``LogdirLocked`` naming the program's own pid. Now the second ``fit`` ends the first's session,
committing the position it reached, and resumes where Keras's own callback resumes. Run in the test's
process (plain python: procsv's two services start as child processes), against Keras's own
``keras.callbacks.BackupAndRestore`` in the same program.
"""

from __future__ import annotations

from typing import Any

import pytest

pytestmark = pytest.mark.slow


def _fit_twice(backup_cls: Any, backup_dir: str, same_object: bool) -> tuple[list[int], list[Any]]:
    """Fit 4 epochs with a callback that raises at the end of epoch 2 (after the backup's, as the guide
    orders them); catch, fit again. The epochs each fit began, as a callback saw them, and the weights."""
    import keras
    import numpy as np
    import tensorflow as tf

    keras.utils.set_random_seed(0)
    x = np.random.default_rng(0).normal(size=(64, 8)).astype(np.float32)
    ds = tf.data.Dataset.from_tensor_slices((x, x[:, :4].argmax(axis=1))).batch(16)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4)])
    model.compile(keras.optimizers.SGD(0.01), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    began: list[int] = []

    class Interrupt(keras.callbacks.Callback):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.armed = True

        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            began.append(epoch)

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            if epoch == 1 and self.armed:
                self.armed = False
                raise RuntimeError("interrupted at the end of epoch 2")

    interrupt = Interrupt()
    backup = backup_cls(backup_dir=backup_dir)
    with pytest.raises(RuntimeError, match="interrupted"):
        model.fit(ds, epochs=4, callbacks=[backup, interrupt], verbose=0)
    model.fit(ds, epochs=4, callbacks=[backup if same_object else backup_cls(backup_dir=backup_dir), interrupt],
              verbose=0)
    return began, [w.numpy() for w in model.weights]


@pytest.mark.parametrize("same_object", [True, False], ids=["same-callback", "new-callback"])
def test_fit_again_after_a_fit_that_raised_resumes_where_keras_resumes(tmp_path, same_object):
    import keras

    import procsv.keras

    theirs, keras_weights = _fit_twice(keras.callbacks.BackupAndRestore, str(tmp_path / "keras"), same_object)
    # before: LogdirLocked; then, the interrupted epoch began again ([0, 1, 1, 2, 3])
    ours, weights = _fit_twice(procsv.keras.BackupAndRestore, str(tmp_path / "procsv"), same_object)
    assert theirs == [0, 1, 2, 3] and ours == theirs, (theirs, ours)
    assert all(a.tobytes() == b.tobytes() for a, b in zip(weights, keras_weights))  # each epoch trained once
