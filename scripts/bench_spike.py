#!/usr/bin/env python3
"""Benchmark: what a loss spike costs a run under ``procsv launch --on-spike rollback`` (issue 68).

Runs in this process (the driver) plus the ``procsv launch`` runs it starts, one at a time. The
training program of the spike cases is ``tests/programs/spike_train.py`` (a custom eager loop, SGD
with momentum, the batch of step s a function of s alone), with the rule's default thresholds
(a window of 200 losses, none judged before 100) and ``--times`` (each step's run, replays too,
written with its wall time: the course of the run read back).

(a) An injected spike, ``--repeats`` launches: the batch of step ``--spike-at`` scaled 7-fold (its
    loss jumps ~50x). procsv finds it at a check (an in-memory snapshot's, or a checkpoint's),
    restores the newest state before its onset in place, replays to it (the replay gives its loss
    again, bit for bit: the data's), restores again, replays to the step before the onset and skips
    the onset .. the detection. Measured: the **detection delay** in steps (the last step run before
    the first restore, read from the course: the step after which the loop went back, minus the
    spike's step), the time **from detection to the first good step** (the ``spike_detected``
    record's time, as the watchdog wrote it, to the wall time of the step after the skipped ones,
    run after the skip; one machine, one clock), the **steps re-done** (every run of a step minus
    the distinct steps run: the two replays), and where the restores read from.
    Correctness: each launch exits 0, its ``spike_detected`` names the spike's step, its
    ``spike_replayed`` says reproduced, it skipped exactly the onset .. the detection
    (``skipped_steps`` in ``logs/report.json``), and its final weights (every variable of the final
    checkpoint) are **bit-equal** to a plain ``python spike_train.py --skip-at ...`` run that never
    applied those steps: ``exact=1``. ``--load``: the same launches again with two CPU-bound
    processes beside each (the issue's goal: detection to the first good step within 0.5 s at load).
(b) A transient spike, ``--repeats`` launches: step ``--spike-at``'s batch scaled only the first time
    this process runs it (``--transient-at``: a miscomputed step, not the data). Correctness: it is
    detected, its replay does not give the loss again (``spike_replayed`` reproduced false: the
    machine's), nothing is skipped, and the final weights are bit-equal to a plain run that never
    spiked (the replay trained the step right): ``transient_ok=1``.
(c) False flags: every example program in ``procsv/examples`` (its own top level, ``seeds/`` and
    ``seeds_tf1/``), each launched with the options it needs (a group, parameter servers) for
    ``--clean-steps`` steps (Keras ``fit``: as many batches, in whole epochs) under the default
    ``--on-spike warn``: its ``spike_detected`` records are counted; goal 0 (``--clean-repeats``
    launches each; a count over all of them, not a median). ``--examples`` picks some.

The training loops: :data:`LOOPS` holds the ones whose spike cases (a) and (b) are built, each a
function of the case to one launch's measurement (``custom``: ``spike_train.py``); Keras ``fit`` and
a two-member group are being built (issue 68) and go there, each with its own plain run to compare
with. Figures are medians over the repeats, with the spread (min..max) in the table. Prints the
tables, then one line:
``spike_detect_delay_steps=<x> spike_recovery_s=<x> spike_redone_steps=<x> exact=<0|1>
transient_ok=<0|1> false_flags=<n> clean_runs=<n> [spike_recovery_load_s=<x>] load=<x>``
and exits 1 if a correctness check failed (or a run did not finish).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Optional

ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", TF_ENABLE_ONEDNN_OPTS="0", PYTHONUNBUFFERED="1")
os.environ.update(TF_CPP_MIN_LOG_LEVEL="3", TF_ENABLE_ONEDNN_OPTS="0")  # this process reads checkpoints
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPIKE_TRAIN = os.path.join(ROOT, "tests", "programs", "spike_train.py")
KERAS_BATCHES_PER_EPOCH = 45  # procsv.examples.keras_fit: 1437 training rows of the digits at batch 32

# (c): every example program, with the launch options it needs and how it is told its length
EXAMPLES: dict[str, tuple[tuple[str, ...], Callable[[int, str], list[str]]]] = {
    "digits": ((), lambda n, d: ["--steps", str(n)]),
    "elastic_digits": (("--nproc", "2", "--standby", "fork"), lambda n, d: ["--steps", str(n)]),
    "keras_fit": ((), lambda n, d: ["--epochs", str(max(1, n // KERAS_BATCHES_PER_EPOCH))]),
    "ps_strategy": (("--ps", "1", "--workers", "2", "--coordinator"), lambda n, d: ["--steps", str(n)]),
    "supervised": ((), lambda n, d: ["--steps", str(n)]),
    **{f"seeds.{name}": ((), lambda n, d: ["--steps", str(n)])
       for name in ("basic", "loop", "manual_summaries", "monitored_session", "monitored_training", "retry",
                    "run_step_fn")},
    **{f"seeds_tf1.{name}": ((), lambda n, d: ["--steps", str(n)])
       for name in ("basic", "loop", "manual_summaries", "retry")},
    # (TF1's MonitoredSession family reads its checkpoint_dir from the program's own --logdir)
    **{f"seeds_tf1.{name}": ((), lambda n, d: ["--steps", str(n), "--logdir", d])
       for name in ("monitored_session", "monitored_training", "run_step_fn", "singular_monitored")},
    "seeds_tf1.replicas": (("--ps", "1", "--workers", "2"), lambda n, d: ["--steps", str(n)]),
}


class BenchError(Exception):
    pass


def events(logdir: str) -> list[dict[str, Any]]:
    path = os.path.join(logdir, "logs", "lifecycle.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as fh:
        return [json.loads(line) for line in fh if line.strip()]


def final_weights(logdir: str) -> dict[str, bytes]:
    """Every variable of the newest checkpoint in ``logdir``, as bytes."""
    import tensorflow as tf

    latest = tf.train.latest_checkpoint(logdir)
    if latest is None:
        raise BenchError(f"no checkpoint in {logdir}")
    reader = tf.train.load_checkpoint(latest)
    return {k: reader.get_tensor(k).tobytes() for k in reader.get_variable_to_shape_map()
            if k.endswith("VARIABLE_VALUE") and not k.startswith("save_counter")}


def spike_args(args: argparse.Namespace) -> list[str]:
    """spike_train.py's flags of every run (launched or plain): the rule's defaults, the length, the saves."""
    return ["--steps", str(args.steps), "--save-steps", str(args.save_steps), "--window", "200",
            "--min-history", "100", "--step-delay", str(args.step_delay)]


def plain_spike_train(args: argparse.Namespace, logdir: str, skip: list[int]) -> dict[str, bytes]:
    """The plain run (no launch) that never applied the steps ``skip``: its final weights."""
    cmd = [sys.executable, SPIKE_TRAIN, "--logdir", logdir, *spike_args(args), "--on-spike", "off", "--step-delay", "0"]
    for s in skip:
        cmd += ["--skip-at", str(s)]
    done = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=600)
    if done.returncode != 0:
        raise BenchError(f"the plain run exited {done.returncode}: {done.stderr[-2000:]}")
    return final_weights(logdir)


def runs_of(path: str) -> list[tuple[int, float]]:
    """(step, wall time) of each run of a step, in order (spike_train.py's ``--times``)."""
    with open(path) as fh:
        return [(int(a), float(b)) for a, b in (line.split() for line in fh if line.strip())]


def custom_loop(args: argparse.Namespace, folder: str, transient: bool) -> dict[str, Any]:
    """One launch of spike_train.py under ``--on-spike rollback`` with a spike (``transient``: the
    machine's) at ``--spike-at``: what it measured, and what it did (for the checks)."""
    logdir, times = os.path.join(folder, "run"), os.path.join(folder, "times.txt")
    flag = "--transient-at" if transient else "--spike-at"
    cmd = [sys.executable, "-m", "procsv", "launch", SPIKE_TRAIN, "--logdir", logdir, "--quiet", "--on-spike",
           "rollback", "--", *spike_args(args), flag, str(args.spike_at), "--times", times]
    done = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=900)
    if done.returncode != 0:
        raise BenchError(f"the {'transient' if transient else 'spike'} launch exited {done.returncode}: "
                         f"{(done.stdout + done.stderr)[-2000:]}")
    ev = events(logdir)
    found = [e for e in ev if e["event"] == "spike_detected"]
    replayed = [e for e in ev if e["event"] == "spike_replayed"]
    back = [e for e in ev if e["event"] == "rolled_back"]
    with open(os.path.join(logdir, "logs", "report.json")) as fh:
        skipped = json.load(fh).get("skipped_steps") or []
    course = runs_of(times)
    out: dict[str, Any] = {"found": [(e["step"], e["onset"]) for e in found],
                           "reproduced": [e["reproduced"] for e in replayed], "skipped": skipped,
                           "sources": sorted({e["source"] for e in back}), "weights": final_weights(logdir),
                           "redone": len(course) - len({s for s, _ in course})}
    if found:
        first = found[0]
        detected_at = first["time"]  # (the watchdog's record of it: ms after the trainer's check)
        back_at = next((i for i in range(1, len(course)) if course[i][0] <= course[i - 1][0]), None)
        if back_at is not None:  # the check ran at the boundary after the last step before the first restore
            out["delay"] = course[back_at - 1][0] - first["step"]
        good = first["step"] + 1  # the step after the skipped ones (a transient: after the spike, replayed)
        after = [t for s, t in course if s == good and t > detected_at]
        out["recovery"] = after[-1] - detected_at if after else float("nan")  # (the run of it that stands)
    return out


# the loops whose spike cases are built: (a) and (b) for one launch of each. Keras fit ("keras":
# procsv.keras.BackupAndRestore, a batch of one epoch scaled) and a two-member group ("group": procsv
# launch --nproc 2, every member skipping alike) are being built (issue 68): each adds its function here,
# with the plain run its final weights are compared with
LOOPS: dict[str, Callable[[argparse.Namespace, str, bool], dict[str, Any]]] = {"custom": custom_loop}
PLAIN: dict[str, Callable[[argparse.Namespace, str, list[int]], dict[str, bytes]]] = {"custom": plain_spike_train}


def clean_run(example: str, steps: int, folder: str) -> dict[str, Any]:
    """(c): one launch of ``procsv.examples.<example>`` for ``steps`` steps under the default
    ``--on-spike warn``: its spike records (any is a false flag)."""
    opts, length = EXAMPLES[example]
    logdir = os.path.join(folder, "run")
    cmd = [sys.executable, "-m", "procsv", "launch", f"procsv.examples.{example}", "--logdir", logdir, "--quiet",
           *opts, "--", *length(steps, logdir)]
    began = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=1800)
    if done.returncode != 0:
        raise BenchError(f"{example} exited {done.returncode}: {(done.stdout + done.stderr)[-2000:]}")
    ev = events(logdir)
    flags = [e for e in ev if e["event"] == "spike_detected"]
    last = next((e.get("step") for e in reversed(ev) if e["event"] == "finished"), None)
    return {"flags": flags, "step": last, "secs": time.monotonic() - began}


def spread(values: list[float], fmt: str = "{:.3f}") -> str:
    if not values:
        return "-"
    return f"{fmt.format(statistics.median(values))} ({fmt.format(min(values))}..{fmt.format(max(values))})"


def med(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def check_spike(run: dict[str, Any], spike_at: int, baseline: dict[str, bytes], transient: bool) -> list[str]:
    """What is wrong with one launch of (a) (``transient``: of (b)); [] if nothing."""
    wrong = []
    if [s for s, _ in run["found"]] != [spike_at]:
        wrong.append(f"spike_detected at {run['found']}, not step {spike_at}")
    if run["reproduced"] != [not transient]:
        wrong.append(f"spike_replayed reproduced {run['reproduced']}, not [{not transient}]")
    onset = run["found"][0][1] if run["found"] else spike_at
    expected = [] if transient else list(range(onset, spike_at + 1))
    if run["skipped"] != expected:
        wrong.append(f"skipped {run['skipped']}, not {expected}")
    if run["weights"].keys() != baseline.keys() or any(run["weights"][k] != baseline[k] for k in baseline):
        wrong.append("final weights differ from the plain run's" + ("" if transient else f" that skips {expected}"))
    return wrong


def table(loops: dict[str, dict[str, list[dict[str, Any]]]], clean: dict[str, list[dict[str, Any]]],
          exact: dict[str, bool], args: argparse.Namespace) -> dict[str, float]:
    """Print the tables; return the figures of the final line (the first loop's: ``custom``)."""
    figures: dict[str, float] = {}
    for loop, rows in loops.items():
        print(f"{'(a) ' + loop + ': a 50x spike, rolled back and skipped':<52} {'median (spread over runs)':>28}")
        for row, runs in rows.items():
            if row == "transient" or not runs:
                continue
            if row == "load":
                print(f"{'  at load (two CPU-bound processes beside it):':<52}")
            delay = [float(r["delay"]) for r in runs if "delay" in r]
            recovery = [r["recovery"] for r in runs if "recovery" in r]
            redone = [float(r["redone"]) for r in runs]
            print(f"{'detection delay, steps after the spike':<52} {spread(delay, '{:.0f}'):>28}")
            print(f"{'detection -> first good step after the skip (s)':<52} {spread(recovery):>28}")
            print(f"{'steps re-done (both replays)':<52} {spread(redone, '{:.0f}'):>28}")
            print(f"{'restored from':<52} {', '.join(sorted(set().union(*(r['sources'] for r in runs)))):>28}")
            print(f"{'exact (bit-equal to the plain run without it)':<52} {int(exact[f'{loop}:{row}']):>28}")
            if not figures or row == "load":
                key = "_load" if row == "load" else ""
                figures.update({f"spike_detect_delay_steps{key}": med(delay), f"spike_recovery_s{key}": med(recovery),
                                f"spike_redone_steps{key}": med(redone)})
        transient = rows.get("transient", [])
        if transient:
            print(f"{'(b) ' + loop + ': a transient spike (the machine)':<52}")
            print(f"{'attributed to the machine, nothing skipped, exact':<52} "
                  f"{sum(not check_spike(r, args.spike_at, r['baseline'], True) for r in transient):>22} of "
                  f"{len(transient)}")
            recovery = [r["recovery"] for r in transient if "recovery" in r]
            print(f"{'detection -> the step after it, replayed (s)':<52} {spread(recovery):>28}")
        print(f"({args.steps} steps of {args.step_delay * 1000:g} ms more each, spike at step {args.spike_at}, "
              f"a checkpoint every {args.save_steps} steps; {args.repeats} launches each)")
    if clean:
        print(f"\n{'(c) false flags under --on-spike warn':<40} {'runs':>6} {'last step':>10} {'flags':>6} {'secs':>8}")
        for example, runs in clean.items():
            steps = ",".join(str(r["step"]) for r in runs)
            print(f"{example:<40} {len(runs):>6} {steps:>10} {sum(len(r['flags']) for r in runs):>6} "
                  f"{med([r['secs'] for r in runs]):>8.1f}")
            for r in runs:
                for flag in r["flags"]:
                    print(f"    flagged: step {flag['step']} loss {flag['loss']:.4g} threshold {flag['threshold']:.4g} "
                          f"median {flag['median']:.4g}")
    return figures


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--repeats", type=int, default=3, help="launches of each spike case (default 3)")
    p.add_argument("--loops", nargs="+", choices=sorted(LOOPS), default=sorted(LOOPS),
                   help="the training loops of (a) and (b) (built: custom)")
    p.add_argument("--steps", type=int, default=400, help="steps of each spike launch (default 400)")
    p.add_argument("--spike-at", type=int, default=265,
                   help="the spike's step (default 265, between two checkpoints; >= 101: the rule judges nothing "
                        "before 100 losses)")
    p.add_argument("--save-steps", type=int, default=50, help="a checkpoint every N steps (default 50)")
    p.add_argument("--step-delay", type=float, default=0.005, help="seconds each step sleeps (default 0.005)")
    p.add_argument("--load", action="store_true", help="(a) again with two CPU-bound processes beside each launch")
    p.add_argument("--no-transient", action="store_true", help="leave out (b)")
    p.add_argument("--clean-steps", type=int, default=3000, help="(c): steps of each example's run (default 3000)")
    p.add_argument("--clean-repeats", type=int, default=1, help="(c): launches of each example (default 1)")
    p.add_argument("--examples", nargs="*", choices=sorted(EXAMPLES), default=None,
                   help="(c): the examples to run (default: all; none: leave (c) out)")
    p.add_argument("--dry-run", action="store_true", help=argparse.SUPPRESS)  # the tables of made-up runs
    args = p.parse_args(argv)
    if args.repeats < 1 or not 100 < args.spike_at < args.steps:
        p.error("--repeats must be >= 1 and --spike-at within 101..--steps-1")
    examples = sorted(EXAMPLES) if args.examples is None else args.examples
    began = time.monotonic()
    wrong: list[str] = []
    loops: dict[str, dict[str, list[dict[str, Any]]]] = {}
    clean: dict[str, list[dict[str, Any]]] = {}
    exact: dict[str, bool] = {}
    with tempfile.TemporaryDirectory(prefix="bench_spike_") as tmp:
        for loop in args.loops:
            run, plain = LOOPS[loop], PLAIN[loop]
            if args.dry_run:
                break
            skipped = plain(args, os.path.join(tmp, f"{loop}-plain-skip"), [args.spike_at])
            clean_weights = plain(args, os.path.join(tmp, f"{loop}-plain"), []) if not args.no_transient else {}
            rows: dict[str, list[dict[str, Any]]] = {"quiet": [], "load": [], "transient": []}
            for row in ("quiet", "load", "transient"):
                if (row == "load" and not args.load) or (row == "transient" and args.no_transient):
                    continue
                exact[f"{loop}:{row}"] = True
                for r in range(args.repeats):
                    busy = [subprocess.Popen([sys.executable, "-c", "while 1: pass"])
                            for _ in range(2 if row == "load" else 0)]
                    try:
                        one = run(args, os.path.join(tmp, f"{loop}-{row}-{r}"), row == "transient")
                    finally:
                        for proc in busy:
                            proc.kill()
                            proc.wait()
                    one["baseline"] = clean_weights if row == "transient" else skipped
                    bad = check_spike(one, args.spike_at, one["baseline"], row == "transient")
                    if row != "transient" and one["found"] and one["found"][0][1] != args.spike_at:
                        # (an onset before the spike's step: the plain run to compare with skips those too)
                        one["baseline"] = plain(args, os.path.join(tmp, f"{loop}-plain-{row}-{r}"),
                                                list(range(one["found"][0][1], args.spike_at + 1)))
                        bad = check_spike(one, args.spike_at, one["baseline"], False)
                    wrong += [f"{loop} {row} run {r}: {w}" for w in bad]
                    exact[f"{loop}:{row}"] = exact[f"{loop}:{row}"] and not bad
                    rows[row].append(one)
            loops[loop] = rows
        for example in examples if not args.dry_run else ():
            for r in range(args.clean_repeats):
                try:
                    one = clean_run(example, args.clean_steps, os.path.join(tmp, f"clean-{example}-{r}"))
                except BenchError as exc:  # (the others still run)
                    wrong.append(str(exc))
                    continue
                clean.setdefault(example, []).append(one)
    if args.dry_run:  # the table code on made-up runs (no launch)
        made = {"found": [(args.spike_at, args.spike_at)], "reproduced": [True], "skipped": [args.spike_at],
                "sources": ["memory"], "weights": {}, "redone": 80, "delay": 12, "recovery": 0.2, "baseline": {}}
        loops = {"custom": {"quiet": [made] * 3, "load": [], "transient": [dict(made, reproduced=[False], skipped=[])]}}
        exact = {"custom:quiet": True, "custom:transient": True}
        clean = {"digits": [{"flags": [], "step": args.clean_steps, "secs": 1.0}]}
    figures = table(loops, clean, exact, args)
    flags = sum(len(r["flags"]) for runs in clean.values() for r in runs)
    if flags:
        wrong.append(f"{flags} false flags in the clean runs")
    for w in wrong:
        print(f"bench_spike: {w}", file=sys.stderr)
    spikes_exact = all(v for k, v in exact.items() if not k.endswith(":transient"))
    transient_ok = all(v for k, v in exact.items() if k.endswith(":transient"))
    load = os.getloadavg()[0]
    line = " ".join(f"{k}={v:.3f}" if "recovery" in k else f"{k}={v:.1f}" for k, v in figures.items())
    print(f"({time.monotonic() - began:.0f} s in all, load {load:.1f})")
    print(f"{line} exact={int(spikes_exact)} transient_ok={int(transient_ok)} false_flags={flags} "
          f"clean_runs={sum(len(runs) for runs in clean.values())} load={load:.1f}")
    return 1 if wrong else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BenchError as exc:
        print(f"bench_spike: {exc}", file=sys.stderr)
        sys.exit(1)
