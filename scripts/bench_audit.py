#!/usr/bin/env python3
"""Benchmark: what ``procsv launch --audit every`` catches and what it costs the trainer (issue 71).

``.venv/bin/python scripts/bench_audit.py [--runs 3] [--seed 71]``. Runs in this process (the driver) plus the
``procsv launch`` runs it starts, one at a time, of ``procsv.examples.digits`` (a single eager trainer):

(a) Injected faults, ``--runs`` launches under ``--audit every``, checkpoints every ``--save-steps``: one bit of
    one weight flipped once (``PROCSV_FAULT=trainer:bitflip:<n>``) after a random step n (seeded). Measured: the
    fraction **caught** (an ``audit`` record with verdict ``trainer`` for an interval ending at or after n: goal
    1.0), the **steps from the fault to the verdict** (the trainer's step when the verdict came, interpolated
    from its commits' records; the final step if it had finished), the intervals from the fault to the verdict
    (goal: within two), the steps from the fault to the first replay that differed (its ``audit`` record with
    verdict ``mismatch``: the fault found, before the second replay's verdict), and whether the run ended succeeded with its final weights **bit-equal** to a clean
    run's (one launch without the audit).
(b) Throughput, ``--runs`` pairs of launches of ``--rate-steps`` with no step delay (the trainer CPU-bound;
    checkpoints every ``--rate-save-steps``, so a dozen intervals are committed while it trains), ``--audit every``
    and off. One after the other (the default) in ABBA order (off then on, on then off, ...: a load that drifts
    weighs on both alike), each trainer's steps per second as it reports them (``ran N of them in X s``, X to
    10 ms, its session's start and end included alike), the pair's ratio on/off. An audited launch is stopped
    (SIGTERM) once its trainer said its rate: the auditors' catching up after the trainer's end, on idle CPU
    only, is not measured and took minutes on a busy machine. ``--together``: each pair's two
    launches at the same time (which starts first swapped every pair), the ratio of their steps a second over the
    window both trainers trained in (``status.json``'s step and the time of its record, interpolated): outside
    load hits both alike. It does not measure what an auditor's running costs (both trainers want the cores, so
    an idle-priority auditor gets almost none, and what it takes from one it takes from the other too), but all
    the audit costs besides: its start, fork and restore, the watchdog's work for it, the checkpoints it holds;
    and the launch started second trails the first by far more than the effect (measured, 2026-12-02 at load
    10-13: ratios 0.39 and 2.2 in one run of two pairs, 0.19, 0.90, 0.77, 1.05 in one of four, the audited launch
    second, first, second, first), so an even number of pairs; not yet a measure of 0.5 %. Goal >= 0.995 for the median of the pairs'
    ratios (printed with its min and max). Beside it, per pair, each launch's CPU seconds by role in its trainer's
    window (psutil every 0.1 s over the launch's processes, named by the log their stdout writes: watchdog,
    checkpoint, summary, zygote, trainer, standby, auditor), the trainer's CPU a step, and each audited run's own
    estimates: the duty cycle's ``cost`` at the end (the slowdown it measured times its duty) and ``spent`` (its
    account: what the audit cost over the run). The shared 2-core machine's noise is far above 0.5 % for a
    single pair (seen: 0.929-1.031 quiet, 0.82 at load 10); the load is printed with each pair.

(c) False alarms (``--false-alarms``: this part alone, its own table and line), every example program that
    the audit covers, one launch each under ``--audit every`` with checkpoints every ``--fa-interval`` steps and no
    step delay, run until at least ``--fa-audited`` of its steps were audited (``audit`` records with verdict
    ``match``; a launch that audited fewer is extended once by the steps missing, then counted as short): the
    ``trainer``, ``nondeterministic`` and ``auditor`` verdicts counted (goal 0), and the steps audited. The
    programs: the digits eager loop (alone and as a group of two on one host, ``--nproc 2``), Keras ``fit``
    (with its ``Dropout``), the TF2 seeds (``procsv.examples.seeds.*``), the TF1 graph seeds
    (``procsv.examples.seeds_tf1.*``: ``Supervisor`` and the ``MonitoredSession`` family; ``replicas`` needs
    ``--ps``, which is not audited) and ``procsv.examples.supervised``'s four modes. ``--programs a,b``: those
    only (by the table's names). One line ``false_alarm_programs=<n> false_alarms=<n> audited_steps_min=<n>
    audited_steps_total=<n> short=<n> load=<1-min load>``; exits 1 on any false alarm, a launch that failed, or a
    program short of ``--fa-audited``.

(d) Stops (``--stops``: this part alone, its own table and line), ``--runs`` runs: the bit flipped after a random
    step, the launch SIGTERMed as soon as the first checkpoint after it commits (its verdict cut off: a preemption),
    then launched again to its end; beside it the same with what the stopped launch's audit left
    (``.procsv/audit.json``) deleted before the relaunch: the behaviour before the audit was carried across launches.
    One line ``stop_runs=<n> stops_before_verdict=<n> caught_carried=<n> exact_carried=<n> caught_before=<n>
    exact_before=<n> load=<1-min load>``; exits 1 if a fault cut off was not caught by the next launch, or its result
    is not bit-equal to a clean run.

(e) What a running auditor costs the trainer, measured inside one run (its windows with the auditor running against
    the pauses beside them, an audit-free control split the same way, CPU burners beside it): its own script,
    ``scripts/bench_audit_within.py``, with its own line; part (b)'s pairs cannot resolve 0.5 %.

Prints a table, then one line ``caught=<fraction> faults=<n> fault_to_mismatch_steps=<median> fault_to_verdict_steps=<median>
fault_to_verdict_intervals=<max> exact=<0|1> steps_per_s_off=<median> steps_per_s_audit=<median>
throughput_ratio=<median of the pairs' ratios> ratio_min=<x> ratio_max=<x> pairs=<n> together=<0|1>
duty_cycle_cost=<median> duty_cycle_spent=<median> auditor_cpu_share=<median CPU s a second of the auditors in
the audited trainer's window> load=<1-min load average at the end>``, and exits 1 if its own check fails (a fault not
caught, a run not succeeded, weights not bit-equal, a false alarm: a ``trainer`` or ``nondeterministic``
verdict in a throughput run).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Optional

import psutil

ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", TF_ENABLE_ONEDNN_OPTS="0", PYTHONUNBUFFERED="1")
os.environ.update(TF_CPP_MIN_LOG_LEVEL="3", TF_ENABLE_ONEDNN_OPTS="0")  # this process reads checkpoints
RAN = re.compile(r"this process ran (\d+) of them in ([0-9.]+) s")


class BenchError(Exception):
    pass


def events(logdir: str) -> list[dict[str, Any]]:
    path = os.path.join(logdir, "logs", "lifecycle.jsonl")
    with open(path) as fh:
        return [json.loads(line) for line in fh if line.strip()]


def final_weights(logdir: str) -> dict[str, bytes]:
    import tensorflow as tf

    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(logdir))
    return {k: reader.get_tensor(k).tobytes() for k in reader.get_variable_to_shape_map()
            if not k.startswith(("save_counter", "_CHECKPOINTABLE_OBJECT_GRAPH"))}


def launch(logdir: str, steps: int, save_steps: int, audit: str, delay: float, fault: Optional[int] = None) -> None:
    env = dict(ENV, **({"PROCSV_FAULT": f"trainer:bitflip:{fault}"} if fault is not None else {}))
    cmd = [sys.executable, "-m", "procsv", "launch", "procsv.examples.digits", "--logdir", logdir, "--audit", audit,
           "--", "--steps", str(steps), "--save-model-secs", "1000", "--save-checkpoint-steps",
           str(save_steps), "--step-delay", str(delay), "--print-every-steps", str(steps)]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    if done.returncode != 0:
        raise BenchError(f"a launch exited {done.returncode}: {done.stderr[-2000:]}")


def step_at(evs: list[dict[str, Any]], when: float, last: int) -> float:
    """The first trainer attempt's step at wall time ``when``, interpolated from its commits (``last`` after
    its final one)."""
    points = [(float(e["time"]), int(e["step"])) for e in evs if e["event"] == "checkpoint_committed"]
    finished = next((float(e["time"]) for e in evs if e["event"] == "exited" and e.get("role") == "trainer"), None)
    if finished is not None and when >= finished:
        return float(last)
    for (t0, s0), (t1, s1) in zip(points, points[1:]):
        if t0 <= when <= t1:
            return s0 + (s1 - s0) * (when - t0) / max(t1 - t0, 1e-9)
    if len(points) >= 2 and when > points[-1][0]:  # past the last commit: at the last pace
        (t0, s0), (t1, s1) = points[-2], points[-1]
        return min(float(last), s1 + (s1 - s0) * (when - t1) / max(t1 - t0, 1e-9))
    return float(last)


def status(logdir: str) -> dict[str, Any]:
    with open(os.path.join(logdir, ".procsv", "status.json")) as fh:
        return dict(json.load(fh))




def rate_cmd(logdir: str, steps: int, save_steps: int, audit: str) -> list[str]:
    """A throughput run's launch: ``--rate-steps`` of digits with no step delay, checkpoints every ``save_steps``."""
    return [sys.executable, "-m", "procsv", "launch", "procsv.examples.digits", "--logdir", logdir, "--audit", audit,
            "--", "--steps", str(steps), "--save-model-secs", "1000", "--save-checkpoint-steps", str(save_steps),
            "--step-delay", "0", "--print-every-steps", str(steps)]


@dataclass
class Measured:
    """One throughput launch: its trainer's rate and window, and the CPU seconds each role of the launch used in that
    window (psutil, every :data:`SAMPLE_SECS`: the watchdog, the services, the zygote, the trainer, its hot standby,
    the auditors), and in all."""

    audit: str
    logdir: str
    rate: float = 0.0
    secs: float = 0.0  # the trainer's X (``ran N of them in X s``)
    window: tuple[float, float] = (0.0, 0.0)  # the trainer's window, on the driver's clock: (its end - X, its end)
    in_window: dict[str, float] = field(default_factory=dict)  # role -> CPU seconds in the trainer's window
    total: dict[str, float] = field(default_factory=dict)  # role -> CPU seconds in all
    audit_status: dict[str, Any] = field(default_factory=dict)
    steps: list[tuple[float, int]] = field(default_factory=list)  # (status.json's updated_at, its step), as written
    common: float = 0.0  # its steps a second in the window its pair's trainers both trained (--together)


SAMPLE_SECS = 0.1


def role_of(pid: int, trainer_pid: Optional[int]) -> str:
    """Which of the launch's processes ``pid`` is, by the log its stdout writes (``logs/<role>.<attempt>.log``): a
    forked process keeps the zygote's command line, not its own; a trainer log that is not the trainer's is its
    hot standby (the next attempt's)."""
    try:
        name = os.path.basename(os.readlink(f"/proc/{pid}/fd/1"))
    except OSError:
        name = ""
    role = name.split(".")[0] if name.endswith(".log") else "watchdog"
    if role == "trainer" and pid != trainer_pid:
        return "standby"
    return role or "other"


def measure_together(runs: list[Measured], steps: int, save_steps: int) -> None:
    """Start every launch of ``runs`` at once, sample their process trees until all have ended, and fill in each one's
    rate, trainer window and CPU by role. Raises :class:`BenchError` if one exits non-zero or has no rate line."""
    procs = [subprocess.Popen(rate_cmd(m.logdir, steps, save_steps, m.audit), env=ENV, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for m in runs]
    series: list[dict[int, list[tuple[float, float]]]] = [{} for _ in runs]
    roles: list[dict[int, str]] = [{} for _ in runs]
    t0 = time.monotonic()
    stopped: set[int] = set()  # the audited launches told to stop once their trainer finished
    while any(p.poll() is None for p in procs):
        now = time.monotonic() - t0
        for i, p in enumerate(procs):
            if runs[i].audit != "off" and i not in stopped and p.poll() is None and _finished(runs[i].logdir):
                p.send_signal(signal.SIGTERM)  # (its trainer's rate is in; the rest of the audit is not measured)
                stopped.add(i)
            try:
                tree = [psutil.Process(p.pid)] + psutil.Process(p.pid).children(recursive=True)
            except psutil.Error:
                continue
            trainer_pid, seen = _trainer_pid(runs[i].logdir)
            if seen is not None and (not runs[i].steps or seen[0] > runs[i].steps[-1][0]):
                runs[i].steps.append(seen)
            for q in tree:
                try:
                    used = q.cpu_times()
                except psutil.Error:
                    continue
                if roles[i].get(q.pid) in (None, "standby", "watchdog"):  # (a standby is promoted, logs open late)
                    roles[i][q.pid] = role_of(q.pid, trainer_pid)
                series[i].setdefault(q.pid, []).append((now, used.user + used.system))
        time.sleep(SAMPLE_SECS)
    for i, (m, p, ser, rol) in enumerate(zip(runs, procs, series, roles)):
        out, err = p.communicate()
        if p.returncode != 0 and i not in stopped:
            raise BenchError(f"a launch exited {p.returncode}: {err[-2000:]}")
        with open(os.path.join(m.logdir, "logs", "trainer.1.log")) as fh:
            found = RAN.search(fh.read())
        if found is None:
            raise BenchError(f"no 'ran N of them in X s' line in {m.logdir}/logs/trainer.1.log")
        m.secs = float(found.group(2))
        m.rate = int(found.group(1)) / m.secs
        trainer = next((pid for pid, r in rol.items() if r == "trainer"), None)
        if trainer is None:
            raise BenchError(f"the trainer of {m.logdir} was never seen")
        end = ser[trainer][-1][0]
        m.window = (end - m.secs, end)
        for pid, points in ser.items():
            role = rol.get(pid, "other")
            m.in_window[role] = m.in_window.get(role, 0.0) + _cpu_at(points, m.window[1]) - _cpu_at(points, m.window[0])
            m.total[role] = m.total.get(role, 0.0) + points[-1][1]
        m.audit_status = status(m.logdir).get("audit") or {}


def _finished(logdir: str) -> bool:
    """Whether the first trainer attempt said its rate (``ran N of them in X s``: it trained all its steps)."""
    try:
        with open(os.path.join(logdir, "logs", "trainer.1.log")) as fh:
            return RAN.search(fh.read()) is not None
    except OSError:
        return False


def _trainer_pid(logdir: str) -> tuple[Optional[int], Optional[tuple[float, int]]]:
    """The trainer's pid and (when the record was made, the step), as ``status.json`` says them now."""
    try:
        st = status(logdir)
    except (OSError, ValueError):
        return None, None
    pid = next((int(c["pid"]) for c in st.get("processes", []) if c.get("role") == "trainer"), None)
    return pid, (float(st["updated_at"]), int(st.get("step") or 0)) if st.get("updated_at") else None


def step_then(points: list[tuple[float, int]], t: float) -> float:
    """The step at wall time ``t``, interpolated between the two records around it (pure)."""
    for (t0, s0), (t1, s1) in zip(points, points[1:]):
        if t0 <= t <= t1:
            return s0 + (s1 - s0) * (t - t0) / max(t1 - t0, 1e-9)
    raise BenchError(f"no step record around {t}")


def common_rates(runs: list[Measured], steps: int) -> float:
    """Each run's steps a second over the window all their trainers trained in (from the first record past their
    start's step to the last before their final one, less a second at either end); its length."""
    spans = []
    for m in runs:
        moving = [(t, s) for t, s in m.steps if 0 < s < steps]
        if len(moving) < 2:
            raise BenchError(f"{m.logdir}: too few step records to find when its trainer trained")
        spans.append((moving[0][0], moving[-1][0]))
    a, b = max(x for x, _ in spans) + 1.0, min(y for _, y in spans) - 1.0
    if b - a < 3.0:
        raise BenchError(f"the trainers trained at the same time for {b - a + 2:.1f} s only")
    for m in runs:
        m.common = (step_then(m.steps, b) - step_then(m.steps, a)) / (b - a)
    return b - a


def _cpu_at(points: list[tuple[float, float]], t: float) -> float:
    """A process's CPU seconds at driver time ``t`` (its last reading by then; 0 before its first)."""
    used = 0.0
    for when, cpu in points:
        if when > t:
            break
        used = cpu
    return used


def throughput(args: argparse.Namespace, root: str, wrong: list[str]) -> dict[str, Any]:
    """Part (b): ``--runs`` pairs of throughput launches, audited and audit-free, each pair run at once
    (``--together``, which launch starts first swapped every pair) or one after the other in ABBA order (off then on,
    then on then off, ...); returns the figures the final line reports."""
    pairs: list[tuple[Measured, Measured]] = []
    ratios: list[float] = []
    for i in range(args.runs):
        on = Measured("every", os.path.join(root, f"rate-every{i}"))
        off = Measured("off", os.path.join(root, f"rate-off{i}"))
        order = [off, on] if i % 2 == 0 else [on, off]
        if args.together:
            measure_together(order, args.rate_steps, args.rate_save_steps)
            both = common_rates([on, off], args.rate_steps)
            ratios.append(on.common / off.common)
        else:
            for m in order:
                measure_together([m], args.rate_steps, args.rate_save_steps)
            ratios.append(on.rate / off.rate)
        evs = events(on.logdir)
        alarms = [e for e in evs if e["event"] == "audit" and e["verdict"] in ("trainer", "nondeterministic")]
        if alarms:
            wrong.append(f"false alarm in a clean run: {alarms[0]}")
        matched = {(e["start"], e["end"]) for e in evs if e["event"] == "audit" and e["verdict"] == "match"}
        own = on.audit_status
        pairs.append((on, off))
        print(f"pair {i} ({'at once' if args.together else 'one after the other'}, {order[0].audit} first): "
              f"every {on.rate:.1f} / off {off.rate:.1f} steps/s" + (
                  f" over each run, every {on.common:.1f} / off {off.common:.1f} over the {both:.1f} s both trained"
                  if args.together else "") + f": ratio {ratios[-1]:.4f}; audited "
              f"{sum(b - a for a, b in matched)} of {args.rate_steps} steps; duty {own.get('duty')}, slowdown "
              f"{own.get('slowdown')}, cost {own.get('cost')}, spent {own.get('spent')}; load "
              f"{os.getloadavg()[0]:.1f}", flush=True)
        for m in (on, off):
            shown = ", ".join(f"{r} {m.in_window[r]:.2f}" for r in sorted(m.in_window) if m.in_window[r] >= 0.005)
            print(f"    {m.audit:>5}: CPU s in the trainer's {m.secs:.1f} s: {shown}", flush=True)
    beside = [sum(v for r, v in m.in_window.items() if r not in ("trainer", "auditor")) / m.secs
              for pair in pairs for m in pair]
    return {
        "off": statistics.median(off.rate for _, off in pairs), "on": statistics.median(on.rate for on, _ in pairs),
        "ratio": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
        "trainer_cpu_per_step_off": statistics.median(off.in_window.get("trainer", 0.0) / args.rate_steps
                                                      for _, off in pairs),
        "trainer_cpu_per_step_on": statistics.median(on.in_window.get("trainer", 0.0) / args.rate_steps
                                                     for on, _ in pairs),
        "auditor_cpu": statistics.median(on.in_window.get("auditor", 0.0) / on.secs for on, _ in pairs),
        "beside_off": statistics.median(beside[1::2]), "beside_on": statistics.median(beside[0::2]),
        "cost": _median_of(on.audit_status.get("cost") for on, _ in pairs),
        "spent": _median_of(on.audit_status.get("spent") for on, _ in pairs),
    }


def _median_of(values: Any) -> float:
    got = [float(v) for v in values if v is not None]
    return statistics.median(got) if got else -1.0


SEEDS = ("basic", "loop", "manual_summaries", "monitored_session", "monitored_training", "retry", "run_step_fn")
SEEDS_TF1 = (*SEEDS, "singular_monitored")
# (name in the table, target, launch options, the program's arguments but its length and checkpoint interval)
FA_PROGRAMS: tuple[tuple[str, str, tuple[str, ...], tuple[str, ...]], ...] = (
    ("digits", "procsv.examples.digits", (), ("--save-model-secs", "100000", "--print-every-steps", "100000")),
    ("digits-group", "procsv.examples.digits", ("--nproc", "2"),
     ("--strategy", "multiworker", "--save-model-secs", "100000", "--print-every-steps", "100000")),
    ("keras-fit", "procsv.examples.keras_fit", (), ()),
    *((f"seeds.{n}", f"procsv.examples.seeds.{n}", (), ()) for n in SEEDS),
    *((f"seeds_tf1.{n}", f"procsv.examples.seeds_tf1.{n}", (), ("--save-model-secs", "100000")) for n in SEEDS_TF1),
    *((f"supervised.{m}", "procsv.examples.supervised", (), ("--mode", m, "--save-model-secs", "100000",
                                                                 "--loop-secs", "1000")) for m in ("basic", "loop", "summaries", "retry")),
)
KERAS_BATCHES = 45  # the example fit's batches an epoch (1,438 training digits, a fifth of 1,797 held out; 32 a batch)


def audited(evs: list[dict[str, Any]]) -> int:
    """The steps the launch's ``match`` verdicts cover (an interval judged twice counted once)."""
    return sum(b - a for a, b in {(int(e["start"]), int(e["end"])) for e in evs
                                  if e["event"] == "audit" and e["verdict"] == "match"})


def false_alarm_run(root: str, name: str, target: str, opts: tuple[str, ...], extra: tuple[str, ...], steps: int,
                    interval: int) -> tuple[int, list[dict[str, Any]], str, list[str]]:
    """One program under ``--audit every`` for about ``steps`` steps: (steps audited, the alarms, the outcome,
    the lines the audit said of itself when it switched itself off)."""
    logdir = os.path.join(root, name.replace(".", "-"))
    if target.endswith("keras_fit"):
        length = ("--epochs", str(math.ceil(steps / KERAS_BATCHES)), "--save-freq", str(interval))
    else:
        length = ("--steps", str(steps), "--save-checkpoint-steps", str(interval))
    cmd = [sys.executable, "-m", "procsv", "launch", target, "--logdir", logdir, "--audit", "every", *opts, "--",
           *length, *extra]
    done = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=3600)
    evs = events(logdir)
    state = next((e["state"] for e in evs if e["event"] == "finished"), f"exit {done.returncode}")
    if done.returncode != 0:
        state = f"{state} (exit {done.returncode}: {done.stderr.strip().splitlines()[-1:] or ''})"
    alarms = [e for e in evs if e["event"] == "audit" and e["verdict"] in ("trainer", "nondeterministic", "auditor",
                                                                           "trial")]
    off = [line for line in done.stderr.splitlines() + done.stdout.splitlines()
           if "audit" in line and ("off for" in line or "switch" in line)]
    return audited(evs), alarms, state, off


def false_alarms(args: argparse.Namespace) -> int:
    """Part (c): every example program the audit covers, ``--fa-audited`` steps of each audited at least."""
    began = time.monotonic()
    chosen = [p for p in FA_PROGRAMS if not args.programs or p[0] in args.programs.split(",")]
    wrong: list[str] = []
    counted: list[int] = []
    alarms_total = short = 0
    print(f"{'program':<30} {'steps':>7} {'audited':>8} {'alarms':>7}  outcome")
    with tempfile.TemporaryDirectory(prefix="procsv-bench-audit-fa-") as root:
        for name, target, opts, extra in chosen:
            steps = int(args.fa_audited * 1.25)
            got, alarms, state, off = false_alarm_run(root, name, target, opts, extra, steps, args.fa_interval)
            if got < args.fa_audited and state == "succeeded" and not alarms and not off:
                more = steps + int((args.fa_audited - got) * 1.5)  # (the audit fell behind: run on past it)
                got, alarms, state, off = false_alarm_run(root, name + "-again", target, opts, extra, more,
                                                          args.fa_interval)
                steps = more
            counted.append(got)
            alarms_total += len(alarms)
            if alarms:
                wrong.append(f"{name}: false alarm {alarms[0]}")
            if state != "succeeded":
                wrong.append(f"{name}: the launch ended {state}")
            if got < args.fa_audited:
                short += 1
                wrong.append(f"{name}: {got} steps audited, fewer than {args.fa_audited}" +
                             (f" (the audit said: {off[0]})" if off else ""))
            print(f"{name:<30} {steps:>7} {got:>8} {len(alarms):>7}  {state}" + (f"; {off[0][:100]}" if off else ""),
                  flush=True)
    for w in wrong:
        print(f"bench_audit: {w}", file=sys.stderr)
    load = os.getloadavg()[0]
    print(f"({time.monotonic() - began:.0f} s in all, load {load:.1f})")
    print(f"false_alarm_programs={len(chosen)} false_alarms={alarms_total} audited_steps_min={min(counted, default=0)} "
          f"audited_steps_total={sum(counted)} short={short} load={load:.1f}")
    return 1 if wrong else 0


def stopped_run(logdir: str, args: argparse.Namespace, fault: int, carry: bool) -> dict[str, Any]:
    """Part (d), one side of one run: a launch with the bit flipped after ``fault``, SIGTERMed as soon as the first
    checkpoint after it commits, then the same launch again (no fault) to its end; ``carry`` False deletes what the
    first launch's audit left (``.procsv/audit.json``) before the second: the behaviour before it was kept."""
    cmd = [sys.executable, "-m", "procsv", "launch", "procsv.examples.digits", "--logdir", logdir, "--audit", "every",
           "--", "--steps", str(args.steps), "--save-model-secs", "1000", "--save-checkpoint-steps",
           str(args.save_steps), "--step-delay", str(args.step_delay), "--print-every-steps", str(args.steps)]
    first = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             env=dict(ENV, PROCSV_FAULT=f"trainer:bitflip:{fault}"))
    after = (fault // args.save_steps + 1) * args.save_steps
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and first.poll() is None:
        if os.path.exists(os.path.join(logdir, "logs", "lifecycle.jsonl")) and any(
                e["event"] == "checkpoint_committed" and e["step"] >= after for e in events(logdir)):
            break
        time.sleep(0.05)
    first.send_signal(signal.SIGTERM)
    first.wait(timeout=600)
    before = len(events(logdir))
    cut = not any(e["event"] == "audit" and e["verdict"] == "trainer" for e in events(logdir))
    if not carry:
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(logdir, ".procsv", "audit.json"))
    done = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=900)
    if done.returncode != 0:
        raise BenchError(f"a relaunch exited {done.returncode}: {done.stderr[-2000:]}")
    evs = events(logdir)[before:]
    hit = next((e for e in evs if e["event"] == "audit" and e["verdict"] == "trainer"
                and e["start"] <= fault <= e["end"]), None)
    return {"cut": cut, "caught": hit is not None, "weights": final_weights(logdir)}


def stops(args: argparse.Namespace) -> int:
    """Part (d): faults whose verdict a stop cut off, caught by the next launch (the carried audit) or not (the
    baseline: what the stopped launch left deleted), side by side on the same fault step, and bit-equal or not."""
    rng = random.Random(args.seed)
    wrong: list[str] = []
    rows = []
    with tempfile.TemporaryDirectory(prefix="procsv-bench-audit-stops-") as root:
        launch(os.path.join(root, "clean"), args.steps, args.save_steps, "off", 0.0)
        reference = final_weights(os.path.join(root, "clean"))
        print(f"{'run':>4} {'fault':>6} {'cut off':>8} {'caught (carried)':>17} {'exact':>6} {'caught (before)':>16} "
              f"{'exact':>6}")
        for i in range(args.runs):
            fault = rng.randint(args.save_steps + 1, args.steps - 2 * args.save_steps)
            new = stopped_run(os.path.join(root, f"carry{i}"), args, fault, carry=True)
            old = stopped_run(os.path.join(root, f"before{i}"), args, fault, carry=False)
            rows.append((new, old))
            print(f"{i:>4} {fault:>6} {str(new['cut'] and old['cut']):>8} {str(new['caught']):>17} "
                  f"{str(new['weights'] == reference):>6} {str(old['caught']):>16} {str(old['weights'] == reference):>6}")
            if new["cut"] and not (new["caught"] and new["weights"] == reference):
                wrong.append(f"run {i}: the fault after step {fault}, its verdict cut off by a stop, was not caught by "
                             "the next launch or its result is not bit-equal to a clean run")
    cut = [(n, o) for n, o in rows if n["cut"] and o["cut"]]
    for w in wrong:
        print(f"bench_audit: {w}", file=sys.stderr)
    load = os.getloadavg()[0]
    print(f"stop_runs={len(rows)} stops_before_verdict={len(cut)} caught_carried={sum(n['caught'] for n, _ in cut)} "
          f"exact_carried={sum(n['weights'] == reference for n, _ in cut)} caught_before={sum(o['caught'] for _, o in cut)} "
          f"exact_before={sum(o['weights'] == reference for _, o in cut)} load={load:.1f}")
    return 1 if wrong else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--steps", type=int, default=1200)
    ap.add_argument("--save-steps", type=int, default=200)
    ap.add_argument("--step-delay", type=float, default=0.02, help="the fault runs' (the throughput runs': 0)")
    ap.add_argument("--rate-steps", type=int, default=24000, help="the throughput runs' steps")
    ap.add_argument("--rate-save-steps", type=int, default=2000, help="the throughput runs' checkpoint interval")
    ap.add_argument("--skip-faults", action="store_true", help="the throughput runs only")
    ap.add_argument("--together", action="store_true",
                    help="part (b): run each pair's audited and audit-free launches at the same time")
    ap.add_argument("--seed", type=int, default=71)
    ap.add_argument("--false-alarms", action="store_true", help="part (c) alone: every example program, no fault")
    ap.add_argument("--fa-audited", type=int, default=10000, help="part (c): the steps to audit of each program")
    ap.add_argument("--fa-interval", type=int, default=1000, help="part (c): the checkpoint interval, in steps")
    ap.add_argument("--programs", default="", help="part (c): these programs only (comma-separated names)")
    ap.add_argument("--stops", action="store_true",
                    help="part (d) alone: a fault whose verdict a stop cuts off, the next launch's catch beside before")
    args = ap.parse_args()
    if args.false_alarms:
        return false_alarms(args)
    if args.stops:
        return stops(args)
    rng = random.Random(args.seed)
    began = time.monotonic()
    wrong: list[str] = []
    with tempfile.TemporaryDirectory(prefix="procsv-bench-audit-") as root:
        clean = os.path.join(root, "clean")
        faults = 0 if args.skip_faults else args.runs
        if faults:
            launch(clean, args.steps, args.save_steps, "off", 0.0)
            reference = final_weights(clean)
        caught, lags, intervals, exact = 0, [], [], True
        found: list[float] = []
        print(f"{'run':>4} {'fault':>6} {'caught':>7} {'verdict on':>11} {'steps to mismatch':>18} {'steps to verdict':>17} "
              f"{'exact':>6}")
        for i in range(faults):
            fault = rng.randint(args.save_steps + 1, args.steps - 1)
            logdir = os.path.join(root, f"fault{i}")
            launch(logdir, args.steps, args.save_steps, "every", args.step_delay, fault)
            evs = events(logdir)
            hit = next((e for e in evs if e["event"] == "audit" and e["verdict"] == "trainer" and e["end"] >= fault),
                       None)
            same = final_weights(logdir) == reference
            exact = exact and same
            state = next((e["state"] for e in evs if e["event"] == "finished"), None)
            if state != "succeeded":
                wrong.append(f"fault run {i} ended {state}")
            if hit is None:
                wrong.append(f"the fault after step {fault} (run {i}) was not caught")
                print(f"{i:>4} {fault:>6} {'no':>7}")
                continue
            caught += 1
            lag = step_at(evs, float(hit["time"]), args.steps) - fault
            lags.append(lag)
            seen = next((e for e in evs if e["event"] == "audit" and e["verdict"] == "mismatch" and e["end"] >= fault),
                        hit)  # (the first replay that differed: the fault found, before the second replay's verdict)
            found.append(step_at(evs, float(seen["time"]), args.steps) - fault)
            intervals.append(math.ceil(lag / args.save_steps))  # the checkpoint intervals the trainer went on
            print(f"{i:>4} {fault:>6} {'yes':>7} {hit['start']:>5}-{hit['end']:<5} {found[-1]:>18.0f} {lag:>17.0f} "
                  f"{str(same):>6}")
        if not exact:
            wrong.append("a fault run's final weights differ from the clean run's")
        got = throughput(args, root, wrong) if args.runs else {}
    if got:
        print(f"throughput (steps/s, {args.runs} pair(s), {'at once' if args.together else 'ABBA'}): off "
              f"{got['off']:.1f}, every {got['on']:.1f}; per-pair ratio median {got['ratio']:.4f} (min "
              f"{got['ratio_min']:.4f}, max {got['ratio_max']:.4f}); the duty cycle's own: cost {got['cost']:.4f} at "
              f"the end, spent {got['spent']:.4f} over the run; trainer CPU ms a step off {got['trainer_cpu_per_step_off'] * 1e3:.3f}, "
              f"every {got['trainer_cpu_per_step_on'] * 1e3:.3f}; the other normal-priority processes' CPU s a second "
              f"off {got['beside_off']:.3f}, every {got['beside_on']:.3f}; the auditors' {got['auditor_cpu']:.3f}")
    for w in wrong:
        print(f"bench_audit: {w}", file=sys.stderr)
    load = os.getloadavg()[0]
    print(f"({time.monotonic() - began:.0f} s in all, load {load:.1f})")
    print(f"caught={caught / faults if faults else -1:.2f} faults={faults} "
          f"fault_to_mismatch_steps={statistics.median(found) if found else -1:.0f} "
          f"fault_to_verdict_steps={statistics.median(lags) if lags else -1:.0f} "
          f"fault_to_verdict_intervals={max(intervals) if intervals else -1} exact={int(exact)} "
          f"steps_per_s_off={got.get('off', -1):.1f} steps_per_s_audit={got.get('on', -1):.1f} "
          f"throughput_ratio={got.get('ratio', -1):.4f} ratio_min={got.get('ratio_min', -1):.4f} "
          f"ratio_max={got.get('ratio_max', -1):.4f} pairs={args.runs} together={int(args.together)} "
          f"duty_cycle_cost={got.get('cost', -1):.4f} duty_cycle_spent={got.get('spent', -1):.4f} "
          f"auditor_cpu_share={got.get('auditor_cpu', -1):.3f} load={load:.1f}")
    return 1 if wrong else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BenchError as exc:
        print(f"bench_audit: {exc}", file=sys.stderr)
        sys.exit(1)
