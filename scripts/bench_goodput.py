"""The goodput breakdown's cost: the quadratic one before issue 66 vs the linear one, side by side.

``.venv/bin/python scripts/bench_goodput.py [--runs 7] [--seed 66]``. Runs in one process, no
TensorFlow. For launches of 10, 100 and 1,000 trainer attempts (seeded: ``tests/goodput_oracle.py``'s
:func:`random_launch`, the launches the equivalence test compares on), it times
``procsv.goodput.breakdown`` (one pass) against the frozen copy of the one it replaced
(``tests/goodput_oracle.breakdown_quadratic``: a slice of the attempts after each attempt), prints
the median and min per call over ``--runs`` runs (each run repeats the call for >= 0.2 s) and the
ratio, checks on each launch that both give the same seconds to the bit, and ends with one
``key=value ...`` line. Exits 1 if any result differs.

The watchdog computes the breakdown of its live launch once per round at most (``status.json``, the
metrics snapshot, procsv's scalars and the live line share it), so the per-call time here is what a
round pays when one of them is due.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import timeit
from typing import Callable

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "tests"))

from goodput_oracle import breakdown_quadratic, random_launch  # noqa: E402
from procsv.goodput import breakdown  # noqa: E402

SIZES = (10, 100, 1000)


def per_call(fn: Callable[[], object], runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        timer = timeit.Timer(fn)
        n, _ = timer.autorange()
        out.append(timer.timeit(n) / n)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--runs", type=int, default=7)
    p.add_argument("--seed", type=int, default=66)
    args = p.parse_args()
    rng = random.Random(args.seed)
    print(f"{'attempts':>8} {'old median':>12} {'old min':>10} {'new median':>12} {'new min':>10} {'old/new':>8}  same")
    same_all = True
    keys = []
    for n in SIZES:
        launch, after = random_launch(rng, n)
        old, new = breakdown_quadratic(launch, after), breakdown(launch, after)
        same = old.secs == new.secs and old.wall == new.wall
        same_all &= same
        t_old = per_call(lambda: breakdown_quadratic(launch, after), args.runs)
        t_new = per_call(lambda: breakdown(launch, after), args.runs)
        m_old, m_new = statistics.median(t_old), statistics.median(t_new)
        print(f"{n:>8} {m_old * 1e6:>10.1f}us {min(t_old) * 1e6:>8.1f}us {m_new * 1e6:>10.1f}us "
              f"{min(t_new) * 1e6:>8.1f}us {m_old / m_new:>8.2f}  {'yes' if same else 'NO'}")
        keys += [f"old_us_{n}={m_old * 1e6:.1f}", f"new_us_{n}={m_new * 1e6:.1f}", f"ratio_{n}={m_old / m_new:.2f}"]
    print(" ".join(keys + [f"runs={args.runs}", f"seed={args.seed}", f"same={'yes' if same_all else 'no'}"]))
    return 0 if same_all else 1


if __name__ == "__main__":
    sys.exit(main())
