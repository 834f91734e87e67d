#!/usr/bin/env python3
"""Benchmark: what a running auditor costs the trainer, measured inside one run (issue 71; ``bench_audit``'s part (e)).

``PROCSV_BENCH_HOST=<n> .venv/bin/python scripts/bench_audit_within.py [--runs 3] [--burners 2] [--steps 60000]``.
Runs in this process (the driver), the ``procsv launch`` runs it starts one at a time, and ``--burners`` CPU-bound
busy loops (each a session of its own, as another user's work is: the host has no spare core) that run throughout.

Why: part (b)'s ABBA pairs of whole runs compare two launches, and run-to-run noise on a shared 2-core machine is some
15 % a pair; the goal (the audited trainer's throughput at least 0.995 of an audit-free one's) needs 0.5 %. Here one
run is compared with itself: the duty cycle stops (SIGSTOP) and continues (SIGCONT) its auditor in windows of a
second or more, so windows with an auditor running and windows without one alternate all through the run, under the
same outside load.

What is measured, per launch of ``procsv.examples.digits`` (``--steps`` with no step delay: CPU-bound; checkpoints
every ``--save-steps``), ``--runs`` launches under ``--audit every`` and as many without (``--audit off``), in ABBA
order (off, on, on, off, ...):

- the trainer's steps in time: the ``loss`` scalars it logs every 10 steps (``--log-every-steps``), each with the
  trainer's wall time, read from the run's event file after it ended (nothing added to the product);
- every ``--sample-ms`` (10): the trainer's CPU time (its process CPU clock, ``clock_gettime`` on its pid: to the
  nanosecond), and for each auditor the lifecycle says was spawned, its state (``/proc/<pid>/stat``: stopped ``T``,
  or not) and CPU time. An interval between two samples is a **run** interval if an auditor was alive and not
  stopped at both ends, a **pause** interval if none was at either end (no auditor, or all stopped), and neither
  if the state changed within it (left out). The trainer's steps in an interval are interpolated from its logged
  steps; intervals before its first logged step or after its last are left out.
- each **run window** (consecutive run intervals) against its local baseline: the trainer's rate in up to
  ``--local-secs`` (2) of pause intervals on either side of it (a load that changes over seconds is on both sides);
  the **ratio**: the run windows' steps over what they would have made at their baselines (what a running auditor
  leaves the trainer), and the **within-run throughput**: the run's steps over those plus the steps the run windows
  lost (what the audit cost this run against the same run without it: about 1 - run share * (1 - ratio)); also the
  plain ratio of all run intervals' rate to all pause intervals' (no local baseline). Each with a 95 % interval, the
  wider of a bootstrap over the run windows and one from the method's own noise: stretches as long as the run
  windows cut from the pauses, each against its own neighbours the same way (their errors' spread, taken for each
  run window: the duty cycle's account lets a trainer beside two burners have one or two windows a minute, too few
  for a bootstrap);
- the trainer's CPU ms a step in each kind of interval, the auditors' CPU seconds a second in run intervals, and
  the run intervals' share of the time (``run_share``);
- the **control**: each audit-off launch split the same way, by the run/pause mask of the audited launch beside it
  in the ABBA order mapped by step (the steps that launch trained with its auditor running are this one's "run"
  steps): the phases of a run (its start, its checkpoints every ``--save-steps``, an auditor's start after each
  commit) fall on the same steps, so a method biased by them shows here as a ratio away from 1;
- between runs (noisy, as part (b)): the audited launch's pause-interval rate over the control's all-interval rate.

An audited launch is stopped (SIGTERM) once its trainer exited: the auditors' catching up afterwards is not measured.
Prints one line per pair, then one line ``runs=<n> burners=<n> auditor_own_session=<0|1: whether an auditor was a
session of its own> ratio=<median run/pause ratio> ratio_lo=<x> ratio_hi=<x> within=<median within-run throughput>
within_lo=<x> within_hi=<x> run_share=<median> first_ratio=<median: the first run window's ratio>
first_lost=<median: the steps it lost over the run's> control_first=<median> control_ratio=<median> control_lo=<x> control_hi=<x>
control_within=<median> control_within_lo=<x> control_within_hi=<x> cpu_ms_run=<x> cpu_ms_pause=<x>
cpu_ms_control=<x> auditor_cpu_run=<x> pause_over_control=<median> audited_steps=<median> steps_per_s_off=<median>
duty_spent=<median of the duty cycle's own spent> load=<1-min load average at the end>`` (a ``_lo``/``_hi`` is the
median over the runs of each run's 95 % bound). ``--keep DIR`` keeps each launch's readings (JSON); ``--analyse DIR`` analyses kept ones
again without launching. Exits 1 if its own check fails: a launch that failed or restarted its trainer, a
``trainer`` or ``nondeterministic`` verdict (a false alarm), an audited launch with no run interval, or the
controls' median ratio or within-run throughput further from 1 than the median half-width of their intervals (the
method biased beyond its own noise).
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import glob
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Optional

ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", TF_ENABLE_ONEDNN_OPTS="0", PYTHONUNBUFFERED="1")
RUN, PAUSE = "run", "pause"


class BenchError(Exception):
    pass


@dataclass(frozen=True)
class Sample:
    """One reading: the driver's wall time, the trainer's CPU seconds, whether an auditor was alive and not stopped,
    the auditors' CPU seconds (those alive), the pids of the auditors alive, and the CPU seconds of the launch's
    other processes (the watchdog, the zygote, the services, the hot standby)."""

    t: float
    cpu: float
    running: bool
    auditor_cpu: float
    auditors: frozenset[int]
    others: float = 0.0


@dataclass
class Interval:
    """Between two samples: its length, the trainer's steps and CPU seconds in it, the auditors' CPU seconds,
    the steps at its ends, its kind (:data:`RUN`, :data:`PAUSE` or None: left out), the other processes' CPU s."""

    t0: float
    secs: float
    steps: float
    cpu: float
    auditor_cpu: float
    s0: float
    s1: float
    kind: Optional[str]
    others: float = 0.0


@dataclass
class Launch:
    """One launch measured: its samples, the trainer's logged (step, wall time), what the lifecycle said."""

    audit: str
    logdir: str
    samples: list[Sample] = field(default_factory=list)
    steps: list[tuple[float, int]] = field(default_factory=list)  # (wall time, step), by time
    own_session: Optional[bool] = None  # whether an auditor was a session of its own (its sid its pid)
    duty: dict[str, Any] = field(default_factory=dict)  # status.json's audit at the end: the duty cycle's own figures
    events: list[dict[str, Any]] = field(default_factory=list)
    intervals: list[Interval] = field(default_factory=list)


# ---------------------------------------------------------------------------------------------- the analysis (pure)

def step_at(steps: list[tuple[float, int]], t: float) -> Optional[float]:
    """The trainer's step at wall time ``t``, interpolated between its logged steps; None outside them."""
    i = bisect.bisect_right(steps, (t, float("inf")))
    if i == 0 or i == len(steps):
        return float(steps[-1][1]) if steps and t == steps[-1][0] else None
    (ta, sa), (tb, sb) = steps[i - 1], steps[i]
    return sa + (sb - sa) * (t - ta) / (tb - ta) if tb > ta else float(sb)


def intervals(samples: list[Sample], steps: list[tuple[float, int]]) -> list[Interval]:
    """Every interval between consecutive samples within the trainer's logged steps, with its kind: run (an auditor
    alive and not stopped at both ends, the same ones), pause (none at either end), else None."""
    out = []
    for a, b in zip(samples, samples[1:]):
        s0, s1 = step_at(steps, a.t), step_at(steps, b.t)
        if s0 is None or s1 is None or b.t <= a.t:
            continue
        kind = (RUN if a.running and b.running and a.auditors == b.auditors else
                PAUSE if not a.running and not b.running else None)
        out.append(Interval(a.t, b.t - a.t, s1 - s0, b.cpu - a.cpu,
                            max(0.0, b.auditor_cpu - a.auditor_cpu) if a.auditors == b.auditors else 0.0, s0, s1, kind,
                            max(0.0, b.others - a.others)))
    return out


def mask_by_step(audited: list[Interval]) -> list[tuple[float, float, str]]:
    """The audited launch's kinds in step space: (first step, last step, kind), consecutive intervals of one kind
    merged; a left-out interval ends a stretch."""
    spans: list[tuple[float, float, str]] = []
    prev: Optional[Interval] = None
    for iv in audited:
        if iv.kind is not None and prev is not None and prev.kind == iv.kind and spans and spans[-1][1] == prev.s1:
            spans[-1] = (spans[-1][0], iv.s1, iv.kind)
        elif iv.kind is not None:
            spans.append((iv.s0, iv.s1, iv.kind))
        prev = iv
    return spans


def apply_mask(control: list[Interval], spans: list[tuple[float, float, str]]) -> list[Interval]:
    """The control's intervals, each of the kind of the audited launch's stretch that holds both its ends' steps
    (None if no one stretch does)."""
    starts = [s[0] for s in spans]
    out = []
    for iv in control:
        i = bisect.bisect_right(starts, iv.s0) - 1
        kind = spans[i][2] if i >= 0 and spans[i][0] <= iv.s0 and iv.s1 <= spans[i][1] else None
        out.append(Interval(iv.t0, iv.secs, iv.steps, iv.cpu, iv.auditor_cpu, iv.s0, iv.s1, kind, iv.others))
    return out


Sums = dict[str, list[float]]  # kind -> [seconds, steps, trainer CPU s, auditor CPU s, the others' CPU s]


def sums(ivs: list[Interval]) -> Sums:
    out: Sums = {RUN: [0.0] * 5, PAUSE: [0.0] * 5}
    for iv in ivs:
        if iv.kind is not None:
            row = out[iv.kind]
            row[0] += iv.secs
            row[1] += iv.steps
            row[2] += iv.cpu
            row[3] += iv.auditor_cpu
            row[4] += iv.others
    return out


@dataclass(frozen=True)
class Window:
    """One stretch of run intervals: its seconds, the trainer's steps in it, and the steps it would have made at the
    rate of the pause intervals next to it (up to ``local`` seconds of them on either side)."""

    secs: float
    steps: float
    expected: float


def stretches(ivs: list[Interval], kind: str) -> list[tuple[int, int]]:
    """The maximal runs of consecutive intervals of ``kind``, as ``ivs[i:j]`` bounds."""
    out: list[tuple[int, int]] = []
    i = 0
    while i < len(ivs):
        if ivs[i].kind != kind:
            i += 1
            continue
        j = i
        while j < len(ivs) and ivs[j].kind == kind:
            j += 1
        out.append((i, j))
        i = j
    return out


def windows(ivs: list[Interval], local: float) -> list[Window]:
    """The run stretches (consecutive run intervals) with their local baselines; a stretch with less than a tenth of a
    second of pause beside it is left out."""
    out = []
    for i, j in stretches(ivs, RUN):
        secs = sum(iv.secs for iv in ivs[i:j])
        steps = sum(iv.steps for iv in ivs[i:j])
        near: list[Interval] = []
        for way in (range(i - 1, -1, -1), range(j, len(ivs))):
            got = 0.0
            for k in way:
                if ivs[k].kind == RUN or got >= local:
                    break
                if ivs[k].kind == PAUSE:
                    near.append(ivs[k])
                    got += ivs[k].secs
        base_secs = sum(iv.secs for iv in near)
        if base_secs >= 0.1:
            out.append(Window(secs, steps, secs * sum(iv.steps for iv in near) / base_secs))
    return out


def figures(ws: list[Window], total_steps: float) -> Optional[tuple[float, float]]:
    """(ratio: the run windows' steps over what their local baselines would have made; within-run throughput: the
    run's steps over those plus the steps the run windows lost), or None without a window."""
    expected = sum(w.expected for w in ws)
    if expected <= 0 or total_steps <= 0:
        return None
    made = sum(w.steps for w in ws)
    return made / expected, total_steps / (total_steps + expected - made)


def bootstrap(ws: list[Window], total_steps: float, rounds: int,
              rng: random.Random) -> Optional[tuple[float, float, float, float]]:
    """95 % percentile intervals of (ratio, within-run throughput), resampling the run windows with replacement;
    None with fewer than two windows."""
    if len(ws) < 2:
        return None
    ratios, withins = [], []
    for _ in range(rounds):
        got = figures([ws[rng.randrange(len(ws))] for _ in ws], total_steps)
        if got is not None:
            ratios.append(got[0])
            withins.append(got[1])
    ratios.sort()
    withins.sort()
    lo, hi = int(0.025 * len(ratios)), min(len(ratios) - 1, int(0.975 * len(ratios)))
    return ratios[lo], ratios[hi], withins[lo], withins[hi]


@dataclass
class Split:
    """One launch's figures: its sums by kind, its run windows, (ratio, within), their 95 % intervals, and the plain
    ratio of all run intervals' rate to all pause intervals' (no local baseline: slow load changes stay in it)."""

    s: Sums
    windows: int
    ratio: float
    within: float
    ci: tuple[float, float, float, float]
    plain: float
    first: float  # the first run window's ratio (an auditor's start: fork, build, restore)
    first_lost: float  # the steps the first run window lost, as a share of the run's

    @property
    def run_share(self) -> float:
        return self.s[RUN][0] / (self.s[RUN][0] + self.s[PAUSE][0])

    def cpu_ms(self, kind: str) -> float:
        return 1e3 * self.s[kind][2] / self.s[kind][1] if self.s[kind][1] > 0 else float("nan")


def null_errors(ivs: list[Interval], length: float, local: float) -> list[float]:
    """The noise of the method: stretches of ``length`` seconds cut from the pause intervals (none of them next to a
    run interval), each against the pause beside it in the same stretch as a run window is against its own; their
    relative errors (steps made over steps expected, less 1)."""
    errs: list[float] = []
    for i, j in stretches(ivs, PAUSE):
        stretch = ivs[i:j]
        k = 0
        while True:
            a = k  # the pseudo window's first interval, after at least ``local`` s of pause before it
            before = 0.0
            while a < len(stretch) and before < local:
                before += stretch[a].secs
                a += 1
            b, secs = a, 0.0
            while b < len(stretch) and secs < length:
                secs += stretch[b].secs
                b += 1
            c, after = b, 0.0
            while c < len(stretch) and after < local:
                after += stretch[c].secs
                c += 1
            if after < local or secs < length:
                break
            near = stretch[k:a] + stretch[b:c]
            rate = sum(iv.steps for iv in near) / sum(iv.secs for iv in near)
            errs.append(sum(iv.steps for iv in stretch[a:b]) / (secs * rate) - 1.0 if rate > 0 else 0.0)
            k = c
    return errs


def null_ci(ws: list[Window], errs: list[float], total_steps: float) -> Optional[tuple[float, float, float, float]]:
    """95 % intervals of (ratio, within-run throughput) from the method's noise (:func:`null_errors`: each run window's
    error as wide as a pause stretch's of its length), or None with fewer than five such stretches."""
    if len(errs) < 5 or not ws:
        return None
    sigma = statistics.pstdev(errs)
    spread = 1.96 * sigma * sum(w.expected ** 2 for w in ws) ** 0.5  # the steps the window's errors may add up to
    expected = sum(w.expected for w in ws)
    lost = expected - sum(w.steps for w in ws)
    ratio = 1.0 - lost / expected
    return (max(0.0, ratio - spread / expected), ratio + spread / expected, total_steps / (total_steps + lost + spread),
            total_steps / max(total_steps + lost - spread, 1e-9))


def split(ivs: list[Interval], local: float, rng: random.Random, rounds: int) -> Optional[Split]:
    """One launch's figures; the 95 % interval is the widest of the bootstrap's over its run windows and the
    method's noise's (:func:`null_ci`), whichever exist (None if neither)."""
    s = sums(ivs)
    ws = windows(ivs, local)
    total = s[RUN][1] + s[PAUSE][1]
    got = figures(ws, total)
    if got is None or s[PAUSE][0] <= 0 or s[RUN][0] <= 0:
        return None
    cis = [c for c in (bootstrap(ws, total, rounds, rng),
                       null_ci(ws, null_errors(ivs, statistics.median(w.secs for w in ws), local), total))
           if c is not None]
    if not cis:
        return None
    ci = (min(c[0] for c in cis), max(c[1] for c in cis), min(c[2] for c in cis), max(c[3] for c in cis))
    return Split(s, len(ws), got[0], got[1], ci, (s[RUN][1] / s[RUN][0]) / (s[PAUSE][1] / s[PAUSE][0]),
                 ws[0].steps / ws[0].expected, (ws[0].expected - ws[0].steps) / total)


# ------------------------------------------------------------------------------------------------- the driver

def _cpu_clock(pid: int) -> int:
    """The clock id of process ``pid``'s CPU time (``clock_getcpuclockid``: ``CPUCLOCK_SCHED``, the whole process)."""
    return ((~pid) << 3) | 2


def _cpu(pid: int) -> Optional[float]:
    try:
        return time.clock_gettime_ns(_cpu_clock(pid)) / 1e9
    except OSError:
        return None


def _stat(pid: int) -> Optional[list[str]]:
    """``/proc/<pid>/stat``'s fields after the command (state first), or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _new_events(path: str, offset: int) -> tuple[list[dict[str, Any]], int]:
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            data = fh.read()
    except OSError:
        return [], offset
    end = data.rfind(b"\n") + 1
    return [json.loads(line) for line in data[:end].splitlines() if line.strip()], offset + end


def measure(m: Launch, args: argparse.Namespace) -> None:
    """Run the launch, sampling every ``--sample-ms`` until it ends (an audited one is SIGTERMed once its trainer
    exited); then read the trainer's logged steps. Raises :class:`BenchError` if it failed."""
    cmd = [sys.executable, "-m", "procsv", "launch", "procsv.examples.digits", "--logdir", m.logdir, "--audit", m.audit,
           "--", "--steps", str(args.steps), "--save-model-secs", "100000", "--save-checkpoint-steps",
           str(args.save_steps), "--step-delay", "0", "--print-every-steps", str(args.steps), "--log-every-steps", "10"]
    os.makedirs(m.logdir)
    with open(m.logdir + ".stderr", "w") as err:
        # (run from the launch's parent directory: ``-m procsv`` from a source tree's root would import that tree,
        # not the interpreter's installed procsv)
        proc = subprocess.Popen(cmd, env=ENV, stdout=subprocess.DEVNULL, stderr=err, cwd=os.path.dirname(m.logdir))
    lifecycle = os.path.join(m.logdir, "logs", "lifecycle.jsonl")
    offset, trainer, auditors, stopped = 0, None, set(), False
    others = {proc.pid}  # the watchdog, then every other process the lifecycle says it spawned (not the auditors)
    period = args.sample_ms / 1e3
    next_read = 0.0
    while proc.poll() is None:
        now = time.time()
        if now >= next_read:
            new, offset = _new_events(lifecycle, offset)
            m.events += new
            for e in new:
                if e["event"] == "spawned" and e["role"] == "trainer" and trainer is None:
                    trainer = int(e["pid"])
                elif e["event"] == "spawned" and e["role"] == "auditor":
                    auditors.add(int(e["pid"]))
                elif e["event"] == "spawned" and e.get("pid"):
                    others.add(int(e["pid"]))
                elif e["event"] == "exited" and e.get("role") == "trainer" and m.audit != "off" and not stopped:
                    proc.send_signal(signal.SIGTERM)  # (the trainer's steps are in; the rest of the audit is not measured)
                    stopped = True
            next_read = now + 0.1
        if trainer is not None and not stopped:
            cpu = _cpu(trainer)
            running, acpu, alive = False, 0.0, set()
            for pid in list(auditors):
                st = _stat(pid)
                if st is None or st[0] in ("Z", "X", "x"):
                    auditors.discard(pid)
                    continue
                alive.add(pid)
                running = running or st[0] not in ("T", "t")
                acpu += _cpu(pid) or 0.0
                if m.own_session is None:
                    m.own_session = int(st[3]) == pid  # (the fields after the command: state, ppid, pgrp, session)
            if cpu is not None:
                m.samples.append(Sample(now, cpu, running, acpu, frozenset(alive),
                                        sum(_cpu(pid) or 0.0 for pid in others)))
        time.sleep(max(0.0, period - (time.time() - now)))
    new, offset = _new_events(lifecycle, offset)
    m.events += new
    if proc.returncode != 0 and not stopped:
        with open(m.logdir + ".stderr") as fh:
            raise BenchError(f"a launch exited {proc.returncode}: {fh.read()[-2000:]}")
    m.steps = logged_steps(m.logdir)
    with contextlib.suppress(OSError, ValueError), open(os.path.join(m.logdir, ".procsv", "status.json")) as fh:
        m.duty = dict(json.load(fh).get("audit") or {})


def logged_steps(logdir: str) -> list[tuple[float, int]]:
    """The trainer's ``loss`` scalars' (wall time, step) from the run's event files, by time."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    rows = []
    for path in glob.glob(os.path.join(logdir, "events.out.tfevents.*")):
        for ev in EventFileLoader(path).Load():
            if any(v.tag == "loss" for v in ev.summary.value):
                rows.append((float(ev.wall_time), int(ev.step)))
    rows.sort()
    return rows


def burners(n: int) -> list[subprocess.Popen[bytes]]:
    """``n`` CPU-bound busy loops, each a session of its own (another user's work: an autogroup each)."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True) for _ in range(n)]


def checked(m: Launch, wrong: list[str]) -> None:
    """The launch's own checks: one trainer attempt only, no false alarm."""
    restarts = [e for e in m.events if e["event"] == "spawned" and e["role"] == "trainer"]
    if len(restarts) != 1:
        wrong.append(f"{m.logdir}: {len(restarts)} trainer attempts (a restart spoils the split)")
    alarms = [e for e in m.events if e["event"] == "audit" and e["verdict"] in ("trainer", "nondeterministic")]
    if alarms:
        wrong.append(f"{m.logdir}: false alarm {alarms[0]}")
    if not m.steps:
        wrong.append(f"{m.logdir}: no logged steps")


def audited_steps(m: Launch) -> int:
    return sum(b - a for a, b in {(int(e["start"]), int(e["end"])) for e in m.events
                                  if e["event"] == "audit" and e["verdict"] == "match"})


def _med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def save(m: Launch, path: str) -> None:
    """What the launch's analysis needs (samples, logged steps, lifecycle, the duty cycle's figures), as JSON."""
    with open(path, "w") as fh:
        json.dump({"audit": m.audit, "logdir": m.logdir, "own_session": m.own_session, "duty": m.duty,
                   "events": m.events, "steps": m.steps,
                   "samples": [[x.t, x.cpu, x.running, x.auditor_cpu, sorted(x.auditors), x.others]
                               for x in m.samples]}, fh)


def load(path: str) -> Launch:
    with open(path) as fh:
        d = json.load(fh)
    return Launch(d["audit"], d["logdir"], [Sample(x[0], x[1], x[2], x[3], frozenset(x[4]), *x[5:]) for x in d["samples"]],
                  [(float(t), int(x)) for t, x in d["steps"]], d["own_session"], d["duty"], d["events"])


def analyse(pairs: list[tuple[Launch, Launch, float]], args: argparse.Namespace, wrong: list[str]) -> str:
    """Each pair's figures, one line each; returns the final line."""
    rng = random.Random(args.seed)
    on_splits: list[Split] = []
    off_splits: list[Split] = []
    pause_over_control: list[float] = []
    own: set[bool] = set()
    audited: list[float] = []
    off_rates: list[float] = []
    spent: list[float] = []  # the duty cycle's own account of what the audit cost each audited launch
    for i, (on, off, load) in enumerate(pairs):
        checked(on, wrong)
        checked(off, wrong)
        on.intervals = intervals(on.samples, on.steps)
        off.intervals = apply_mask(intervals(off.samples, off.steps), mask_by_step(on.intervals))
        a = split(on.intervals, args.local_secs, rng, args.rounds)
        c = split(off.intervals, args.local_secs, rng, args.rounds)
        if on.own_session is not None:
            own.add(on.own_session)
        audited.append(float(audited_steps(on)))
        if on.duty.get("spent") is not None:
            spent.append(float(on.duty["spent"]))
        if a is None or c is None:
            wrong.append(f"pair {i}: too little of a run or a pause to compare (the audited launch's auditor ran "
                         f"{sums(on.intervals)[RUN][0]:.2f} s)")
            continue
        on_splits.append(a)
        off_splits.append(c)
        off_all = (c.s[RUN][1] + c.s[PAUSE][1]) / (c.s[RUN][0] + c.s[PAUSE][0])
        off_rates.append(off_all)
        pause_over_control.append((a.s[PAUSE][1] / a.s[PAUSE][0]) / off_all)
        print(f"pair {i} ({'off' if i % 2 == 0 else 'on'} first, load {load:.1f}): audited: ratio {a.ratio:.4f} "
              f"({a.ci[0]:.4f}-{a.ci[1]:.4f}; {a.windows} windows; plain {a.plain:.4f}), within {a.within:.4f} "
              f"({a.ci[2]:.4f}-{a.ci[3]:.4f}), the first window's ratio {a.first:.3f} (it lost {a.first_lost:.4f} of the run's "
              f"steps; control {c.first:.3f}), run {a.s[RUN][0]:.1f} s of {a.s[RUN][0] + a.s[PAUSE][0]:.1f} "
              f"({a.run_share:.3f}), trainer CPU ms a step run {a.cpu_ms(RUN):.3f} / pause {a.cpu_ms(PAUSE):.3f}, "
              f"auditor CPU s a s run {a.s[RUN][3] / a.s[RUN][0]:.3f}, the other processes' run "
              f"{a.s[RUN][4] / a.s[RUN][0]:.3f} / pause {a.s[PAUSE][4] / a.s[PAUSE][0]:.3f}, {audited[-1]:.0f} steps audited, the duty "
              f"cycle's own slowdown {on.duty.get('slowdown')} bound {on.duty.get('bound')} spent {on.duty.get('spent')}; control: ratio "
              f"{c.ratio:.4f} ({c.ci[0]:.4f}-{c.ci[1]:.4f}; plain {c.plain:.4f}), within {c.within:.4f} "
              f"({c.ci[2]:.4f}-{c.ci[3]:.4f}), CPU ms a step "
              f"{1e3 * (c.s[RUN][2] + c.s[PAUSE][2]) / (c.s[RUN][1] + c.s[PAUSE][1]):.3f}, {off_all:.1f} steps/s; "
              f"audited pause rate / control {pause_over_control[-1]:.4f}", flush=True)
    for name, lo, hi in (("ratio", 0, 1), ("within-run throughput", 2, 3)):
        middle = _med([c.ratio if lo == 0 else c.within for c in off_splits])
        half = _med([(c.ci[hi] - c.ci[lo]) / 2 for c in off_splits])
        if off_splits and abs(middle - 1.0) > half:
            wrong.append(f"the controls' median {name} {middle:.4f} is further from 1 than their intervals' median "
                         f"half-width {half:.4f}: the split is biased by the run's phases")
    return (f"runs={len(on_splits)} burners={args.burners} auditor_own_session={int(True in own)} "
            f"ratio={_med([a.ratio for a in on_splits]):.4f} ratio_lo={_med([a.ci[0] for a in on_splits]):.4f} "
            f"ratio_hi={_med([a.ci[1] for a in on_splits]):.4f} within={_med([a.within for a in on_splits]):.4f} "
            f"within_lo={_med([a.ci[2] for a in on_splits]):.4f} within_hi={_med([a.ci[3] for a in on_splits]):.4f} "
            f"run_share={_med([a.run_share for a in on_splits]):.4f} first_ratio={_med([a.first for a in on_splits]):.4f} "
            f"first_lost={_med([a.first_lost for a in on_splits]):.4f} "
            f"control_first={_med([c.first for c in off_splits]):.4f} "
            f"control_ratio={_med([c.ratio for c in off_splits]):.4f} "
            f"control_lo={_med([c.ci[0] for c in off_splits]):.4f} control_hi={_med([c.ci[1] for c in off_splits]):.4f} "
            f"control_within={_med([c.within for c in off_splits]):.4f} "
            f"control_within_lo={_med([c.ci[2] for c in off_splits]):.4f} "
            f"control_within_hi={_med([c.ci[3] for c in off_splits]):.4f} "
            f"cpu_ms_run={_med([a.cpu_ms(RUN) for a in on_splits]):.4f} "
            f"cpu_ms_pause={_med([a.cpu_ms(PAUSE) for a in on_splits]):.4f} cpu_ms_control="
            f"{_med([1e3 * (c.s[RUN][2] + c.s[PAUSE][2]) / (c.s[RUN][1] + c.s[PAUSE][1]) for c in off_splits]):.4f} "
            f"auditor_cpu_run={_med([a.s[RUN][3] / a.s[RUN][0] for a in on_splits]):.3f} "
            f"pause_over_control={_med(pause_over_control):.4f} audited_steps={_med(audited):.0f} "
            f"steps_per_s_off={_med(off_rates):.1f} duty_spent={_med(spent):.4f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=3, help="audited launches, and as many audit-free controls")
    ap.add_argument("--burners", type=int, default=2, help="CPU-bound busy loops beside the launches")
    ap.add_argument("--steps", type=int, default=60000)
    ap.add_argument("--save-steps", type=int, default=2000)
    ap.add_argument("--sample-ms", type=float, default=10.0)
    ap.add_argument("--local-secs", type=float, default=2.0,
                    help="a run window's baseline: up to this many seconds of pause on either side")
    ap.add_argument("--rounds", type=int, default=2000, help="the bootstrap's resamples")
    ap.add_argument("--seed", type=int, default=71)
    ap.add_argument("--keep", default="", help="a directory to keep each launch's readings in (JSON), for --analyse")
    ap.add_argument("--analyse", default="", help="no launch: the readings --keep kept in this directory, analysed")
    args = ap.parse_args()
    wrong: list[str] = []
    began = time.monotonic()
    loads: list[float] = []
    pairs: list[tuple[Launch, Launch, float]] = []
    if args.analyse:
        with open(os.path.join(args.analyse, "pairs.json")) as fh:
            kept = json.load(fh)
        args.burners = kept["burners"]
        for i, load_then in enumerate(kept["loads"]):
            pairs.append((load(os.path.join(args.analyse, f"on{i}.json")),
                          load(os.path.join(args.analyse, f"off{i}.json")), load_then))
            loads.append(load_then)
    else:
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # (the burners are killed on the way out)
        hot = burners(args.burners)
        try:
            with tempfile.TemporaryDirectory(prefix="procsv-bench-within-") as root:
                for i in range(args.runs):
                    on, off = (Launch("every", os.path.join(root, f"on{i}")),
                               Launch("off", os.path.join(root, f"off{i}")))
                    for m in ([off, on] if i % 2 == 0 else [on, off]):
                        measure(m, args)
                        loads.append(os.getloadavg()[0])
                        if args.keep:
                            os.makedirs(args.keep, exist_ok=True)
                            save(m, os.path.join(args.keep, f"{m.audit.replace('every', 'on')}{i}.json"))
                    pairs.append((on, off, loads[-1]))
                    if args.keep:
                        with open(os.path.join(args.keep, "pairs.json"), "w") as fh:
                            json.dump({"burners": args.burners, "loads": [p[2] for p in pairs]}, fh)
        finally:
            for b in hot:
                with contextlib.suppress(ProcessLookupError):
                    b.kill()
                b.wait()
    line = analyse(pairs, args, wrong)
    for w in wrong:
        print(f"bench_audit_within: {w}", file=sys.stderr)
    now = os.getloadavg()[0]
    print(f"({time.monotonic() - began:.0f} s in all, load {min(loads, default=now):.1f}-{max(loads, default=now):.1f})")
    print(f"{line} load={now if not args.analyse else max(loads, default=0.0):.1f}")
    return 1 if wrong else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BenchError as exc:
        print(f"bench_audit_within: {exc}", file=sys.stderr)
        sys.exit(1)
