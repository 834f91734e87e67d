"""The suite's time budget, measured as a newcomer and CI meet it: the README's test command on a
fresh clone, side by side with a baseline revision in one run.

Runs on the developer's machine (no procsv process of its own). For each revision and each of
``--runs`` rounds (the revisions alternate inside a round, so both see the same machine): a fresh
``git clone`` of this repository at that revision, then the README's test command phase by phase
(venv and install, ``scripts/typecheck``, pytest with the README's options), each timed, with the
mean load average while pytest runs beside it and the CPU seconds of pytest and everything it started
(the suite is CPU-bound on 2 cores: its CPU time is what a shared machine blurs least, and at best
the wall time is that over the cores). ``--coverage`` instead runs pytest once per revision
under coverage.py, measuring the processes the tests start (``patch = subprocess, fork, _exit,
execv``, ``sigterm = true``: the zygote's forks included; a process killed with SIGKILL, or started
with an environment of its own, writes no data) and reports line coverage of ``procsv/``,
``services/`` and ``ipc/``.

    python3 scripts/bench_suite.py --baseline 99384ee --runs 3
    python3 scripts/bench_suite.py --baseline 99384ee --coverage

Prints a table and ends with one ``key=value`` line; exits 1 if any pytest run failed (a fast
suite that fails measures nothing).
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Optional

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYTEST = ["-m", "pytest", "-q", "-n", "5", "--dist", "worksteal", "-p", "no:cacheprovider"]  # the README's options
SOURCES = ("procsv", "services", "ipc")


@dataclass
class Run:
    rev: str
    install: float = 0.0
    typecheck: float = 0.0
    pytest: float = 0.0
    cpu: float = 0.0  # CPU seconds of pytest and every process it started (cpuacct cgroup, else waited children)
    load: float = 0.0
    ok: bool = False
    summary: str = ""
    failures: list[str] = field(default_factory=list)
    coverage: Optional[float] = None
    slowest: list[str] = field(default_factory=list)

    @property
    def total(self) -> float:
        return self.install + self.typecheck + self.pytest


def timed(cmd: list[str], cwd: str, env: Optional[dict[str, str]] = None) -> tuple[float, subprocess.CompletedProcess[str]]:
    start = time.monotonic()
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    return time.monotonic() - start, done


CGROUP = "/sys/fs/cgroup/cpuacct"


def timed_cpu(cmd: list[str], cwd: str, env: Optional[dict[str, str]] = None
              ) -> tuple[float, float, subprocess.CompletedProcess[str]]:
    """:func:`timed`, and the CPU seconds of the command and every process it started: the suite is
    CPU-bound on 2 cores, so its CPU time is the figure a busy machine does not blur the way it blurs
    the wall time. A cgroup v1 ``cpuacct`` of its own counts every descendant, orphans included (root);
    else the children the command waited for (``RUSAGE_CHILDREN``)."""
    group = os.path.join(CGROUP, f"procsv-bench-{os.getpid()}-{time.monotonic_ns()}")
    try:
        os.mkdir(group)
    except OSError:
        group = ""

    def enter() -> None:
        if group:
            with open(os.path.join(group, "tasks"), "w") as fh:
                fh.write(str(os.getpid()))

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, preexec_fn=enter)
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    if group:
        with open(os.path.join(group, "cpuacct.usage")) as fh:
            cpu = int(fh.read()) / 1e9
        try:
            os.rmdir(group)
        except OSError:
            pass  # a process still in it (an orphan): the group goes with the machine
    return wall, cpu, done


def load() -> float:
    with open("/proc/loadavg") as fh:
        return float(fh.read().split()[0])


class LoadBeside:
    """The mean of the 1-minute load average, sampled every 10 s while a command runs (the suite's own
    processes included: on 2 cores a CPU-bound suite alone shows about 3)."""

    def __init__(self) -> None:
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(10.0):
            self.samples.append(load())

    def __enter__(self) -> "LoadBeside":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def mean(self) -> float:
        return statistics.fmean(self.samples) if self.samples else load()


def coverage_rc(clone: str, data: str) -> str:
    path = os.path.join(data, "coveragerc")
    with open(path, "w") as fh:
        fh.write("[run]\nsource =\n" + "".join(f"    {os.path.join(clone, s)}\n" for s in SOURCES)
                 + f"parallel = true\npatch = subprocess, fork, _exit, execv\nsigterm = true\n"
                 + f"data_file = {os.path.join(data, '.coverage')}\n")
    return path


def one(rev: str, with_coverage: bool, keep: bool) -> Run:
    run = Run(rev)
    clone = tempfile.mkdtemp(prefix="procsv-suite-")
    try:
        subprocess.run(["git", "clone", "-q", REPO, clone], check=True)
        subprocess.run(["git", "checkout", "-q", rev], cwd=clone, check=True)
        py = os.path.join(clone, ".venv", "bin", "python")
        extra = ["coverage>=7.10"] if with_coverage else []
        t1, venv = timed([sys.executable, "-m", "venv", ".venv"], clone)
        if venv.returncode:
            run.summary = f"venv failed: {venv.stderr.strip().splitlines()[-1:]}"
            return run
        with open(os.path.join(clone, ".ci", "run")) as fh:
            with_uv = "uv pip install" in fh.read()  # the revision's own install: uv's from 45fb49b on, pip's before
        if with_uv:
            t_uv, got_uv = timed([py, "-m", "pip", "install", "-q", "uv>=0.13,<1"], clone)
            t1 += t_uv
            if got_uv.returncode:
                run.summary = f"installing uv failed: {got_uv.stderr.strip().splitlines()[-1:]}"
                return run
            install = [os.path.join(clone, ".venv", "bin", "uv"), "pip", "install", "-q", "--python", py,
                       "--compile-bytecode", "-e", ".[test]", *extra]
        else:
            install = [py, "-m", "pip", "install", "-q", "-e", ".[test]", *extra]
        t2, inst = timed(install, clone)
        run.install = t1 + t2
        if inst.returncode:
            run.summary = f"install failed: {inst.stderr.strip().splitlines()[-1:]}"
            return run
        if not with_coverage:
            run.typecheck, tc = timed(["bash", "scripts/typecheck"], clone)
            if tc.returncode:
                run.summary = "typecheck failed"
                return run
        env = dict(os.environ)
        cmd = [py, *PYTEST]
        if with_coverage:
            data = tempfile.mkdtemp(prefix="procsv-cov-")
            rc = coverage_rc(clone, data)
            env["COVERAGE_RCFILE"] = rc
            cmd = [py, "-m", "coverage", "run", "--rcfile", rc, *PYTEST]
        with LoadBeside() as beside:
            run.pytest, run.cpu, done = timed_cpu(cmd, clone, env)
        run.load = beside.mean
        lines = done.stdout.strip().splitlines()
        run.summary = lines[-1] if lines else done.stderr.strip()[-200:]
        run.ok = done.returncode == 0
        run.slowest = [ln for ln in lines if re.match(r"^\d+\.\d+s (call|setup|teardown) ", ln)][:10]
        run.failures = [ln for ln in lines if ln.startswith(("FAILED ", "ERROR "))]  # (pytest's short summary)
        if not run.ok:  # the failures' own reports, kept: a shared machine's flake is seen once
            fd, kept = tempfile.mkstemp(prefix=f"procsv-suite-{rev}-", suffix=".out")
            with os.fdopen(fd, "w") as fh:
                fh.write(done.stdout + done.stderr)
            run.failures.append(f"(pytest's whole output: {kept})")
        if with_coverage:
            subprocess.run([py, "-m", "coverage", "combine", "-q", "--rcfile", rc], cwd=clone, env=env)
            rep = subprocess.run([py, "-m", "coverage", "report", "--rcfile", rc, "--format=total", "--precision=2"],
                                 cwd=clone, env=env, capture_output=True, text=True)
            run.coverage = float(rep.stdout.strip()) if rep.returncode == 0 else None
            shutil.rmtree(data, ignore_errors=True)
        return run
    finally:
        if not keep:
            shutil.rmtree(clone, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rev", default="HEAD", help="the revision measured (default HEAD)")
    ap.add_argument("--baseline", help="a revision measured beside it, alternating (e.g. the last landed)")
    ap.add_argument("--runs", type=int, default=3, help="rounds (default 3); medians are reported")
    ap.add_argument("--coverage", action="store_true", help="line coverage across every process, one round")
    ap.add_argument("--keep", action="store_true", help="keep the clones (their paths are printed)")
    args = ap.parse_args()
    revs = [subprocess.run(["git", "rev-parse", "--short", r], cwd=REPO, capture_output=True, text=True,
                           check=True).stdout.strip() for r in ([args.baseline] if args.baseline else []) + [args.rev]]
    runs: dict[str, list[Run]] = {r: [] for r in revs}
    if args.runs < 1:
        ap.error("--runs must be at least 1")
    for round_no in range(1 if args.coverage else args.runs):
        for rev in (revs if round_no % 2 == 0 else revs[::-1]):  # alternate who goes first
            run = one(rev, args.coverage, args.keep)
            runs[rev].append(run)
            print(f"  {rev}: install {run.install:.0f} s, typecheck {run.typecheck:.0f} s, pytest {run.pytest:.0f} s "
                  f"({run.cpu:.0f} CPU s) "
                  f"(load {run.load:.2f}){'' if run.coverage is None else f', coverage {run.coverage:.2f} %'}: "
                  f"{run.summary}", flush=True)
            if not run.ok:
                print("\n".join([*run.failures, *run.slowest]), flush=True)
    print(f"\n{'revision':>10} {'runs':>4} {'pytest s':>9} {'(min-max)':>13} {'CPU s':>7} {'command s':>10} {'load':>5} "
          f"{'coverage %':>10}")
    for rev, rs in runs.items():
        py = [r.pytest for r in rs]
        cov = [r.coverage for r in rs if r.coverage is not None]
        print(f"{rev:>10} {len(rs):>4} {statistics.median(py):>9.0f} {f'({min(py):.0f}-{max(py):.0f})':>13} "
              f"{statistics.median([r.cpu for r in rs]):>7.0f} {statistics.median([r.total for r in rs]):>10.0f} {statistics.median([r.load for r in rs]):>5.2f} "
              f"{(f'{statistics.median(cov):.2f}' if cov else '-'):>10}")
    ok = all(r.ok for rs in runs.values() for r in rs)
    new = runs[revs[-1]]
    fields = [f"rev={revs[-1]}", f"pytest_s={statistics.median([r.pytest for r in new]):.0f}",
              f"cpu_s={statistics.median([r.cpu for r in new]):.0f}",
              f"command_s={statistics.median([r.total for r in new]):.0f}"]
    if args.baseline:
        base = runs[revs[0]]
        fields += [f"baseline={revs[0]}", f"baseline_pytest_s={statistics.median([r.pytest for r in base]):.0f}",
                   f"ratio={statistics.median([r.pytest for r in new]) / statistics.median([r.pytest for r in base]):.2f}",
                   f"baseline_cpu_s={statistics.median([r.cpu for r in base]):.0f}",
                   f"cpu_ratio={statistics.median([r.cpu for r in new]) / max(1e-9, statistics.median([r.cpu for r in base])):.2f}"]
    if args.coverage:
        fields += [f"coverage_{rev}={rs[0].coverage}" for rev, rs in runs.items()]
    fields.append(f"ok={int(ok)}")
    print(" ".join(fields))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
