"""What a launch's first services cost: started fresh (``/bin/sh`` execs ``python -m procsv.services.<role>``)
beside grown from the launch's service seeds (``services/seed.py``, ``procsv/watchdog/seeds.py``).

Runs on the developer's machine. Each round runs the same minimal launch (the digits example, ``--steps
10``, its own logdir) four ways, one after the other, so all see the same machine: ``cold`` is ``python
-c`` that calls ``procsv.cli.main``, as a shell's ``procsv launch`` is (a fresh interpreter with procsv's
CLI imported); ``warm`` is a fork of a helper process that imported TensorFlow once (outside the
measurement) and calls it with ``--fork-prewarm``, as ``tests/conftest.py: launch()`` does from the
tests' fork server. Each way twice: ``fresh`` with the seeds switched off in the launching process (its
``ServiceSeeds.plant`` plants none), ``seeded`` as the launch is. Measured: the CPU seconds of the
two service processes (``utime + stime`` of each, sampled from ``/proc`` every 10 ms until it ends: a
seed's own import counts, it is the same process), the time from the launch's start to both services'
ready (each one's stats file names its pid: written just before its Hello), and the CPU of the whole
launch (a cpuacct cgroup of its own; root and cgroup v1 ``cpuacct`` needed). Correctness first: each
launch must exit 0, commit its final checkpoint at step 10, and record its first services ``"via":
"fresh"`` or ``"fork"`` as the way says; otherwise the script exits 1.

    python3 scripts/bench_service_start.py --runs 3

Prints a table (medians of ``--runs`` and their spread) and ends with one ``key=value`` line.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Optional

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CGROUP = "/sys/fs/cgroup/cpuacct"
ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONUNBUFFERED": "1"}
ROLES = ("checkpoint", "summary")
WAYS = ("cold-fresh", "cold-seeded", "warm-fresh", "warm-seeded")
TICK = os.sysconf("SC_CLK_TCK")

# in the launching process, before procsv.cli.main: the seeds off (the fresh ways) or as they are
_SWITCH = """
import procsv.watchdog.seeds as seeds
def _switch(on):
    if not on:
        seeds.ServiceSeeds.plant = staticmethod(lambda preempt_signal: seeds.ServiceSeeds())
"""
_COLD = _SWITCH + """
import sys
from procsv.cli import main
_switch(sys.argv[1] == "1")
sys.exit(main(sys.argv[2:]))
"""
# the warm side: imports TensorFlow once, then forks one launch per line of JSON on stdin
# ([cgroup, seeds, argv]); the child joins the cgroup first; the parent answers each with its exit code
_WARM = _SWITCH + """
import json, os, sys
import tensorflow  # noqa: F401
import procsv.cli
print("ready", flush=True)
for line in sys.stdin:
    group, on, argv = json.loads(line)
    pid = os.fork()
    if pid == 0:
        with open(os.path.join(group, "tasks"), "w") as fh:
            fh.write(str(os.getpid()))
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        os.dup2(null, 2)
        code = 1
        try:
            _switch(on)
            code = procsv.cli.main(argv)
        finally:
            sys.stdout.flush()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    print(os.waitstatus_to_exitcode(status), flush=True)
"""


def _group(name: str) -> str:
    path = os.path.join(CGROUP, f"procsv-bench-{os.getpid()}-{name}")
    os.makedirs(path)
    return path


def _usage(path: str) -> float:
    with open(os.path.join(path, "cpuacct.usage")) as fh:
        return int(fh.read()) / 1e9


def _drop(path: str) -> None:
    for _ in range(100):
        try:
            os.rmdir(path)
            return
        except OSError:
            time.sleep(0.05)  # (a process of it still exiting)


def _records(logdir: str) -> list[dict]:
    try:
        with open(os.path.join(logdir, "logs", "lifecycle.jsonl")) as fh:
            return [json.loads(line) for line in fh if line.strip().endswith("}")]
    except OSError:
        return []


def _cpu(pid: int) -> Optional[float]:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / TICK


class Watch:
    """Samples a launch's first services while it runs: each one's pid, CPU seconds and ready time."""

    def __init__(self, logdir: str, start: float) -> None:
        self.logdir, self.start = logdir, start
        self.pids: dict[str, int] = {}
        self.cpu: dict[str, float] = {}
        self.ready: dict[str, float] = {}
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.done.is_set():
            if len(self.pids) < len(ROLES):
                for r in _records(self.logdir):
                    if r.get("event") == "spawned" and r.get("role") in ROLES and r.get("attempt") == 1:
                        self.pids.setdefault(r["role"], r["pid"])
            for role, pid in self.pids.items():
                if (cpu := _cpu(pid)) is not None:
                    self.cpu[role] = cpu
                if role not in self.ready:
                    try:
                        with open(os.path.join(self.logdir, ".procsv", f"{role}_stats.json")) as fh:
                            if json.load(fh).get("pid") == pid:
                                self.ready[role] = time.monotonic() - self.start
                    except (OSError, ValueError):
                        pass
            time.sleep(0.01)

    def stop(self) -> None:
        self.done.set()
        self.thread.join()


def _check(logdir: str, want_via: str, watch: Watch) -> str:
    """'' if the launch did what it should, else why."""
    records = _records(logdir)
    vias = {r.get("role"): r.get("via") for r in records
            if r.get("event") == "spawned" and r.get("role") in ROLES and r.get("attempt") == 1}
    if vias != {role: want_via for role in ROLES}:
        return f"its first services started {vias}, not {want_via!r}"
    if not os.path.exists(os.path.join(logdir, ".procsv", "checkpoints", "model.ckpt-10.json")):
        return "no checkpoint committed at step 10"
    if set(watch.cpu) != set(ROLES) or set(watch.ready) != set(ROLES):
        return f"services not seen (CPU of {sorted(watch.cpu)}, ready of {sorted(watch.ready)})"
    return ""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    if not os.path.isdir(CGROUP):
        print(f"bench_service_start: needs cgroup v1 cpuacct at {CGROUP} (and root)", file=sys.stderr)
        return 2
    work = tempfile.mkdtemp(prefix="bench-services-")
    warm = subprocess.Popen([sys.executable, "-c", _WARM], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            stderr=subprocess.DEVNULL, env=ENV, cwd=REPO)
    assert warm.stdout is not None and warm.stdin is not None
    if warm.stdout.readline().strip() != "ready":
        print("bench_service_start: the warm helper did not start", file=sys.stderr)
        return 1
    # per way: (services' CPU s, services' ready s, the launch's CPU s)
    results: dict[str, list[tuple[float, float, float]]] = {way: [] for way in WAYS}
    failures: list[str] = []
    try:
        for run in range(args.runs):
            for way in WAYS:
                seeded = way.endswith("seeded")
                logdir = os.path.join(work, f"{way}-{run}")
                argv = ["launch", "procsv.examples.digits", "--logdir", logdir,
                        *(["--fork-prewarm"] if way.startswith("warm") else []), "--", "--steps", "10"]
                group = _group(f"{way}-{run}")
                start = time.monotonic()
                watch = Watch(logdir, start)
                if way.startswith("cold"):
                    proc = subprocess.Popen([sys.executable, "-c", _COLD, "1" if seeded else "0", *argv], env=ENV,
                                            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                            preexec_fn=lambda g=group: open(os.path.join(g, "tasks"), "w").write(
                                                str(os.getpid())))
                    code = proc.wait()
                else:
                    warm.stdin.write(json.dumps([group, seeded, argv]) + "\n")
                    warm.stdin.flush()
                    code = int(warm.stdout.readline())
                watch.stop()
                launch_cpu = _usage(group)
                _drop(group)
                why = f"exit {code}" if code != 0 else _check(logdir, "fork" if seeded else "fresh", watch)
                if why:
                    failures.append(f"{way} run {run + 1}: {why}")
                    continue
                services = sum(watch.cpu.values())
                ready = max(watch.ready.values())
                results[way].append((services, ready, launch_cpu))
                print(f"  run {run + 1} {way:11s}: services {services:5.2f} s CPU "
                      f"({', '.join(f'{r} {watch.cpu[r]:.2f}' for r in ROLES)}), ready at {ready:5.2f} s, "
                      f"launch {launch_cpu:5.2f} s CPU", flush=True)
    finally:
        warm.stdin.close()
        warm.wait(30)
        shutil.rmtree(work, ignore_errors=True)
    load = os.getloadavg()[0]
    print(f"\nminimal launch (digits --steps 10), medians of {args.runs} (spread min-max), load {load:.2f}")
    print(f"{'':13s}{'services CPU s':>22s}{'services ready s':>22s}{'launch CPU s':>22s}")
    med: dict[str, tuple[float, ...]] = {}
    for way, got in results.items():
        if not got:
            continue
        cols = list(zip(*got))
        med[way] = tuple(statistics.median(c) for c in cols)
        print(f"{way:13s}" + "".join(f"{m:9.2f} ({min(c):.2f}-{max(c):.2f})" for m, c in zip(med[way], cols)))
    line = []
    for kind in ("cold", "warm"):
        fresh, seeded = med.get(f"{kind}-fresh"), med.get(f"{kind}-seeded")
        if fresh is None or seeded is None:
            continue
        print(f"{kind}: seeded/fresh services CPU {seeded[0] / fresh[0]:.2f}, ready {seeded[1] / fresh[1]:.2f}, "
              f"launch CPU {seeded[2] / fresh[2]:.2f}")
        line += [f"{kind}_fresh_services_cpu_s={fresh[0]:.2f}", f"{kind}_seeded_services_cpu_s={seeded[0]:.2f}",
                 f"{kind}_services_cpu_ratio={seeded[0] / fresh[0]:.2f}", f"{kind}_fresh_ready_s={fresh[1]:.2f}",
                 f"{kind}_seeded_ready_s={seeded[1]:.2f}", f"{kind}_fresh_launch_cpu_s={fresh[2]:.2f}",
                 f"{kind}_seeded_launch_cpu_s={seeded[2]:.2f}"]
    for failure in failures:
        print(f"FAILED: {failure}", file=sys.stderr)
    print(" ".join(line + [f"runs={args.runs}", f"load={load:.2f}", f"ok={0 if failures else 1}"]))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
