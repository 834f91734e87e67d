#!/usr/bin/env python3
"""Benchmark (issue 69): stuck trainers found in seconds, slow work left alone.

One concern: measuring how soon procsv finds each kind of hang and that it never kills slow work.

(a) Hangs. For each kind, a launch whose trainer hangs at a step of its first attempt: ``lock`` (a
    deadlock between its threads: a lock it holds, taken again), ``read`` (a read from a pipe that never
    returns), ``sleep`` (a step that sleeps for an hour), and ``group`` (in a two-member
    ``MultiWorkerMirroredStrategy`` group, worker 1 deadlocked while the chief waits for it in the
    step's collectives). From the hang (the program prints its wall time as it hangs) to its
    detection (the judgement: ``hang_detected``'s time less its ``stacks_secs``), to the SIGTERM
    (``hang_detected``) and to the first step of the restarted attempt (``first_step``). Side by
    side: procsv's defaults (``--stuck-secs 10``) and today's rule alone (``--stuck-secs 0`` with
    ``--hang-timeout`` ``--baseline-timeout``, 20 s here: the detection is that timeout, 600 s at
    its default). Each verdict must name the hanging frame (``where``) and, in the group, worker 1
    (``culprit``), else the benchmark fails.
(b) Slow work, one launch of ``--minutes`` (10 for the issue's figure) with default settings: a
    trainer whose first step computes for ``--slow-secs`` (tracing), which then computes for
    ``--slow-secs`` inside its loop every 300 steps (an evaluation), whose steps grow slower, and
    whose checkpoints are large (``--ballast-mb``); beside it a two-member group whose chief computes
    for ``--slow-secs`` every 300 steps while worker 1 waits for it. Any ``hang_detected`` fails
    the benchmark (it must be never).
(c) ``procsv stacks`` on those live launches, three times each: how long the command takes (the issue:
    at most 2 s), and that it names every member.

Medians of ``--runs`` (3) and min-max. Prints a table, then one line:
``lock_detect_s=<x> read_detect_s=<x> sleep_detect_s=<x> group_detect_s=<x> lock_first_step_s=<x> ...
baseline_detect_s=<x> slow_minutes=<x> slow_killed=<n> stacks_cmd_s=<x> load=<x>``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Optional

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(REPO, "tests", "programs", "tiny_train.py")
GROUP = os.path.join(REPO, "tests", "programs", "group_local_nan.py")
KINDS = ("lock", "read", "sleep", "group")
HUNG_LINE = re.compile(r"(?:hanging|reading forever|deadlocked|deadlocks) (?:in )?(?:at )?step (\d+) at ([0-9.]+)")


def events(logdir: str) -> list[dict[str, Any]]:
    try:
        with open(os.path.join(logdir, "logs", "lifecycle.jsonl")) as fh:
            return [json.loads(line) for line in fh.read().split("\n")[:-1]]
    except (FileNotFoundError, json.JSONDecodeError):
        return []


def launch(logdir: str, target: str, args: list[str], opts: list[str], timeout: float) -> tuple[int, str, str]:
    argv = [sys.executable, "-m", "procsv", "launch", target, "--logdir", logdir, *opts, "--", *args]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    return proc.returncode, out, err


def one_hang(kind: str, baseline: bool, timeout_secs: float) -> dict[str, Any]:
    """One launch whose trainer hangs (``kind``); its figures, or raises if the verdict is wrong."""
    logdir = tempfile.mkdtemp(prefix=f"bench-hang-{kind}-")
    rules = ["--stuck-secs", "0", "--hang-timeout", f"{timeout_secs:g}"] if baseline else []
    if kind == "group":
        code, out, err = launch(logdir, GROUP, ["--steps", "200", "--deadlock-at", "100"],
                                ["--nproc", "2", "--standby", "fork", "--hang-grace-secs", "1", *rules], 600)
    else:
        code, out, err = launch(logdir, TINY, ["--steps", "200", "--hang-at-step", "100", "--hang-kind", kind,
                                               "--step-delay", "0.02"], ["--hang-grace-secs", "1", *rules], 600)
    found = HUNG_LINE.search(out)
    ev = events(logdir)
    hang = [e for e in ev if e["event"] == "hang_detected"]
    if code != 0 or found is None or len(hang) != 1:
        raise SystemExit(f"bench_hang: {kind}: exit {code}, hang line {bool(found)}, {len(hang)} verdict(s)\n{err[-2000:]}")
    h = hang[0]
    frame = {"lock": "held.acquire()  # never returns", "read": "os.read(r, 1)",
             "sleep": "time.sleep(0.05 if args.hang_until_stop else 3600)",
             "group": "stuck.acquire()  # never returns"}[kind]
    program = GROUP if kind == "group" else TINY
    with open(program) as fh:
        line = next(n for n, text in enumerate(fh, 1) if frame in text)
    expect = f"({os.path.basename(program)}:{line})"
    if expect not in h["where"] or (kind == "group" and h["culprit"] != "worker1"):
        raise SystemExit(f"bench_hang: {kind}: the verdict names {h['where']!r} (culprit {h['culprit']!r}), "
                         f"not {expect}")
    hung_at = float(found.group(2))
    first = next((e for e in ev if e["event"] == "first_step" and e["time"] > h["time"]), None)
    return {"detect": h["time"] - h["stacks_secs"] - hung_at, "signal": h["time"] - hung_at,
            "first_step": (first["time"] - hung_at) if first else float("nan"), "stacks": h["stacks_secs"]}


def _text(path: str) -> str:
    try:
        with open(path, errors="replace") as fh:
            return fh.read()
    except OSError:
        return ""


def slow_work(minutes: float, slow_secs: float, ballast: int) -> tuple[int, list[str], float]:
    """The slow-work launches (a single trainer and a group) side by side for ``minutes``, ``procsv stacks``
    three times on each meanwhile; (verdicts, notes, the median time of procsv stacks)."""
    secs = minutes * 60
    runs = []
    tiny_dir, group_dir = tempfile.mkdtemp(prefix="bench-slow-"), tempfile.mkdtemp(prefix="bench-slow-group-")
    tiny = [sys.executable, "-m", "procsv", "launch", TINY, "--logdir", tiny_dir, "--", "--steps", "100000000",
            "--step-delay", "0.02", "--step-growth", "0.00001", "--compute-at-step", "300", "--compute-every", "300",
            "--compute-secs", f"{slow_secs:g}", "--first-compute", f"{slow_secs:g}", "--ballast-mb", str(ballast),
            "--save-steps", "500"]
    group = [sys.executable, "-m", "procsv", "launch", GROUP, "--logdir", group_dir, "--nproc", "2", "--",
             "--steps", "100000000", "--compute-at", "300", "--compute-every", "300", "--compute-secs", f"{slow_secs:g}",
             "--step-delay", "0.02"]
    for argv in (tiny, group):
        runs.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=REPO,
                                     start_new_session=True))
    looks: dict[str, list[float]] = {"trainer": [], "group": []}
    try:
        started = time.monotonic()
        for d in (tiny_dir, group_dir):  # (the first attempts start after the pre-warmed trainer's import)
            while time.monotonic() - started < 300 and '"event": "first_step"' not in _text(
                    os.path.join(d, "logs", "lifecycle.jsonl")):
                time.sleep(0.5)
        for i in range(3):  # (c) procsv stacks on the live launches, a quarter of the way in each time
            time.sleep(secs / 4)
            for name, d in (("trainer", tiny_dir), ("group", group_dir)):
                t0 = time.monotonic()
                got = subprocess.run([sys.executable, "-m", "procsv", "stacks", d], capture_output=True, text=True,
                                     cwd=REPO)
                looks[name].append(time.monotonic() - t0)
                if got.returncode != 0 or "trainer (pid " not in got.stdout or \
                        (name == "group" and "worker1 (pid " not in got.stdout):
                    raise SystemExit(f"bench_hang: procsv stacks on the live {name} failed: {got.stderr[-1000:]}")
        time.sleep(max(0.0, secs - (time.monotonic() - started)))
    finally:  # (a failed check stops the launches too: none is left running)
        for p in runs:
            os.killpg(p.pid, signal.SIGTERM)
    for p in runs:
        p.communicate(timeout=300)
    verdicts, notes = 0, []
    for name, d in (("trainer", tiny_dir), ("group", group_dir)):
        ev = events(d)
        hangs = [e for e in ev if e["event"] == "hang_detected"]
        attempts = sum(1 for e in ev if e["event"] == "spawned" and e.get("role") == "trainer")
        steps = max((e.get("step", 0) for e in ev if e["event"] in ("trained", "finished")), default=0)
        try:
            with open(os.path.join(d, "logs", "trainer.1.log"), errors="replace") as fh:
                computed = sum(1 for line in fh if "computing in step" in line or "the chief computes" in line)
        except OSError:
            computed = 0
        verdicts += len(hangs)
        notes.append(f"{name}: {len(hangs)} verdict(s), {attempts} attempt(s), step {steps}, {computed} computation(s) "
                     f"of {slow_secs:g} s; procsv stacks took {statistics.median(looks[name]):.2f} s "
                     f"({min(looks[name]):.2f}-{max(looks[name]):.2f})" + "".join(f"; judged: {h['reason']}" for h in hangs))
    stacks_s = statistics.median(looks["trainer"] + looks["group"])
    return verdicts, notes, stacks_s


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--kinds", default=",".join(KINDS))
    p.add_argument("--baseline-timeout", type=float, default=20.0)
    p.add_argument("--minutes", type=float, default=10.0, help="the slow-work launches' length (0: none)")
    p.add_argument("--slow-secs", type=float, default=60.0)
    p.add_argument("--ballast-mb", type=int, default=256)
    args = p.parse_args()
    kinds = [k for k in args.kinds.split(",") if k]
    results: dict[tuple[str, bool], list[dict[str, Any]]] = {}
    for _ in range(args.runs):
        for kind in kinds:
            for baseline in (False, True):
                results.setdefault((kind, baseline), []).append(one_hang(kind, baseline, args.baseline_timeout))
    verdicts, notes, stacks_s = slow_work(args.minutes, args.slow_secs, args.ballast_mb) if args.minutes > 0 \
        else (0, [], float("nan"))
    load = os.getloadavg()[0]

    def med(kind: str, baseline: bool, key: str) -> str:
        xs = [r[key] for r in results[(kind, baseline)]]
        return f"{statistics.median(xs):.2f} ({min(xs):.2f}-{max(xs):.2f})"

    print(f"{'hang':<7} {'rule':<28} {'to detection s':>20} {'to SIGTERM s':>20} {'to first step s':>20} {'stacks s':>18}")
    for kind in kinds:
        for baseline in (False, True):
            rule = f"--hang-timeout {args.baseline_timeout:g} alone" if baseline else "--stuck-secs 10 (default)"
            print(f"{kind:<7} {rule:<28} {med(kind, baseline, 'detect'):>20} {med(kind, baseline, 'signal'):>20} "
                  f"{med(kind, baseline, 'first_step'):>20} {med(kind, baseline, 'stacks'):>18}")
    for note in notes:
        print(f"slow work over {args.minutes:g} min: {note}")
    line = " ".join(f"{k}_{f}_s={statistics.median(r[f] for r in results[(k, False)]):.2f}"
                    for k in kinds for f in ("detect", "first_step"))
    base = statistics.median(r["detect"] for k in kinds for r in results[(k, True)]) if kinds else float("nan")
    print(f"{line} baseline_detect_s={base:.2f} slow_minutes={args.minutes:g} slow_killed={verdicts} "
          f"stacks_cmd_s={stacks_s:.2f} load={load:.1f}")
    return 1 if verdicts else 0


if __name__ == "__main__":
    sys.exit(main())
