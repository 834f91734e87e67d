"""A tiny Keras ``fit`` whose input of given batches is NaN (issue 41), under procsv.keras.BackupAndRestore.

    --nan-at I          the input of batch I (counted over the whole fit from 0: epoch * --batches +
                        batch) is NaN (repeatable): its loss, gradients and, applied, the weights turn NaN
    --spike-at I        the input and target of batch I are scaled by 7 (repeatable): its loss jumps ~50x,
                        finite (a loss spike, issue 68)
    --transient-at I    the loss of batch I is scaled by 50 (its gradient too) the first time this process
                        computes a loss of that batch, not again (repeatable; a fault of the machine: a
                        replay computes it right)
    --noise N           the target's noise (a function of the batch too): its loss stays about N**2 / 2 from
                        batch to batch, as a real fit's does (default 0: it falls towards 0)
    --op-determinism    tf.config.experimental.enable_op_determinism() (a replay computes what the first run did)
    --on-spike P        BackupAndRestore(on_spike=P), with the spike rule's window 20 and min_history 15
    --zero-weight-at I  batch I has sample weight 0 (repeatable): with SGD (no momentum) a zero
                        gradient, so the plain run that never applied batch I (its iteration counted)
    --epochs E          epochs of --batches N batches each (steps_per_epoch=N over one stream of
                        E * N batches: batch I is the same input whichever epoch reads it)
    --save-freq K       BackupAndRestore(save_freq=K) (0: save_freq=False, no commit before fit's end)
    --rows R            rows per batch (default 8; 65536: 1.5 MiB a batch)
    --replay-memory-mib M  BackupAndRestore(replay_memory_bytes=M MiB)
    --keras-version V   keras.__version__ reads V in this process (a Keras the replay is not tested with)
    --rss               print "rss_mib first=F peak=P": VmRSS after the first batch, and its peak after any batch
    --mmap-threshold B  glibc's malloc serves every block of B bytes or more with mmap (``mallopt(M_MMAP_THRESHOLD,
                        B)`` at the program's start: the threshold pinned, as ``MALLOC_MMAP_THRESHOLD_=B`` in its
                        environment pins it, which a test's launch cannot pass without starting afresh, TensorFlow
                        imported again, rather than as a fork of its fork server)
    --batch-delay S     seconds each batch sleeps (a callback's on_train_batch_end)
    --terminate-on-nan  also keras.callbacks.TerminateOnNaN (it stops fit at a batch whose logs["loss"] is NaN)
    --kill-after I      (with --kill-file F) after fit's batch I (counted from 0 over the fit), unless F exists:
                        write this process's pid to F and wait (at most 120 s) to be killed
    --no-callback       a plain fit, without procsv
    --backup-dir D      BackupAndRestore(backup_dir=D) (for a plain `python keras_nan.py` run)
    --weights-out F     write the final weights and the optimizer's iteration count here (.npz)
    --times F           append "<step> <wall time>" to F at each computation of a batch's loss (replays too: the
                        batch told by its target; step = batch + 1, procsv's step of it): scripts/bench_spike.py
                        reads the course back (the loss's value is the same, bit for bit, as without it)

The input of batch I is a function of I alone, so a run is reproducible and its plain twin computable.
"""

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--nan-at", type=int, action="append", default=[])
p.add_argument("--spike-at", type=int, action="append", default=[])
p.add_argument("--transient-at", type=int, action="append", default=[])
p.add_argument("--on-spike", default=None)
p.add_argument("--noise", type=float, default=0.0)
p.add_argument("--op-determinism", action="store_true")
p.add_argument("--zero-weight-at", type=int, action="append", default=[])
p.add_argument("--epochs", type=int, default=3)
p.add_argument("--batches", type=int, default=10)
p.add_argument("--save-freq", type=int, default=5)
p.add_argument("--batch-delay", type=float, default=0.0)
p.add_argument("--rows", type=int, default=8)
p.add_argument("--replay-memory-mib", type=float, default=None)
p.add_argument("--keras-version", default=None)
p.add_argument("--rss", action="store_true")
p.add_argument("--mmap-threshold", type=int, default=None)
p.add_argument("--terminate-on-nan", action="store_true")
p.add_argument("--kill-after", type=int, default=None)
p.add_argument("--kill-file", default=None)
p.add_argument("--no-callback", action="store_true")
p.add_argument("--weights-out", default=None)
p.add_argument("--backup-dir", default=None)
p.add_argument("--times", default=None)
args = p.parse_args()
if args.mmap_threshold is not None:
    import ctypes

    M_MMAP_THRESHOLD = -3  # (malloc.h)
    assert ctypes.CDLL(None).mallopt(M_MMAP_THRESHOLD, args.mmap_threshold) == 1, "mallopt(M_MMAP_THRESHOLD) failed"

keras.utils.set_random_seed(0)
if args.op_determinism:
    tf.config.experimental.enable_op_determinism()
poisoned = tf.constant(args.nan_at + [-1], dtype=tf.int64)
zeroed = tf.constant(args.zero_weight_at + [-1], dtype=tf.int64)
spiked = tf.constant(args.spike_at + [-1], dtype=tf.int64)


def batch(i):  # type: ignore[no-untyped-def]
    rows = args.rows
    x = tf.reshape(tf.sin(tf.cast(i * rows * 4 + tf.range(rows * 4, dtype=tf.int64), tf.float32) * 0.37), [rows, 4])
    y = tf.reduce_sum(x, axis=1, keepdims=True) * 0.5 + 0.1
    if args.noise:
        y += args.noise * tf.reshape(tf.sin(tf.cast(i * rows + tf.range(rows, dtype=tf.int64), tf.float32) * 7.1), [rows, 1])
    scale = tf.where(tf.reduce_any(tf.equal(spiked, i)), 7.0, 1.0)
    x, y = x * scale, y * scale
    x = tf.where(tf.reduce_any(tf.equal(poisoned, i)), tf.fill([rows, 4], float("nan")), x)
    weight = tf.where(tf.reduce_any(tf.equal(zeroed, i)), tf.zeros([rows]), tf.ones([rows]))
    return x, y, weight


data = tf.data.Dataset.range(args.epochs * args.batches).map(batch)
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="tanh"), keras.layers.Dense(1)])
computed = tf.Variable(0, dtype=tf.int64, trainable=False)  # the losses this process computed (not saved)
transient = tf.constant(args.transient_at + [-1], dtype=tf.int64)


def loss(y_true, y_pred):  # type: ignore[no-untyped-def]  # mse; a --transient-at batch's first computation 50x
    n = computed.assign_add(1) - 1  # (batch n, when nothing was computed twice before it)
    return keras.losses.mean_squared_error(y_true, y_pred) * tf.where(tf.reduce_any(tf.equal(transient, n)), 50.0, 1.0)


def timed(base):  # type: ignore[no-untyped-def]  # --times: each computation of a batch's loss noted, with its time
    steps = {y.numpy().tobytes(): i + 1 for i, (_, y, _) in enumerate(data)}  # target -> step (fit's own pipeline)
    assert len(steps) == args.epochs * args.batches  # (every batch's target its own)
    out = open(args.times, "a", buffering=1)  # (line-buffered: a kill loses no whole line)

    def note(y_true):  # type: ignore[no-untyped-def]
        out.write(f"{steps.get(y_true.numpy().tobytes(), -1)} {time.time():.6f}\n")
        return np.int64(0)

    def timed_loss(y_true, y_pred):  # type: ignore[no-untyped-def]
        noted = tf.py_function(note, [y_true], tf.int64)
        with tf.control_dependencies([noted]):
            return tf.identity(base(y_true, y_pred))

    return timed_loss


chosen = loss if args.transient_at else "mse"
model.compile(keras.optimizers.SGD(0.05), timed(loss if args.transient_at else keras.losses.mean_squared_error)
              if args.times else chosen)


class Delay(keras.callbacks.Callback):  # type: ignore[misc]
    def on_train_batch_end(self, batch, logs=None):  # type: ignore[no-untyped-def]
        time.sleep(args.batch_delay)


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


class Rss(keras.callbacks.Callback):  # type: ignore[misc]
    first = peak = 0.0

    def on_train_batch_end(self, batch, logs=None):  # type: ignore[no-untyped-def]
        now = rss_mib()
        Rss.first = Rss.first or now
        Rss.peak = max(Rss.peak, now)


class KillPoint(keras.callbacks.Callback):  # type: ignore[misc]
    epoch = 0

    def on_epoch_begin(self, epoch, logs=None):  # type: ignore[no-untyped-def]
        KillPoint.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):  # type: ignore[no-untyped-def]
        if KillPoint.epoch * args.batches + batch != args.kill_after or os.path.exists(args.kill_file):
            return
        with open(args.kill_file + ".tmp", "w") as fh:
            fh.write(str(os.getpid()))
        os.replace(args.kill_file + ".tmp", args.kill_file)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            time.sleep(0.05)


if args.keras_version:
    keras.__version__ = args.keras_version
callbacks = [Delay()] if args.batch_delay else []
if args.rss:
    callbacks.append(Rss())
if args.terminate_on_nan:
    callbacks.append(keras.callbacks.TerminateOnNaN())
if args.kill_after is not None:
    callbacks.append(KillPoint())
if not args.no_callback:
    import procsv.keras

    import procsv

    capped = {} if args.replay_memory_mib is None else {"replay_memory_bytes": int(args.replay_memory_mib * 2**20)}
    spikes = {} if args.on_spike is None else {"on_spike": args.on_spike,
                                              "spike_thresholds": procsv.SpikeThresholds(window=20, min_history=15)}
    callbacks.append(procsv.keras.BackupAndRestore(args.backup_dir, save_freq=args.save_freq or False, **capped,
                                                   **spikes))
model.fit(data, epochs=args.epochs, steps_per_epoch=args.batches, callbacks=callbacks, verbose=0)
if args.weights_out:
    np.savez(args.weights_out, *model.get_weights(), np.asarray(model.optimizer.iterations.numpy()))
if args.rss:
    print(f"rss_mib first={Rss.first:.1f} peak={Rss.peak:.1f}", flush=True)
print(f"fit done: {int(model.optimizer.iterations.numpy())} iterations", flush=True)
