#!/usr/bin/env python3
"""Summarize a ``--cpu-log`` of the test suite (tests/cpu_profile.py): CPU seconds per file and the
costliest tests, against the wall time the suite needs on ``--cores`` cores (CPU / cores at best).

    python scripts/suite_cpu.py suite-cpu.jsonl [--top 40] [--cores 2] [--durations tests/durations.json]

``--durations FILE`` also writes the wall time of every test of at least 1 s (node id -> seconds), the
order the suite's xdist workers take the long tests in (tests/longest_first.py).

Ends with one ``key=value`` line. Runs anywhere (no procsv import)."""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("log")
    p.add_argument("--top", type=int, default=40)
    p.add_argument("--cores", type=int, default=2)
    p.add_argument("--durations", default=None, help="write {node id: wall seconds} of the tests of 1 s or more")
    a = p.parse_args(argv)
    rows = []
    with open(a.log) as fh:
        for line in fh:
            try:
                rows.append(json.loads(line))
            except ValueError:
                continue
    if not rows:
        print(f"suite_cpu: no test in {a.log}", file=sys.stderr)
        return 1
    total = sum(r["cpu"] for r in rows)
    by_file: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0])
    for r in rows:
        f = by_file[r["test"].split("::")[0]]
        f[0] += r["cpu"]
        f[1] += r["wall"]
        f[2] += 1
    print(f"{'file':60} {'tests':>5} {'cpu s':>8} {'share':>6} {'wall s':>8}")
    for name, (cpu, wall, n) in sorted(by_file.items(), key=lambda kv: -kv[1][0])[:a.top]:
        print(f"{name:60} {n:5d} {cpu:8.1f} {cpu / total:6.1%} {wall:8.1f}")
    print()
    print(f"{'test':100} {'cpu s':>8} {'wall s':>8}")
    for r in sorted(rows, key=lambda r: -r["cpu"])[:a.top]:
        print(f"{r['test'][:100]:100} {r['cpu']:8.1f} {r['wall']:8.1f}")
    left = [r for r in rows if r.get("left")]
    if left:  # children of a worker alive (or unreaped) after the test that started them
        print(f"\n{len(left)} test(s) left children of their worker behind (each charged for what they burned during it):")
        for r in left[:a.top]:
            print(f"  {r['test'][:100]}: {'; '.join(r['left'])[:200]}")
    if a.durations:
        walls = {r["test"]: round(r["wall"], 1) for r in sorted(rows, key=lambda r: r["test"]) if r["wall"] >= 1}
        with open(a.durations + ".tmp", "w") as fh:
            json.dump(walls, fh, indent=0, sort_keys=True)
            fh.write("\n")
        os.replace(a.durations + ".tmp", a.durations)
    heavy = sum(r["cpu"] for r in rows if r["cpu"] >= 10)
    print(f"\ntests={len(rows)} cpu_s={total:.0f} floor_min={total / a.cores / 60:.1f} "
          f"heavy_tests={sum(1 for r in rows if r['cpu'] >= 10)} heavy_share={heavy / total:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
