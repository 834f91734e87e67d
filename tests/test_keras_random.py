"""A Keras layer that draws random numbers in training keeps their state where no checkpoint holds it
(:func:`procsv.trainer.keras.restore_target.unrestored_random`), in-process with real Keras.

Measured (issue 71): a seeded ``Dropout`` fit under ``procsv launch``, SIGKILLed once after its first
checkpoint, ends with other weights than a run never killed (Keras 3's ``SeedGenerator`` state is a variable
of the layer's ``variables``, not of what ``tf.train.Checkpoint(model=...)`` saves): so ``fit`` says at its start
that a resume will not be bit-exact, and the audit switches itself off for such a program.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from procsv.trainer.keras.restore_target import unrestored_random


def test_a_dropout_or_noise_layer_is_named_even_nested_and_its_seed_state_is_not_in_the_checkpoint(tmp_path) -> None:
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.Dropout(0.5, seed=1),
                              keras.layers.Dense(2)])
    assert unrestored_random(model) == ["dropout"]
    saved = [name for name, _ in tf.train.list_variables(tf.train.Checkpoint(model=model).write(str(tmp_path / "c")))]
    assert not [name for name in saved if "seed" in name], saved  # (the premise: what the name says)
    assert any("seed_generator_state" in v.path for v in model.variables)
    inner = keras.Sequential([keras.Input((4,)), keras.layers.GaussianNoise(0.1, name="noise")])
    assert unrestored_random(keras.Sequential([keras.Input((4,)), inner, keras.layers.Dense(1)])) == ["noise"]
    assert unrestored_random(keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])) == []
