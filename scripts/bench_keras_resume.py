#!/usr/bin/env python3
"""Benchmark: how long a resumed Keras ``fit`` takes to get back to training: its input, its first batch.

(a) Putting the input back at the interrupted epoch.

A resumed ``fit`` (``procsv.keras.BackupAndRestore``) must start the interrupted epoch with its
input where the uninterrupted run had it: each epoch's seeded shuffle reshuffles. Two ways, side
by side on the same pipeline, in this process, with Keras' own epoch iterator (what ``fit`` runs):

- **drawn**: every batch of the earlier epochs is read again and thrown away (what procsv did for
  every input before; what it still does where the pipeline holds other state across epochs);
- **seeds only**: each earlier epoch's iterator is made and nothing read
  (:func:`procsv.trainer.keras.input_position.replay_epochs` on a pipeline whose only state across epochs is
  its shuffles' seeds).

The pipeline is a typical one: TFRecord files of serialized 32x32x3 images, parsed and normalized
in a parallel map, a seeded ``shuffle(..., reshuffle_each_iteration=True)``, batches of 64, prefetch,
its size declared with ``assert_cardinality``. For each count of earlier epochs, ``--repeats``
runs of each way, interleaved, each on a pipeline built afresh (as a restarted trainer builds it);
the figure is the median and the spread is printed beside it. Correctness check: after either way,
the next epoch's batches must be those of an uninterrupted run (checked once per count, on every
batch); the script exits non-zero if not.

(b) The first batch after the restore: Keras traces and instantiates its train step there (plain
Keras, and procsv before this benchmark's change) against procsv's warm-up, which did both before
the restore (``procsv.trainer.keras.step_warmup`` and ``Supervisor.warm_up``'s cancelled call: in a hot
standby, before it waits). Each sample is a freshly built model (the MLP of ``bench_keras.py`` on
these images, fed from memory so that no file is read in the batch timed) whose first
``train_function`` call is timed, the two ways alternating, after one
unmeasured round that pays TensorFlow's one-time costs; ``--repeats`` samples of each. Correctness
check: the warmed-up train step is traced exactly once (its first batch found the trace).

Prints the tables, then one line (for (a), the largest count):
``replay_epochs=<n> replay_drawn_s=<x> replay_seeds_s=<x> speedup=<x> first_batch_plain_s=<x>
first_batch_warm_s=<x> exact=<0|1>``
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from typing import Any, Callable

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
HERE = os.path.abspath(__file__)
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from keras.src.backend.tensorflow.trainer import TFEpochIterator  # noqa: E402

from procsv.trainer.keras import input_position
from procsv.trainer.keras import step_warmup
from procsv.trainer.standby import warmup  # noqa: E402

BATCH = 64


def write_records(folder: str, examples: int, shards: int = 4) -> list[str]:
    rng = np.random.default_rng(0)
    paths = [os.path.join(folder, f"train-{i:02d}.tfrecord") for i in range(shards)]
    writers = [tf.io.TFRecordWriter(p) for p in paths]
    for i in range(examples):
        image = rng.integers(0, 256, size=(32, 32, 3), dtype=np.uint8)
        feature = {"image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[image.tobytes()])),
                   "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(i % 10)]))}
        writers[i % shards].write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
    for w in writers:
        w.close()
    return paths


def pipeline(paths: list[str], examples: int) -> Any:
    spec = {"image": tf.io.FixedLenFeature([], tf.string), "label": tf.io.FixedLenFeature([], tf.int64)}

    def parse(record: Any) -> Any:
        ex = tf.io.parse_single_example(record, spec)
        image = tf.reshape(tf.io.decode_raw(ex["image"], tf.uint8), (32, 32, 3))
        return tf.cast(image, tf.float32) / 255.0, ex["label"]

    ds = tf.data.TFRecordDataset(paths).map(parse, num_parallel_calls=2)
    ds = ds.shuffle(10_000, seed=1, reshuffle_each_iteration=True).batch(BATCH)
    return ds.apply(tf.data.experimental.assert_cardinality(-(-examples // BATCH))).prefetch(2)


def epoch_iterator(make: Callable[[], Any]) -> Any:
    keras.utils.set_random_seed(0)
    return TFEpochIterator(x=make(), distribute_strategy=tf.distribute.get_strategy())


def next_epoch(it: Any) -> list[bytes]:
    """The next epoch as fit reads it: the bytes of every batch's images."""
    out = []
    with it.catch_stop_iteration():
        for _, _, iterator in it:
            out.append(next(iterator)[0].numpy().tobytes())
    return out


def replay(make: Callable[[], Any], epochs: int, drawn: bool) -> tuple[float, Any, input_position.Replay]:
    it = epoch_iterator(make)
    real = input_position.draw_reason
    if drawn:  # the same code, told that every batch must be read
        input_position.draw_reason = lambda inp: "drawn (the baseline)"  # type: ignore[assignment]
    try:
        t0 = time.perf_counter()
        result = input_position.replay_epochs(input_position.FitInput(it, None, True, None, epochs + 1), epochs)
        secs = time.perf_counter() - t0
    finally:
        input_position.draw_reason = real  # type: ignore[assignment]
    return secs, it, result


def first_batch(make: Callable[[], Any], warm: bool) -> tuple[float, int]:
    """Seconds of the first ``train_function`` call of a model built now (after procsv's warm-up
    of its train step if ``warm``), and how often that step was traced in all."""
    model = keras.Sequential([keras.Input((32, 32, 3)), keras.layers.Flatten(),
                              keras.layers.Dense(1024, activation="relu"), keras.layers.Dense(1024, activation="relu"),
                              keras.layers.Dense(10)])
    model.compile(optimizer=keras.optimizers.Adam(1e-4),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    it = epoch_iterator(make)
    model.make_train_function()
    step = step_warmup.free_variables(model.train_function)["multi_step_on_iterator"]
    if warm:
        found = step_warmup.train_step_warm_up(model.train_function, it)
        assert found is not None
        warmup.trace_and_instantiate(found[0], (found[1],), {}, instantiate_too=True)
    with it.catch_stop_iteration():
        for _, _, iterator in it:
            t0 = time.perf_counter()
            model.train_function(iterator)
            secs = time.perf_counter() - t0
            break
    return secs, int(step.experimental_get_tracing_count())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=8192)
    ap.add_argument("--epochs", default="2,8,32", help="counts of earlier epochs to put back (comma-separated)")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    counts = [int(c) for c in args.epochs.split(",")]
    rows = []
    exact_all = True
    with tempfile.TemporaryDirectory(prefix="bench-keras-resume-") as folder:
        paths = write_records(folder, args.examples)
        make = lambda: pipeline(paths, args.examples)  # noqa: E731
        for count in counts:
            plain = epoch_iterator(make)
            for _ in range(count):
                next_epoch(plain)
            expected = next_epoch(plain)
            times: dict[bool, list[float]] = {True: [], False: []}
            exact = True
            for r in range(args.repeats):
                for drawn in (True, False):
                    secs, it, result = replay(make, count, drawn)
                    times[drawn].append(secs)
                    if drawn != (result.draw_reason is not None) or (not drawn and result.drawn):
                        print(f"bench_keras_resume: seeds-only replay drew {result.drawn} batches "
                              f"({result.draw_reason})", file=sys.stderr)
                        exact = False
                    if r == 0 and next_epoch(it) != expected:
                        print(f"bench_keras_resume: after {count} epochs put back "
                              f"{'drawn' if drawn else 'by seeds'}, the next epoch differs", file=sys.stderr)
                        exact = False
            exact_all &= exact
            rows.append((count, times[True], times[False], exact))
        images = np.random.default_rng(1).random((512, 32, 32, 3), dtype=np.float32)
        labels = np.arange(512, dtype=np.int64) % 10
        in_memory = lambda: tf.data.Dataset.from_tensor_slices((images, labels)).batch(BATCH)  # noqa: E731
        first: dict[bool, list[float]] = {False: [], True: []}
        for r in range(args.repeats + 1):
            for warm in (False, True):
                secs, traces = first_batch(in_memory, warm)
                if traces != 1:
                    print(f"bench_keras_resume: the train step was traced {traces} times "
                          f"({'warmed up' if warm else 'plain'})", file=sys.stderr)
                    exact_all = False
                if r > 0:  # the first round pays TensorFlow's one-time costs
                    first[warm].append(secs)
    print(f"{'earlier epochs':>14} {'drawn (s)':>20} {'seeds only (s)':>24} {'speedup':>8} {'next epoch exact':>17}")
    for count, drawn_t, seeds_t, exact in rows:
        d, s = statistics.median(drawn_t), statistics.median(seeds_t)
        print(f"{count:>14} {d:>8.3f} ({min(drawn_t):.3f}..{max(drawn_t):.3f}) "
              f"{s:>10.4f} ({min(seeds_t):.4f}..{max(seeds_t):.4f}) {d / s:>8.0f} {str(exact):>17}")
    print(f"({args.examples} examples of 32x32x3 in TFRecord files, {-(-args.examples // BATCH)} batches an epoch; "
          f"medians of {args.repeats} runs, spread in brackets)")
    plain, warm = statistics.median(first[False]), statistics.median(first[True])
    print(f"\n{'first batch after the restore':<34} {'seconds (median, spread)':>26}")
    print(f"{'traced and instantiated there':<34} {plain:>8.3f} ({min(first[False]):.3f}..{max(first[False]):.3f})")
    print(f"{'warmed up before the restore':<34} {warm:>8.3f} ({min(first[True]):.3f}..{max(first[True]):.3f})")
    count, drawn_t, seeds_t, _ = rows[-1]
    d, s = statistics.median(drawn_t), statistics.median(seeds_t)
    print(f"replay_epochs={count} replay_drawn_s={d:.3f} replay_seeds_s={s:.4f} speedup={d / s:.0f} "
          f"first_batch_plain_s={plain:.3f} first_batch_warm_s={warm:.3f} exact={int(exact_all)}")
    return 0 if exact_all else 1


if __name__ == "__main__":
    sys.exit(main())
