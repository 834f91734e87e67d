#!/usr/bin/env python3
"""The in-memory tier of a ``procsv launch --nproc 2`` group: steps re-done per member kill, and what the tier costs a step.

Runs the digits example (``--strategy multiworker --step-delay 0.005``, bench_group.py's step) with the
group's in-memory tier on (the watchdog's default ``PROCSV_GROUP_SNAPSHOT_STEPS``, 50) and off
(``PROCSV_GROUP_SNAPSHOT_STEPS=0``: every restart restores the newest disk checkpoint, as before issue 54),
the two alternating within each repeat:

(e) steps re-done per kill: ``--save-model-secs 600`` (no disk save during the run), worker1 SIGKILLed
    3 times, each 100-200 steps (drawn) after its group's first step; per kill, the group's last step
    (the highest step either member printed, ``--print-every-steps 1``) minus the step the next group
    restored (its ``restored`` record; ``initialized``: 0), and where it came from (``source``);
(f) step time: an uninterrupted run of 1500 steps, the members' own "ran M of them in T s, C s of CPU"
    lines: wall T / M (the chief's) and CPU C / M (both members'); the tier's cost is on / off - 1 of the
    CPU per step (on a shared machine the wall time moves by tens of percent from run to run with the
    other work; the CPU a process spends per step much less), the wall time's beside.

Prints, per repeat, then medians of the repeats (spread min-max) and one line
``tier_redone_on=<x> tier_redone_off=<x> tier_step_ms_on=<x> tier_step_ms_off=<x> tier_cost=<x> tier_wall_cost=<x>``.
``python scripts/bench_group_tier.py --repeats 3``; ``bench_group.py --tier`` runs it too.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import statistics
import sys
from typing import Any

import bench_group as bg  # scripts/ is this script's folder, first on sys.path
from bench_alone import run_alone
from results_table import median_spread

TIER_OFF = dict(bg.ENV, PROCSV_GROUP_SNAPSHOT_STEPS="0")
TIER_ON = {k: v for k, v in bg.ENV.items() if k != "PROCSV_GROUP_SNAPSHOT_STEPS"}
STEP = ["--strategy", "multiworker", "--step-delay", "0.005"]


def printed(logdir: str, log: str) -> list[int]:
    try:
        with open(os.path.join(logdir, "logs", f"{log}.log")) as fh:
            return [int(m.group(1)) for m in re.finditer(r"^digits: step (\d+) ", fh.read(), re.M)]
    except FileNotFoundError:
        return []


def redone_run(logdir: str, env: dict[str, str], rng: random.Random, kills: int = 3) -> list[dict[str, Any]]:
    """(e): ``kills`` SIGKILLs of worker1; per kill the steps re-done and the restore's source."""
    os.makedirs(os.path.dirname(logdir), exist_ok=True)
    proc = bg.launch(logdir, [], [*STEP, "--save-model-secs", "600", "--print-every-steps", "1", "--steps", "100000"],
                     env=env)
    rows = []
    try:
        for attempt in range(1, kills + 1):
            first = bg.wait(lambda: bg.chief_first_step(logdir, attempt), 300, f"attempt {attempt}'s first step")
            start = printed(logdir, f"trainer.{attempt}")[:1] or [int(first["step"])]
            at = start[0] + rng.randint(100, 200)
            bg.wait(lambda: (printed(logdir, f"worker1.{attempt}") or [0])[-1] >= at, 300, f"step {at}")
            pid = bg.wait(lambda: bg.worker_pid(logdir, attempt), 30, "worker1's pid")
            os.kill(pid, 9)
            bg.wait(lambda: bg.chief_first_step(logdir, attempt + 1), 300, f"attempt {attempt + 1}'s first step")
    finally:
        bg.stop(proc)
        bg.leftovers(logdir)
    ev = bg.events(logdir)
    starts = [e for e in ev if e["event"] in ("restored", "initialized")]
    for attempt in range(1, kills + 1):
        last = max(max(printed(logdir, f"{log}.{attempt}") or [0]) for log in ("trainer", "worker1"))
        nxt = starts[attempt]  # attempt + 1's (starts[0] is attempt 1's)
        rows.append({"redone": last - int(nxt["step"]), "source": nxt.get("source") or "none"})
    return rows


def step_run(logdir: str, env: dict[str, str], steps: int = 1500) -> tuple[float, float]:
    """(f): seconds per step of the chief of an uninterrupted run (wall), and CPU seconds per step of
    both members together."""
    os.makedirs(os.path.dirname(logdir), exist_ok=True)
    proc = bg.launch(logdir, [], [*STEP, "--save-model-secs", "600", "--print-every-steps", "100000",
                                  "--steps", str(steps)], env=env)
    try:
        code = proc.wait(900)
    finally:
        bg.stop(proc)
        bg.leftovers(logdir)
    found = []
    for log in ("trainer.1", "worker1.1"):
        with open(os.path.join(logdir, "logs", f"{log}.log")) as fh:
            found.append(re.search(r"ran (\d+) of them in ([0-9.]+) s, ([0-9.]+) s of CPU", fh.read()))
    if code != 0 or not all(found):
        raise bg.BenchError(f"the uninterrupted run in {logdir} exited {code} without its finished lines")
    n = int(found[0].group(1))
    return float(found[0].group(2)) / n, sum(float(m.group(3)) for m in found if m) / n


def measure(root: str, repeats: int, rng: random.Random) -> dict[str, list[float]]:
    """Both measures, tier on and off alternating; per repeat: median re-done per kill, s per step."""
    out: dict[str, list[float]] = {"redone_on": [], "redone_off": [], "step_on": [], "step_off": [], "cpu_on": [],
                                   "cpu_off": []}
    for r in range(repeats):
        for name, env in ((("on", TIER_ON), ("off", TIER_OFF)) if r % 2 == 0 else (("off", TIER_OFF), ("on", TIER_ON))):
            rows = redone_run(os.path.join(root, f"e{r}{name}", "run"), env, rng)
            secs, cpu = step_run(os.path.join(root, f"f{r}{name}", "run"), env)
            out[f"redone_{name}"].append(statistics.median(x["redone"] for x in rows))
            out[f"step_{name}"].append(secs)
            out[f"cpu_{name}"].append(cpu)
            print(f"repeat {r + 1}, tier {name}: re-done per kill {[x['redone'] for x in rows]} "
                  f"(from {sorted({x['source'] for x in rows})}), {secs * 1000:.2f} ms per step, "
                  f"{cpu * 1000:.2f} ms of CPU per step (both members)", flush=True)
    return out


def report(out: dict[str, list[float]]) -> str:
    cost = [on / off - 1 for on, off in zip(out["cpu_on"], out["cpu_off"])]
    wall = [on / off - 1 for on, off in zip(out["step_on"], out["step_off"])]
    print(f"steps re-done per worker1 kill: tier on {median_spread(out['redone_on'], '.1f')}, "
          f"off {median_spread(out['redone_off'], '.1f')}")
    print(f"CPU per step, ms (both members): tier on {median_spread([x * 1000 for x in out['cpu_on']], '.2f')}, "
          f"off {median_spread([x * 1000 for x in out['cpu_off']], '.2f')}; cost {median_spread(cost, '+.4f', ' to ')}")
    print(f"wall per step, ms (the chief): tier on {median_spread([x * 1000 for x in out['step_on']], '.2f')}, "
          f"off {median_spread([x * 1000 for x in out['step_off']], '.2f')}; {median_spread(wall, '+.4f', ' to ')}")
    med = statistics.median
    return (f"tier_redone_on={med(out['redone_on']):.1f} tier_redone_off={med(out['redone_off']):.1f} "
            f"tier_step_ms_on={med(out['step_on']) * 1000:.3f} tier_step_ms_off={med(out['step_off']) * 1000:.3f} "
            f"tier_cost={med(cost):+.4f} tier_wall_cost={med(wall):+.4f}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    return run_alone("bench_group_tier", lambda root: measure(root, args.repeats, random.Random(args.seed)), report)


if __name__ == "__main__":
    sys.exit(main())
