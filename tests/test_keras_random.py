"""The state of a Keras layer's random numbers is saved and restored with a fit's checkpoint
(:func:`procsv.trainer.keras.restore_target.seed_states`, :class:`~procsv.trainer.keras.restore_target.WholeOrPosition`),
in-process with real Keras.

Keras 3 keeps a ``Dropout`` or ``GaussianNoise`` layer's ``SeedGenerator`` state among the layer's ``variables``, not
its weights, so ``tf.train.Checkpoint(model=...)`` saves none of it (the premise, asserted below). Measured (issue 71):
a seeded ``Dropout`` fit under ``procsv launch``, SIGKILLed once after its first checkpoint, ended with other weights
than a run never killed, and the audit switched itself off for such a program. The fit's checkpoint now holds the
states (``seeds/...``): ``tests/test_keras_fit.py``'s kills of the example, whose MLP has a ``Dropout`` layer, end
bit-identical to a plain fit.
"""

from __future__ import annotations

import gc
import logging

import keras
import tensorflow as tf

from procsv.trainer.keras.restore_target import WholeOrPosition, seed_states


class _Said(logging.Handler):
    """The messages TensorFlow's logger says."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_a_dropout_or_noise_layers_seed_state_even_nested_is_saved_and_restored_and_an_older_checkpoint_keeps_it(
        tmp_path) -> None:
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.Dropout(0.5, seed=1),
                              keras.layers.Dense(2)])
    saved = [name for name, _ in tf.train.list_variables(tf.train.Checkpoint(model=model).write(str(tmp_path / "c")))]
    assert not [name for name in saved if "seed" in name], saved  # (the premise: Keras' own checkpoint has none)
    states = seed_states(model)
    assert list(states) == ["_functional._operations.2.seed_generator"], states  # (where the layer sits)
    inner = keras.Sequential([keras.Input((4,)), keras.layers.GaussianNoise(0.1, name="noise")])
    assert len(seed_states(keras.Sequential([keras.Input((4,)), inner, keras.layers.Dense(1)]))) == 1
    assert seed_states(keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])) == {}

    (state,) = states.values()
    state.assign([5, 41])  # (as after 41 batches)
    path = tf.train.Checkpoint(model=model, seeds=tf.train.Checkpoint(**states)).save(str(tmp_path / "s"))
    assert any(name.startswith("seeds/") for name, _ in tf.train.list_variables(path))
    state.assign([0, 0])
    target = WholeOrPosition(tf.train.Checkpoint(model=model), tf.train.Checkpoint(), tf.train.Checkpoint(seeds=tf.train.Checkpoint(**states)))
    # the checkpoint's values that ``whole`` lacks (its seeds, the Supervisor's global_step) are restored by others:
    # no TensorFlow warning of "unrestored values" when the restore's status goes (was: one on every resume, auditor)
    tf_logger, said = logging.getLogger("tensorflow"), _Said()
    tf_logger.addHandler(said)
    try:
        target.restore(path)
        restored = list(state.numpy()), target.mismatch, target.unseeded
        target = WholeOrPosition(tf.train.Checkpoint(model=model), tf.train.Checkpoint(),
                                 tf.train.Checkpoint(seeds=tf.train.Checkpoint(**states)))  # (the one used goes)
        gc.collect()
    finally:
        tf_logger.removeHandler(said)
    assert restored == ([5, 41], None, False)
    assert not [m for m in said.messages if "unrestored values" in m], said.messages
    older = tf.train.Checkpoint(model=model).save(str(tmp_path / "old"))  # written before the seeds were saved
    state.assign([7, 7])
    target.restore(older)
    assert target.mismatch is None and target.unseeded and list(state.numpy()) == [7, 7]  # the whole state, said


def test_a_restarted_program_whose_layers_keras_names_otherwise_restores_each_state_into_its_own_layer(tmp_path) -> None:
    """A base model built and saved by the first run, loaded from its file by the restarted one, a ``Dropout`` head
    on it: the first run's layers are ``dropout`` (the base's) and ``dropout_1`` (the head's); the restarted run's
    are ``dropout`` both (a loaded layer keeps its name, Keras' count of names does not move). Keyed by the layers'
    names, the base's state was restored into the head's generator and the base's left as it was, unsaid
    (measured under ``procsv launch``: killed once, other weights than a plain fit's). A checkpoint whose states are
    another model's is said (``unmatched_seeds``)."""
    def model_on(base: keras.Model) -> keras.Model:
        return keras.Sequential([keras.Input((4,)), base, keras.layers.Dropout(0.2), keras.layers.Dense(2)])

    base = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.Dropout(0.3)])
    base.save(str(tmp_path / "base.keras"))
    first = model_on(base)
    again = model_on(keras.models.load_model(str(tmp_path / "base.keras")))  # (the restarted program's)
    named = [[layer.name for layer in m.layers[0].layers + m.layers[1:2]] for m in (first, again)]
    assert named[0] != named[1], named  # (the premise: Keras names them otherwise)
    states, restored = seed_states(first), seed_states(again)
    assert list(states) == list(restored) and len(states) == 2, (list(states), list(restored))
    for i, state in enumerate(states.values()):
        state.assign([i + 1, 10 * (i + 1)])
    path = tf.train.Checkpoint(model=first, seeds=tf.train.Checkpoint(**states)).save(str(tmp_path / "s"))
    target = WholeOrPosition(tf.train.Checkpoint(model=again), tf.train.Checkpoint(),
                             tf.train.Checkpoint(seeds=tf.train.Checkpoint(**restored)))
    target.restore(path)
    assert [list(v.numpy()) for v in restored.values()] == [[1, 10], [2, 20]]  # each into its own layer
    assert target.mismatch is None and not target.unseeded and not target.unmatched_seeds
    other = seed_states(keras.Sequential([keras.Input((4,)), keras.layers.GaussianNoise(0.1)]))  # another model's
    path = tf.train.Checkpoint(model=again, seeds=tf.train.Checkpoint(**other)).save(str(tmp_path / "o"))
    target.restore(path)
    assert target.mismatch is None and not target.unseeded and target.unmatched_seeds
