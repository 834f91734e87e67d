"""TensorFlow's transfer-learning tutorial, tiny: freeze the base, fit, unfreeze it, compile a new optimizer,
fit more from ``initial_epoch=history.epoch[-1]``, one BackupAndRestore for both fits:
``python keras_finetune.py keras|procsv OUT [--backup DIR] [--kill-at EPOCH --marker FILE [--logdir DIR]] [--kill-between]``.

``--kill-at EPOCH``: the program SIGKILLs itself at the end of fit 2's epoch ``EPOCH`` once (``FILE`` is
made first; a run that finds it kills nothing), once the checkpoint of that epoch's beginning is on disk
(``--logdir DIR``, the launch's: its manifest there; at most 60 s).
``--kill-between``: the program SIGKILLs itself once (the same ``FILE``) after fit 1 returned, before fit 2.
Prints ``fit N epochs [...]`` (its History's epochs) for each fit; writes the final weights to ``OUT`` (.npz).
"""

import os
import signal
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402


BATCHES = 4  # an epoch's batches (32 samples, batch_size 8)
FIT1_EPOCHS = 3


class Kill(keras.callbacks.Callback):
    def __init__(self, at: int, marker: str, logdir: str) -> None:
        super().__init__()
        self.at, self.marker, self.logdir = at, marker, logdir

    def on_epoch_end(self, epoch: int, logs: object = None) -> None:
        if epoch == self.at and not os.path.exists(self.marker):
            if self.logdir:  # procsv: the snapshot of this epoch's beginning committed, the one the kill must not lose
                # (fit 1's epochs, then fit 2's from initial_epoch = FIT1_EPOCHS - 1 up to this one)
                step = BATCHES * (FIT1_EPOCHS + epoch - (FIT1_EPOCHS - 1))
                manifest = os.path.join(self.logdir, ".procsv", "checkpoints", f"model.ckpt-{step}.json")
                deadline = time.monotonic() + 60
                while not os.path.exists(manifest) and time.monotonic() < deadline:
                    time.sleep(0.05)
            open(self.marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)


def main(argv: list[str]) -> int:
    side, out = argv[0], argv[1]
    backup = argv[argv.index("--backup") + 1] if "--backup" in argv else None
    kill_at = int(argv[argv.index("--kill-at") + 1]) if "--kill-at" in argv else -1
    marker = argv[argv.index("--marker") + 1] if "--marker" in argv else ""
    logdir = argv[argv.index("--logdir") + 1] if "--logdir" in argv else ""
    keras.utils.set_random_seed(0)
    tf.config.experimental.enable_op_determinism()
    x = np.random.default_rng(0).normal(size=(32, 8)).astype(np.float32)
    y = x[:, :4].argmax(axis=1)
    if side == "keras":
        callback = keras.callbacks.BackupAndRestore(backup_dir=backup)
    else:
        import procsv.keras

        callback = procsv.keras.BackupAndRestore(backup_dir=backup)
    base = keras.layers.Dense(16, activation="relu", name="base")
    model = keras.Sequential([keras.Input((8,)), base, keras.layers.Dense(4, name="head")])
    base.trainable = False
    model.compile(keras.optimizers.Adam(1e-2), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = model.fit(x, y, batch_size=8, epochs=FIT1_EPOCHS, shuffle=False, callbacks=[callback], verbose=0)
    print(f"fit 1 epochs {history.epoch}", flush=True)
    if "--kill-between" in argv and not os.path.exists(marker):  # fit 1's final checkpoint committed as it returned
        open(marker, "w").close()
        os.kill(os.getpid(), signal.SIGKILL)
    base.trainable = True
    model.compile(keras.optimizers.RMSprop(1e-3), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    fine = model.fit(x, y, batch_size=8, epochs=6, initial_epoch=history.epoch[-1], shuffle=False,
                     callbacks=[callback, Kill(kill_at, marker, logdir)], verbose=0)
    print(f"fit 2 epochs {fine.epoch}", flush=True)
    np.savez(out, *[w.numpy() for w in model.weights])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
