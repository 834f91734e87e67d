"""Benchmark: the bare cost of supervision, the digits step under ``sess.run`` against no procsv at all.

Runs in one process (the "trainer") plus the checkpoint and summary services a plain ``python
train.py`` Supervisor starts: ``.venv/bin/python scripts/bench_supervision.py [--repeats 3]``.

The digits example's model and ``tf.function`` train step (``procsv.examples.digits``), with the
example's batches, called in short interleaved blocks (ABBA, so drift from other processes on
the machine cancels out in pairs):

* ``bare``: ``train_step(x, y)``, no procsv in the loop;
* ``procsv``: ``sess.run(train_step, x, y)`` inside ``Supervisor.managed_session()`` with
  no checkpoint in the timed blocks (``save_model_secs=10**6``: ``0`` would ask for no checkpoint
  at all, which turns the in-memory tier off too), summaries off (``save_summaries_secs=0``),
  nothing logged, once with the in-memory snapshot tier off (``PROCSV_MEMORY_SNAPSHOTS=0``: the bare
  cost of supervision, the goal's measurement) and once with it on (the default 0.01: the tier
  is budgeted at 1 % of the loop's time).

The Supervisor's clock (:class:`lockstep.TrainingClock`) stands still during the bare blocks: the
step boundary's timers (progress reports every 0.1 s, summary hand-offs, the tier's interval)
then fire as often per supervised step as in a loop of its own. On the wall clock, with a bare
block between every two supervised ones, each would fire at nearly every supervised block's
start and the supervised steps would pay for the bare blocks' time too: the boundary's periodic
work about twice as often as in a real loop, and with the tier on, about twice its budget. Many
short blocks (300 pairs of 50 steps, about 30 ms each), because this machine's speed drifts by
several percent within a second: an A/A check (bare against bare, in the same process) gave
medians within 0.1-0.8 % with 600 rounds of 50-step blocks, within 1-4 % with 32 of 1000 steps.

Throughput is steps per second; the ratio procsv / bare of each repeat is the median of the
per-pair ratios. Prints a table with the spread over the repeats, then one line:
``throughput_ratio=<x> throughput_ratio_tier=<x> step_ms_bare=<x> step_ms=<x>`` (medians over
repeats). Exits 1 if a correctness check fails: the supervised global step must equal the
``sess.run`` calls made, and with the tier on it must have taken in-memory snapshots.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench_summary import settle  # noqa: E402  # scripts/ is this script's folder, first on sys.path
from lockstep import TrainingClock  # noqa: E402


def series(tmp: str, tier: bool, blocks: int, block_steps: int, parts: Any) -> dict[str, Any]:
    """One ABBA series of bare and supervised blocks; returns the medians, the paired ratio and checks."""
    import tensorflow as tf

    import procsv

    x_train, y_train, train_step, model, optimizer, batch_indices = parts
    os.environ["PROCSV_MEMORY_SNAPSHOTS"] = "0.01" if tier else "0"
    logdir = tempfile.mkdtemp(dir=tmp)
    clock = TrainingClock()  # stands still during the bare blocks
    sv = procsv.Supervisor(logdir=logdir, checkpoint=tf.train.Checkpoint(model=model, optimizer=optimizer),
                           save_model_secs=10**6, save_summaries_secs=0, clock=clock)
    per: dict[bool, list[float]] = {True: [], False: []}
    runs = 0
    step = 0
    with sv.managed_session() as sess:
        settle()
        start = sv.step

        def block(supervised: bool) -> float:
            nonlocal step, runs
            if not supervised:
                clock.pause()
            t0 = time.perf_counter()
            for _ in range(block_steps):
                step += 1
                idx = batch_indices(0, step, len(x_train), 64)
                if supervised:
                    sess.run(train_step, x_train[idx], y_train[idx])
                    runs += 1
                else:
                    train_step(x_train[idx], y_train[idx])
            secs = time.perf_counter() - t0
            clock.resume()
            return secs / block_steps

        block(True), block(False)  # warm up both paths (the trace is shared)
        for k in range(blocks):
            for supervised in ((True, False) if k % 2 else (False, True)):
                per[supervised].append(block(supervised))
        advanced = sv.step - start
        taken = sv._keeper.agent.memory_taken if sv._keeper is not None else 0
    shutil.rmtree(logdir, ignore_errors=True)
    ratios = [bare / sup for bare, sup in zip(per[False], per[True])]  # throughput procsv / bare, per pair
    return {"bare": statistics.median(per[False]), "procsv": statistics.median(per[True]),
            "ratio": statistics.median(ratios), "runs": runs, "advanced": advanced, "taken": taken}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3, help="series per configuration (>= 3 for quoted figures)")
    p.add_argument("--blocks", type=int, default=300, help="ABBA block pairs per series")
    p.add_argument("--block-steps", type=int, default=50)
    args = p.parse_args()

    import tensorflow as tf

    from procsv.examples.digits import batch_indices, build_model, load_data

    tf.random.set_seed(0)
    x_train, y_train, _, _ = load_data(0)
    model, optimizer, loss_fn = build_model()

    @tf.function  # type: ignore[untyped-decorator]
    def train_step(x: tf.Tensor, y: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        with tf.GradientTape() as tape:
            logits = model(x, training=True)
            loss = loss_fn(y, logits)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        acc = tf.reduce_mean(tf.cast(tf.equal(tf.argmax(logits, axis=1), y), tf.float32))
        return loss, acc

    parts = (x_train, y_train, train_step, model, optimizer, batch_indices)
    tmp = tempfile.mkdtemp(prefix="bench-supervision-")
    results: dict[bool, list[dict[str, Any]]] = {False: [], True: []}
    try:
        for _ in range(args.repeats):
            for tier in (False, True):
                results[tier].append(series(tmp, tier, args.blocks, args.block_steps, parts))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    ok = True
    for tier, rs in results.items():
        for r in rs:
            if r["advanced"] != r["runs"]:
                print(f"FAILED: the global step advanced {r['advanced']} for {r['runs']} sess.run calls", file=sys.stderr)
                ok = False
            if tier and r["taken"] == 0:
                print("FAILED: the in-memory tier was on and took no snapshot", file=sys.stderr)
                ok = False

    def med(tier: bool, key: str) -> float:
        return float(statistics.median(r[key] for r in results[tier]))

    def spread(tier: bool, key: str, scale: float = 1.0, fmt: str = ".4f") -> str:
        vals = [r[key] * scale for r in results[tier]]
        return f"{min(vals):{fmt}}-{max(vals):{fmt}}"

    print(f"{'digits step, no logging, no checkpoints':<44}{'bare TF':>16}{'procsv sess.run':>18}"
          f"{'throughput ratio':>18}   spread over {args.repeats} repeats (ratio)")
    for tier, name in ((False, "supervision only (tier off)"), (True, "with the in-memory tier (default)")):
        print(f"{name:<44}{med(tier, 'bare') * 1e3:>13.3f} ms{med(tier, 'procsv') * 1e3:>15.3f} ms"
              f"{med(tier, 'ratio'):>18.4f}   {spread(tier, 'ratio')}")
    print(f"goal: throughput ratio >= 0.99 (supervision only); snapshots taken with the tier: "
          f"{', '.join(str(r['taken']) for r in results[True])}")
    print(f"throughput_ratio={med(False, 'ratio'):.4f} throughput_ratio_tier={med(True, 'ratio'):.4f} "
          f"step_ms_bare={med(False, 'bare') * 1e3:.3f} step_ms={med(False, 'procsv') * 1e3:.3f}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
