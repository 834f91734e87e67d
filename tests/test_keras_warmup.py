"""Keras' train step is traced and instantiated before the restore, without touching the run's input.

The program (``tests/programs/keras_warm.py``) runs a real ``fit`` under ``procsv launch``, and
reports how often Keras' ``multi_step_on_iterator`` was traced when the first batch began and in
all; its final weights are compared with those of the same fit without procsv, bit for bit (a
warm-up that made an iterator over the program's dataset would have moved its shuffle on). The
stand-in dataset is checked in-process with real TensorFlow.
"""

from __future__ import annotations

import os
import shutil
import signal

import keras
import numpy as np
import pytest
import tensorflow as tf
from keras.src.backend.tensorflow.trainer import TFEpochIterator

from conftest import PROGRAMS, REPO, finish, launch, lifecycle, quiet_env, wait_for
from pyfork import Running, start_python
from procsv.trainer.keras import step_warmup

PROGRAM = os.path.join(PROGRAMS, "keras_warm.py")


def _weights(path: str) -> list[np.ndarray]:
    with np.load(path) as data:
        return [data[f"arr_{i}"] for i in range(len(data.files))]


def _plain_fit(out_path: str, *args: str) -> Running:
    """The same fit without procsv, started beside the launch (its result is read after the launch's;
    forked from the fork server)."""
    return start_python([PROGRAM, out_path, "--no-callback", *args], env=quiet_env(), cwd=REPO)


class _PlainFit:
    """The plain fit both launches here are compared with (24 epochs, ``--slow --no-sleep``): started
    once, by whichever test first calls :meth:`start` at the moment it chose, and read by both."""

    def __init__(self, folder: str) -> None:
        self.path = os.path.join(folder, "plain.npz")
        self.proc: Running | None = None
        self.done: tuple[int, str, str] | None = None

    def start(self) -> None:
        if self.proc is None:
            self.proc = _plain_fit(self.path, "--slow", "--no-sleep")

    def result(self) -> tuple[int, str, str]:
        """(exit code, stdout, stderr) of the plain fit, waiting for it."""
        assert self.proc is not None, "the plain fit was never started"
        if self.done is None:
            got = self.proc.result(180)
            self.done = (got.returncode, got.stdout, got.stderr)
        return self.done


@pytest.fixture(scope="module")
def plain_fit():
    import tempfile

    folder = tempfile.mkdtemp(prefix="pt-", dir="/tmp")
    plain = _PlainFit(folder)
    try:
        yield plain
    finally:
        if plain.proc is not None and plain.done is None:
            plain.proc.kill()
            plain.proc.result(60)  # (ended by the kill)
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.slow
def test_the_train_step_is_traced_before_the_first_batch_once_and_the_fit_is_unchanged(short_tmp, plain_fit):
    # the launch's fit is the standby test's (24 epochs) without its 40 ms a batch, so one plain fit serves
    # both; its trainer is never replaced, so no hot standby is made to wait unused (--standby fork)
    plain_fit.start()
    out_path = os.path.join(short_tmp, "procsv.npz")
    code, out, err = finish(launch(os.path.join(short_tmp, "run"), out_path, "--slow", "--no-sleep",
                                   target=PROGRAM, opts=("--standby", "fork")), 180)
    pcode, pout, perr = plain_fit.result()
    assert pcode == 0, perr
    assert "traced before the first batch: 0" in pout  # plain Keras traces at its first batch
    assert code == 0, err
    assert "traced before the first batch: 1" in out, out
    assert "traced in all: 1" in out, out  # the first batch found the warm-up's trace: not traced again
    a, b = _weights(plain_fit.path), _weights(out_path)
    assert len(a) == len(b) and all(x.tobytes() == y.tobytes() for x, y in zip(a, b))


@pytest.mark.slow
def test_a_promoted_standby_ran_the_train_step_on_shadow_copies_and_the_fit_is_unchanged(short_tmp, plain_fit):
    """A hot standby runs Keras' step once on shadow copies of its variables (reading its stand-in
    iterator, never the input) before it waits; promoted mid-fit, its first batch finds the kernels
    made, and the final weights are still plain fit's, bit for bit."""
    logdir, out_path = os.path.join(short_tmp, "run"), os.path.join(short_tmp, "procsv.npz")
    proc = launch(logdir, out_path, "--slow", target=PROGRAM, opts=("--standby", "hot"))
    try:
        ready = wait_for(lambda: [e for e in lifecycle(logdir) if e["event"] == "standby_ready"], 120,
                         what="a ready standby")[0]
        first = [e for e in lifecycle(logdir) if e["event"] == "spawned" and e["role"] == "trainer"][0]
        os.kill(first["pid"], signal.SIGKILL)
        # the plain fit runs beside the promoted standby's rest of the fit (not before the standby is
        # ready, which must happen within the first trainer's fit), unless the test above started it:
        # the same 24 epochs, without the sleep, which changes no weight
        plain_fit.start()
    finally:
        code, out, err = finish(proc, 180)
    pcode, _, perr = plain_fit.result()
    assert pcode == 0, perr
    assert code == 0, err
    promoted = [e for e in lifecycle(logdir) if e["event"] == "spawned" and e.get("via") == "standby"]
    assert [e["pid"] for e in promoted] == [ready["pid"]]
    with open(os.path.join(logdir, "logs", "trainer.2.log")) as fh:
        log = fh.read()
    # the step fit runs under procsv: Keras' one_step_on_data with its batch kept (issue 41's rollback)
    assert "standby ran one_step_keeping_its_batch once on shadow copies of its variables" in log, log
    assert "traced in all: 1" in log, log  # traced in the standby, before it waited: never again
    a, b = _weights(plain_fit.path), _weights(out_path)
    assert len(a) == len(b) and all(x.tobytes() == y.tobytes() for x, y in zip(a, b))


@pytest.mark.parametrize("spec", [
    (tf.TensorSpec((None, 8), tf.float32), tf.TensorSpec((None,), tf.int64)),
    {"image": tf.TensorSpec((None, 4, 4, 3), tf.uint8), "mask": tf.TensorSpec((None, 4), tf.bool),
     "weight": tf.TensorSpec((), tf.float64)},
    (tf.TensorSpec((16, 8), tf.float32), tf.TensorSpec((16, None), tf.int32)),
], ids=["tuple", "dict", "fixed batch"])
def test_the_stand_in_dataset_has_exactly_the_element_spec_of_the_input(spec):
    stand_in = step_warmup._stand_in(spec)
    assert stand_in is not None and stand_in.element_spec == spec


@pytest.mark.parametrize("spec", [
    (tf.RaggedTensorSpec((None, None), tf.float32), tf.TensorSpec((None,), tf.int64)),
    (tf.TensorSpec((None,), tf.string),),
    (tf.TensorSpec(None, tf.float32),),
], ids=["ragged", "string", "unknown rank"])
def test_no_stand_in_for_elements_other_than_dense_numeric_tensors(spec):
    assert step_warmup._stand_in(spec) is None


def _compiled(run_eagerly: bool) -> keras.Model:
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(2)])
    model.compile("sgd", "mse", run_eagerly=run_eagerly)
    model.make_train_function()
    return model


def test_the_warm_up_is_keras_train_step_traced_with_an_iterator_not_over_the_input():
    x = np.zeros((32, 8), np.float32)
    dataset = tf.data.Dataset.from_tensor_slices((x, x[:, :2])).shuffle(32, seed=1).batch(8)
    it = TFEpochIterator(x=dataset, distribute_strategy=tf.distribute.get_strategy())
    model = _compiled(run_eagerly=False)
    warm = step_warmup.train_step_warm_up(model.train_function, it)
    assert warm is not None
    step, iterator = warm
    assert step is step_warmup.free_variables(model.train_function)["multi_step_on_iterator"]
    assert iterator.element_spec == dataset.element_spec
    assert float(tf.reduce_sum(next(iterator)[0])) == 0.0  # zeros of a stand-in, not the input's batch


def test_a_model_run_eagerly_has_nothing_to_warm_up():
    x = np.zeros((32, 8), np.float32)
    it = TFEpochIterator(x=tf.data.Dataset.from_tensor_slices((x, x[:, :2])).batch(8),
                         distribute_strategy=tf.distribute.get_strategy())
    assert step_warmup.train_step_warm_up(_compiled(run_eagerly=True).train_function, it) is None
