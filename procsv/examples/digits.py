"""A real, small training job: an MLP on the 8x8 handwritten digits bundled with procsv (no download).

Run in the trainer process by ``procsv launch procsv.examples.digits --logdir DIR -- --steps N``,
or directly with ``python -m procsv.examples.digits --logdir DIR``. Deterministic given ``--seed``:
the batch of step ``s`` is a pure function of (seed, s), so a run resumed from a checkpoint at
step S takes exactly the batches an uninterrupted run would have taken after S.

A step returns ``{"loss": ..., "accuracy": ...}``: procsv watches the ``"loss"`` entry for NaN or
infinity (issue 41). ``--nan-at-steps`` poisons the batches of given steps with a NaN (for
``scripts/bench_nonfinite.py`` and trying ``--on-nonfinite``); ``--skip-steps`` is the plain run
that never applies given steps (their step function does nothing), which a run that rolled back
and skipped those steps ends bit-equal to.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any, Optional, Sequence

import numpy as np


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="procsv.examples.digits", description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=2000, help="total global steps (default 2000)")
    p.add_argument("--save-model-secs", type=float, default=10.0, help="checkpoint every N seconds (default 10)")
    p.add_argument("--save-checkpoint-steps", type=int, default=None, help="also checkpoint every N steps")
    p.add_argument("--save-summaries-secs", type=float, default=5.0, help="periodic summaries (default 5)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-every-steps", type=int, default=10, help="log loss/accuracy every N steps")
    p.add_argument("--log-in-graph", action="store_true",
                   help="log loss/accuracy inside train_step instead, at every step (written by the graph)")
    p.add_argument("--print-every-steps", type=int, default=250)
    p.add_argument("--step-delay", type=float, default=0.0, help="sleep this long per step (simulates a slower model)")
    p.add_argument("--strategy", choices=["default", "multiworker"], default="default",
                   help="multiworker: tf.distribute.MultiWorkerMirroredStrategy across the trainers of "
                        "`procsv launch --nproc N` (each takes its share of every global batch)")
    p.add_argument("--nan-at-steps", type=_steps, default=(), metavar="N,M,...",
                   help="a NaN in the input of these global steps (off by default)")
    p.add_argument("--skip-steps", type=_steps, default=(), metavar="N,M,...",
                   help="these global steps train on nothing (the run that never applied them)")
    p.add_argument("--logdir", default=None, help="only when run without `procsv launch`")
    args = p.parse_args(argv)
    if args.log_in_graph and args.strategy != "default":
        p.error("--log-in-graph works with --strategy default only (a replica's step cannot log inside the graph)")
    return args


def _steps(text: str) -> tuple[int, ...]:
    """``"30,70"`` as global steps (``argparse`` turns the ValueError into one usage line)."""
    steps = tuple(int(s) for s in text.split(",") if s.strip())
    if any(s < 1 for s in steps):
        raise ValueError(text)
    return steps


def load_data(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(x_train, y_train, x_test, y_test): the digits shuffled by ``seed``, a fifth held out.

    The data (``digits.npz`` beside this module, 45 KB) is the test part of the UCI "Optical
    Recognition of Handwritten Digits" set (E. Alpaydin and C. Kaynak, 1998; CC BY 4.0): 1797
    images of 8x8 pixels valued 0..16 and their labels, the same 1797 that scikit-learn bundles as
    ``load_digits``. It ships with procsv rather than through scikit-learn: with scikit-learn
    installed, ``import keras`` also imports it and SciPy (about 1 s and 60 MiB more for every
    fresh trainer and for the zygote, measured here).
    """
    import importlib.resources

    with importlib.resources.files("procsv.examples").joinpath("digits.npz").open("rb") as fh:
        with np.load(fh, allow_pickle=False) as data:
            x, y = data["x"], data["y"]
    x = (x / 16.0).astype(np.float32)
    y = y.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(x))
    x, y = x[order], y[order]
    n_test = len(x) // 5
    return x[n_test:], y[n_test:], x[:n_test], y[:n_test]


def batch_indices(seed: int, step: int, n: int, batch_size: int) -> np.ndarray:
    """The sampler: step ``step`` (1-based) always gets the same examples for a given seed."""
    return np.random.default_rng([seed, step]).integers(0, n, size=batch_size)


def build_model() -> tuple[Any, Any, Any]:
    """The 64-64-10 MLP, its Adam optimizer (slots created) and the loss: (model, optimizer, loss_fn)."""
    import keras

    model = keras.Sequential([
        keras.Input((64,)),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(10),
    ])
    optimizer = keras.optimizers.Adam(1e-3)
    optimizer.build(model.trainable_variables)
    return model, optimizer, keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def multiworker_step(strategy: Any, model: Any, optimizer: Any, global_batch: int) -> Any:
    """The train step under ``MultiWorkerMirroredStrategy``: each task's share of the global batch,
    gradients all-reduced; returns the global batch's ``{"loss": ..., "accuracy": ...}`` on every task
    (the ``"loss"`` entry is watched for NaN on every member, as a single trainer's is)."""
    import keras
    import tensorflow as tf

    per_example = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")

    def replica_step(x: Any, y: Any) -> tuple[Any, Any]:
        with tf.GradientTape() as tape:
            logits = model(x, training=True)
            loss = tf.nn.compute_average_loss(per_example(y, logits), global_batch_size=global_batch)
            # with oneDNN (TensorFlow's default on x86; TF_ENABLE_ONEDNN_OPTS=0 turns it off) relu turns a
            # NaN input into 0, so a poisoned batch (--nan-at-steps) left the loss finite and only the
            # weights NaN (a snapshot's scan then finds them, with no step to skip); this term is +0.0 for
            # a finite batch (the loss and its gradients bit for bit as without it) and NaN for a poisoned one
            loss += 0.0 * tf.reduce_sum(x)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        hits = tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, axis=1), y), tf.float32)) / global_batch
        return loss, hits

    @tf.function  # type: ignore[untyped-decorator]  # TensorFlow ships no type information
    def train_step(x: Any, y: Any) -> dict[str, Any]:
        loss, hits = strategy.run(replica_step, args=(x, y))
        return {"loss": strategy.reduce(tf.distribute.ReduceOp.SUM, loss, axis=None),
                "accuracy": strategy.reduce(tf.distribute.ReduceOp.SUM, hits, axis=None)}

    return train_step


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import tensorflow as tf

    import procsv

    tf.random.set_seed(args.seed)
    keras.utils.set_random_seed(args.seed)
    tf.config.experimental.enable_op_determinism()
    x_train, y_train, x_test, y_test = load_data(args.seed)

    if args.strategy == "multiworker":
        t_strategy = time.time()
        strategy = tf.distribute.MultiWorkerMirroredStrategy()  # reads the TF_CONFIG procsv launch --nproc set
        # its start-up (the group's collectives and coordination service) as this trainer saw it, in its log
        print(f"digits: MultiWorkerMirroredStrategy up at {time.time():.3f} in {time.time() - t_strategy:.3f} s",
              flush=True)
        with strategy.scope():
            model, optimizer, loss_fn = build_model()
        train_step = multiworker_step(strategy, model, optimizer, args.batch_size)
    else:
        model, optimizer, loss_fn = build_model()

        @tf.function  # type: ignore[untyped-decorator]  # TensorFlow ships no type information
        def train_step(x: tf.Tensor, y: tf.Tensor) -> dict[str, tf.Tensor]:
            with tf.GradientTape() as tape:
                logits = model(x, training=True)
                loss = loss_fn(y, logits)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            acc = tf.reduce_mean(tf.cast(tf.equal(tf.argmax(logits, axis=1), y), tf.float32))
            if args.log_in_graph:  # written by the graph at every call: nothing to read after the step
                sv.log_scalars({"loss": loss, "accuracy": acc}, step=optimizer.iterations)
            return {"loss": loss, "accuracy": acc}  # the "loss" entry is watched for NaN (issue 41)
    rank, nproc = procsv.cluster.rank(), procsv.cluster.nproc()

    def test_accuracy() -> float:
        logits = model(x_test, training=False)
        return float(np.mean(np.argmax(logits.numpy(), axis=1) == y_test))

    sv = procsv.Supervisor(
        logdir=args.logdir,
        checkpoint=tf.train.Checkpoint(model=model, optimizer=optimizer),
        save_model_secs=args.save_model_secs,
        save_checkpoint_steps=args.save_checkpoint_steps,
        save_summaries_secs=args.save_summaries_secs,
        summary_fn=lambda: {"test_accuracy": test_accuracy()},
    )
    # traced while a hot standby waits, so that a promoted one's first step does not pay for it
    shard = slice(rank, None, nproc) if args.strategy == "multiworker" else slice(None)  # this task's share
    sv.warm_up(train_step, x_train[:args.batch_size][shard], y_train[:args.batch_size][shard])

    def one_step() -> Any:
        """One step; inside it ``sv.step`` is the step being run, and its batch is a function of that
        step alone: a step run again after a rollback, or the one after a skipped step, takes its own."""
        s = sv.step
        if s in args.skip_steps:
            return None  # applies nothing; the global step moves past it
        idx = batch_indices(args.seed, s, len(x_train), args.batch_size)[shard]
        x = x_train[idx]
        if s in args.nan_at_steps:
            x = x.copy()
            x[0, 0] = np.nan  # a poisoned batch: the loss, the gradients and the update turn NaN
        return train_step(x, y_train[idx])

    t0, c0 = time.monotonic(), time.process_time()
    with sv.managed_session() as sess:
        traced_early = train_step.experimental_get_tracing_count()
        start = sv.step
        if start >= args.steps:
            print(f"digits: already trained to step {start} (--steps {args.steps}); nothing to do", flush=True)
        while not sv.should_stop() and sv.step < args.steps:
            out = sess.run(one_step)
            if out is None:
                continue  # a --skip-steps step
            loss, acc = (out["loss"], out["accuracy"]) if isinstance(out, dict) else out
            if args.step_delay:
                time.sleep(args.step_delay)
            step = sv.step
            if not args.log_in_graph and step % args.log_every_steps == 0:
                sv.log_scalars({"loss": loss, "accuracy": acc})
            if step % args.print_every_steps == 0 or step == args.steps:
                print(f"digits: step {step} loss {float(loss):.4f} batch accuracy {float(acc):.3f}", flush=True)
    if sv.step >= args.steps:
        print(f"digits: finished {args.steps} steps (this process ran {sv.step - start} of them in "
              f"{time.monotonic() - t0:.2f} s, {time.process_time() - c0:.2f} s of CPU, traced train_step {train_step.experimental_get_tracing_count()} "
              f"time(s), {traced_early} before its first step); test accuracy {test_accuracy():.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
