"""``fit`` again after a ``fit`` that raised, against Keras's own BackupAndRestore: the cases an attack found.

Variants of tests/test_keras_fit_again.py's program: the raise of TensorFlow's fault-tolerance migration
guide itself (``on_epoch_begin`` of a later epoch), a dataset of unknown cardinality (Keras's ``steps``
is None: whole_epochs cannot tell an epoch's end), and ``save_freq`` in batches.
"""

from __future__ import annotations

from typing import Any

import pytest

pytestmark = pytest.mark.slow


def _fit_twice(backup_cls: Any, backup_dir: str, where: str, unknown: bool,
               **backup_kw: Any) -> tuple[list[int], list[Any]]:
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
    model.fit(ds, epochs=4, callbacks=[backup, interrupt], verbose=0)
    return began, [w.numpy() for w in model.weights]


@pytest.mark.parametrize("where, unknown", [("epoch_begin", False), ("epoch_end", True), ("epoch_begin", True)],
                         ids=["guide-epoch-begin", "unknown-cardinality-epoch-end", "unknown-cardinality-epoch-begin"])
def test_fit_again_resumes_where_keras_resumes(tmp_path, where, unknown):
    import keras

    import procsv.keras

    theirs, keras_weights = _fit_twice(keras.callbacks.BackupAndRestore, str(tmp_path / "keras"), where, unknown)
    ours, weights = _fit_twice(procsv.keras.BackupAndRestore, str(tmp_path / "procsv"), where, unknown)
    same_weights = all(a.tobytes() == b.tobytes() for a, b in zip(weights, keras_weights))  # each epoch trained once
    # with an unknown cardinality, Keras's params["steps"] is None: whole_epochs kept the finished epoch's end
    # as a position inside it, and the second fit began the finished epoch again (its batches skipped, its
    # epoch-begin and epoch-end callbacks run a second time): [0, 1, 1, 2, 3]
    assert ours == theirs and same_weights, (theirs, ours, same_weights)


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
