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
    assert list(states) == ["dropout.seed_generator"], states
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
