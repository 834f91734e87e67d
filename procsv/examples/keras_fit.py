"""Keras ``model.fit`` under procsv: the digits MLP, a ``tf.data`` pipeline, validation data.

Run in the trainer process by ``procsv launch procsv.examples.keras_fit --logdir DIR -- --epochs N``,
or directly with ``python -m procsv.examples.keras_fit --logdir DIR``. The only procsv line is the
callback: ``callbacks=[procsv.keras.BackupAndRestore(save_freq=...)]``. Kill it at any moment and
launch it again (or let ``procsv launch`` restart it): ``fit`` goes on at the next batch, and the
final weights are bit-for-bit those of a run that was never interrupted.

``--input`` picks how the data reaches ``fit``: ``tfdata`` (a seeded ``shuffle`` reshuffled every
epoch), ``numpy`` (arrays with ``fit(shuffle=True)``) or ``pydataset`` (a ``keras.utils.PyDataset``
whose per-epoch order is a pure function of the seed and the epoch).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any, Optional, Sequence

import numpy as np


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="procsv.examples.keras_fit", description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--input", choices=("tfdata", "numpy", "pydataset"), default="tfdata")
    p.add_argument("--save-freq", default="epoch", help="'epoch' or a number of batches (default epoch)")
    p.add_argument("--save-secs", type=float, default=None, help="also checkpoint every N seconds")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--hidden", type=int, default=64, help="units of the hidden layer (default 64)")
    p.add_argument("--dropout", type=float, default=0.2, help="dropout rate after the hidden layer (default 0.2; 0: "
                   "none)")
    p.add_argument("--delete-checkpoint", action="store_true", help="remove procsv's checkpoints when fit completes")
    p.add_argument("--batch-delay", type=float, default=0.0, help="sleep this long after each batch")
    p.add_argument("--unseeded", action="store_true", help="shuffle without a seed (a resume cannot be exact)")
    p.add_argument("--no-callback", action="store_true", help="plain fit, without procsv (for comparisons)")
    p.add_argument("--weights-out", default=None, help="write the final weights here (.npz)")
    p.add_argument("--logdir", default=None, help="only when run without `procsv launch`")
    return p.parse_args(argv)


def build_model(hidden: int, dropout: float = 0.2) -> Any:
    """The digits MLP as Keras' guides write it: a hidden layer, ``Dropout`` after it (random numbers drawn in
    training: a resume is exact only if their state is restored too), the logits."""
    import keras

    model = keras.Sequential([
        keras.Input((64,)),
        keras.layers.Dense(hidden, activation="relu"),
        *([keras.layers.Dropout(dropout)] if dropout else []),
        keras.layers.Dense(10),
    ])
    model.compile(optimizer=keras.optimizers.Adam(1e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    return model


def make_input(kind: str, x: np.ndarray, y: np.ndarray, batch_size: int, seed: int, unseeded: bool) -> dict[str, Any]:
    """The keyword arguments of ``fit`` that carry the training data."""
    import keras
    import tensorflow as tf

    if kind == "tfdata":
        ds = tf.data.Dataset.from_tensor_slices((x, y))
        ds = ds.shuffle(len(x), seed=None if unseeded else seed, reshuffle_each_iteration=True)
        return {"x": ds.batch(batch_size)}
    if kind == "numpy":
        return {"x": x, "y": y, "batch_size": batch_size, "shuffle": True}

    class Digits(keras.utils.PyDataset):  # type: ignore[misc]  # keras ships no type information
        """Batches in an order that is a pure function of (seed, epoch)."""

        def __init__(self) -> None:
            super().__init__()
            self.epoch = 0
            self.order = np.random.default_rng([seed, 0]).permutation(len(x))

        def __len__(self) -> int:
            return -(-len(x) // batch_size)

        def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
            idx = self.order[i * batch_size:(i + 1) * batch_size]
            return x[idx], y[idx]

        def on_epoch_end(self) -> None:
            self.epoch += 1
            self.order = np.random.default_rng([seed, self.epoch]).permutation(len(x))

    return {"x": Digits()}


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import tensorflow as tf

    from procsv.examples.digits import load_data

    if not args.unseeded:  # (op determinism refuses unseeded random ops, so it goes too)
        keras.utils.set_random_seed(args.seed)
        tf.config.experimental.enable_op_determinism()
    x_train, y_train, x_test, y_test = load_data(args.seed)
    model = build_model(args.hidden, args.dropout)
    callbacks: list[Any] = []
    if not args.no_callback:
        import procsv.keras

        save_freq: Any = args.save_freq if args.save_freq == "epoch" else int(args.save_freq)
        callbacks.append(procsv.keras.BackupAndRestore(backup_dir=args.logdir, save_freq=save_freq,
                                                       save_secs=args.save_secs,
                                                       delete_checkpoint=args.delete_checkpoint))
    if args.batch_delay:
        callbacks.append(keras.callbacks.LambdaCallback(on_train_batch_end=lambda b, logs: time.sleep(args.batch_delay)))
    t0 = time.monotonic()
    history = model.fit(**make_input(args.input, x_train, y_train, args.batch_size, args.seed, args.unseeded),
                        epochs=args.epochs, validation_data=(x_test, y_test), callbacks=callbacks, verbose=0)
    val = history.history.get("val_accuracy") or [float("nan")]
    print(f"keras_fit: fit returned after {time.monotonic() - t0:.1f} s; {len(history.history.get('loss', []))} "
          f"epoch(s) in this process; validation accuracy {val[-1]:.3f}", flush=True)
    if args.weights_out and not model.stop_training:  # only the weights of a completed fit
        tmp = args.weights_out + ".tmp.npz"
        np.savez(tmp, *[np.asarray(w) for w in model.weights])
        os.replace(tmp, args.weights_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
