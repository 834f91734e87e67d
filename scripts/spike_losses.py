"""Write ``tests/spike_clean_losses.npz``: long clean runs of real per-step losses, for the spike rule's tests.

Run by hand (``.venv/bin/python scripts/spike_losses.py``; about a minute of CPU): the digits MLP of
:mod:`procsv.examples.digits` (its data, sampler, model and Adam) trained for 5000 steps in a plain
loop, without procsv, at batch 64 with seed 0 and at batch 16 with seed 1 (the second's late losses
are small and spread over a factor of ten from batch to batch: the hardest clean run for a rule that
must not flag one). Each step's loss is stored as float32, in step order.
"""

from __future__ import annotations

import os
import sys

import numpy as np

OUT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "spike_clean_losses.npz")
RUNS = {"digits_seed0_batch64": (0, 64), "digits_seed1_batch16": (1, 16)}
STEPS = 5000


def losses(seed: int, batch_size: int, steps: int) -> np.ndarray:
    """The loss of each of ``steps`` steps of the digits MLP (seed ``seed``, batches of ``batch_size``)."""
    import keras
    import tensorflow as tf

    from procsv.examples.digits import batch_indices, build_model, load_data

    tf.random.set_seed(seed)
    keras.utils.set_random_seed(seed)
    x_train, y_train, _, _ = load_data(seed)
    model, optimizer, loss_fn = build_model()

    @tf.function  # type: ignore[untyped-decorator]  # TensorFlow ships no type information
    def step(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss

    out = [step(x_train[idx], y_train[idx]) for idx in
           (batch_indices(seed, s, len(x_train), batch_size) for s in range(1, steps + 1))]
    return np.array([float(v) for v in out], dtype=np.float32)


def main() -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    np.savez_compressed(OUT, **{name: losses(seed, size, STEPS) for name, (seed, size) in RUNS.items()})
    print(f"wrote {OUT}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
