#!/usr/bin/env python3
"""Goodput of a ``procsv launch --nproc 2`` group with a member SIGKILLed every 30 s, against the same run with no kill.

Runs the digits example (``--strategy multiworker --step-delay 0.005``, bench_group.py's step) for ``--secs``
seconds (>= 180) after the group's first step, twice per repeat, in alternating order: with
``--chaos every=30,seed=1`` (the chief, the group's ``trainer``, SIGKILLed 30 s after each attempt's first
step: the group is restarted, by the standby group when it is ready) and with no kill. Each run ends
with a SIGTERM (the group commits its last step: exit 143). The goodput is the launch's own
(``logs/report.json``: the share of the wall time spent on steps that were kept, from the launch's start),
and the figure asked for is the ratio of the two: ``goodput with kills / goodput without``.

Per kill run it also reads the recoveries (``report.json``): how many, their MTTR (``total_s``), the steps
re-done, and how the next group came (``spawned`` records ``via``: ``standby`` or ``zygote``).

Checks (exit 1 if one fails): every run exits 143 with a committed final checkpoint at its last step; a
kill run restarted the group at least ``secs / 30 - 1`` times and never gave up; the no-kill run restarted
nothing. Prints one row per run, then medians (spread min-max) and one line
``group_goodput_kill=<x> group_goodput_nokill=<x> group_goodput_ratio=<x> group_kills=<n> group_mttr_s=<x>
group_redone=<x> group_promoted=<share> load=<avg>``.
``python scripts/bench_group_goodput.py --repeats 3`` (about 2 x 3.5 min a repeat).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

import bench_group as bg  # scripts/ is this script's folder, first on sys.path
from results_table import median_spread

STEP = ["--strategy", "multiworker", "--step-delay", "0.005", "--print-every-steps", "100000"]
EVERY = 30.0


def one_run(logdir: str, secs: float, kills: bool) -> dict[str, Any]:
    """One launch of ``secs`` seconds of training after its first step; its report's figures."""
    os.makedirs(os.path.dirname(logdir), exist_ok=True)
    opts = ["--chaos", f"every={EVERY:g},seed=1"] if kills else []
    proc = bg.launch(logdir, opts, [*STEP, "--save-model-secs", "10", "--steps", "100000000"])
    try:
        bg.wait(lambda: bg.chief_first_step(logdir, 1), 300, "the group's first step")
        end = time.time() + secs
        while time.time() < end:
            if proc.poll() is not None:
                raise bg.BenchError(f"the launch in {logdir} ended early with {proc.returncode}")
            time.sleep(0.5)
    finally:
        code = bg.stop(proc, 180.0)
    with open(os.path.join(logdir, "logs", "report.json")) as fh:
        report: dict[str, Any] = json.load(fh)
    ev = bg.events(logdir)
    spawned = [e for e in ev if e["event"] == "spawned" and e.get("role") == "trainer" and e.get("attempt", 1) > 1]
    recs = [r for r in report.get("recoveries") or [] if r.get("total_s") is not None]
    import tensorflow as tf  # (here: the launches above do not wait for this process's import)

    latest = tf.train.latest_checkpoint(logdir)
    last = max((e.get("step", 0) for e in ev if e["event"] == "checkpoint_committed"), default=-1)
    return {"code": code, "goodput": report.get("goodput"), "restarts": report.get("restarts", 0),
            "gave_up": any(e["event"] == "gave_up" for e in ev),
            "mttr": [r["total_s"] for r in recs], "redone": [r["steps_redone"] for r in recs
                                                              if r.get("steps_redone") is not None],
            "promoted": sum(e.get("via") == "standby" for e in spawned), "spawned": len(spawned),
            "final_ok": latest is not None and latest.endswith(f"-{last}")}


def check(run: dict[str, Any], kills: bool, secs: float) -> list[str]:
    """What is wrong with a run (empty: nothing)."""
    bad = []
    if run["code"] != 143:
        bad.append(f"exit {run['code']}, not 143")
    if not run["final_ok"]:
        bad.append("the newest checkpoint is not the last committed step")
    if run["goodput"] is None:
        bad.append("report.json has no goodput")
    if kills and (run["restarts"] < int(secs // EVERY) - 1 or run["gave_up"]):
        bad.append(f"{run['restarts']} restart(s) in {secs:.0f} s with a kill every {EVERY:.0f} s"
                   + (" and it gave up" if run["gave_up"] else ""))
    if not kills and run["restarts"]:
        bad.append(f"{run['restarts']} restart(s) with no kill")
    return bad


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--secs", type=float, default=180.0, help="training seconds per run (>= 180 for the issue's figure)")
    args = p.parse_args()
    root = tempfile.mkdtemp(prefix="bench-group-goodput-")
    rows: list[tuple[dict[str, Any], dict[str, Any]]] = []
    failures: list[str] = []
    loads: list[float] = []
    try:
        for r in range(args.repeats):
            order = (True, False) if r % 2 == 0 else (False, True)
            got: dict[bool, dict[str, Any]] = {}
            for kills in order:
                loads.append(os.getloadavg()[0])
                run = one_run(os.path.join(root, f"r{r}{'k' if kills else 'n'}", "run"), args.secs, kills)
                loads.append(os.getloadavg()[0])
                failures += [f"repeat {r + 1} {'kill' if kills else 'no-kill'}: {x}" for x in check(run, kills, args.secs)]
                got[kills] = run
                print(f"repeat {r + 1} {'kills  ' if kills else 'no kill'}: goodput {run['goodput']}, "
                      f"{run['restarts']} restart(s), MTTR {run['mttr'] and round(statistics.median(run['mttr']), 3)} s, "
                      f"re-done {run['redone']}, {run['promoted']}/{run['spawned']} via standby, exit {run['code']}",
                      flush=True)
            rows.append((got[True], got[False]))
    except (bg.BenchError, TimeoutError) as e:
        failures.append(str(e))
    finally:
        if not failures:
            shutil.rmtree(root, ignore_errors=True)
    if not rows:
        print(f"FAILED: {failures}", file=sys.stderr)
        return 1
    med = statistics.median
    kill_g = [k["goodput"] for k, _ in rows if k["goodput"] is not None]
    none_g = [n["goodput"] for _, n in rows if n["goodput"] is not None]
    ratio = [k["goodput"] / n["goodput"] for k, n in rows if k["goodput"] and n["goodput"]]
    mttr = [med(k["mttr"]) for k, _ in rows if k["mttr"]]
    redone = [med(k["redone"]) for k, _ in rows if k["redone"]]
    promoted = sum(k["promoted"] for k, _ in rows) / max(1, sum(k["spawned"] for k, _ in rows))
    print(f"\n{'figure':<34} {'median (min-max) over ' + str(len(rows)) + ' repeats'}")
    print(f"{'goodput, a kill every 30 s':<34} {median_spread(kill_g, '.4f')}")
    print(f"{'goodput, no kill':<34} {median_spread(none_g, '.4f')}")
    print(f"{'ratio (goal >= 0.98)':<34} {median_spread(ratio, '.4f')}")
    print(f"{'MTTR per kill, s (report total_s)':<34} {median_spread(mttr, '.3f') if mttr else '-'}")
    print(f"{'steps re-done per kill':<34} {median_spread(redone, '.1f') if redone else '-'}")
    print(f"{'restarts by the standby group':<34} {promoted:.2f}")
    if failures:
        print("FAILED: " + "; ".join(failures), file=sys.stderr)
    print(f"group_goodput_kill={med(kill_g):.4f} group_goodput_nokill={med(none_g):.4f} "
          f"group_goodput_ratio={med(ratio):.4f} group_kills={med([k['restarts'] for k, _ in rows]):.0f} "
          f"group_mttr_s={med(mttr) if mttr else float('nan'):.3f} group_redone={med(redone) if redone else float('nan'):.1f} "
          f"group_promoted={promoted:.2f} load={statistics.mean(loads):.1f}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
