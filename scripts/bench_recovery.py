#!/usr/bin/env python3
"""Benchmark: how fast procsv notices a death, recovers, keeps training, and saves on preemption.

Runs the built-in example under ``procsv launch`` and measures, in one run:

(a) detection latency: this script sends SIGKILL to the trainer and reads the moment the watchdog
    noticed (``noticed`` in logs/lifecycle.jsonl; same machine, same wall clock);
(b) MTTR: SIGKILL to the first completed step after restore, with the watchdog's breakdown, for
    procsv (pre-warmed trainer, forked from a zygote) side by side with the baseline, a plain
    fresh-process restart of the same program (``--no-prewarm``: a new interpreter imports
    TensorFlow, as a bash restart loop or torchrun would; the services stay up, which only helps it);
(c) goodput under ``--chaos every=30`` with a checkpoint every 2 s for --chaos-secs (>= 180 s);
(d) SIGTERM preemption over --trials trials: steps lost between the last completed step and the
    emergency checkpoint, and the share of trials whose emergency checkpoint committed in the grace.

Prints a table, then one line:
``detect_ms=<x> mttr_s=<x> mttr_ratio=<x> goodput=<x> preempt_saved=<x> steps_lost=<x>``
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Optional

ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", TF_ENABLE_ONEDNN_OPTS="0", PYTHONUNBUFFERED="1")


def events(logdir: str) -> list[dict[str, Any]]:
    try:
        with open(os.path.join(logdir, "logs", "lifecycle.jsonl")) as fh:
            return [json.loads(line) for line in fh if line.strip()]
    except (FileNotFoundError, json.JSONDecodeError):
        return []


def wait(cond, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(0.01)
    raise SystemExit(f"bench_recovery: timed out waiting for {what}")


def launch(logdir: str, opts: list[str], example: list[str]) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "procsv", "launch", "procsv.examples.digits", "--logdir", logdir, "--quiet",
           *opts, "--", *example]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV,
                            start_new_session=True)


def trainer_started(logdir: str, attempt: int) -> Optional[dict[str, Any]]:
    ev = events(logdir)
    spawned = next((e for e in ev if e["event"] == "spawned" and e["role"] == "trainer" and e["attempt"] == attempt),
                   None)
    if spawned is None:
        return None
    first = next((e for e in ev if e["event"] == "first_step" and e["pid"] == spawned["pid"]), None)
    return {"pid": spawned["pid"], "first_step": first["time"]} if first else None


def kill_series(kills: int, prewarm: bool, rng: random.Random) -> dict[str, Any]:
    """Kill the trainer ``kills`` times; return detection latencies, MTTRs and breakdowns."""
    logdir = tempfile.mkdtemp(prefix="bench-recovery-")
    opts = [] if prewarm else ["--no-prewarm"]
    proc = launch(logdir, opts, ["--steps", "10000000", "--save-model-secs", "2", "--step-delay", "0.002"])
    detect, mttr = [], []
    try:
        for attempt in range(1, kills + 1):
            info = wait(lambda: trainer_started(logdir, attempt), 120, f"attempt {attempt}'s first step")
            time.sleep(rng.uniform(1.0, 2.5))  # let it train (and checkpoint) a little
            t_kill = time.time()
            os.kill(info["pid"], signal.SIGKILL)
            exited = wait(lambda: next((e for e in events(logdir) if e["event"] == "exited"
                                        and e.get("pid") == info["pid"]), None), 30, "the death to be noticed")
            detect.append(exited["noticed"] - t_kill)
            nxt = wait(lambda: trainer_started(logdir, attempt + 1), 120, "the restarted trainer's first step")
            mttr.append(nxt["first_step"] - t_kill)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(180)
    with open(os.path.join(logdir, "logs", "report.json")) as fh:
        report = json.load(fh)
    parts = {k: statistics.median([r[k] for r in report["recoveries"] if r[k] is not None])
             for k in ("respawn_s", "restore_s", "first_step_s")}
    return {"detect": detect, "mttr": mttr, "parts": parts}


def chaos_goodput(secs: float) -> dict[str, Any]:
    logdir = tempfile.mkdtemp(prefix="bench-chaos-")
    proc = launch(logdir, ["--chaos", "every=30,seed=1"],
                  ["--steps", "10000000", "--save-model-secs", "2", "--step-delay", "0.002"])
    time.sleep(secs)
    proc.send_signal(signal.SIGTERM)
    proc.wait(180)
    with open(os.path.join(logdir, "logs", "report.json")) as fh:
        report = json.load(fh)
    return report


def preempt_trials(trials: int, rng: random.Random, grace: float) -> dict[str, Any]:
    saved = 0
    lost: list[int] = []
    commit_secs: list[float] = []
    for i in range(trials):
        logdir = tempfile.mkdtemp(prefix="bench-preempt-")
        proc = launch(logdir, ["--stop-grace-secs", str(grace)],
                      ["--steps", "10000000", "--save-model-secs", "1000", "--step-delay", "0.002"])
        wait(lambda: trainer_started(logdir, 1), 120, "the first step")
        time.sleep(rng.uniform(0.5, 3.0))
        t_term = time.time()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(grace + 60)
        with open(os.path.join(logdir, ".procsv", "status.json")) as fh:
            status = json.load(fh)
        commits = [e for e in events(logdir) if e["event"] == "checkpoint_committed" and e["reason"] == "preempted"]
        last_step = status["step"]
        committed = commits[-1]["step"] if commits else 0
        lost.append(last_step - committed)
        ok = bool(commits) and code == 128 + signal.SIGTERM and commits[-1]["time"] - t_term <= grace
        saved += ok
        if commits:
            commit_secs.append(commits[-1]["time"] - t_term)
    return {"saved": saved / trials, "lost": lost, "commit_secs": commit_secs}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kills", type=int, default=8, help="SIGKILLs per series (a, b)")
    p.add_argument("--chaos-secs", type=float, default=185.0, help="length of the chaos run (c), >= 180")
    p.add_argument("--trials", type=int, default=10, help="SIGTERM trials (d), >= 10")
    p.add_argument("--grace", type=float, default=30.0, help="--stop-grace-secs for (d)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    rng = random.Random(args.seed)

    warm = kill_series(args.kills, True, rng)
    cold = kill_series(args.kills, False, rng)
    chaos = chaos_goodput(args.chaos_secs)
    pre = preempt_trials(args.trials, rng, args.grace)

    med = statistics.median
    detect_ms = med(warm["detect"] + cold["detect"]) * 1000
    mttr, mttr_base = med(warm["mttr"]), med(cold["mttr"])
    print(f"{'measure':<44} {'procsv (pre-warmed)':>20} {'fresh process':>14}")
    print(f"{'(a) detect after SIGKILL, median ms':<44} {med(warm['detect']) * 1000:>20.1f} "
          f"{med(cold['detect']) * 1000:>14.1f}")
    print(f"{'(a) detect, max ms':<44} {max(warm['detect']) * 1000:>20.1f} {max(cold['detect']) * 1000:>14.1f}")
    print(f"{'(b) MTTR kill->first step after restore, s':<44} {mttr:>20.3f} {mttr_base:>14.3f}")
    for k, label in (("respawn_s", "noticed->process started"), ("restore_s", "started->state restored"),
                     ("first_step_s", "restored->first step")):
        print(f"{'    ' + label + ', median s':<44} {warm['parts'][k]:>20.3f} {cold['parts'][k]:>14.3f}")
    print(f"{'(c) goodput, chaos every 30 s, ckpt every 2 s':<44} {chaos['goodput']:>20.3f} {'':>14}")
    print(f"{'    wall s / restarts / steps re-done':<44} "
          f"{chaos['wall_s']:>9.0f} / {chaos['restarts']} / {chaos['steps_redone']:<5} {'':>14}")
    print(f"{'(d) SIGTERM trials with emergency ckpt in grace':<44} {pre['saved'] * 100:>19.0f}% {'':>14}")
    print(f"{'    steps lost per trial (max)':<44} {max(pre['lost']):>20d} {'':>14}")
    if pre["commit_secs"]:
        print(f"{'    SIGTERM->emergency commit, median s':<44} {med(pre['commit_secs']):>20.3f} {'':>14}")
    print(f"samples: {len(warm['detect'])}+{len(cold['detect'])} kills, {args.trials} SIGTERM trials")
    print(f"detect_ms={detect_ms:.1f} mttr_s={mttr:.3f} mttr_ratio={mttr / mttr_base:.3f} "
          f"goodput={chaos['goodput']:.3f} preempt_saved={pre['saved']:.2f} steps_lost={max(pre['lost'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
