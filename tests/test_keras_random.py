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

import keras
import tensorflow as tf

from procsv.trainer.keras.restore_target import WholeOrPosition, seed_states


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
    whole = tf.train.Checkpoint(model=model)
    path = tf.train.Checkpoint(model=model, seeds=tf.train.Checkpoint(**states)).save(str(tmp_path / "s"))
    assert any(name.startswith("seeds/") for name, _ in tf.train.list_variables(path))
    state.assign([0, 0])
    target = WholeOrPosition(whole, tf.train.Checkpoint(), tf.train.Checkpoint(seeds=tf.train.Checkpoint(**states)))
    target.restore(path)
    assert list(state.numpy()) == [5, 41] and target.mismatch is None and not target.unseeded
    older = tf.train.Checkpoint(model=model).save(str(tmp_path / "old"))  # written before the seeds were saved
    state.assign([7, 7])
    target.restore(older)
    assert target.mismatch is None and target.unseeded and list(state.numpy()) == [7, 7]  # the whole state, said
