#!/usr/bin/env python3
"""Benchmark: the loss-spike judgement alone (``SpikeHistory.judge``, issue 68), on real and digits-like losses.

Runs in one process, no TensorFlow: ``.venv/bin/python scripts/bench_spike_judge.py [--against FILE]``.
Each stream of losses is fed to a :class:`~procsv.trainer.nonfinite.spike.SpikeHistory` ``--chunks``
losses at a time (a check before each in-memory snapshot: the digits benchmark's tier takes one every
~600 steps, a hot standby's every ~64) and each judgement is timed. Streams:

* ``npz64``, ``npz16``: the digits MLP's real losses of ``tests/spike_clean_losses.npz`` (5000 steps
  at batch 64 and 16; the second's late losses spread over a factor of ten);
* ``noisy``: digits-like, 20,000 steps: a decay from 2.3 to 0.005 with lognormal batch noise
  (sigma 0.7, as the batch-16 run's late losses), a 1000x spike every 2,000 steps (each must be found).

``--against FILE``: another version of ``procsv/trainer/nonfinite/spike.py`` (e.g. ``git show
main:procsv/trainer/nonfinite/spike.py > /tmp/spike_main.py``), loaded as a module of its own and
timed alternately with this tree's (A B B A ..., so that the machine's load cancels out in the
ratio); the spikes each finds must be equal (exit 1 if not). Prints, per stream and chunk, the
median ms per judgement over ``--repeats`` runs (each run's median) with the spread, then one line
``key=value``.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import time
from types import ModuleType
from typing import Any

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from procsv.trainer.nonfinite import spike  # noqa: E402


def streams() -> dict[str, np.ndarray]:
    """The loss streams, by name."""
    out: dict[str, np.ndarray] = {}
    with np.load(os.path.join(ROOT, "tests", "spike_clean_losses.npz")) as runs:
        out["npz64"] = runs["digits_seed0_batch64"].astype(np.float64)
        out["npz16"] = runs["digits_seed1_batch16"].astype(np.float64)
    rng = np.random.default_rng(0)
    t = np.arange(20_000)
    noisy = (0.005 + 2.3 * np.exp(-t / 400.0)) * np.exp(rng.normal(0.0, 0.7, t.size))
    noisy[1999::2000] *= 1000
    out["noisy"] = noisy
    return out


def load(path: str) -> ModuleType:
    """``path`` (a version of spike.py) as a module of its own."""
    spec = importlib.util.spec_from_file_location("spike_against", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules["spike_against"] = module  # (its dataclasses look their module up)
    spec.loader.exec_module(module)
    return module


def replay(module: Any, losses: np.ndarray, chunk: int) -> tuple[float, float, list[tuple[int, int, float]]]:
    """(the median ms per judgement, the total ms, the spikes found as (onset, step, threshold))."""
    history = module.SpikeHistory(module.SpikeThresholds())
    took: list[float] = []
    found: list[tuple[int, int, float]] = []
    for at in range(0, losses.size, chunk):
        history.feed(range(at + 1, at + 1 + losses[at:at + chunk].size), losses[at:at + chunk])
        t0 = time.perf_counter()
        spikes = history.judge()
        took.append(time.perf_counter() - t0)
        found += [(s.onset, s.step, s.threshold) for s in spikes]
    return statistics.median(took) * 1e3, sum(took) * 1e3, found


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--against", help="another spike.py to time alternately with this tree's")
    p.add_argument("--chunks", default="64,600", help="losses per judgement (comma-separated)")
    p.add_argument("--repeats", type=int, default=9)
    args = p.parse_args()
    variants: dict[str, Any] = {"this": spike}
    if args.against:
        variants = {"against": load(args.against), "this": spike}
    chunks = [int(c) for c in args.chunks.split(",")]
    data = streams()
    times: dict[tuple[str, str, int], list[float]] = {}
    found: dict[tuple[str, str, int], list[tuple[int, int, float]]] = {}
    for r in range(args.repeats):
        for name, losses in data.items():
            for chunk in chunks:
                order = list(variants) if r % 2 == 0 else list(reversed(variants))
                for v in order:
                    median, _, spikes = replay(variants[v], losses, chunk)
                    times.setdefault((v, name, chunk), []).append(median)
                    found[(v, name, chunk)] = spikes
    ok = True
    load_avg = os.getloadavg()[0]
    print(f"{'stream':<8}{'chunk':>6}" + "".join(f"{v + ' ms':>12}{'spread':>16}" for v in variants)
          + ("     ratio" if args.against else "") + f"   ({args.repeats} repeats, load {load_avg:.1f})")
    summary: dict[str, str] = {}
    for name in data:
        for chunk in chunks:
            line = f"{name:<8}{chunk:>6}"
            for v in variants:
                ts = times[(v, name, chunk)]
                line += f"{statistics.median(ts):>12.3f}{f'{min(ts):.3f}-{max(ts):.3f}':>16}"
                summary[f"{v}_{name}_{chunk}_ms"] = f"{statistics.median(ts):.3f}"
            if args.against:
                ratio = statistics.median(times[("this", name, chunk)]) / statistics.median(times[("against", name, chunk)])
                line += f"{ratio:>10.3f}"
                if found[("this", name, chunk)] != found[("against", name, chunk)]:
                    print(f"FAILED: {name} by {chunk}: the spikes found differ", file=sys.stderr)
                    ok = False
            spikes = found[("this", name, chunk)]
            expected = [s for s in range(2000, data[name].size + 1, 2000)] if name == "noisy" else []
            if [s for _, s, _ in spikes] != expected:
                print(f"FAILED: {name} by {chunk}: spikes at {[s for _, s, _ in spikes]}, not {expected}", file=sys.stderr)
                ok = False
            print(line)
    print(" ".join(f"{k}={v}" for k, v in summary.items()) + f" load={load_avg:.1f} exact={int(ok)}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
