#!/usr/bin/env python3
"""Benchmark: the trainer's pace while its summary service is hung, then dead, then replaced.

Runs the built-in example under ``procsv launch`` (``--log-every-steps 1 --step-delay 0.005
--save-model-secs 2 --save-summaries-secs 1``: loss and accuracy logged at every step), and in
each run, once training is past step 300:

  healthy window: 3 s with the summary service up;
  outage window:  SIGSTOP of the summary service (alive, taking no more data), 3 s later SIGKILL,
                  until the watchdog names its successor in ``status.json``;
then waits for the successor's event file, lets it write what was held back for 2 s, and stops the
run with SIGTERM. The step times are the trainer's own clock: the wall time of each ``loss`` value,
read back with TensorBoard's ``EventAccumulator``. Per window: the median step time, the rate
(steps/s) and, for the outage, the longest step (a step that waited for the stopped service would
take the whole 3 s stop).

Runs ``--repeats`` times (default 3; >= 3 for quoted figures) and prints a table of medians with
the spread (min to max), then the line ``outage_step_ratio=<x> outage_rate_ratio=<x>
healthy_step_ms=<x> outage_step_ms=<x> worst_outage_step_ms=<x> repeats=<n> verified=<0|1>``
(medians; a ratio is outage over healthy). Exits 1 if a run's check failed: the launch not
exiting 143, the service not replaced exactly once, ``loss`` or ``accuracy`` not exactly one value
per step from step 1 to the last, or any summary dropped. Usage: ``python
scripts/bench_summary_outage.py [--repeats N]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Optional

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # this process too: reading the events imports TensorFlow
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

from bench_group import launch, status, wait  # noqa: E402  # scripts/ is this script's folder, first on sys.path
from results_table import span  # noqa: E402

ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", TF_ENABLE_ONEDNN_OPTS="0", PYTHONUNBUFFERED="1")
ENV.pop("PROCSV_LOGDIR", None)
ENV.pop("PROCSV_RUNTIME_DIR", None)
EXAMPLE = ["--steps", "100000", "--log-every-steps", "1", "--step-delay", "0.005",
           "--save-model-secs", "2", "--save-summaries-secs", "1"]
EVERY_STEP = ("loss", "accuracy")  # the example logs these at every step with --log-every-steps 1
WINDOW = 3.0  # seconds of each window (healthy; stopped before the SIGKILL)


def role_pid(logdir: str, role: str) -> Optional[int]:
    for p in status(logdir).get("processes", []):
        if p["role"] == role:
            return int(p["pid"])
    return None


def read_scalars(logdir: str) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing import event_accumulator as ea
    sizes = {ea.SCALARS: 0, ea.TENSORS: 0, ea.HISTOGRAMS: 0, ea.IMAGES: 0}  # keep every event
    acc = ea.EventAccumulator(logdir, size_guidance=sizes)  # purge_orphaned_data=True, as TensorBoard
    acc.Reload()
    return {tag: [(e.step, e.wall_time) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def check(scalars: dict[str, list[tuple[int, float]]], final: dict[str, Any], code: int, replaced: int) -> list[str]:
    """What is wrong with a run (empty: nothing): one value per step of each every-step tag, none dropped."""
    wrong = []
    if code != 128 + signal.SIGTERM:
        wrong.append(f"the launch exited {code}, not {128 + signal.SIGTERM}")
    if replaced != 1:
        wrong.append(f"the summary service was restarted {replaced} times, not once")
    last = max((s for s, _ in scalars.get("loss", [])), default=0)
    for tag in EVERY_STEP:
        steps = [s for s, _ in scalars.get(tag, [])]
        if steps != list(range(1, last + 1)):
            missing = sorted(set(range(1, last + 1)) - set(steps))
            wrong.append(f"{tag}: {len(steps)} values for steps 1-{last}, {len(missing)} missing, "
                         f"e.g. {missing[:5]}")
    if last < int(final.get("step", 0)) - 1:
        wrong.append(f"loss ends at step {last}, the run at step {final.get('step')}")
    dropped = (final.get("summaries") or {}).get("dropped")
    if dropped != 0:
        wrong.append(f"{dropped} summaries dropped")
    return wrong


def pace(walls: list[float]) -> dict[str, float]:
    if len(walls) < 3:  # a window without steps: no pace (the run's check says so)
        return {"median": float("nan"), "worst": float("nan"), "rate": float("nan"), "steps": float(len(walls))}
    gaps = [b - a for a, b in zip(walls, walls[1:])]
    return {"median": statistics.median(gaps), "worst": max(gaps),
            "rate": (len(walls) - 1) / (walls[-1] - walls[0]), "steps": float(len(walls))}


def one_run(logdir: str) -> tuple[dict[str, float], dict[str, float], list[str]]:
    proc = launch(logdir, [], EXAMPLE, group=(), env=ENV)  # its output in logdir + ".out"
    try:
        wait(lambda: status(logdir).get("step", 0) > 300, 300, "training to run")
        victim = wait(lambda: role_pid(logdir, "summary"), 30, "the summary service's pid")
        t_healthy = time.time()
        time.sleep(WINDOW)  # the reference window: the service healthy
        t_down = time.time()
        os.kill(victim, signal.SIGSTOP)  # first hung (it takes no more data), then dead
        time.sleep(WINDOW)
        os.kill(victim, signal.SIGKILL)
        new = wait(lambda: role_pid(logdir, "summary") not in (None, victim) and role_pid(logdir, "summary"),
                   120, "the watchdog to restart the summary service")
        t_up = time.time()
        wait(lambda: any(f.endswith(f"procsv-{new}") for f in os.listdir(logdir)), 60,
             "the new service's event file")
        time.sleep(2.0)  # what was held back is restated and written meanwhile
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    out = subprocess.run([sys.executable, "-m", "procsv", "status", logdir, "--json"], capture_output=True,
                         text=True, env=ENV, timeout=60)
    final: dict[str, Any] = json.loads(out.stdout) if out.returncode == 0 else {}
    summary: dict[str, Any] = next((p for p in final.get("processes", []) if p["role"] == "summary"), {})
    replaced = int(summary.get("restarts", -1)) if summary.get("pid") == new else -1
    scalars = read_scalars(logdir)
    wrong = check(scalars, final, proc.returncode, replaced)
    if proc.returncode != 128 + signal.SIGTERM:
        with open(logdir + ".out", errors="replace") as fh:
            wrong.append(fh.read().strip()[-2000:])
    walls = [w for _, w in scalars.get("loss", [])]
    healthy, down = pace([w for w in walls if t_healthy <= w < t_down]), pace([w for w in walls if t_down <= w < t_up])
    if min(healthy["steps"], down["steps"]) < 3:
        wrong.append(f"too few steps to time: {healthy['steps']:.0f} healthy, {down['steps']:.0f} in the outage")
    return healthy, down, wrong


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3, help="runs (>= 3 for quoted figures)")
    args = p.parse_args()
    runs: list[tuple[dict[str, float], dict[str, float], list[str]]] = []
    tmp = tempfile.mkdtemp(prefix="bench-outage-")
    try:
        for i in range(max(1, args.repeats)):
            runs.append(one_run(os.path.join(tmp, f"run{i}")))
            for line in runs[-1][2]:
                print(f"run {i + 1}: check failed: {line}", file=sys.stderr)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    med = statistics.median
    spread = span

    healthy = [h["median"] * 1e3 for h, _, _ in runs]
    down = [d["median"] * 1e3 for _, d, _ in runs]
    rate_h = [h["rate"] for h, _, _ in runs]
    rate_d = [d["rate"] for _, d, _ in runs]
    worst = [d["worst"] * 1e3 for _, d, _ in runs]
    step_ratio = [d["median"] / h["median"] for h, d, _ in runs]
    rate_ratio = [d["rate"] / h["rate"] for h, d, _ in runs]
    verified = all(not wrong for _, _, wrong in runs)
    checks = "; ".join("ok" if not wrong else f"{len(wrong)} failed" for _, _, wrong in runs)
    rows = [
        ("median step time", f"{med(healthy):.2f} ms", f"{med(down):.2f} ms",
         f"ratio {med(step_ratio):.2f} (spread {spread(step_ratio, '.2f')}; healthy {spread(healthy, '.2f')} ms, "
         f"outage {spread(down, '.2f')} ms)"),
        ("steps per second", f"{med(rate_h):.0f}/s", f"{med(rate_d):.0f}/s",
         f"ratio {med(rate_ratio):.2f} (spread {spread(rate_ratio, '.2f')})"),
        ("longest step", "", f"{med(worst):.0f} ms",
         f"spread {spread(worst, '.0f')} ms; a step waiting for the stopped service would take {WINDOW:.0f} s"),
        ("one value per step, none dropped", "", "", f"{'yes' if verified else 'NO'} ({checks})"),
    ]
    print(f"medians of {len(runs)} runs (steps in the windows: healthy "
          f"{spread([h['steps'] for h, _, _ in runs], '.0f')}, outage {spread([d['steps'] for _, d, _ in runs], '.0f')})")
    print(f"{'measurement':<34}{'healthy':>12}{'outage':>12}   result")
    for name, ours, base, result in rows:
        print(f"{name:<34}{ours:>12}{base:>12}   {result}")
    print(f"outage_step_ratio={med(step_ratio):.3f} outage_rate_ratio={med(rate_ratio):.3f} "
          f"healthy_step_ms={med(healthy):.2f} outage_step_ms={med(down):.2f} worst_outage_step_ms={med(worst):.0f} "
          f"repeats={len(runs)} verified={int(verified)}")
    return 0 if verified else 1


if __name__ == "__main__":
    sys.exit(main())
