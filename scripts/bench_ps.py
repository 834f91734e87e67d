"""Parameter servers (``procsv launch --ps 2 --workers 3``): how fast each task comes back, against TF's own Supervisor.

Runs on one machine: ``.venv/bin/python scripts/bench_ps.py [--repeats N] [--step-delay S]``. The
cluster is 2 parameter servers and 3 workers running ``scripts/bench_ps_program.py`` (the replicas
example's graph, variables on the parameter servers), each train op sleeping ``--step-delay``
seconds (default 0.05: three workers at most 60 steps/s in all, a few percent of a core each, so
that the machine stays below saturation and a recovery is not slowed by the training itself).
Each worker appends ``<time> <pid> <global step>`` to a file per task after each step; every figure
is read from those lines and from ``logs/lifecycle.jsonl``.

Each repeat runs:

* **procsv**, one launch with ``--save-model-secs 2``, in this order: every worker stepping and a
  checkpoint committed; 10 s; **SIGKILL of worker 2** (not the chief): *worker MTTR* is the kill to
  worker 2's next completed step (a new pid); *survivor throughput* is the steps/s of the chief and
  worker 1 over the 10 s after the kill divided by their steps/s over the 10 s before; **SIGKILL of
  the chief**: *chief MTTR* is the kill to the chief's next completed step; **SIGKILL of ps0**:
  *ps MTTR* is the kill to the moment every worker has completed a step again in a new process
  (procsv restarts ps0 and ends the workers, the chief restores the newest checkpoint), and *ps
  steps lost* is the highest global step completed before the kill minus the step restored;
  **SIGTERM to the launch**: *preempt steps lost* is the highest global step any worker completed
  minus the global step held by the newest checkpoint (read with ``tf.train.load_variable``);
* **TensorFlow's own Supervisor** (``tf.compat.v1.train.Supervisor``, ``--plain``) on the same
  cluster shape, the parameter servers plain ``tf.distribute.Server`` processes and each worker
  under a plain restart loop (a loop that runs it again whenever it exits, as a shell ``while
  true`` would): the restarted worker imports TensorFlow, builds its graph and server, and its
  ``managed_session`` polls ``ready_op`` every ``recovery_wait_secs`` (TF's default, 30 s; the model
  is initialized already, so the first poll passes); after 10 s of stepping, **SIGKILL of worker
  2**: *worker MTTR* as above.

The table shows the median and the spread (min .. max) over the repeats; *worker MTTR ratio* is
procsv's worker MTTR over TensorFlow's. Correctness checks, each failing the script (exit 1): every
killed task steps again, the launch exits 143 on SIGTERM and leaves no process, the step restored
after the ps kill is no older than the last checkpoint committed before it (steps lost <= those
since the last commit), and 0 steps lost on SIGTERM. The last line is ``worker_mttr_s=
worker_mttr_ratio= survivor_throughput= ps_mttr_s= ps_steps_lost= chief_mttr_s= preempt_steps_lost=``
(medians). The goals (issue 43): worker MTTR <= 0.5 s, survivor throughput >= 0.95, ps MTTR <= 3 s,
0 steps lost on SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Callable, Optional

from results_table import median_spread  # scripts/ is this script's folder, first on sys.path

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROGRAM = os.path.join(REPO, "scripts", "bench_ps_program.py")
PS, WORKERS = 2, 3
WINDOW = 10.0


class CheckFailed(Exception):
    """One of the benchmark's own correctness checks failed."""


def env() -> dict[str, str]:
    e = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="", PYTHONUNBUFFERED="1")
    e["PYTHONPATH"] = REPO + os.pathsep + e.get("PYTHONPATH", "")
    return e


def wait_for(cond: Callable[[], Any], timeout: float, what: str) -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = cond()
        if got:
            return got
        time.sleep(0.05)
    raise CheckFailed(f"timed out after {timeout:g} s waiting for {what}")


def steps(record: str, task: int) -> list[tuple[float, int, int]]:
    """``(time, pid, global step)`` of every step task ``task`` recorded."""
    try:
        with open(os.path.join(record, f"w{task}.steps")) as fh:
            out = []
            for line in fh:
                if line.endswith("\n"):
                    t, pid, g = line.split()
                    out.append((float(t), int(pid), int(g)))
            return out
    except FileNotFoundError:
        return []


def first_after(record: str, task: int, t0: float, old_pid: Optional[int]) -> Optional[float]:
    """When task ``task`` first completed a step after ``t0`` in a process other than ``old_pid``."""
    return next((t for t, pid, _ in steps(record, task) if t > t0 and pid != old_pid), None)


def last_pid(record: str, task: int) -> int:
    return steps(record, task)[-1][1]


def rate(record: str, tasks: list[int], a: float, b: float) -> float:
    return sum(1 for k in tasks for t, _, _ in steps(record, k) if a <= t < b) / (b - a)


def lifecycle(logdir: str) -> list[dict[str, Any]]:
    try:
        with open(os.path.join(logdir, "logs", "lifecycle.jsonl")) as fh:
            return [json.loads(x) for x in fh if x.endswith("\n") and x.strip()]
    except FileNotFoundError:
        return []


def status_pid(logdir: str, role: str) -> Optional[int]:
    try:
        with open(os.path.join(logdir, ".procsv", "status.json")) as fh:
            st = json.load(fh)
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return next((p["pid"] for p in st.get("processes", []) if p["role"] == role), None)


def tree_kill(root: subprocess.Popen[str]) -> None:
    import psutil

    try:
        procs = [psutil.Process(root.pid), *psutil.Process(root.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for p in procs:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass


def run_procsv(work: str, delay: float) -> dict[str, float]:
    """One procsv launch through every kill; the figures of this repeat."""
    logdir, record = os.path.join(work, "procsv"), os.path.join(work, "procsv-steps")
    os.makedirs(record)
    cmd = [sys.executable, "-m", "procsv", "launch", PROGRAM, "--logdir", logdir, "--ps", str(PS), "--workers",
           str(WORKERS), "--quiet", "--", "--record-dir", record, "--save-model-secs", "2", "--step-delay", str(delay)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env(), cwd=REPO,
                            start_new_session=True)
    out: dict[str, float] = {}
    try:
        wait_for(lambda: proc.poll() is not None or all(steps(record, k) for k in range(WORKERS)) and
                 [e for e in lifecycle(logdir) if e["event"] == "checkpoint_committed"], 300,
                 "every worker stepping and a checkpoint")
        if proc.poll() is not None:
            raise CheckFailed(f"the launch ended: {proc.communicate()[1][-2000:]}")
        time.sleep(WINDOW)
        # worker 2
        old = last_pid(record, 2)
        t0 = time.time()
        os.kill(old, signal.SIGKILL)
        back = wait_for(lambda: first_after(record, 2, t0, old), 120, "worker 2 stepping again")
        out["worker_mttr_s"] = back - t0
        time.sleep(max(0.0, t0 + WINDOW - time.time()) + 0.5)
        before, after = rate(record, [0, 1], t0 - WINDOW, t0), rate(record, [0, 1], t0, t0 + WINDOW)
        out["survivor_throughput"] = after / before
        # the chief
        old = last_pid(record, 0)
        t1 = time.time()
        os.kill(old, signal.SIGKILL)
        back = wait_for(lambda: first_after(record, 0, t1, old), 120, "the chief stepping again")
        out["chief_mttr_s"] = back - t1
        n = len([e for e in lifecycle(logdir) if e["event"] == "checkpoint_committed"])
        wait_for(lambda: len([e for e in lifecycle(logdir) if e["event"] == "checkpoint_committed"]) > n, 60,
                 "a checkpoint after the chief's restart")
        # ps0
        time.sleep(1.0)
        olds = {k: last_pid(record, k) for k in range(WORKERS)}
        ps_pid = status_pid(logdir, "ps0")
        if ps_pid is None:
            raise CheckFailed("status.json names no ps0")
        t2 = time.time()
        os.kill(ps_pid, signal.SIGKILL)
        backs = wait_for(lambda: (b := [first_after(record, k, t2, olds[k]) for k in range(WORKERS)]) and
                         all(x is not None for x in b) and b, 180, "every worker stepping again after ps0")
        out["ps_mttr_s"] = max(backs) - t2
        done = max(g for k in range(WORKERS) for t, _, g in steps(record, k) if t < t2)
        events = lifecycle(logdir)
        committed = [e["step"] for e in events if e["event"] == "checkpoint_committed" and e["time"] < t2]
        restored = [e["step"] for e in events if e["event"] == "restored" and e["time"] > t2]
        if not restored:
            raise CheckFailed("no restore after ps0's kill")
        if restored[0] < committed[-1]:
            raise CheckFailed(f"after ps0's kill the chief restored step {restored[0]}, older than the last "
                              f"commit {committed[-1]}")
        out["ps_steps_lost"] = float(done - restored[0])
        # SIGTERM
        time.sleep(2.0)
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(120)
        except subprocess.TimeoutExpired:
            raise CheckFailed("the launch did not end within 120 s of SIGTERM")
        if code != 128 + signal.SIGTERM:
            raise CheckFailed(f"the launch exited {code} on SIGTERM, not 143: {proc.communicate()[1][-2000:]}")
        import tensorflow as tf

        latest = tf.train.latest_checkpoint(logdir)
        if latest is None:
            raise CheckFailed("no checkpoint after SIGTERM")
        held = int(tf.train.load_variable(latest, "global_step"))
        top = max(g for k in range(WORKERS) for _, _, g in steps(record, k))
        out["preempt_steps_lost"] = float(max(0, top - held))
        if top > held:
            raise CheckFailed(f"SIGTERM lost {top - held} steps (checkpoint {held}, a worker completed {top})")
        import psutil

        left = [p.pid for p in psutil.process_iter(["environ"]) if (p.info["environ"] or {}).get("PROCSV_LOGDIR")
                == os.path.abspath(logdir)]
        if left:
            raise CheckFailed(f"processes of the run left after SIGTERM: {left}")
    finally:
        if proc.poll() is None:
            tree_kill(proc)
            proc.wait(30)
    return out


def run_plain(work: str, delay: float) -> float:
    """The same cluster under TF's own Supervisor and a plain restart loop; worker 2's MTTR."""
    from procsv.cluster import make_ps_tf_config
    from procsv.common.spawn import free_ports

    logdir, record = os.path.join(work, "plain"), os.path.join(work, "plain-steps")
    os.makedirs(record)
    ports = free_ports(PS + WORKERS, "127.0.0.1")
    ps = [f"127.0.0.1:{p}" for p in ports[:PS]]
    workers = [f"127.0.0.1:{p}" for p in ports[PS:]]
    procs: list[subprocess.Popen[str]] = []
    stopping = threading.Event()
    current: dict[int, subprocess.Popen[str]] = {}
    serve = ("import json, os, tensorflow as tf; c = json.loads(os.environ['TF_CONFIG']); "
             "tf.distribute.Server(tf.train.ClusterSpec(c['cluster']), job_name='ps', "
             "task_index=c['task']['index']).join()")

    def loop(k: int) -> None:  # while true; do python bench_ps_program.py --plain ...; done
        e = dict(env(), TF_CONFIG=make_ps_tf_config(ps, workers, "worker", k))
        while not stopping.is_set():
            p = subprocess.Popen([sys.executable, PROGRAM, "--plain", "--record-dir", record, "--logdir", logdir,
                                  "--save-model-secs", "2", "--step-delay", str(delay)], env=e, cwd=REPO,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True,
                                 start_new_session=True)
            current[k] = p
            p.wait()

    threads = [threading.Thread(target=loop, args=(k,), daemon=True) for k in range(WORKERS)]
    try:
        for i in range(PS):
            procs.append(subprocess.Popen([sys.executable, "-c", serve], env=dict(env(), TF_CONFIG=make_ps_tf_config(
                ps, workers, "ps", i)), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True,
                start_new_session=True))
        for t in threads:
            t.start()
        wait_for(lambda: all(steps(record, k) for k in range(WORKERS)), 300, "every plain worker stepping")
        time.sleep(WINDOW)
        old = last_pid(record, 2)
        t0 = time.time()
        os.kill(old, signal.SIGKILL)
        back = wait_for(lambda: first_after(record, 2, t0, old), 180, "plain worker 2 stepping again")
        return float(back - t0)
    finally:
        stopping.set()
        for p in list(current.values()) + procs:
            if p.poll() is None:
                p.kill()
            p.wait(30)


def spread(values: list[float]) -> str:
    return median_spread(values, ".3g", " .. ")


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--step-delay", type=float, default=0.05, help="seconds each train op sleeps (default 0.05)")
    args = p.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # this process reads the checkpoint with TensorFlow
    if args.repeats < 1 or args.step_delay < 0:
        print("bench_ps: --repeats must be >= 1 and --step-delay >= 0", file=sys.stderr)
        return 2
    figures: dict[str, list[float]] = {}
    try:
        for r in range(args.repeats):
            work = tempfile.mkdtemp(prefix="bench-ps-")
            try:
                got = run_procsv(work, args.step_delay)
                got["tf_worker_mttr_s"] = run_plain(work, args.step_delay)
                got["worker_mttr_ratio"] = got["worker_mttr_s"] / got["tf_worker_mttr_s"]
            finally:
                shutil.rmtree(work, ignore_errors=True)
            print(f"repeat {r + 1}: " + " ".join(f"{k}={v:.3g}" for k, v in got.items()), flush=True)
            for k, v in got.items():
                figures.setdefault(k, []).append(v)
    except CheckFailed as e:
        print(f"bench_ps: check failed: {e}", file=sys.stderr)
        return 1
    rows = [("worker MTTR, procsv (s)", "worker_mttr_s"), ("worker MTTR, TF Supervisor + restart loop (s)",
                                                           "tf_worker_mttr_s"),
            ("worker MTTR ratio (procsv / TF)", "worker_mttr_ratio"),
            ("survivors' steps/s, 10 s after / before", "survivor_throughput"), ("ps MTTR (s)", "ps_mttr_s"),
            ("steps lost at the ps kill", "ps_steps_lost"), ("chief MTTR (s)", "chief_mttr_s"),
            ("steps lost on SIGTERM", "preempt_steps_lost")]
    print(f"\n{PS} parameter servers, {WORKERS} workers, --step-delay {args.step_delay:g} s, {args.repeats} repeat(s): "
          "median (min .. max)")
    for name, key in rows:
        print(f"  {name:<48} {spread(figures[key])}")
    keys = ["worker_mttr_s", "worker_mttr_ratio", "survivor_throughput", "ps_mttr_s", "ps_steps_lost", "chief_mttr_s",
            "preempt_steps_lost"]
    print(" ".join(f"{k}={statistics.median(figures[k]):.3g}" for k in keys))
    return 0


if __name__ == "__main__":
    sys.exit(main())
