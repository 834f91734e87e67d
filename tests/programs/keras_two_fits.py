"""Two ``fit`` calls in a row with one BackupAndRestore, the pattern of TensorFlow's multi-worker Keras
tutorial and fault-tolerance migration guide (fit, then fit more on another dataset), killed once in
the second: ``python keras_two_fits.py keras|procsv OUT [--kill-at EPOCH --marker FILE] [--backup DIR] [--logdir DIR]``.

``keras``: Keras' own ``keras.callbacks.BackupAndRestore(DIR)``; ``procsv``: ``procsv.keras.BackupAndRestore``
(``backup_dir=None`` under ``procsv launch``: the launch's logdir). Fit 1: 4 epochs of a 6-batch
dataset; fit 2: 4 epochs of an 8-batch one; both with validation data, so that a model's metrics hold
the validation values after each epoch. ``--kill-at EPOCH``: the program SIGKILLs itself at the end
of fit 2's batch 2 of ``EPOCH`` (from 0), once (``FILE`` is made first; a run that finds it kills
nothing), after a backup of a step of ``EPOCH`` is on disk (``--logdir``, the launch's: once procsv's
checkpoint of a step from the epoch's beginning to the kill's is committed there). procsv takes the
epoch-end save at its next step boundary, and one that comes while an earlier commit is in flight (a
slow commit, at load) at the first boundary after that commit's answer, with that later step's state:
a callback that blocks stops the boundaries. So the epoch's batches before the kill's wait for the
commit in flight (the previous epoch's beginning) and pause, to let the next boundary read its answer
and take the save, and the kill's waits for that save's commit, which goes on in the checkpoint
service; a wait that runs out (60 s) fails loudly: ``keras_two_fits: gave up ...`` on stderr, the
marker made, exit code 3, no kill.

Prints one line ``fit N began at epoch E`` (E: the first epoch its loop began, ``none`` if it trained
no epoch) and ``fit N losses [...]`` (its History's training loss per epoch) for each fit, and writes
the final weights to ``OUT`` (.npz).
"""

import os
import re
import signal
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

FIT1_BATCHES, FIT2_BATCHES, EPOCHS, BATCH = 6, 8, 4, 8
KILL_BATCH = 2  # the kill: at the end of fit 2's batch 2 of --kill-at's epoch
WAIT_SECS = 60.0  # a wait for procsv's commit that runs out fails loudly
PAUSE_SECS = 0.1  # procsv reads its checkpoint service's answers at a step boundary at most every 10 ms


def _data(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    x = np.random.default_rng(seed).normal(size=(n, 8)).astype(np.float32)
    return x, x[:, :4].argmax(axis=1).astype(np.int64)


def _committed(logdir: str) -> list[int]:
    """The steps of procsv's checkpoints committed in ``logdir`` (their manifests are there)."""
    found = re.compile(r"model\.ckpt-(\d+)\.json").fullmatch
    names = os.listdir(os.path.join(logdir, ".procsv", "checkpoints"))
    return [int(m.group(1)) for m in map(found, names) if m is not None]


def _wait_committed(logdir: str, lo: int, hi: int, marker: str) -> None:
    """Wait until procsv has a checkpoint of a step from ``lo`` to ``hi`` committed; after ``WAIT_SECS``
    fail loudly (the marker made: the restarted program kills nothing), never go on as if it were."""
    deadline = time.monotonic() + WAIT_SECS
    while not any(lo <= step <= hi for step in _committed(logdir)):
        if time.monotonic() > deadline:
            open(marker, "w").close()
            print(f"keras_two_fits: gave up after {WAIT_SECS:g} s waiting for procsv to commit a checkpoint of a "
                  f"step from {lo} to {hi} (committed: {sorted(_committed(logdir))}); not killing", file=sys.stderr,
                  flush=True)
            os._exit(3)
        time.sleep(0.05)


class Report(keras.callbacks.Callback):
    """Which epoch each fit began, and the SIGKILL of ``--kill-at``."""

    def __init__(self, fit: int, kill_at: int, marker: str, logdir: str) -> None:
        super().__init__()
        self.fit, self.kill_at, self.marker, self.logdir = fit, kill_at, marker, logdir
        self.began: object = "none"
        self.epoch = -1

    def on_epoch_begin(self, epoch: int, logs: object = None) -> None:
        self.epoch = epoch
        if self.began == "none":
            self.began = epoch

    def on_train_batch_end(self, batch: int, logs: object = None) -> None:
        if self.fit != 2 or batch > KILL_BATCH or self.kill_at < 0 or os.path.exists(self.marker):
            return
        if self.epoch != self.kill_at:
            return
        if self.logdir:  # procsv: a step of this epoch committed, the snapshot the kill must not lose
            begin = (FIT1_BATCHES + FIT2_BATCHES) * EPOCHS - FIT2_BATCHES * (EPOCHS - self.kill_at)
            if batch < KILL_BATCH:
                if not any(step >= begin for step in _committed(self.logdir)):  # the epoch-end save not yet taken:
                    # the commit it waits behind lands, and the next boundary reads its answer and takes the save
                    _wait_committed(self.logdir, begin - FIT2_BATCHES, begin + batch, self.marker)
                    time.sleep(PAUSE_SECS)
                return
            _wait_committed(self.logdir, begin, begin + batch + 1, self.marker)
        elif batch < KILL_BATCH:
            return
        open(self.marker, "w").close()
        os.kill(os.getpid(), signal.SIGKILL)


def main(argv: list[str]) -> int:
    side, out = argv[0], argv[1]
    kill_at = int(argv[argv.index("--kill-at") + 1]) if "--kill-at" in argv else -1
    marker = argv[argv.index("--marker") + 1] if "--marker" in argv else ""
    backup_dir = argv[argv.index("--backup") + 1] if "--backup" in argv else None
    logdir = argv[argv.index("--logdir") + 1] if "--logdir" in argv else ""
    save_freq = int(argv[argv.index("--save-freq") + 1]) if "--save-freq" in argv else "epoch"
    keras.utils.set_random_seed(0)
    tf.config.experimental.enable_op_determinism()
    if side == "keras":
        callback = keras.callbacks.BackupAndRestore(backup_dir=backup_dir, save_freq=save_freq)
    else:
        import procsv.keras

        callback = procsv.keras.BackupAndRestore(backup_dir=backup_dir, save_freq=save_freq)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(4)])
    model.compile(keras.optimizers.Adam(1e-2), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    for fit, batches, seed in ((1, FIT1_BATCHES, 1), (2, FIT2_BATCHES, 2)):
        x, y = _data(batches * BATCH, seed)
        val = _data(2 * BATCH, seed + 10)
        report = Report(fit, kill_at, marker, logdir)
        history = model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, validation_data=val,
                            callbacks=[callback, report], verbose=0)
        print(f"fit {fit} began at epoch {report.began}", flush=True)
        print(f"fit {fit} losses {[float(v) for v in history.history.get('loss', [])]}", flush=True)
    np.savez(out, *[w.numpy() for w in model.weights])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
