"""Benchmark: what an in-memory snapshot charges the step path, part by part (issue 54 point 5).

Runs in one process (the "trainer") plus the checkpoint and summary services a plain ``python
train.py`` Supervisor starts: ``.venv/bin/python scripts/bench_snapshot_charge.py [--secs 40]``.

The digits example's model and ``tf.function`` step (``procsv.examples.digits``), its loss
returned (and so watched for non-finite values) as under ``procsv launch``, with the in-memory
tier at its default budget (``PROCSV_MEMORY_SNAPSHOTS``, 0.01) and no disk checkpoint in the timed
loop (``save_model_secs=10**6``: ``0`` asks for no checkpoint at all, which turns the tier off too;
the stop's final checkpoint comes after it). ``PROCSV_ON_SPIKE=off`` gives the floor without the
spike judgement. The parts
of each in-memory snapshot are timed by wrapping, from this script, the functions that do them:

* ``sync``: the step counter's advances applied to the variable (``StepCounter.sync``);
* ``reuse_check``: whether the last walk of the object graph may be reused (``SnapshotStore.plan_reusable``);
* ``precheck``: the watched losses since the last snapshot, read once (``NonfiniteWatch.precheck``);
* ``spike``: of which the loss-spike judgement of the losses read (``SpikeHistory.judge``);
* ``copy``: the tensors into the slot (``snapshot.take``, with a fresh walk when one is made);
* ``verify``: the copy looked at for NaN/Inf (``NonfiniteWatch.verify``);
* ``hand_off``: the snapshot's message to the service (``TrainerChannels.send_snapshot``);
* ``snapshot``: the whole of ``MemoryTier.snapshot``;
* ``boundary``: the whole step boundary that took it, as the tier measured it;
* ``after``: the step after it beyond a typical step, and the reads made for its acknowledgment;
* ``charged``: what the tier charged itself for it (``memory_tier.snapshot_cost``: the two above).

Prints each part's median and 90th percentile in ms over the snapshots taken, then one line
``charged_ms=<x> snapshot_ms=<x> spike_ms=<x> snapshots=<n> step_ms=<x> load=<x>``; exits 1 when no
snapshot was taken (nothing was measured).
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any, Callable

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

TIMES: dict[str, list[float]] = {}


def timed(owner: Any, name: str, part: str) -> None:
    """Replace ``owner.name`` by a wrapper that records each call's duration under ``part``."""
    inner: Callable[..., Any] = getattr(owner, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            TIMES.setdefault(part, []).append(time.perf_counter() - t0)

    setattr(owner, name, wrapper)


def charged(owner: Any) -> None:
    """Record what ``memory_tier.snapshot_cost`` returns (the tier's charge per snapshot)."""
    inner = owner.snapshot_cost

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        cost = inner(*args, **kwargs)
        TIMES.setdefault("charged", []).append(cost)
        TIMES.setdefault("boundary", []).append(args[0].spent)
        TIMES.setdefault("after", []).append(cost - args[0].spent)
        return cost

    owner.snapshot_cost = wrapper


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--secs", type=float, default=40.0, help="seconds of training")
    args = p.parse_args()

    import tensorflow as tf

    import procsv
    from procsv.examples.digits import batch_indices, build_model, load_data
    from procsv.trainer import channels, step_boundary
    from procsv.trainer.checkpoint import memory, memory_tier, snapshot_store
    from procsv.trainer.nonfinite import spike, watch

    timed(step_boundary.StepCounter, "sync", "sync")
    timed(snapshot_store.SnapshotStore, "plan_reusable", "reuse_check")
    timed(watch.NonfiniteWatch, "precheck", "precheck")
    timed(spike.SpikeHistory, "judge", "spike")
    timed(snapshot_store, "take", "copy")
    timed(watch.NonfiniteWatch, "verify", "verify")
    timed(channels.TrainerChannels, "send_snapshot", "hand_off")
    timed(memory.MemoryTier, "snapshot", "snapshot")
    charged(memory_tier)

    tf.random.set_seed(0)
    x_train, y_train, _, _ = load_data(0)
    model, optimizer, loss_fn = build_model()

    @tf.function  # type: ignore[untyped-decorator]
    def train_step(x: tf.Tensor, y: tf.Tensor) -> dict[str, tf.Tensor]:
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return {"loss": loss}

    tmp = tempfile.mkdtemp(prefix="bench-charge-")
    steps = 0
    try:
        sv = procsv.Supervisor(logdir=tmp, checkpoint=tf.train.Checkpoint(model=model, optimizer=optimizer),
                               save_model_secs=10**6, save_summaries_secs=0)
        sv.warm_up(train_step, x_train[:64], y_train[:64])
        with sv.managed_session() as sess:
            t0 = time.perf_counter()
            end = t0 + args.secs
            while time.perf_counter() < end:
                idx = batch_indices(0, sv.step, len(x_train), 64)
                sess.run(train_step, x_train[idx], y_train[idx])
                steps += 1
            secs = time.perf_counter() - t0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    def q(values: list[float], at: float) -> float:
        ordered = sorted(values)
        return ordered[min(len(ordered) - 1, int(at * len(ordered)))]

    for part in ("sync", "reuse_check", "precheck", "spike", "copy", "verify", "hand_off", "snapshot", "boundary", "after", "charged"):
        values = TIMES.get(part, [])
        if values:
            print(f"{part:<12}{statistics.median(values) * 1e3:>9.3f} ms median{q(values, 0.9) * 1e3:>9.3f} ms p90"
                  f"{len(values):>7} calls")
    snaps = TIMES.get("snapshot", [])
    if not snaps:
        print("FAILED: the in-memory tier took no snapshot: nothing was measured", file=sys.stderr)
        return 1
    judged = TIMES.get("spike", [])
    costs = TIMES.get("charged") or [math.nan]
    print(f"charged_ms={statistics.median(costs) * 1e3:.3f} "
          f"snapshot_ms={statistics.median(snaps) * 1e3:.3f} "
          f"spike_ms={statistics.median(judged) * 1e3 if judged else 0.0:.3f} snapshots={len(snaps)} "
          f"step_ms={secs / max(1, steps) * 1e3:.3f} load={os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
