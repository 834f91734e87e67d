"""``fit`` again after an interrupted ``fit``, in one process (issue 67, point 3).

The pattern of TensorFlow's fault-tolerance migration guide: another callback raises at an epoch end,
the program catches it and calls ``fit`` again with a ``BackupAndRestore`` (the same object, or a new
one). Before, procsv kept the interrupted fit's services and the logdir's lock, and the second ``fit``
raised ``LogdirLocked`` naming the program's own pid. Now the second ``fit`` ends the first's session,
committing the position it reached, and resumes where Keras's own callback resumes. Run in the test's
process (plain python: procsv's two services start as child processes), against Keras's own
``keras.callbacks.BackupAndRestore`` in the same program: the guide's raise at an epoch's start, one at
an epoch's end, a dataset of unknown cardinality, and a fit of another directory in between (the last
three found by an attack).
"""

from __future__ import annotations

from typing import Any

import pytest

pytestmark = pytest.mark.slow


def _fit_twice(backup_cls: Any, backup_dir: str, where: str, unknown: bool, same_object: bool = True,
               **backup_kw: Any) -> tuple[list[int], list[Any]]:
    """Fit 4 epochs with a callback that raises at the end of epoch 2 (``where``: at the start of epoch 3,
    the migration guide's) after the backup's, as the guide orders them; catch, fit again with the same
    callback or a new one. The epochs each fit began, as a callback saw them, and the weights."""
    import keras
    import numpy as np
    import tensorflow as tf

    keras.utils.set_random_seed(0)
    x = np.random.default_rng(0).normal(size=(64, 8)).astype(np.float32)
    ds = tf.data.Dataset.from_tensor_slices((x, x[:, :4].argmax(axis=1)))
    if unknown:
        ds = ds.filter(lambda a, b: True)  # cardinality unknown: Keras's params["steps"] is None
    ds = ds.batch(16)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4)])
    model.compile(keras.optimizers.SGD(0.01), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    began: list[int] = []

    class Interrupt(keras.callbacks.Callback):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.armed = True

        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            began.append(epoch)
            if where == "epoch_begin" and epoch == 2 and self.armed:  # the migration guide's InterruptingCallback
                self.armed = False
                raise RuntimeError("interrupted at the beginning of epoch 3")

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            if where == "epoch_end" and epoch == 1 and self.armed:
                self.armed = False
                raise RuntimeError("interrupted at the end of epoch 2")

    interrupt = Interrupt()
    backup = backup_cls(backup_dir=backup_dir, **backup_kw)
    with pytest.raises(RuntimeError, match="interrupted"):
        model.fit(ds, epochs=4, callbacks=[backup, interrupt], verbose=0)
    again = backup if same_object else backup_cls(backup_dir=backup_dir, **backup_kw)
    model.fit(ds, epochs=4, callbacks=[again, interrupt], verbose=0)
    return began, [w.numpy() for w in model.weights]


@pytest.mark.parametrize("where, unknown, same_object", [
    ("epoch_end", False, True), ("epoch_end", False, False), ("epoch_begin", False, True), ("epoch_end", True, True),
    ("epoch_begin", True, True)], ids=["same-callback", "new-callback", "guide-epoch-begin",
                                       "unknown-cardinality-epoch-end", "unknown-cardinality-epoch-begin"])
def test_fit_again_after_a_fit_that_raised_resumes_where_keras_resumes(tmp_path, where, unknown, same_object):
    import keras

    import procsv.keras

    theirs, keras_weights = _fit_twice(keras.callbacks.BackupAndRestore, str(tmp_path / "keras"), where, unknown,
                                       same_object)
    # before: LogdirLocked; then, the interrupted epoch began again ([0, 1, 1, 2, 3]), with an unknown
    # cardinality too (Keras's params["steps"] is None: the finished epoch's end was kept as a position in it)
    ours, weights = _fit_twice(procsv.keras.BackupAndRestore, str(tmp_path / "procsv"), where, unknown, same_object)
    assert ours == theirs and (where != "epoch_end" or theirs == [0, 1, 2, 3]), (theirs, ours)
    assert all(a.tobytes() == b.tobytes() for a, b in zip(weights, keras_weights))  # each epoch trained once


def _three_fits(backup_cls: Any, a: str, b: str) -> tuple[list[int], float]:
    """fit with backup ``a`` raises at the end of epoch 2; a fit with backup ``b`` (another model's phase)
    runs to its end; fit with ``a`` again. The epochs the third fit began, and its duration."""
    import time

    import keras
    import numpy as np
    import tensorflow as tf

    keras.utils.set_random_seed(0)
    x = np.random.default_rng(0).normal(size=(64, 8)).astype(np.float32)
    ds = tf.data.Dataset.from_tensor_slices((x, x[:, :4].argmax(axis=1))).batch(16)

    def model() -> Any:
        m = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4)])
        m.compile(keras.optimizers.SGD(0.01), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return m

    began: list[int] = []

    class Interrupt(keras.callbacks.Callback):  # type: ignore[misc]
        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            began.append(epoch)

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            if epoch == 1 and not fits:
                raise RuntimeError("interrupted at the end of epoch 2")

    fits: list[str] = []
    first = model()
    with pytest.raises(RuntimeError, match="interrupted"):
        first.fit(ds, epochs=4, callbacks=[backup_cls(backup_dir=a), Interrupt()], verbose=0)
    fits.append("a")
    model().fit(ds, epochs=2, callbacks=[backup_cls(backup_dir=b)], verbose=0)
    began.clear()
    t0 = time.monotonic()
    first.fit(ds, epochs=4, callbacks=[backup_cls(backup_dir=a), Interrupt()], verbose=0)
    return began, time.monotonic() - t0


def test_fit_again_after_a_fit_of_another_backup_dir_in_between_resumes_where_keras_resumes(tmp_path):
    # a3e9309 ends only a session of the same directory: the second fit's end killed the first fit's
    # still-live services as "process(es) the run
    # left behind"; the third fit then waited stop_grace_secs (120 s) for the first session's commit, and
    # began the interrupted epoch again ([1, 2, 3])
    import keras

    import procsv.keras

    theirs, _ = _three_fits(keras.callbacks.BackupAndRestore, str(tmp_path / "ka"), str(tmp_path / "kb"))
    ours, secs = _three_fits(procsv.keras.BackupAndRestore, str(tmp_path / "pa"), str(tmp_path / "pb"))
    assert theirs == [2, 3] and ours == theirs and secs < 60, (theirs, ours, secs)
