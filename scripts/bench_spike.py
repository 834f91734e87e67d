#!/usr/bin/env python3
"""Benchmark: what a loss spike costs a run under ``procsv launch --on-spike rollback`` (issue 68).

One concern: the spike cases of a custom loop, Keras ``fit`` and a two-member group, and the false flags of the
example programs, each measured from its launches' course and records and checked against its plain run.

Runs in this process (the driver) plus the ``procsv launch`` runs it starts, one at a time. The
cases of (a) and (b) (``--case loop,fit,group``, default all; side by side in one table), each a
program whose batch of step s is a function of s alone, started with ``--times`` (each step's run,
replays too, written with its wall time: the course of the run read back):

- ``loop``: ``tests/programs/spike_train.py`` (a custom eager loop, SGD with momentum), with the
  rule's default thresholds (a window of 200 losses, none judged before 100); its plain run is
  ``python spike_train.py --skip-at ...``.
- ``fit``: ``tests/programs/keras_nan.py`` (Keras ``fit`` under ``procsv.keras.BackupAndRestore(
  on_spike="rollback")``, SGD without momentum, 6 epochs of 10 batches, a checkpoint every 10
  batches, the rule's window 20 and min_history 15): batch 44 (step 45, mid-epoch) scaled 7-fold;
  its transient is the first computation of batch 37's loss (step 38) scaled 50-fold. Its plain run
  is a ``fit`` without procsv whose skipped batches have sample weight 0 (no update); the optimizer's
  iteration count is left out of the comparison (a skipped batch counts none).
- ``group``: ``tests/programs/group_local_nan.py`` under ``--nproc 2`` (a MultiWorkerMirroredStrategy
  custom loop returning ``strategy.reduce(SUM, per_replica_loss)``; the Supervisor's rule with window
  20, min_history 20, z 6), 120 steps, worker 1's batch of step 70 scaled (the group's loss ~50x):
  the chief finds it, the group restarts and every member restores the newest state before it and
  skips it. Its course is the chief's. Its plain run is a launched group (``--standby fork``) with
  ``--skip-at``. It has no (b): a group's spike is not replayed (taken as the data's; a replay would
  cost a second restart of every member), and the table says so in its column.

(a) An injected spike, ``--runs`` launches: the loop's batch of step ``--spike-at`` scaled 7-fold (its
    loss jumps ~50x). procsv finds it at a check (an in-memory snapshot's, or a checkpoint's),
    restores the newest state before its onset in place, replays to it (the replay gives its loss
    again, bit for bit: the data's), restores again, replays to the step before the onset and skips
    the onset .. the detection. Measured: the **detection delay** in steps (the last step run before
    the first restore, read from the course: the step after which the loop went back, minus the
    spike's step), the time **from detection to the first good step** (the ``spike_detected``
    record's time, as the watchdog wrote it, to the wall time of the step after the skipped ones,
    run after the skip; one machine, one clock; a group's includes its restart), the **steps
    re-done** (every run of a step minus the distinct steps run: the two replays; a group's: from
    its restored state to where it found the spike), and where the restores read from.
    Correctness: each launch exits 0, its ``spike_detected`` names the spike's step, its
    ``spike_replayed`` says reproduced (a group: no ``spike_replayed``), it skipped exactly the
    onset .. the detection (``skipped_steps`` in ``logs/report.json``), and its final weights are
    **bit-equal** to its case's plain run that never applied those steps: ``exact=1`` (the loop),
    ``fit_exact=1``, ``group_exact=1``. ``--load``: the same launches again with two CPU-bound
    processes beside each (the issue's goal: detection to the first good step within 0.5 s at load).
(b) A transient spike, ``--runs`` launches (the loop and the fit): the spike's batch scaled only the
    first time this process runs it (``--transient-at``: a miscomputed step, not the data). Correctness: it is
    detected, its replay does not give the loss again (``spike_replayed`` reproduced false: the
    machine's), nothing is skipped, and the final weights are bit-equal to a plain run that never
    spiked (the replay trained the step right): ``transient_ok=1``, ``fit_transient_ok=1``.
(c) False flags: every example program in ``procsv/examples`` (its own top level, ``seeds/`` and
    ``seeds_tf1/``), each launched with the options it needs (a group, parameter servers) for
    ``--clean-steps`` steps (Keras ``fit``: as many batches, in whole epochs) under the default
    ``--on-spike warn``: its ``spike_detected`` records are counted; goal 0 (``--clean-repeats``
    launches each; a count over all of them, not a median). ``--examples`` picks some (none: no (c)).

Figures are medians over the runs (``--runs``, default 3; ``--runs 1``: a quick pass), with the spread
(min..max) in the table. Prints the tables, then one line: the loop's keys as they were,
``spike_detect_delay_steps=<x> spike_recovery_s=<x> spike_redone_steps=<x> [spike_detect_delay_steps_load=<x>
spike_recovery_s_load=<x> spike_redone_steps_load=<x>] exact=<0|1> transient_ok=<0|1> false_flags=<n>
clean_runs=<n> load=<x>``, then the fit's and the group's, named as the loop's with ``fit_`` and ``group_``
before them (``fit_spike_recovery_s=<x> ... fit_exact=<0|1> fit_transient_ok=<0|1> group_spike_recovery_s=<x>
... group_exact=<0|1>``; a case left out by ``--case`` has none), and exits 1 if a correctness check failed (or a
run did not finish).
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
    """(step, wall time) of each run of a step, in order (the programs' ``--times``)."""
    with open(path) as fh:
        return [(int(a), float(b)) for a, b in (line.split() for line in fh if line.strip())]


def measured(logdir: str, times: str, weights: dict[str, bytes]) -> dict[str, Any]:
    """What one launch with a spike measured (its course read back from ``times``), and what it did (for the
    checks): the spike records, the replays' verdicts, the steps skipped, where the restores read from (an in-place
    rollback's ``rolled_back``, a restarted group's ``restored`` after the spike), the final ``weights``."""
    ev = events(logdir)
    found = [e for e in ev if e["event"] == "spike_detected"]
    replayed = [e for e in ev if e["event"] == "spike_replayed"]
    since = found[0]["time"] if found else float("inf")
    sources = {e["source"] for e in ev if e["event"] == "rolled_back"} | {
        e["source"] for e in ev if e["event"] == "restored" and e["time"] >= since and e.get("source")}
    with open(os.path.join(logdir, "logs", "report.json")) as fh:
        skipped = json.load(fh).get("skipped_steps") or []
    course = runs_of(times)
    out: dict[str, Any] = {"found": [(e["step"], e["onset"]) for e in found],
                           "reproduced": [e["reproduced"] for e in replayed], "skipped": skipped,
                           "sources": sorted(sources), "weights": weights,
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


def launched(what: str, cmd: list[str], timeout: float = 900) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=timeout)
    if done.returncode != 0:
        raise BenchError(f"{what} exited {done.returncode}: {(done.stdout + done.stderr)[-2000:]}")


def custom_loop(args: argparse.Namespace, folder: str, transient: bool) -> dict[str, Any]:
    """One launch of spike_train.py under ``--on-spike rollback`` with a spike (``transient``: the
    machine's) at ``--spike-at``: what it measured, and what it did (for the checks)."""
    logdir, times = os.path.join(folder, "run"), os.path.join(folder, "times.txt")
    flag = "--transient-at" if transient else "--spike-at"
    launched(f"the loop's {'transient' if transient else 'spike'} launch",
             [sys.executable, "-m", "procsv", "launch", SPIKE_TRAIN, "--logdir", logdir, "--quiet", "--on-spike",
              "rollback", "--", *spike_args(args), flag, str(args.spike_at), "--times", times])
    return measured(logdir, times, final_weights(logdir))


# (a) and (b) in Keras fit: keras_nan.py (BackupAndRestore(on_spike="rollback"), the rule's window 20 and
# min_history 15; SGD without momentum), FIT_EPOCHS epochs of 10 batches, a checkpoint every 10 batches; batch
# FIT_SPIKE_BATCH (mid-epoch) scaled 7-fold for (a), the first computation of batch FIT_TRANSIENT_BATCH's loss
# 50x for (b). procsv's step of batch b is b + 1
KERAS_NAN = os.path.join(ROOT, "tests", "programs", "keras_nan.py")
FIT_EPOCHS, FIT_SPIKE_BATCH, FIT_TRANSIENT_BATCH = 6, 44, 37
FIT_ARGS = ("--epochs", str(FIT_EPOCHS), "--noise", "0.5", "--op-determinism")


def fit_weights(path: str) -> dict[str, bytes]:
    """keras_nan.py's ``--weights-out``: the model's weights (the optimizer's iteration count, last, left out:
    a skipped batch counts none, a plain fit's batch of sample weight 0 one)."""
    import numpy as np

    with np.load(path) as saved:
        return {k: saved[k].tobytes() for k in saved.files[:-1]}


def keras_fit(args: argparse.Namespace, folder: str, transient: bool) -> dict[str, Any]:
    """One launch of keras_nan.py under ``--on-spike rollback``, as :func:`custom_loop`."""
    logdir, times, out = (os.path.join(folder, name) for name in ("run", "times.txt", "weights.npz"))
    flag, batch = ("--transient-at", FIT_TRANSIENT_BATCH) if transient else ("--spike-at", FIT_SPIKE_BATCH)
    launched(f"the fit's {'transient' if transient else 'spike'} launch",
             [sys.executable, "-m", "procsv", "launch", KERAS_NAN, "--logdir", logdir, "--quiet", "--on-spike",
              "rollback", "--", *FIT_ARGS, "--on-spike", "rollback", "--save-freq", "10", "--batch-delay",
              str(args.step_delay), flag, str(batch), "--times", times, "--weights-out", out])
    return measured(logdir, times, fit_weights(out))


def plain_keras_fit(args: argparse.Namespace, folder: str, skip: list[int]) -> dict[str, bytes]:
    """The plain fit (no procsv) that never applied the steps ``skip`` (their batches of sample weight 0: SGD
    without momentum moves nothing): its final weights."""
    os.makedirs(folder, exist_ok=True)
    out = os.path.join(folder, "weights.npz")
    cmd = [sys.executable, KERAS_NAN, "--no-callback", *FIT_ARGS, "--weights-out", out,
           "--times", os.path.join(folder, "times.txt")]  # (the same loss function as the launch's)
    for s in skip:
        cmd += ["--zero-weight-at", str(s - 1)]
    launched("the plain fit", cmd, 600)
    return fit_weights(out)


# (a) in a two-member group: group_local_nan.py under procsv launch --nproc 2 (a MultiWorkerMirroredStrategy
# custom loop returning strategy.reduce(SUM, per_replica_loss); the Supervisor's rule with window 20,
# min_history 20, z 6; the group's in-memory snapshots every 50 steps), GROUP_STEPS steps, worker 1's batch of
# step GROUP_SPIKE_AT scaled (the group's loss ~50x). No (b): a group's spike is not replayed (taken as the data's)
GROUP_LOCAL_NAN = os.path.join(ROOT, "tests", "programs", "group_local_nan.py")
GROUP_STEPS, GROUP_SPIKE_AT = 120, 70


def group_loop(args: argparse.Namespace, folder: str, transient: bool) -> dict[str, Any]:
    """One launch of group_local_nan.py under ``--nproc 2 --on-spike rollback`` (``--group-nan``: a NaN in worker 1's
    batch at that step under ``--on-nonfinite rollback`` instead), as :func:`custom_loop` (the chief's course: every
    member runs the same steps); ``--group-restart``: its rollback restarts the group (``PROCSV_GROUP_ROLLBACK``)."""
    if transient:
        raise BenchError("a group has no transient case: its spike is not replayed")
    logdir, times = os.path.join(folder, "run"), os.path.join(folder, "times.txt")
    case = (["--on-nonfinite", "rollback"], ["--nan-at", str(args.group_spike_at), "--in-batch"]) if args.group_nan \
        else (["--on-spike", "rollback"], ["--spike-at", str(args.group_spike_at)])
    env = dict(ENV, PROCSV_GROUP_ROLLBACK="restart") if args.group_restart else ENV
    done = subprocess.run([sys.executable, "-m", "procsv", "launch", GROUP_LOCAL_NAN, "--logdir", logdir, "--quiet",
                           "--nproc", "2", *case[0], "--", "--steps", str(args.group_steps), *case[1], "--times", times,
                           "--step-delay", str(args.group_step_delay)], capture_output=True, text=True, env=env,
                          timeout=900)
    if done.returncode != 0:
        raise BenchError(f"the group's launch exited {done.returncode}: {(done.stdout + done.stderr)[-2000:]}")
    out = measured(logdir, times, final_weights(logdir))
    if args.group_nan:  # (a NaN: no spike record; its detection is the nonfinite_detected record, its step the NaN's)
        # its detection: the chief's run of the step whose check found it (the check follows it at once; its record
        # is written only after the rollback in place, which tells it), read from the course: one machine, one clock
        found = [e for e in events(logdir) if e["event"] == "nonfinite_detected"]
        out["found"] = [(args.group_spike_at, args.group_spike_at)] if found else []
        course = runs_of(times)
        back_at = next((i for i in range(1, len(course)) if course[i][0] <= course[i - 1][0]), None)
        if found and back_at is not None:
            detected_at = course[back_at - 1][1]
            after = [t for s, t in course if s == args.group_spike_at + 1 and t > detected_at]
            out["recovery"] = after[-1] - detected_at if after else float("nan")
            out["delay"] = course[back_at - 1][0] - args.group_spike_at
    out["in_place"] = any(e["event"] == "rolled_back" and e.get("group") for e in events(logdir))
    print(f"bench_spike: group ({'nan' if args.group_nan else 'spike'}, "
          f"{'restart forced' if args.group_restart else 'in place where it can'}): in place {out['in_place']}, "
          f"detection to the first good step {out.get('recovery', float('nan')):.3f} s", file=sys.stderr, flush=True)
    return out


def plain_group(args: argparse.Namespace, folder: str, skip: list[int]) -> dict[str, bytes]:
    """The plain group run (launched: a group needs its cluster; never restarted, no standby) that never applied
    the steps ``skip``: its final weights."""
    logdir = os.path.join(folder, "run")
    cmd = [sys.executable, "-m", "procsv", "launch", GROUP_LOCAL_NAN, "--logdir", logdir, "--quiet", "--nproc", "2",
           "--standby", "fork", "--", "--steps", str(args.group_steps), "--step-delay", str(args.group_step_delay)]
    for s in skip:
        cmd += ["--skip-at", str(s)]
    launched("the plain group run", cmd)
    return final_weights(logdir)


# the cases of (a) and (b), each a function of the case to one launch's measurement, with the plain run its final
# weights are compared with, the spike's step (procsv's), and whether it has a transient case (b)
LOOPS: dict[str, Callable[[argparse.Namespace, str, bool], dict[str, Any]]] = {
    "loop": custom_loop, "fit": keras_fit, "group": group_loop}
PLAIN: dict[str, Callable[[argparse.Namespace, str, list[int]], dict[str, bytes]]] = {
    "loop": plain_spike_train, "fit": plain_keras_fit, "group": plain_group}
TITLES = {"loop": "custom loop", "fit": "Keras fit", "group": "group of 2"}
REPLAYED = {"loop": True, "fit": True, "group": False}  # a group's spike is taken as the data's: no replay, no (b)


def spike_step(case: str, args: argparse.Namespace, transient: bool = False) -> int:
    """The step of the case's spike (procsv's numbering: a Keras batch b is step b + 1)."""
    if case == "fit":
        return (FIT_TRANSIENT_BATCH if transient else FIT_SPIKE_BATCH) + 1
    return args.group_spike_at if case == "group" else args.spike_at


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


def check_spike(run: dict[str, Any], spike_at: int, baseline: dict[str, bytes], transient: bool,
                replays: bool = True) -> list[str]:
    """What is wrong with one launch of (a) (``transient``: of (b)); [] if nothing. ``replays``: the case replays
    a spike before skipping it (a group's is taken as the data's: no ``spike_replayed`` record)."""
    wrong = []
    if [s for s, _ in run["found"]] != [spike_at]:
        wrong.append(f"spike_detected at {run['found']}, not step {spike_at}")
    if run["reproduced"] != ([not transient] if replays else []):
        wrong.append(f"spike_replayed reproduced {run['reproduced']}, not {[not transient] if replays else []}")
    onset = run["found"][0][1] if run["found"] else spike_at
    expected = [] if transient else list(range(onset, spike_at + 1))
    if run["skipped"] != expected:
        wrong.append(f"skipped {run['skipped']}, not {expected}")
    if not baseline or run["weights"].keys() != baseline.keys() or any(run["weights"][k] != baseline[k]
                                                                      for k in baseline):
        wrong.append("final weights differ from the plain run's" + ("" if transient else f" that skips {expected}"))
    return wrong


WIDTH, COLUMN = 50, 24  # the table's first column, and each case's


def table(loops: dict[str, dict[str, list[dict[str, Any]]]], clean: dict[str, list[dict[str, Any]]],
          exact: dict[str, bool], args: argparse.Namespace) -> dict[str, float]:
    """Print the tables (the cases of (a) and (b) side by side); return the figures of the final line (the
    custom loop's under their names of old, the others' prefixed ``fit_``, ``group_``)."""
    figures: dict[str, float] = {}
    cases = list(loops)

    def line(label: str, cells: list[str]) -> None:
        print(f"{label:<{WIDTH}}" + "".join(f"{c:>{COLUMN}}" for c in cells))

    if cases:
        line("(a) a 50x spike, rolled back and skipped", [TITLES[c] for c in cases])
        line("    median (min..max) over the runs", ["" for _ in cases])
    for row in ("quiet", "load"):
        if not any(loops[c].get(row) for c in cases):
            continue
        if row == "load":
            print("  at load (two CPU-bound processes beside each launch):")
        cells: dict[str, list[str]] = {k: [] for k in ("delay", "recovery", "redone", "sources", "exact")}
        for case in cases:
            runs = loops[case].get(row) or []
            delay = [float(r["delay"]) for r in runs if "delay" in r]
            recovery = [r["recovery"] for r in runs if "recovery" in r]
            redone = [float(r["redone"]) for r in runs]
            cells["delay"].append(spread(delay, "{:.0f}"))
            cells["recovery"].append(spread(recovery))
            cells["redone"].append(spread(redone, "{:.0f}"))
            cells["sources"].append(", ".join(sorted(set().union(*(r["sources"] for r in runs)))) or "-")
            cells["exact"].append(str(int(exact[f"{case}:{row}"])) if f"{case}:{row}" in exact else "-")
            if runs:
                prefix, key = ("" if case == "loop" else f"{case}_"), ("_load" if row == "load" else "")
                figures.update({f"{prefix}spike_detect_delay_steps{key}": med(delay),
                                f"{prefix}spike_recovery_s{key}": med(recovery),
                                f"{prefix}spike_redone_steps{key}": med(redone)})
        line("detection delay, steps after the spike", cells["delay"])
        line("detection -> first good step after the skip (s)", cells["recovery"])
        line("steps re-done (replays; a group: its restart's)", cells["redone"])
        line("restored from", cells["sources"])
        line("exact (bit-equal to the plain run without it)", cells["exact"])
    if cases and not args.no_transient:  # (a group's column says why it has none)
        print("(b) a transient spike (the machine's)")
        attributed, recovery = [], []
        for case in cases:
            runs = loops[case].get("transient") or []
            if not REPLAYED[case]:
                attributed.append("not replayed (*)")
                recovery.append("-")
                continue
            ok = sum(not check_spike(r, spike_step(case, args, True), r["baseline"], True) for r in runs)
            attributed.append(f"{ok} of {len(runs)}" if runs else "-")
            recovery.append(spread([r["recovery"] for r in runs if "recovery" in r]))
        line("attributed to the machine, nothing skipped, exact", attributed)
        line("detection -> the step after it, replayed (s)", recovery)
        if not all(REPLAYED[c] for c in cases):
            print("(*) a group's spike is taken as the data's: no replay tells the machine's from it (it would cost "
                  "a second restart\n    of every member), so the group has no transient case; its row in (a) is "
                  "every spike's")
    settings = {  # (each case's, under the table)
        "loop": f"spike_train.py, {args.steps} steps of {args.step_delay * 1000:g} ms more each, the spike (and the "
                f"transient) at step {args.spike_at},\n    a checkpoint every {args.save_steps} steps; rule window 200, "
                "min_history 100",
        "fit": f"keras_nan.py, {FIT_EPOCHS} epochs of 10 batches of {args.step_delay * 1000:g} ms more each, the spike "
               f"at step {FIT_SPIKE_BATCH + 1}, the transient at step {FIT_TRANSIENT_BATCH + 1},\n    a checkpoint "
               "every 10 batches; rule window 20, min_history 15",
        "group": f"group_local_nan.py --nproc 2 (MultiWorkerMirroredStrategy), {GROUP_STEPS} steps, the spike in "
                 f"worker 1's batch of step {GROUP_SPIKE_AT};\n    rule window 20, min_history 20, z 6",
    }
    for case in cases:
        launches = max(len(rows) for rows in loops[case].values())
        print(f"{TITLES[case]}: {settings[case]}; {launches} launches each")
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


def cases_of(text: str) -> list[str]:
    """``--case``: a comma-separated list of the cases of (a) and (b), in the table's order."""
    named = [c.strip() for c in text.split(",") if c.strip()]
    unknown = [c for c in named if c not in LOOPS]
    if unknown or not named:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a comma-separated list of {', '.join(LOOPS)}")
    return [c for c in LOOPS if c in named]


def made_up(case: str, args: argparse.Namespace) -> dict[str, list[dict[str, Any]]]:
    """``--dry-run``: a case's rows of made-up runs (the table code without a launch)."""
    step = spike_step(case, args)
    made = {"found": [(step, step)], "reproduced": [True] if REPLAYED[case] else [], "skipped": [step],
            "sources": ["memory"], "weights": {"w": b"0"}, "redone": 80, "delay": 12, "recovery": 0.2,
            "baseline": {"w": b"0"}}
    transient = dict(made, found=[(spike_step(case, args, True),) * 2], reproduced=[False], skipped=[])
    return {"quiet": [made] * args.runs, "load": [], "transient": [transient] if REPLAYED[case] else []}


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--runs", "--repeats", dest="runs", type=int, default=3,
                   help="launches of each spike case (default 3; --runs 1: a quick pass)")
    p.add_argument("--case", type=cases_of, default=list(LOOPS),
                   help="the cases of (a) and (b), comma-separated: loop (a custom loop), fit (Keras fit), group "
                        "(a two-member group); default all")
    p.add_argument("--steps", type=int, default=400, help="steps of each custom loop launch (default 400)")
    p.add_argument("--spike-at", type=int, default=265,
                   help="the custom loop's spike step (default 265, between two checkpoints; >= 101: the rule judges "
                        "nothing before 100 losses)")
    p.add_argument("--save-steps", type=int, default=50, help="the loop: a checkpoint every N steps (default 50)")
    p.add_argument("--step-delay", type=float, default=0.005,
                   help="seconds each step of the loop and each batch of the fit sleeps (default 0.005)")
    p.add_argument("--load", action="store_true", help="(a) again with two CPU-bound processes beside each launch")
    p.add_argument("--group-steps", type=int, default=GROUP_STEPS, help=f"the group's steps (default {GROUP_STEPS})")
    p.add_argument("--group-spike-at", type=int, default=GROUP_SPIKE_AT,
                   help=f"the group's spike (or --group-nan) step (default {GROUP_SPIKE_AT})")
    p.add_argument("--group-step-delay", type=float, default=0.0, help="seconds each group member sleeps after a step")
    p.add_argument("--group-nan", action="store_true",
                   help="the group's case is a NaN in worker 1's batch at --group-spike-at (--on-nonfinite rollback)")
    p.add_argument("--group-restart", action="store_true",
                   help="the group's rollback restarts every member (PROCSV_GROUP_ROLLBACK=restart: the path before)")
    p.add_argument("--no-transient", action="store_true", help="leave out (b)")
    p.add_argument("--clean-steps", type=int, default=3000, help="(c): steps of each example's run (default 3000)")
    p.add_argument("--clean-repeats", type=int, default=1, help="(c): launches of each example (default 1)")
    p.add_argument("--examples", nargs="*", choices=sorted(EXAMPLES), default=None,
                   help="(c): the examples to run (default: all; none: leave (c) out)")
    p.add_argument("--dry-run", action="store_true", help=argparse.SUPPRESS)  # the tables of made-up runs
    args = p.parse_args(argv)
    if args.runs < 1 or not 100 < args.spike_at < args.steps:
        p.error("--runs must be >= 1 and --spike-at within 101..--steps-1")
    examples = sorted(EXAMPLES) if args.examples is None else args.examples
    began = time.monotonic()
    wrong: list[str] = []
    loops: dict[str, dict[str, list[dict[str, Any]]]] = {}
    clean: dict[str, list[dict[str, Any]]] = {}
    exact: dict[str, bool] = {}
    with tempfile.TemporaryDirectory(prefix="bench_spike_") as tmp:
        for case in args.case:
            run, plain, spike_at = LOOPS[case], PLAIN[case], spike_step(case, args)
            if args.dry_run:
                loops[case] = made_up(case, args)
                exact.update({f"{case}:quiet": True, **({f"{case}:transient": True} if REPLAYED[case] else {})})
                continue
            transients = REPLAYED[case] and not args.no_transient
            skipped = plain(args, os.path.join(tmp, f"{case}-plain-skip"), [spike_at])
            clean_weights = plain(args, os.path.join(tmp, f"{case}-plain"), []) if transients else {}
            rows: dict[str, list[dict[str, Any]]] = {"quiet": [], "load": [], "transient": []}
            for row in ("quiet", "load", "transient"):
                if (row == "load" and not args.load) or (row == "transient" and not transients):
                    continue
                exact[f"{case}:{row}"] = True
                for r in range(args.runs):
                    busy = [subprocess.Popen([sys.executable, "-c", "while 1: pass"])
                            for _ in range(2 if row == "load" else 0)]
                    try:
                        one = run(args, os.path.join(tmp, f"{case}-{row}-{r}"), row == "transient")
                    finally:
                        for proc in busy:
                            proc.kill()
                            proc.wait()
                    one["baseline"] = clean_weights if row == "transient" else skipped
                    step = spike_step(case, args, row == "transient")
                    bad = check_spike(one, step, one["baseline"], row == "transient", REPLAYED[case])
                    if row != "transient" and one["found"] and one["found"][0][1] != step:
                        # (an onset before the spike's step: the plain run to compare with skips those too)
                        one["baseline"] = plain(args, os.path.join(tmp, f"{case}-plain-{row}-{r}"),
                                                list(range(one["found"][0][1], step + 1)))
                        bad = check_spike(one, step, one["baseline"], False, REPLAYED[case])
                    wrong += [f"{case} {row} run {r}: {w}" for w in bad]
                    exact[f"{case}:{row}"] = exact[f"{case}:{row}"] and not bad
                    rows[row].append(one)
            loops[case] = rows
        for example in examples if not args.dry_run else ():
            for r in range(args.clean_repeats):
                try:
                    one = clean_run(example, args.clean_steps, os.path.join(tmp, f"clean-{example}-{r}"))
                except BenchError as exc:  # (the others still run)
                    wrong.append(str(exc))
                    continue
                clean.setdefault(example, []).append(one)
    if args.dry_run:  # the table code on made-up runs (no launch)
        clean = {"digits": [{"flags": [], "step": args.clean_steps, "secs": 1.0}]}
    figures = table(loops, clean, exact, args)
    flags = sum(len(r["flags"]) for runs in clean.values() for r in runs)
    if flags:
        wrong.append(f"{flags} false flags in the clean runs")
    for w in wrong:
        print(f"bench_spike: {w}", file=sys.stderr)

    def ok(case: str, row: str) -> str:  # (a): every row of the case (quiet, load) exact; (b): its transient row
        rows = [v for k, v in exact.items() if k.startswith(f"{case}:") and (k.endswith(":transient") == (row == "b"))]
        return str(int(all(rows)))

    def keys(case: str) -> str:
        prefix = "" if case == "loop" else f"{case}_"
        line = " ".join(f"{k}={v:.3f}" if "recovery" in k else f"{k}={v:.1f}" for k, v in figures.items()
                        if k.startswith(prefix) and (case != "loop" or not k.startswith(("fit_", "group_"))))
        transient = f" {prefix}transient_ok={ok(case, 'b')}" if REPLAYED[case] else ""  # (1 when left out, as before)
        return f"{line} {prefix}exact={ok(case, 'a')}{transient}"

    load = os.getloadavg()[0]
    print(f"({time.monotonic() - began:.0f} s in all, load {load:.1f})")
    # the custom loop's keys as they were (first, unprefixed), then the other cases' (prefixed fit_, group_)
    first = f"{keys('loop')} " if "loop" in loops else ""
    others = "".join(f" {keys(case)}" for case in loops if case != "loop")
    print(f"{first}false_flags={flags} clean_runs={sum(len(runs) for runs in clean.values())} load={load:.1f}{others}")
    return 1 if wrong else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BenchError as exc:
        print(f"bench_spike: {exc}", file=sys.stderr)
        sys.exit(1)
