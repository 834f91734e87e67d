#!/usr/bin/env python3
"""Benchmark: what the bulk check of the kept losses costs the step boundary of a snapshot, by dtype.

Runs in one process, no procsv launch: a :class:`procsv.trainer.nonfinite.losses.LossWatch` keeps
``--steps`` device losses of ``--value`` (what a fast loop keeps between two in-memory snapshots,
10 s at 1,000 steps/s), then :meth:`check` runs; its wall time is measured, ``--repeats`` times per
case, the cases interleaved. ``f16_sum16`` is the baseline: float16 losses summed in float16 (the
running sum as merged with the ``charge`` branch), whose sum of 10,000 losses of 10 passes float16's
65504, so that every check read every value again; ``f16`` sums each chunk in float16 and adds it
in float32 (now); ``f32`` for scale. Correctness: every check of finite losses says None, and a
check of a window with one NaN (at step ``--steps`` // 2) finds exactly that step; exit 1 if not.
The last line: ``key=value`` (medians in ms, and the load).
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from typing import Any, Callable

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import tensorflow as tf  # noqa: E402

from procsv.trainer.nonfinite.losses import CHUNK, LossWatch  # noqa: E402


class Sum16(LossWatch):
    """The baseline: the running sum kept in the losses' own dtype (float16 here)."""

    def _compact(self, stack: bool = True) -> None:
        if not self.pending:
            return
        pad = CHUNK - len(self.pending)
        pending = self.pending + [self._zero(self.pending[-1].dtype)] * pad
        steps = self.steps + [self.steps[-1]] * pad
        total = self.total if self.total is not None else self._zero(pending[0].dtype)
        self.total = tf.raw_ops.AddN(inputs=pending + [total])
        self.chunks.append((steps, self._stack(pending) if stack else pending))
        self.pending, self.steps = [], []


def one(make: Callable[[], LossWatch], dtype: Any, steps: int, value: float, bad: int) -> tuple[float, bool]:
    watch = make()
    watch.warm()
    losses = [tf.constant(math.nan if step == bad else value, dtype) for step in range(steps)]
    for step, loss in enumerate(losses):
        watch.keep_step(step, loss)
    t = time.perf_counter()
    found = watch.check()
    took = (time.perf_counter() - t) * 1e3
    return took, found == (bad if bad >= 0 else None)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=10_000)
    p.add_argument("--value", type=float, default=10.0)
    p.add_argument("--repeats", type=int, default=7)
    args = p.parse_args()
    cases: dict[str, tuple[Callable[[], LossWatch], Any]] = {
        "f16_sum16": (lambda: Sum16(()), tf.float16),
        "f16": (lambda: LossWatch(()), tf.float16),
        "f32": (lambda: LossWatch(()), tf.float32),
    }
    times: dict[str, list[float]] = {name: [] for name in cases}
    ok = True
    for _ in range(args.repeats):
        for name, (make, dtype) in cases.items():
            took, right = one(make, dtype, args.steps, args.value, -1)
            times[name].append(took)
            ok = ok and right
    for name, (make, dtype) in cases.items():  # a NaN is still found, by each
        ok = ok and one(make, dtype, args.steps, args.value, args.steps // 2)[1]
    load = os.getloadavg()[0]
    print(f"{'case':<10} {'median ms':>10} {'min':>8} {'max':>8}   ({args.steps} losses of {args.value}, "
          f"{args.repeats} repeats, load {load:.1f})")
    for name, ts in times.items():
        print(f"{name:<10} {statistics.median(ts):>10.3f} {min(ts):>8.3f} {max(ts):>8.3f}")
    print(" ".join(f"{name}_ms={statistics.median(ts):.3f}" for name, ts in times.items()) + f" load={load:.1f} exact={int(ok)}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
