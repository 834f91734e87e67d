"""What a launch costs in CPU: ``procsv launch`` started afresh beside one started from an interpreter
that has imported TensorFlow (its first zygote grown from a seed, ``procsv/zygote/seed.py``).

Runs on the developer's machine. Each round runs the same small launch (the digits example, ``--steps
30``, its own logdir) both ways, alternating, so both see the same machine: ``fresh`` is ``python -m
procsv launch ...`` as a shell starts it; ``warm`` is a fork of a helper process that imported
TensorFlow once (outside the measurement), which calls ``procsv.cli.main`` with the same arguments, as
a program or test harness that drives launches does. Each launch's CPU is that of a cpuacct cgroup of
its own (every process of the launch, its services, zygote, trainers and standby included; root and
cgroup v1 ``cpuacct`` needed), with its wall time. Correctness first: each launch must exit 0, commit its
final checkpoint at step 30, and say how its first zygote started (``fresh``: spawned; ``warm``: ``"via":
"fork"``); otherwise the script exits 1.

    python3 scripts/bench_launch_cost.py --runs 3

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
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CGROUP = "/sys/fs/cgroup/cpuacct"
ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONUNBUFFERED": "1"}

# the warm side: imports TensorFlow once, then forks one launch per line of JSON on stdin
# ([cgroup, argv]); the child joins the cgroup first; the parent answers each with its exit code
_WARM = """
import json, os, sys
import tensorflow  # noqa: F401
import procsv.cli
print("ready", flush=True)
for line in sys.stdin:
    group, argv = json.loads(line)
    pid = os.fork()
    if pid == 0:
        with open(os.path.join(group, "tasks"), "w") as fh:
            fh.write(str(os.getpid()))
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        os.dup2(null, 2)
        code = 1
        try:
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


def _check(logdir: str, want_via: str) -> str:
    """'' if the launch did what it should (its final checkpoint at 30, its first zygote ``want_via``), else why."""
    records = []
    with open(os.path.join(logdir, "logs", "lifecycle.jsonl")) as fh:
        records = [json.loads(line) for line in fh if line.strip()]
    via = next((r.get("via") for r in records if r.get("event") == "spawned" and r.get("role") == "zygote"), None)
    if via != want_via:
        return f"its first zygote started {via!r}, not {want_via!r}"
    if not os.path.exists(os.path.join(logdir, ".procsv", "checkpoints", "model.ckpt-30.json")):
        return "no checkpoint committed at step 30"
    return ""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    if not os.path.isdir(CGROUP):
        print(f"bench_launch_cost: needs cgroup v1 cpuacct at {CGROUP} (and root)", file=sys.stderr)
        return 2
    work = tempfile.mkdtemp(prefix="bench-launch-")
    warm = subprocess.Popen([sys.executable, "-c", _WARM], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            stderr=subprocess.DEVNULL, env=ENV, cwd=REPO)
    assert warm.stdout is not None and warm.stdin is not None
    if warm.stdout.readline().strip() != "ready":
        print("bench_launch_cost: the warm helper did not start", file=sys.stderr)
        return 1
    results: dict[str, list[tuple[float, float]]] = {"fresh": [], "warm": []}
    failures: list[str] = []
    try:
        for run in range(args.runs):
            for way in ("fresh", "warm"):
                logdir = os.path.join(work, f"{way}-{run}")
                argv = ["launch", "procsv.examples.digits", "--logdir", logdir, "--", "--steps", "30"]
                group = _group(f"{way}-{run}")
                start = time.monotonic()
                if way == "fresh":
                    proc = subprocess.Popen([sys.executable, "-m", "procsv", *argv], env=ENV, cwd=REPO,
                                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                            preexec_fn=lambda g=group: open(os.path.join(g, "tasks"), "w").write(
                                                str(os.getpid())))
                    code = proc.wait()
                else:
                    warm.stdin.write(json.dumps([group, argv]) + "\n")
                    warm.stdin.flush()
                    code = int(warm.stdout.readline())
                wall = time.monotonic() - start
                cpu = _usage(group)
                _drop(group)
                why = f"exit {code}" if code != 0 else _check(logdir, "fresh" if way == "fresh" else "fork")
                if why:
                    failures.append(f"{way} run {run + 1}: {why}")
                results[way].append((cpu, wall))
                print(f"  run {run + 1} {way:5s}: {cpu:5.2f} s CPU, {wall:5.2f} s wall", flush=True)
    finally:
        warm.stdin.close()
        warm.wait(30)
        shutil.rmtree(work, ignore_errors=True)
    load = os.getloadavg()[0]
    print(f"\nlaunch of digits --steps 30, medians of {args.runs} (spread min-max), load {load:.2f}")
    print(f"{'':8s}{'CPU s':>18s}{'wall s':>18s}")
    med = {}
    for way, got in results.items():
        cpus, walls = [c for c, _ in got], [w for _, w in got]
        med[way] = (statistics.median(cpus), statistics.median(walls))
        print(f"{way:8s}{med[way][0]:8.2f} ({min(cpus):.2f}-{max(cpus):.2f}){med[way][1]:8.2f} "
              f"({min(walls):.2f}-{max(walls):.2f})")
    ratio = med["warm"][0] / med["fresh"][0]
    print(f"warm/fresh CPU {ratio:.2f}")
    for failure in failures:
        print(f"FAILED: {failure}", file=sys.stderr)
    print(f"fresh_cpu_s={med['fresh'][0]:.2f} warm_cpu_s={med['warm'][0]:.2f} cpu_ratio={ratio:.2f} "
          f"fresh_wall_s={med['fresh'][1]:.2f} warm_wall_s={med['warm'][1]:.2f} runs={args.runs} load={load:.2f} "
          f"ok={0 if failures else 1}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
