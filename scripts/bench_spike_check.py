#!/usr/bin/env python3
"""Benchmark: what loss-spike detection (``--on-spike``, issue 68) adds to the check before a snapshot.

Runs in one process, no procsv launch: a :class:`procsv.trainer.nonfinite.watch.NonfiniteWatch` keeps
``--steps`` float32 device losses (noisy real-looking values: a decay with lognormal noise) as a loop
keeps them between two snapshots, then its :meth:`precheck` runs (what the step boundary runs before
the snapshot's copy); its wall time is measured. Cases, interleaved, ``--repeats`` times each, every
one a watch that judged ``--history`` steps already (a trainer past its first window) and then
checks ``--checks`` windows of ``--steps`` losses in turn, its last check's time measured (a trainer
in its stride, not its first snapshots): ``off`` (``--on-spike off``: the bulk check alone, one read of
the losses' running sum), ``warn`` (the default: one read of the values, the rule over them). Also
the keeping itself, per step: ``keep_us`` (what the loop pays at each step, off and warn).
Correctness: no spike in the clean losses; one injected 50x spike is found at its step; exit 1 if not. The last line: ``key=value`` (medians, and the load).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import tensorflow as tf  # noqa: E402

from procsv.trainer.nonfinite.spike import OnSpike, Spike  # noqa: E402
from procsv.trainer.nonfinite.watch import NonfiniteWatch  # noqa: E402


def losses(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return ((2.0 + 6.0 / np.sqrt(np.arange(1, n + 1))) * np.exp(rng.normal(0, 0.05, n))).astype(np.float32)


def one(policy: OnSpike, history: int, steps: int, checks: int, values: np.ndarray) -> tuple[float, float, list[int]]:
    """(the last precheck's ms, the last window's keeping in us per step, the steps of the spikes found)."""
    found: list[Spike] = []
    watch = NonfiniteWatch(None, ("loss",), (), spike_policy=policy, spiked=lambda s, step: found.extend(s))
    watch.losses.warm()
    tensors = [tf.constant(v) for v in values]
    for s in range(history):  # the window judged already
        watch.losses.keep_step(s + 1, tensors[s])
    watch.precheck(history)
    took = keep = 0.0
    for c in range(checks):
        first = history + c * steps
        t = time.perf_counter()
        for s in range(first, first + steps):
            watch.losses.keep_step(s + 1, tensors[s])
        keep = (time.perf_counter() - t) / steps * 1e6
        t = time.perf_counter()
        watch.precheck(first + steps)
        took = (time.perf_counter() - t) * 1e3
    return took, keep, [s.step for s in found]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=600, help="losses kept between two snapshots (default 600)")
    p.add_argument("--history", type=int, default=200)
    p.add_argument("--checks", type=int, default=4)
    p.add_argument("--repeats", type=int, default=9)
    args = p.parse_args()
    clean = losses(args.history + args.steps * args.checks, 0)
    spiked = clean.copy()
    at = args.history + args.steps * args.checks - args.steps // 2
    spiked[at - 1] *= 50
    times: dict[str, list[float]] = {"off": [], "warn": []}
    keeps: dict[str, list[float]] = {"off": [], "warn": []}
    ok = True
    for _ in range(args.repeats):
        for name in times:
            took, keep, found = one(OnSpike(name), args.history, args.steps, args.checks, clean)
            times[name].append(took)
            keeps[name].append(keep)
            ok = ok and found == []
    ok = ok and one(OnSpike.WARN, args.history, args.steps, args.checks, spiked)[2] == [at]
    load = os.getloadavg()[0]
    print(f"{'case':<6} {'check ms':>9} {'min':>7} {'max':>7} {'keep us/step':>13}   ({args.steps} losses, "
          f"{args.repeats} repeats, load {load:.1f})")
    for name, ts in times.items():
        print(f"{name:<6} {statistics.median(ts):>9.3f} {min(ts):>7.3f} {max(ts):>7.3f} "
              f"{statistics.median(keeps[name]):>13.2f}")
    summary: dict[str, Any] = {f"{n}_ms": f"{statistics.median(ts):.3f}" for n, ts in times.items()}
    summary.update({f"{n}_keep_us": f"{statistics.median(ts):.2f}" for n, ts in keeps.items()})
    print(" ".join(f"{k}={v}" for k, v in summary.items()) + f" load={load:.1f} exact={int(ok)}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
