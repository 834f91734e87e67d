"""input_position.replay_epochs: a resumed fit's input is put back where the uninterrupted run had it.

In-process, with real Keras and tf.data: Keras' own epoch iterator (``TFEpochIterator``, what
``model.fit`` iterates) is run for some epochs, each batch drawn as the train function draws it;
another, over the same pipeline built afresh (as a restarted trainer builds it), is put back at
that epoch by ``replay_epochs``; the next epoch's batches must then be the same. Where the
pipeline's only state across epochs is its shuffles' seeds, no batch may be read to do it.
"""

from __future__ import annotations

import os
from typing import Any, Callable

import keras
import numpy as np
import pytest
import tensorflow as tf
from keras.src.backend.tensorflow.trainer import TFEpochIterator

from procsv.trainer.keras import input_position

N, BATCH, EPOCHS = 96, 8, 3
X = np.arange(N, dtype=np.float32)
Y = np.arange(N, dtype=np.int64)


def _slices() -> Any:
    return tf.data.Dataset.from_tensor_slices((X, Y))


SEEDS_ONLY: dict[str, Callable[[str], Any]] = {
    "shuffle, map, prefetch": lambda tmp: _slices().shuffle(N, seed=1).map(
        lambda a, b: (a * 2, b), num_parallel_calls=2).batch(BATCH).prefetch(2),
    "filter with a declared cardinality": lambda tmp: _slices().shuffle(N, seed=1).filter(
        lambda a, b: b % 3 > 0).apply(tf.data.experimental.assert_cardinality(64)).batch(BATCH),
    "cache in memory, then shuffle": lambda tmp: _slices().cache().shuffle(N, seed=1).batch(BATCH),
    "TFRecord files, shuffled": lambda tmp: tf.data.TFRecordDataset(_records(tmp)).map(
        lambda s: (tf.io.parse_tensor(s, tf.float32), tf.constant(0, tf.int64))).shuffle(N, seed=1).batch(BATCH)
        .apply(tf.data.experimental.assert_cardinality(N // BATCH)),
}

DRAWN: dict[str, tuple[Callable[[str], Any], str]] = {
    "a stateful random op in a map": (lambda tmp: _slices().shuffle(N, seed=1).map(
        lambda a, b: (a + tf.random.uniform(()), b)).batch(BATCH), "stateful op RandomUniform"),
    "a tf.random.Generator in a map": (lambda tmp: _augmented(), "stateful op"),
    "a filter of unknown size": (lambda tmp: _slices().shuffle(N, seed=1).filter(
        lambda a, b: b % 3 > 0).batch(BATCH), "number of batches is unknown"),
    "cache to a file": (lambda tmp: _slices().cache(os.path.join(tmp, "cache")).shuffle(N, seed=1).batch(BATCH),
                        "stateful op CacheDataset"),
    "NumPy arrays with shuffle=True": (lambda tmp: None, "stateful op RandomShuffle"),
}


def _augmented() -> Any:
    """Random noise from one generator for the whole run: its state moves on with every element read."""
    rng = tf.random.Generator.from_seed(1)
    return _slices().shuffle(N, seed=1).map(lambda a, b: (a + rng.uniform(()), b)).batch(BATCH)


def _records(tmp: str) -> list[str]:
    path = os.path.join(tmp, "x.tfrecord")
    if not os.path.exists(path):
        with tf.io.TFRecordWriter(path) as w:
            for v in X:
                w.write(tf.io.serialize_tensor(tf.constant(v)).numpy())
    return [path]


def _epoch_iterator(pipeline: Any) -> Any:
    """Keras' epoch iterator over a pipeline built now, after the seed fit's program sets."""
    keras.utils.set_random_seed(0)
    strategy = tf.distribute.get_strategy()
    dataset = pipeline()
    if dataset is None:  # NumPy arrays, shuffled by Keras
        return TFEpochIterator(x=X, y=Y, batch_size=BATCH, shuffle=True, distribute_strategy=strategy)
    return TFEpochIterator(x=dataset, distribute_strategy=strategy)


def _train_epoch(it: Any) -> list[list[float]]:
    """One epoch as fit runs it: the first tensor of every batch the train function draws."""
    out = []
    with it.catch_stop_iteration():
        for _, _, iterator in it:
            out.append(next(iterator)[0].numpy().tolist())
    return out


def _resumed(pipeline: Any) -> tuple[input_position.Replay, list[list[float]]]:
    it = _epoch_iterator(pipeline)
    replay = input_position.replay_epochs(input_position.FitInput(it, None, True, None, EPOCHS + 1), EPOCHS)
    return replay, _train_epoch(it)


def _uninterrupted(pipeline: Any) -> list[list[list[float]]]:
    it = _epoch_iterator(pipeline)
    return [_train_epoch(it) for _ in range(EPOCHS + 1)]


@pytest.mark.parametrize("name", sorted(SEEDS_ONLY))
def test_a_pipeline_whose_epochs_leave_only_shuffle_seeds_is_put_back_without_reading_a_batch(name, tmp_path):
    pipeline = lambda: SEEDS_ONLY[name](str(tmp_path))  # noqa: E731
    epochs = _uninterrupted(pipeline)
    assert epochs[EPOCHS] != epochs[EPOCHS - 1]  # reshuffled every epoch: the position matters
    replay, next_epoch = _resumed(pipeline)
    assert replay.draw_reason is None and replay.drawn == 0
    assert next_epoch == epochs[EPOCHS]


@pytest.mark.parametrize("name", sorted(DRAWN))
def test_a_pipeline_with_other_state_across_epochs_is_drawn_and_put_back_exactly(name, tmp_path):
    make, reason = DRAWN[name]
    pipeline = lambda: make(str(tmp_path / "resumed"))  # noqa: E731
    os.makedirs(tmp_path / "resumed")
    os.makedirs(tmp_path / "plain")
    epochs = _uninterrupted(lambda: make(str(tmp_path / "plain")))
    replay, next_epoch = _resumed(pipeline)
    assert replay.draw_reason is not None and reason in replay.draw_reason
    assert replay.drawn == sum(len(e) for e in epochs[:EPOCHS])
    assert next_epoch == epochs[EPOCHS]


def test_a_replay_that_draws_reports_as_it_goes_and_one_that_does_not_never_reports():
    reports: list[float] = []
    it = _epoch_iterator(lambda: DRAWN["a filter of unknown size"][0](""))
    input_position.replay_epochs(input_position.FitInput(it, None, True, None, EPOCHS + 1), EPOCHS,
                              report=lambda: reports.append(1.0), report_every=0.0)
    assert len(reports) == EPOCHS * 8  # a report after every batch drawn: 64 examples, 8 batches an epoch
    reports.clear()
    ticks = iter(range(10_000))  # a clock that moves 1 s each time it is read
    it = _epoch_iterator(lambda: DRAWN["a filter of unknown size"][0](""))
    input_position.replay_epochs(input_position.FitInput(it, None, True, None, EPOCHS + 1), EPOCHS,
                              report=lambda: reports.append(1.0), report_every=5.0, clock=lambda: float(next(ticks)))
    # the clock reads 0 at the start and 1, 3, 4, 5, 6, 7, 9, ... after the 24 batches (once more after a
    # report): reported after the first batch, then whenever 5 s passed since: batches 1, 6, 11, 16 and 21
    assert len(reports) == 5
    reports.clear()
    it = _epoch_iterator(lambda: SEEDS_ONLY["shuffle, map, prefetch"](""))
    input_position.replay_epochs(input_position.FitInput(it, None, True, None, EPOCHS + 1), EPOCHS,
                              report=lambda: reports.append(1.0), report_every=0.0)
    assert reports == []


def test_not_drawing_a_pipeline_with_a_random_generator_in_a_map_would_change_its_batches(monkeypatch):
    """Why such a pipeline is drawn: made to skip the reads, its next epoch is not the uninterrupted one."""
    epochs = _uninterrupted(_augmented)
    pipeline = _augmented
    monkeypatch.setattr(input_position, "draw_reason", lambda inp: None)
    replay, next_epoch = _resumed(pipeline)
    assert replay.drawn == 0
    assert next_epoch != epochs[EPOCHS]


def test_steps_per_epoch_set_continues_one_iterator_across_epochs_so_it_is_drawn():
    def pipeline() -> Any:
        return _slices().shuffle(N, seed=1).batch(BATCH).repeat()

    keras.utils.set_random_seed(0)
    plain = TFEpochIterator(x=pipeline(), steps_per_epoch=5, distribute_strategy=tf.distribute.get_strategy())
    epochs = [_train_epoch(plain) for _ in range(EPOCHS + 1)]
    keras.utils.set_random_seed(0)
    it = TFEpochIterator(x=pipeline(), steps_per_epoch=5, distribute_strategy=tf.distribute.get_strategy())
    replay = input_position.replay_epochs(input_position.FitInput(it, None, True, 5, EPOCHS + 1), EPOCHS)
    assert replay.draw_reason is not None and "steps_per_epoch" in replay.draw_reason
    assert replay.drawn == 5 * EPOCHS
    assert _train_epoch(it) == epochs[EPOCHS]
