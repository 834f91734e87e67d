#!/usr/bin/env python3
"""Benchmark: how fast procsv notices a death, recovers, keeps training, and saves on preemption.

Runs the built-in example under ``procsv launch`` and measures, in one run:

(a) detection latency: this script sends SIGKILL to the trainer and reads the moment the watchdog
    noticed (``noticed`` in logs/lifecycle.jsonl; same machine, same wall clock);
(b) MTTR: SIGKILL to the first completed step after restore, with the watchdog's breakdown, for
    procsv (pre-warmed trainer, forked from a zygote) side by side with the baseline, a plain
    fresh-process restart of the same program (``--no-prewarm``: a new interpreter imports
    TensorFlow, as a bash restart loop or torchrun would; the services stay up, which only helps it).
    Each kill comes after the attempt's first committed checkpoint (as a kill every 30 s would),
    at a random point of the next 2 s checkpoint interval: an attempt killed before any commit
    made no progress, and the restart policy's backoff (1, 2, 4 s ...) would be measured instead;
(c) goodput under ``--chaos every=30`` with a checkpoint every 2 s for --chaos-secs (>= 180 s), and
    by this script's own clock (:func:`own_goodput`: the steps the example prints in each attempt's
    log, stamped as this script reads them), which must agree with the report's within 1 point
    once the report's snapshot blocks are added (this clock cannot see a block of tens of ms; it
    counts them as stepping), else the run fails;
(d) SIGTERM preemption over --trials trials: steps lost between the last completed step and the
    emergency checkpoint, and the share of trials whose emergency checkpoint committed in the grace;
(e) the hot standby with the in-memory snapshot tier (issue 14: ``--standby hot``, the default
    ``PROCSV_MEMORY_SNAPSHOTS``) against the pre-warmed fork without the tier (``--standby fork``,
    ``PROCSV_MEMORY_SNAPSHOTS=0``: what (b) and (c) measure): MTTR, steps re-done per kill, and
    goodput under the same chaos as (c), beside a run of the same length with no kill; and the
    standby's resident memory. Every kill of the hot series must be recovered by promoting the
    standby (the ``spawned`` event says ``via: standby``), else the run fails.

``--series`` runs only some of the kill series (``--series hot --chaos-secs 0 --trials 0``: the steps
re-done per kill alone); a series left out prints nan. (a)-(c) and (e) are repeated --repeats times (>= 3); every figure on the last line is the median of
the repeats' medians, and the table shows the spread (min-max over the repeats).

Prints a table, then one line:
``detect_ms=<x> mttr_s=<x> mttr_ratio=<x> goodput=<x> preempt_saved=<x> steps_lost=<x> mttr_hot_s=<x>
redone_per_kill=<x> redone_per_kill_fork=<x> goodput_hot=<x> goodput_vs_nokill=<x> standby_rss_mb=<x>
memory_interval_steps=<x> memory_interval_calm_steps=<x>`` (``goodput`` and ``mttr_s`` are the
pre-warmed fork without the tier, as before; an in-memory interval is the steps between the
snapshots a run's checkpoint service held, from ``.procsv/checkpoint_stats.json``: of the hot kill
series, the interval in effect when its kills landed, which the steps re-done per kill are held to;
and of the run with no kill, where it grows with the trainer's age, Young's interval
(``procsv.trainer.checkpoint.memory_tier``)).
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

from bench_group import events, wait  # scripts/ is this script's folder, first on sys.path
from bench_ownclock import PRINT_EVERY, StepLines, blocked_kept, blocked_share, own_goodput

ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", TF_ENABLE_ONEDNN_OPTS="0", PYTHONUNBUFFERED="1")


SAVE_SECS = 2.0  # --save-model-secs of the kill series and the chaos runs
MODES = {"fork": ["--standby", "fork"], "fresh": ["--standby", "off"], "hot": ["--standby", "hot"]}


def launch(logdir: str, opts: list[str], example: list[str], memory: bool = False) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "procsv", "launch", "procsv.examples.digits", "--logdir", logdir, "--quiet",
           *opts, "--", *example]
    env = dict(ENV, PROCSV_MEMORY_SNAPSHOTS="0.01" if memory else "0")
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                            start_new_session=True)


def trainer_started(logdir: str, attempt: int) -> Optional[dict[str, Any]]:
    ev = events(logdir)
    spawned = next((e for e in ev if e["event"] == "spawned" and e["role"] == "trainer" and e["attempt"] == attempt),
                   None)
    if spawned is None:
        return None
    first = next((e for e in ev if e["event"] == "first_step" and e["pid"] == spawned["pid"]), None)
    return {"pid": spawned["pid"], "first_step": first["time"], "via": spawned.get("via")} if first else None


def committed_since(logdir: str, since: float) -> bool:
    """A checkpoint committed after wall time ``since`` (a trainer attempt's first step)."""
    return any(e["event"] == "checkpoint_committed" and e["time"] > since for e in events(logdir))


def standby_rss(logdir: str, attempt: int) -> Optional[float]:
    """The resident memory (MiB) of the standby prepared for ``attempt``, once it is ready."""
    import psutil

    ready = next((e for e in events(logdir) if e["event"] == "standby_ready" and e["attempt"] == attempt), None)
    if ready is None:
        return None
    try:
        return psutil.Process(ready["pid"]).memory_info().rss / 2**20
    except psutil.Error:
        return None


def kill_series(kills: int, mode: str, rng: random.Random, memory: bool = False) -> dict[str, Any]:
    """Kill the trainer ``kills`` times; return detection latencies, MTTRs, breakdowns, steps re-done."""
    logdir = tempfile.mkdtemp(prefix="bench-recovery-")
    proc = launch(logdir, MODES[mode],
                  ["--steps", "10000000", "--save-model-secs", str(SAVE_SECS), "--step-delay", "0.002"], memory)
    detect, mttr, rss, promoted = [], [], [], 0
    try:
        for attempt in range(1, kills + 1):
            info = wait(lambda: trainer_started(logdir, attempt), 120, f"attempt {attempt}'s first step")
            if mode == "hot":  # the standby is ready before the kill (what a kill every 30 s finds)
                rss.append(wait(lambda: standby_rss(logdir, attempt + 1), 120, "a ready standby"))
            # what a kill every 30 s finds: this attempt has committed a checkpoint. (Killed before
            # its first commit, an attempt made no progress, and the restart policy backs off 1, 2,
            # 4 s ... as it must for a crash loop: that is not the restart's speed.) Then the kill
            # lands at a random point of the next checkpoint interval.
            wait(lambda: committed_since(logdir, info["first_step"]), 120, f"attempt {attempt}'s first commit")
            time.sleep(rng.uniform(0.0, SAVE_SECS))
            t_kill = time.time()
            os.kill(info["pid"], signal.SIGKILL)
            exited = wait(lambda: next((e for e in events(logdir) if e["event"] == "exited"
                                        and e.get("pid") == info["pid"]), None), 30, "the death to be noticed")
            detect.append(exited["noticed"] - t_kill)
            nxt = wait(lambda: trainer_started(logdir, attempt + 1), 120, "the restarted trainer's first step")
            mttr.append(nxt["first_step"] - t_kill)
            promoted += nxt["via"] == "standby"  # the standby became the trainer (not a fork after all)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(180)
    with open(os.path.join(logdir, "logs", "report.json")) as fh:
        report = json.load(fh)
    parts = {k: statistics.median([r[k] for r in report["recoveries"] if r[k] is not None])
             for k in ("respawn_s", "restore_s", "first_step_s")}
    redone = [r["steps_redone"] for r in report["recoveries"] if r["steps_redone"] is not None]
    return {"detect": detect, "mttr": mttr, "parts": parts, "redone": redone, "rss": rss, "promoted": promoted,
            "memory_interval": memory_interval(logdir) if memory else None}


def left_out() -> dict[str, Any]:
    """What a kill series left out (``--series``) measured: nothing (its figures print nan)."""
    nan = float("nan")
    return {"detect": [nan], "mttr": [nan], "parts": {k: nan for k in ("respawn_s", "restore_s", "first_step_s")},
            "redone": [nan], "rss": [nan], "promoted": 0, "memory_interval": None}


def chaos_goodput(secs: float, mode: str = "fork", memory: bool = False, kills: bool = True,
                  every: float = 30.0) -> dict[str, Any]:
    """One chaos run of ``secs``; its report.json, with ``own_goodput``: the goodput by this
    script's clock (:func:`own_goodput`, from the step it polls), to check the report's against."""
    logdir = tempfile.mkdtemp(prefix="bench-chaos-")
    t0 = time.time()
    proc = launch(logdir, MODES[mode] + (["--chaos", f"every={every:g},seed=1"] if kills else []),
                  ["--steps", "10000000", "--save-model-secs", str(SAVE_SECS), "--step-delay", "0.002",
                   "--print-every-steps", str(PRINT_EVERY)], memory)
    lines = StepLines(os.path.join(logdir, "logs"))
    while time.time() < t0 + secs:
        lines.read(time.time())
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    stop = time.time()
    while proc.poll() is None:  # the stop's last steps too, up to the launch's exit
        if time.time() > stop + 180:
            raise TimeoutError(f"the chaos run in {logdir} did not stop within 180 s of SIGTERM")
        lines.read(time.time())
        time.sleep(0.02)
    t1 = time.time()
    lines.read(t1)
    with open(os.path.join(logdir, "logs", "report.json")) as fh:
        report: dict[str, Any] = json.load(fh)
    report["memory_interval"] = memory_interval(logdir)
    report["own_goodput"] = own_goodput(lines.by_start(), t0, t1)
    report["blocked_kept_s"] = blocked_kept(logdir)
    return report


def memory_interval(logdir: str) -> Optional[float]:
    """Steps between in-memory snapshots over a run, from what its checkpoint service held
    (``checkpoint_stats.json``); None if it held fewer than two."""
    with open(os.path.join(logdir, ".procsv", "checkpoint_stats.json")) as fh:
        memory = json.load(fh).get("memory") or {}
    if memory.get("held", 0) < 2:
        return None
    return float(memory["last_step"] - memory["first_step"]) / (memory["held"] - 1)


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


def spread(values: list[float], fmt: str = ".3f") -> str:
    return f"{min(values):{fmt}}-{max(values):{fmt}}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kills", type=int, default=6, help="SIGKILLs per series (a, b, e)")
    p.add_argument("--chaos-secs", type=float, default=185.0,
                   help="length of each chaos run (c, e), >= 180; 0 skips the chaos runs (their keys print nan)")
    p.add_argument("--trials", type=int, default=10, help="SIGTERM trials (d), >= 10")
    p.add_argument("--grace", type=float, default=30.0, help="--stop-grace-secs for (d)")
    p.add_argument("--repeats", type=int, default=3, help="repeats of (a)-(c) and (e), >= 3 for quoted figures")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--series", nargs="+", choices=("fork", "fresh", "hot"), default=["fork", "fresh", "hot"],
                   help="the kill series to run (default all three; one left out prints nan for its figures)")
    args = p.parse_args()
    rng = random.Random(args.seed)
    med = statistics.median

    runs: list[dict[str, Any]] = []
    for r in range(args.repeats):
        warm = kill_series(args.kills, "fork", rng) if "fork" in args.series else left_out()
        cold = kill_series(args.kills, "fresh", rng) if "fresh" in args.series else left_out()
        mem = kill_series(args.kills, "hot", rng, memory=True) if "hot" in args.series else left_out()
        nan = {"goodput": float("nan")}
        chaos = chaos_goodput(args.chaos_secs, "fork") if args.chaos_secs > 0 else nan
        chaos_mem = chaos_goodput(args.chaos_secs, "hot", memory=True) if args.chaos_secs > 0 else nan
        calm = chaos_goodput(args.chaos_secs, "hot", memory=True, kills=False) if args.chaos_secs > 0 else nan
        runs.append({"warm": warm, "cold": cold, "mem": mem, "chaos": chaos, "chaos_mem": chaos_mem, "calm": calm})
        print(f"repeat {r + 1}: mttr warm {med(warm['mttr']):.3f} cold {med(cold['mttr']):.3f} memory "
              f"{med(mem['mttr']):.3f} s; redone/kill {med(warm['redone'])} vs {med(mem['redone'])}; goodput "
              f"{chaos['goodput']:.3f} vs {chaos_mem['goodput']:.3f} (no kill {calm['goodput']:.3f})", flush=True)
    pre = preempt_trials(args.trials, rng, args.grace) if args.trials > 0 else {"saved": 1.0, "lost": [0],
                                                                                   "commit_secs": []}

    def per_run(f: Any) -> list[float]:
        return [float(f(x)) for x in runs]

    rows: list[tuple[str, list[float], list[float], list[float]]] = [
        ("(a) detect after SIGKILL, median ms", per_run(lambda x: med(x["warm"]["detect"]) * 1000),
         per_run(lambda x: med(x["cold"]["detect"]) * 1000), per_run(lambda x: med(x["mem"]["detect"]) * 1000)),
        ("(b) MTTR kill->first step after restore, s", per_run(lambda x: med(x["warm"]["mttr"])),
         per_run(lambda x: med(x["cold"]["mttr"])), per_run(lambda x: med(x["mem"]["mttr"]))),
    ]
    for k, label in (("respawn_s", "noticed->process started"), ("restore_s", "started->state restored"),
                     ("first_step_s", "restored->first step")):
        rows.append((f"    {label}, s", per_run(lambda x, k=k: x["warm"]["parts"][k]),
                     per_run(lambda x, k=k: x["cold"]["parts"][k]), per_run(lambda x, k=k: x["mem"]["parts"][k])))
    rows.append(("(e) steps re-done per kill, median", per_run(lambda x: med(x["warm"]["redone"])),
                 per_run(lambda x: med(x["cold"]["redone"])), per_run(lambda x: med(x["mem"]["redone"]))))
    rows.append(("(c,e) goodput, chaos every 30 s, ckpt every 2 s", per_run(lambda x: x["chaos"]["goodput"]),
                 [], per_run(lambda x: x["chaos_mem"]["goodput"])))
    rows.append(("    the same run with no kill", [], [], per_run(lambda x: x["calm"]["goodput"])))
    intervals = [x["mem"]["memory_interval"] for x in runs if x["mem"].get("memory_interval") is not None]
    calm_intervals = [x["calm"]["memory_interval"] for x in runs if x["calm"].get("memory_interval") is not None]
    print(f"{'measure (median of repeats, min-max)':<46} {'fork, no tier':>20} {'fresh process':>20} "
          f"{'hot standby+memory':>20}")
    for label, a, b, c in rows:
        cells = [f"{med(v):.3f} ({spread(v)})" if v else "" for v in (a, b, c)]
        print(f"{label:<46} {cells[0]:>20} {cells[1]:>20} {cells[2]:>20}")
    if args.trials <= 0:
        print("(d) SIGTERM trials skipped (--trials 0): preempt_saved and steps_lost are not measured")
    else:
        print(f"{'(d) SIGTERM trials with emergency ckpt in grace':<46} {pre['saved'] * 100:>19.0f}%")
        print(f"{'    steps lost per trial (max)':<46} {max(pre['lost']):>20d}")
    saved = f"{pre['saved']:.2f}" if args.trials > 0 else "nan"
    lost = str(max(pre["lost"])) if args.trials > 0 else "nan"
    if pre["commit_secs"]:
        print(f"{'    SIGTERM->emergency commit, median s':<46} {med(pre['commit_secs']):>20.3f}")
    print(f"samples: {args.repeats} repeats x {args.kills} kills x {len(args.series)} series, chaos "
          f"{args.chaos_secs:g} s x 3 per repeat, {args.trials} SIGTERM trials")
    detect_ms = med(per_run(lambda x: med(x["warm"]["detect"] + x["cold"]["detect"]) * 1000))
    mttr = med(rows[1][1])
    mttr_ratio = med(per_run(lambda x: med(x["warm"]["mttr"]) / med(x["cold"]["mttr"])))
    goodput_vs = med(per_run(lambda x: x["chaos_mem"]["goodput"] / x["calm"]["goodput"]))
    rss = per_run(lambda x: med(x["mem"]["rss"]))
    print(f"{'standby resident memory, MiB':<46} {'':>20} {'':>20} {med(rss):>9.0f} ({spread(rss, '.0f')})")
    interval = med(intervals) if intervals else float("nan")
    calm_interval = med(calm_intervals) if calm_intervals else float("nan")
    if intervals:
        print(f"{'in-memory interval, steps (the kill series)':<46} {'':>20} {'':>20} "
              f"{interval:>9.1f} ({spread(intervals, '.1f')})")
        print(f"goal: steps re-done per kill <= the in-memory interval: {med(rows[5][3]):.1f} <= {interval:.1f} "
              f"{'met' if med(rows[5][3]) <= interval else 'NOT met'}")
    if calm_intervals:
        print(f"{'    the run with no kill (it ages: Young)':<46} {'':>20} {'':>20} "
              f"{calm_interval:>9.1f} ({spread(calm_intervals, '.1f')})")
    print(f"detect_ms={detect_ms:.1f} mttr_s={mttr:.3f} mttr_ratio={mttr_ratio:.3f} goodput={med(rows[-2][1]):.3f} "
          f"preempt_saved={saved} steps_lost={lost} mttr_hot_s={med(rows[1][3]):.3f} "
          f"redone_per_kill={med(rows[5][3]):.1f} redone_per_kill_fork={med(rows[5][1]):.1f} "
          f"goodput_hot={med(rows[-2][3]):.3f} goodput_vs_nokill={goodput_vs:.3f} standby_rss_mb={med(rss):.0f} "
          f"memory_interval_steps={interval:.1f} memory_interval_calm_steps={calm_interval:.1f}")
    own = [(x[k]["own_goodput"], x[k]["goodput"], blocked_share(x[k])) for x in runs for k in ("chaos", "chaos_mem")
           if "own_goodput" in x[k]]
    for mine, theirs, blocked in own:
        print(f"goodput by this script's clock {mine:.3f}; the report's {theirs:.3f} + its snapshot blocks "
              f"{blocked:.3f} (this clock cannot see them) = {theirs + blocked:.3f}")
    promotions = sum(x["mem"]["promoted"] for x in runs)
    print(f"hot series: {promotions} of {args.repeats * args.kills} kills recovered by promoting the ready standby")
    # correctness: each kill was followed by a restart that trained again, every hot-series kill by
    # a promotion (the series waits for a ready standby before each kill), and preemption saved
    ran = [s for s, name in (("warm", "fork"), ("cold", "fresh"), ("mem", "hot")) if name in args.series]
    if pre["saved"] < 1.0 or any(len(x[s]["mttr"]) != args.kills for x in runs for s in ran):
        print("bench_recovery: a restart or an emergency checkpoint failed", file=sys.stderr)
        return 1
    if any(abs(mine - theirs - blocked) > 0.01 for mine, theirs, blocked in own):
        print("bench_recovery: the report's goodput and this script's own clock differ by more than 1 point",
              file=sys.stderr)
        return 1
    if "hot" in args.series and promotions != args.repeats * args.kills:
        print("bench_recovery: a hot-series kill was not recovered by the standby", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
