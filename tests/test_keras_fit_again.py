"""``fit`` again after an interrupted ``fit``, in one process (issue 67, point 3).

The pattern of TensorFlow's fault-tolerance migration guide: another callback raises at an epoch end,
the program catches it and calls ``fit`` again with a ``BackupAndRestore`` (the same object, or a new
one). Before, procsv kept the interrupted fit's services and the logdir's lock, and the second ``fit``
raised ``LogdirLocked`` naming the program's own pid. Now the second ``fit`` ends the first's session,
committing the position it reached, and resumes where Keras's own callback resumes. Run in the test's
process (plain python: procsv's two services start as child processes), against Keras's own
``keras.callbacks.BackupAndRestore`` in the same program: the guide's raise at an epoch's start, one at
an epoch's end, a dataset of unknown cardinality, and a fit of another directory in between (the last
three found by an attack). Also a fit after a completed fit (fit, then fit more on another dataset:
``tests/programs/keras_two_fits.py``), which before "resumed" the first.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest

from conftest import PROGRAMS, quiet_env, run_python

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


def _two_fits(side: str, folder: str, capsys: Any) -> tuple[list[str], list[Any]]:
    """``tests/programs/keras_two_fits.py`` run in this process with ``side``'s callback (no kill): the lines
    it printed of each fit (the epoch it began, its training losses) and its final weights."""
    import importlib.util
    import os

    import numpy as np

    from conftest import PROGRAMS

    spec = importlib.util.spec_from_file_location("keras_two_fits", os.path.join(PROGRAMS, "keras_two_fits.py"))
    assert spec is not None and spec.loader is not None
    program = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(program)
    capsys.readouterr()
    out = os.path.join(folder, f"{side}.npz")
    from tensorflow.python.framework import config as tf_config

    was = tf_config.is_op_determinism_enabled()
    try:
        assert program.main([side, out, "--backup", os.path.join(folder, side)]) == 0
    finally:  # (the program turns TensorFlow's op determinism on: process-wide, so off again for the worker's next tests)
        if not was:
            tf_config.disable_op_determinism()
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("fit ")]
    with np.load(out) as data:
        return lines, [data[f"arr_{i}"] for i in range(len(data.files))]


def test_a_fit_after_a_completed_fit_begins_at_its_first_epoch_and_logs_its_training_loss_as_kerass(
        short_tmp, capsys):
    # the multi-worker tutorial's pattern: fit, then fit more on another dataset, one callback. Before, the
    # second fit "resumed" the completed first ("fit resumes at epoch 4, batch 7" of its 8-batch epochs: the
    # first's 6 batches of its last epoch), trained 2 batches, and logged as its loss the first fit's
    # validation metrics mixed with them
    theirs, keras_weights = _two_fits("keras", short_tmp, capsys)
    ours, weights = _two_fits("procsv", short_tmp, capsys)
    assert [line for line in theirs if "began" in line] == ["fit 1 began at epoch 0", "fit 2 began at epoch 0"]
    assert ours == theirs  # the epoch each began, and the training loss of each epoch, equal
    assert all(a.tobytes() == b.tobytes() for a, b in zip(weights, keras_weights))


def test_a_fit_a_callback_ended_early_trains_nothing_when_the_restarted_program_runs_it_again(short_tmp, monkeypatch):
    # found by an attack: fit 1 ended by EarlyStopping at epoch 2 of 20, then fit 2, killed in its first epoch
    # (before its first checkpoint). Before, the final commit recorded epoch 2 (past the last epoch run), so the
    # restarted program's fit 1 resumed at epoch 3 of 20 and trained 2 more epochs (a fresh EarlyStopping's
    # patience), where the run without a kill (and Keras' own callback, which deleted its backup) trained none
    import keras
    import numpy as np

    import procsv.keras
    from procsv.trainer.keras import fit as keras_fit

    began: list[int] = []

    class Began(keras.callbacks.Callback):  # type: ignore[misc]
        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            began.append(epoch)

    def program() -> list[int]:
        began.clear()
        keras.utils.set_random_seed(0)
        x = np.random.default_rng(0).normal(size=(32, 8)).astype(np.float32)
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4)])
        model.compile(keras.optimizers.SGD(0.01), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        stop = keras.callbacks.EarlyStopping(monitor="loss", min_delta=100.0, patience=1)  # stops after epoch 2
        history = model.fit(x, x[:, :4].argmax(axis=1), batch_size=8, epochs=20, shuffle=False, verbose=0,
                            callbacks=[procsv.keras.BackupAndRestore(backup_dir=short_tmp), stop, Began()])
        return list(history.epoch)

    assert program() == [0, 1] and began == [0, 1]
    monkeypatch.setattr(keras_fit, "_COMPLETED", {})  # a restarted program: no fit of this process completed
    monkeypatch.setattr(keras_fit, "_HELD", set())
    program()
    assert began == []  # (its History lists its epochs, as a completed fit's after a restart: 0-19, not known to have
    # ended early)


def _completed_then_raised(backup_cls: Any, backup_dir: str) -> tuple[list[int], list[Any]]:
    """fit 2 epochs to the end; fit 4 more, which raises at the start of its epoch 3 (the migration guide's
    InterruptingCallback); catch, fit again. The epochs the fits began, and the weights."""
    import keras
    import numpy as np

    keras.utils.set_random_seed(0)
    x = np.random.default_rng(0).normal(size=(32, 8)).astype(np.float32)
    y = x[:, :4].argmax(axis=1)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4)])
    model.compile(keras.optimizers.SGD(0.1), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    began: list[int] = []

    class Interrupt(keras.callbacks.Callback):  # type: ignore[misc]
        armed = False

        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            began.append(epoch)
            if epoch == 2 and self.armed:
                self.armed = False
                raise RuntimeError("interrupted at the beginning of epoch 3")

    interrupt = Interrupt()
    model.fit(x, y, batch_size=8, epochs=2, shuffle=False, callbacks=[backup_cls(backup_dir=backup_dir), interrupt],
              verbose=0)
    interrupt.armed = True
    with pytest.raises(RuntimeError, match="interrupted"):
        model.fit(x, y, batch_size=8, epochs=4, shuffle=False, callbacks=[backup_cls(backup_dir=backup_dir), interrupt],
                  verbose=0)
    model.fit(x, y, batch_size=8, epochs=4, shuffle=False, callbacks=[backup_cls(backup_dir=backup_dir), interrupt],
              verbose=0)
    return began, [w.numpy() for w in model.weights]


def test_a_fit_that_raised_after_a_completed_fit_of_the_same_model_resumes_where_keras_resumes(tmp_path):
    # found by an attack: the fit again after the raise "continued from the model in memory, fit 1's end",
    # restored no position and began at epoch 0 ([0, 1, 0, 1, 0, 1, 2, 3]: fit 2's epochs 0 and 1 trained twice)
    import keras

    import procsv.keras

    theirs, keras_weights = _completed_then_raised(keras.callbacks.BackupAndRestore, str(tmp_path / "keras"))
    ours, weights = _completed_then_raised(procsv.keras.BackupAndRestore, str(tmp_path / "procsv"))
    assert theirs == [0, 1, 0, 1, 2, 2, 3] and ours == theirs, (theirs, ours)
    assert all(a.tobytes() == b.tobytes() for a, b in zip(weights, keras_weights))


FINETUNE = os.path.join(PROGRAMS, "keras_finetune.py")


def test_the_fine_tuning_tutorial_runs_its_second_fit_on_the_model_in_memory(short_tmp, finetune_keras):
    # freeze, fit, unfreeze, a new optimizer, fit more from history.epoch[-1]: before, the second fit restored
    # the first's checkpoint into the changed structure and raised MismatchedCheckpoint ("base/kernel")
    runs = {}
    for side in ("keras", "procsv"):
        if side == "keras":
            done, folder = finetune_keras
            out = os.path.join(folder, "keras.npz")
        else:
            out = os.path.join(short_tmp, f"{side}.npz")
            done = run_python([FINETUNE, side, out, "--backup", os.path.join(short_tmp, side)], env=quiet_env(),
                              timeout=120)
        assert done.returncode == 0, done.stderr
        lines = [line for line in done.stdout.splitlines() if line.startswith("fit ")]
        assert lines == ["fit 1 epochs [0, 1, 2]", "fit 2 epochs [2, 3, 4, 5]"], (side, done.stdout)
        with np.load(out) as data:
            runs[side] = [data[f"arr_{i}"] for i in range(len(data.files))]
    assert all(a.tobytes() == b.tobytes() for a, b in zip(runs["keras"], runs["procsv"]))  # as Keras' own


def test_the_fine_tuning_tutorial_killed_between_its_fits_runs_its_second_fit_after_the_restart(short_tmp,
                                                                                               finetune_keras):
    # found by an attack: SIGKILL after fit 1 returned (its final checkpoint committed), before fit 2's first
    # checkpoint. The rerun's fit 1 restored its own end and trained nothing, and its History was empty:
    # history.epoch[-1] raised IndexError at every restart (under procsv launch: a start-up crash loop)
    def run(side: str, *extra: str) -> Any:
        return run_python([FINETUNE, side, os.path.join(short_tmp, f"{side}.npz"), "--backup",
                           os.path.join(short_tmp, side), *extra], env=quiet_env(), timeout=120)

    plain, plain_folder = finetune_keras
    assert plain.returncode == 0, plain.stderr
    kill = ("--kill-between", "--marker", os.path.join(short_tmp, "killed"))
    assert run("procsv", *kill).returncode == -9
    again = run("procsv", *kill)
    assert again.returncode == 0, again.stderr
    lines = [line for line in again.stdout.splitlines() if line.startswith("fit ")]
    assert lines == ["fit 1 epochs [0, 1, 2]", "fit 2 epochs [2, 3, 4, 5]"], again.stdout
    with np.load(os.path.join(plain_folder, "keras.npz")) as theirs, np.load(os.path.join(short_tmp, "procsv.npz")) as ours:
        assert all(theirs[k].tobytes() == ours[k].tobytes() for k in theirs.files)  # the uninterrupted weights


def _other_models_after_a_completed_fit(backup_cls: Any, backup_dir: str) -> list[list[Any]]:
    """Model A fits to the end; a new model B fits with the same directory; then a model loaded from A's saved
    file fits too (programs that build a fresh model in a loop, or load one). Each model's weights after its fit."""
    import keras
    import numpy as np

    keras.utils.set_random_seed(0)
    x = np.random.default_rng(0).normal(size=(32, 8)).astype(np.float32)
    y = x[:, :4].argmax(axis=1)

    def build() -> Any:
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4)])
        model.compile(keras.optimizers.SGD(0.1), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model

    out = []
    a = build()
    a.fit(x, y, batch_size=8, epochs=2, shuffle=False, callbacks=[backup_cls(backup_dir=backup_dir)], verbose=0)
    out.append([w.numpy() for w in a.weights])
    saved = os.path.join(os.path.dirname(backup_dir), os.path.basename(backup_dir) + "-a.keras")
    a.save(saved)
    b = build()  # a fresh model: its own initial weights
    b.fit(x, y, batch_size=8, epochs=2, shuffle=False, callbacks=[backup_cls(backup_dir=backup_dir)], verbose=0)
    out.append([w.numpy() for w in b.weights])
    c = keras.models.load_model(saved)
    c.layers[0].kernel.assign(c.layers[0].kernel * 0.5)  # the program changes the loaded model before it fits it
    c.fit(x, y, batch_size=8, epochs=2, shuffle=False, callbacks=[backup_cls(backup_dir=backup_dir)], verbose=0)
    out.append([w.numpy() for w in c.weights])
    return out


def test_a_fit_of_another_model_after_a_completed_fit_begins_from_that_models_own_weights_as_under_keras(tmp_path):
    # found by an attack: the model in memory was keyed on the object, so a fresh model's fit (or a loaded one's)
    # restored the last fit's final state over its own weights; Keras's own callback deleted its backup at the
    # completed fit's end, and the next fit began from the model it was given
    import keras

    import procsv.keras

    theirs = _other_models_after_a_completed_fit(keras.callbacks.BackupAndRestore, str(tmp_path / "keras"))
    ours = _other_models_after_a_completed_fit(procsv.keras.BackupAndRestore, str(tmp_path / "procsv"))
    for model, (k, p) in enumerate(zip(theirs, ours)):
        assert all(a.tobytes() == b.tobytes() for a, b in zip(k, p)), f"model {'abc'[model]}"
