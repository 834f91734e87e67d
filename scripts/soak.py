#!/usr/bin/env python3
"""Soak: many checkpoint cycles and trainer restarts under ``procsv launch``, watching for leaks.

Runs ``tests/programs/tiny_train.py`` (one 4-float variable, a checkpoint every ``--save-steps``
steps) under ``procsv launch --chaos every=SECS`` (SIGKILL to the trainer SECS after each attempt's
first step) until at least ``--restarts`` trainer restarts and ``--commits`` checkpoint commits have
happened, then stops the launch with SIGTERM (an orderly stop: the trainer commits its emergency
checkpoint; the launch exits 143). Defaults: 100 restarts and 1,000 commits, a few minutes;
``--restarts 20 --commits 100 --chaos-every 0.75`` is the ~25-40 s version ``tests/test_soak.py`` runs.

Along the way, every ``--interval`` seconds, it samples each long-lived process of the run with
psutil -- the watchdog, the pre-warmed trainer (zygote), the checkpoint service and the summary
service -- for open file descriptors, threads, RSS and memory mappings, and the logdir's size on
disk.

How growth is measured. A process that was just started is still settling: lazy imports, the
allocator's arenas, ZeroMQ's I/O threads, the first restore's caches. So samples taken before the
``--warmup-restarts``-th restart (default: a tenth of ``--restarts``, at least 2) are not compared.
The run is periodic -- each trainer attempt connects to the services, maps its snapshot memory,
checkpoints, is killed, and the watchdog reaps it and starts the next -- and the long-lived
processes' counts follow that cycle, so samples are grouped by restart cycle (the restart count when
taken; the cycle the soak stopped in is left out) and compared window to window, never sample to
sample. An fd is known by its number and what it refers to (the inode of its socket, file, pipe or
memfd) and a thread by its id; their growth is the number that stayed open (alive) through every
sample of the last window minus the number that did through every sample of the first. A connection
of a trainer attempt, a file a commit has open, a thread of one restart is new in each cycle and
closed within it, so it is held through neither window, however large a share of the time it is open
on a loaded machine; a leaked one stays open and is held through the last. (Counting did not do: the
checkpoint service holds 19 fds, and 20 or 21 while another trainer attempt's connection is open or
a commit has a file open. Under CI's load that was half of the samples or more: cycle peaks, then
medians of counts, reported growths of 1 and 0.5 with no leak.) Mappings and RSS are levels: the
median of all the window's samples, their growth (last window) - (first window). The windows are the
first and the last k cycles after warm-up, k = a tenth of them, at least 3. The table also shows the
raw first sample after warm-up and the raw last sample.

Goals, each checked (the script exits 1 if one fails, naming it):

* fd growth <= 0 and thread growth <= 0 for every long-lived process; memory mappings grow by
  at most 3 (the allocator adds a heap segment now and then, once; a leak adds one per restart);
  RSS growth < 20 MB;
* every long-lived process is the same process from start to end (none was restarted);
* 0 zombies: a child of the watchdog or the zygote seen as a zombie in samples spanning >= 2 s
  (a child is a zombie for milliseconds between its death and its reap: that is not counted);
* 0 leftovers after the run: no process of the run alive, no runtime directory left (the launch
  runs with a private ``TMPDIR``, so every ``procsv-*`` directory in it is this run's);
* at least ``--restarts`` restarts and ``--commits`` commits; the launch exited 143;
* logs are bounded: for each role, only the first attempt's log and the last ``--keep-logs``
  attempts' remain (see ``procsv/watchdog/logrotate.py``);
* the final checkpoint restores with plain ``tf.train.Checkpoint`` and holds the state of exactly
  its step (tiny_train adds 1 to each weight per step, so weight == global_step == the step of the
  last ``checkpoint_committed``).

``logs/lifecycle.jsonl`` is not rotated (tools read it whole); its growth is reported per restart
and per commit. The machine's load matters: on a shared machine timings vary, counts do not.

Prints a table, then one line:
``soak_fd_growth=<n> soak_thread_growth=<n> soak_rss_growth_mb=<x> zombies=<n> leftovers=<n> restarts=<n> commits=<n>``
(the growths are the largest over the long-lived processes).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Optional

import psutil

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(REPO, "tests", "programs", "tiny_train.py")
ROLES = ("watchdog", "zygote", "checkpoint", "summary")
RSS_GOAL_MB = 20.0
ZOMBIE_SECS = 2.0
MAPS_SLACK = 3  # new mappings allowed: the allocator adds an arena or a heap segment now and then, once
EXIT_SIGTERM = 128 + signal.SIGTERM
_ATTEMPT_FILE = re.compile(r"^(?P<role>[a-z]+)\.(?P<attempt>[0-9]+)\.(?:log|error\.json)$")


@dataclass
class Sample:
    t: float  # seconds since the launch
    restarts: int
    fds: int
    threads: int
    rss: int
    maps: int  # memory mappings (lines of /proc/<pid>/maps): an mmap never undone shows here first
    open_fds: frozenset[tuple[int, int, int]] = frozenset()  # each open fd: (number, st_dev, st_ino of its object)
    tids: frozenset[int] = frozenset()  # the ids of its threads

    def to_json(self) -> dict[str, Any]:
        return {**vars(self), "open_fds": sorted(self.open_fds), "tids": sorted(self.tids)}


@dataclass
class Tracked:
    """One long-lived process of the run and its samples."""

    role: str
    pid: int
    create_time: float
    samples: list[Sample] = field(default_factory=list)
    replaced_by: list[int] = field(default_factory=list)  # pids seen in its role later (a restart)


class Lifecycle:
    """Reads ``logs/lifecycle.jsonl`` incrementally and counts what the soak needs."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.pos = 0
        self.restarts = 0
        self.commits = 0
        self.last_commit_step = -1
        self.trainer_attempt = 0
        self.standby_attempt = 0  # a hot standby is spawned as the next trainer attempt (and logs as it)
        self.chaos_kills = 0
        self.other_failures: list[dict[str, Any]] = []
        self.failed_saves: list[dict[str, Any]] = []

    def poll(self) -> None:
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.pos)
                data = fh.read()
        except FileNotFoundError:
            return
        end = data.rfind(b"\n")
        if end < 0:
            return
        self.pos += end + 1
        for line in data[:end].splitlines():
            if not line.strip():
                continue
            ev = json.loads(line)
            kind = ev["event"]
            if kind == "restarted":
                self.restarts += 1
            elif kind == "checkpoint_committed":
                self.commits += 1
                self.last_commit_step = max(self.last_commit_step, ev["step"])
            elif kind == "spawned" and ev["role"] == "trainer":
                self.trainer_attempt = max(self.trainer_attempt, ev["attempt"])
            elif kind == "spawned" and ev["role"] == "standby":
                self.standby_attempt = max(self.standby_attempt, ev["attempt"])
            elif kind == "chaos_kill":
                self.chaos_kills += 1
            elif kind == "checkpoint_failed":
                self.failed_saves.append(ev)  # a trainer killed mid-save fails its save: counted, not a finding
            elif kind in ("gave_up", "checkpoint_stalled", "summary_stalled", "hang_detected", "zygote_gone"):
                self.other_failures.append(ev)


def read_status(logdir: str) -> Optional[dict[str, Any]]:
    try:
        with open(os.path.join(logdir, ".procsv", "status.json")) as fh:
            return json.load(fh)  # type: ignore[no-any-return]
    except (OSError, json.JSONDecodeError):
        return None


def role_pids(logdir: str, watchdog_pid: int) -> dict[str, int]:
    """The long-lived processes' pids, from ``status.json`` (the watchdog's own is known)."""
    pids = {"watchdog": watchdog_pid}
    st = read_status(logdir)
    if st is None:
        return pids
    if st.get("prewarm"):
        pids["zygote"] = st["prewarm"]["pid"]
    for p in st.get("processes", []):
        if p["role"] in ("checkpoint", "summary") and p.get("alive", True) and p.get("pid"):
            pids[p["role"]] = p["pid"]
    return pids


def dir_size(path: str) -> tuple[int, int]:
    """Apparent bytes and number of files under ``path``."""
    total = files = 0
    for root, _dirs, names in os.walk(path):
        for name in names:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
                files += 1
            except OSError:
                pass
    return total, files


def fd_ids(pid: int) -> frozenset[tuple[int, int, int]]:
    """The open fds of ``pid``, each as (number, st_dev, st_ino) of what it refers to: an fd that
    stays open keeps both; one closed and opened again gets a new object (a socket, a temporary
    file), and often another number. Several fds on one object (``/dev/null``) stay apart."""
    folder = f"/proc/{pid}/fd"
    found = set()
    for name in os.listdir(folder):
        try:
            st = os.stat(os.path.join(folder, name))
        except OSError:  # closed meanwhile
            continue
        found.add((int(name), st.st_dev, st.st_ino))
    return frozenset(found)


def thread_ids(pid: int) -> frozenset[int]:
    return frozenset(int(name) for name in os.listdir(f"/proc/{pid}/task"))


def count_maps(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/maps", "rb") as fh:
            return fh.read().count(b"\n")
    except OSError:
        return -1


def children_of(pid: int) -> list[int]:
    """``pid``'s children, from each of its threads' ``/proc/<pid>/task/<tid>/children`` (psutil's
    ``children()`` reads the stat file of every process on the machine to find them: 3.7 ms a call with
    75 processes, four times a second, and a loaded test machine runs hundreds)."""
    kids: list[int] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return kids
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as fh:
                kids += [int(k) for k in fh.read().split()]
        except FileNotFoundError:  # the thread ended meanwhile, or a kernel without the file: psutil's way
            if not os.path.exists(f"/proc/{pid}/task/{tid}"):
                continue
            try:
                return [k.pid for k in psutil.Process(pid).children()]
            except psutil.Error:
                return []
        except OSError:
            continue
    return kids


def zombie_children(pids: list[int]) -> set[int]:
    found: set[int] = set()
    for pid in pids:
        for kid in children_of(pid):
            try:
                with open(f"/proc/{kid}/stat") as fh:
                    if fh.read().rsplit(")", 1)[1].split()[0] == "Z":
                        found.add(kid)
            except (OSError, IndexError):
                pass
    return found


def run_processes(logdir: str, tmpdir: str, pids: list[int]) -> list[int]:
    """Live processes of the run: by ``PROCSV_LOGDIR``/``PROCSV_RUNTIME_DIR``, or a pid we sampled."""
    found: set[int] = set()
    for proc in psutil.process_iter(["pid", "status"]):
        try:
            if proc.info["status"] == psutil.STATUS_ZOMBIE or proc.pid == os.getpid():
                continue
            environ = proc.environ()
        except (psutil.Error, OSError):
            continue
        if environ.get("PROCSV_LOGDIR") == logdir or environ.get("PROCSV_RUNTIME_DIR", "").startswith(tmpdir):
            found.add(proc.pid)
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                found.add(pid)
        except psutil.Error:
            pass
    return sorted(found)


def cycles(samples: list[Sample], warmup_restarts: int) -> list[list[Sample]]:
    """The samples after warm-up, one list per restart cycle (by the restart count when taken).

    The last cycle (the one the soak stopped in) is left out: it may hold a single sample.
    """
    groups: dict[int, list[Sample]] = {}
    for s in samples:
        if s.restarts >= warmup_restarts:
            groups.setdefault(s.restarts, []).append(s)
    return [groups[k] for k in sorted(groups)][:-1]


def growth(cycs: list[list[Sample]]) -> dict[str, float]:
    """Growth from the first to the last windows of cycles (see the module docstring)."""
    k = max(3, len(cycs) // 10) if len(cycs) >= 6 else max(1, len(cycs) // 2)
    first, last = cycs[:k], cycs[-k:]

    def held(window: list[list[Sample]], key: str) -> int:
        # what stayed open (alive) through every sample of the window
        return len(frozenset.intersection(*(getattr(s, key) for cyc in window for s in cyc)))

    def level(window: list[list[Sample]], key: str) -> float:
        return float(statistics.median(getattr(s, key) for cyc in window for s in cyc))

    return {"fds": float(held(last, "open_fds") - held(first, "open_fds")),
            "threads": float(held(last, "tids") - held(first, "tids")),
            "maps": level(last, "maps") - level(first, "maps"),
            "rss_mb": (level(last, "rss") - level(first, "rss")) / 2**20}


def kept_attempt_files(logs: str) -> dict[str, list[int]]:
    kept: dict[str, set[int]] = {}
    for name in os.listdir(logs):
        m = _ATTEMPT_FILE.match(name)
        if m and name.endswith(".log"):
            kept.setdefault(m.group("role"), set()).add(int(m.group("attempt")))
    return {role: sorted(a) for role, a in kept.items()}


def verify_checkpoint(logdir: str, expect_step: int) -> Optional[str]:
    """Restore the latest checkpoint with plain TensorFlow; None if it holds exactly ``expect_step``."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
    import tensorflow as tf

    path = tf.train.latest_checkpoint(logdir)
    if path is None:
        return "tf.train.latest_checkpoint found no checkpoint"
    weights = tf.Variable(tf.zeros([4]))
    step = tf.Variable(0, dtype=tf.int64)
    try:
        tf.train.Checkpoint(weights=weights, global_step=step).restore(path).assert_existing_objects_matched()
    except Exception as exc:  # noqa: BLE001 - any failure to restore is the finding
        return f"{path} does not restore: {type(exc).__name__}: {exc}"
    got_step, w = int(step.numpy()), weights.numpy()
    if got_step != expect_step:
        return f"{path} holds step {got_step}, but the last committed step was {expect_step}"
    if not all(float(x) == float(got_step) for x in w):
        return f"{path} at step {got_step} holds weights {w.tolist()}, expected {float(got_step)} each"
    return None


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--restarts", type=int, default=100, help="trainer restarts to go through (default 100)")
    p.add_argument("--commits", type=int, default=1000, help="checkpoint commits to go through (default 1000)")
    p.add_argument("--chaos-every", type=float, default=3.0,
                   help="SIGKILL the trainer this many seconds after each attempt's first step (default 3)")
    p.add_argument("--save-steps", type=int, default=10, help="checkpoint every N steps (default 10)")
    p.add_argument("--step-delay", type=float, default=0.01, help="seconds per training step (default 0.01)")
    p.add_argument("--keep-logs", type=int, default=10, help="procsv launch --keep-logs (default 10)")
    p.add_argument("--interval", type=float, default=0.25, help="seconds between samples (default 0.25)")
    p.add_argument("--warmup-restarts", type=int, default=None,
                   help="samples before this many restarts are not compared (default restarts/10, >= 2)")
    p.add_argument("--max-secs", type=float, default=900.0, help="give up after this long (default 900)")
    p.add_argument("--workdir", default=None,
                   help="keep the logdir, the launch's output and samples.json here (default: a temp folder, "
                        "removed if every check passed)")
    args = p.parse_args()
    warmup = args.warmup_restarts if args.warmup_restarts is not None else max(2, args.restarts // 10)

    work = args.workdir or tempfile.mkdtemp(prefix="procsv-soak-")
    os.makedirs(work, exist_ok=True)
    logdir = os.path.abspath(os.path.join(work, "run"))
    tmpdir = os.path.abspath(os.path.join(work, "tmp"))  # the run's private TMPDIR: its runtime dir goes here
    os.makedirs(tmpdir, exist_ok=True)
    env = dict(os.environ, TMPDIR=tmpdir, TF_CPP_MIN_LOG_LEVEL="3", TF_ENABLE_ONEDNN_OPTS="0", PYTHONUNBUFFERED="1")
    env.pop("PROCSV_LOGDIR", None)
    env.pop("PROCSV_RUNTIME_DIR", None)
    cmd = [sys.executable, "-m", "procsv", "launch", TINY, "--logdir", logdir, "--quiet",
           "--keep-logs", str(args.keep_logs), "--chaos", f"every={args.chaos_every:g},target=trainer,signal=KILL",
           "--stop-grace-secs", "60", "--",
           "--steps", "1000000000", "--step-delay", str(args.step_delay), "--save-steps", str(args.save_steps),
           "--bad-attempts", "none"]
    t0 = time.monotonic()
    out_path = os.path.join(work, "launch.out")  # the launch's terminal output (a file: never a full pipe)
    with open(out_path, "wb") as out:
        launch = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO,
                                  start_new_session=True)
    life = Lifecycle(os.path.join(logdir, "logs", "lifecycle.jsonl"))
    tracked: dict[str, Tracked] = {}
    zombie_seen: dict[int, float] = {}  # pid -> first time seen as a zombie
    zombies: set[int] = set()
    logdir_samples: list[tuple[float, int, int]] = []  # (t, restarts, bytes)
    failures: list[str] = []
    next_sample = 0.0
    timed_out = False
    try:
        while launch.poll() is None:
            now = time.monotonic() - t0
            life.poll()
            if life.restarts >= args.restarts and life.commits >= args.commits:
                break
            if now > args.max_secs:
                timed_out = True
                break
            if now >= next_sample:
                next_sample = now + args.interval
                for role, pid in role_pids(logdir, launch.pid).items():
                    t = tracked.get(role)
                    if t is not None and t.pid != pid:
                        if pid not in t.replaced_by:
                            t.replaced_by.append(pid)
                        continue
                    try:
                        proc = psutil.Process(pid)
                        with proc.oneshot():
                            s = Sample(now, life.restarts, proc.num_fds(), proc.num_threads(),
                                       proc.memory_info().rss, count_maps(pid), fd_ids(pid), thread_ids(pid))
                            created = proc.create_time()
                    except (psutil.Error, OSError):
                        continue
                    if t is None:
                        t = tracked[role] = Tracked(role, pid, created)
                    t.samples.append(s)
                parents = [t.pid for t in tracked.values() if t.role in ("watchdog", "zygote")]
                zs = zombie_children(parents)
                for z in zs:
                    first = zombie_seen.setdefault(z, now)
                    if now - first >= ZOMBIE_SECS:
                        zombies.add(z)
                for z in list(zombie_seen):
                    if z not in zs:
                        del zombie_seen[z]
                logdir_samples.append((now, life.restarts, dir_size(logdir)[0]))
            time.sleep(0.05)
    finally:
        if launch.poll() is None:
            launch.send_signal(signal.SIGTERM)
        try:
            launch.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(launch.pid, signal.SIGKILL)
            launch.wait()
            failures.append("the launch did not stop within 120 s of SIGTERM (killed)")
    wall = time.monotonic() - t0
    life.poll()
    code = launch.returncode

    # ----------------------------------------------------------------- after the run
    time.sleep(0.5)  # the kernel finishes tearing down the last SIGKILLed group
    sampled = [t.pid for t in tracked.values()] + [pid for t in tracked.values() for pid in t.replaced_by]
    left_procs = run_processes(logdir, tmpdir, sampled)
    left_dirs = sorted(n for n in os.listdir(tmpdir) if n.startswith("procsv-"))
    zombies |= {c.pid for c in psutil.Process().children() if c.status() == psutil.STATUS_ZOMBIE}
    leftovers = len(left_procs) + len(left_dirs)

    if timed_out:
        failures.append(f"gave up after {args.max_secs:g} s with {life.restarts} restarts and {life.commits} commits")
    if code != EXIT_SIGTERM:
        with open(out_path, errors="replace") as fh:
            lines = fh.read().strip().splitlines()
        # why it ended (its give-up line comes before its closing report, which fills the tail)
        why = [ln for ln in lines[:-15] if ln.startswith("procsv: giving up")]
        tail = "\n".join(why + lines[-15:])
        failures.append(f"the launch exited {code}, expected {EXIT_SIGTERM} (stopped by SIGTERM)\n{tail}")
    if life.restarts < args.restarts:
        failures.append(f"only {life.restarts} restarts (asked for {args.restarts})")
    if life.commits < args.commits:
        failures.append(f"only {life.commits} commits (asked for {args.commits})")
    if life.other_failures:
        kinds = sorted({e["event"] for e in life.other_failures})
        failures.append(f"unexpected lifecycle events: {', '.join(kinds)} ({len(life.other_failures)} in all)")
    if zombies:
        failures.append(f"zombies (unreaped >= {ZOMBIE_SECS:g} s): {sorted(zombies)}")
    if left_procs:
        failures.append(f"processes left after the run: {left_procs}")
    if left_dirs:
        failures.append(f"runtime directories left after the run: {left_dirs} in {tmpdir}")

    # growth per process
    rows = []
    worst = {"fds": 0.0, "threads": 0.0, "rss_mb": 0.0, "maps": 0.0}
    for role in ROLES:
        t = tracked.get(role)
        if t is None:
            failures.append(f"the {role} process was never sampled")
            continue
        if t.replaced_by:
            failures.append(f"the {role} process (pid {t.pid}) was replaced during the run by {t.replaced_by}")
        cycs = cycles(t.samples, warmup)
        if len(cycs) < 2:
            failures.append(f"too few restart cycles sampled for the {role} process ({len(cycs)} after warm-up)")
            continue
        g = growth(cycs)
        after = [s for cyc in cycs for s in cyc]
        for k in worst:
            worst[k] = max(worst[k], g[k])
        a, z = after[0], t.samples[-1]
        rows.append((role, t.pid, len(t.samples), a, z, g))
        if g["fds"] > 0:
            failures.append(f"{role}: open file descriptors grew by {g['fds']:g}")
        if g["threads"] > 0:
            failures.append(f"{role}: threads grew by {g['threads']:g}")
        if g["maps"] > MAPS_SLACK:
            failures.append(f"{role}: memory mappings grew by {g['maps']:g} (at most {MAPS_SLACK} allowed)")
        if g["rss_mb"] >= RSS_GOAL_MB:
            failures.append(f"{role}: RSS grew by {g['rss_mb']:.1f} MB (goal < {RSS_GOAL_MB:g})")

    # logs
    logs = os.path.join(logdir, "logs")
    kept = kept_attempt_files(logs) if os.path.isdir(logs) else {}
    # the last trainer attempt spawned, or the standby spawned after it for the next one: a standby
    # logs as the attempt it will become (logs/trainer.<n>.log), and its spawn rotates the logs too
    k = max(life.trainer_attempt, life.standby_attempt)
    want = sorted({1} | set(range(max(1, k - args.keep_logs + 1), k + 1)))
    if k > 1 and k not in kept.get("trainer", []):
        want.remove(k)  # the last attempt was stopped before it opened its log (SIGTERM right after its spawn)
    if kept.get("trainer") != want:
        failures.append(f"trainer logs kept: attempts {kept.get('trainer')}, expected {want} "
                        f"(the first and the last {args.keep_logs})")
    for role, attempts in kept.items():
        if len(attempts) > args.keep_logs + 1:
            failures.append(f"{role}: {len(attempts)} per-attempt logs kept (at most {args.keep_logs + 1})")
    logs_bytes, logs_files = dir_size(logs)
    try:
        life_bytes = os.path.getsize(life.path)
    except OSError:
        life_bytes = 0
    events_bytes = sum(os.path.getsize(os.path.join(logdir, n)) for n in os.listdir(logdir)
                       if n.startswith("events.out.tfevents"))
    ckpt_bytes, ckpt_files = dir_size(os.path.join(logdir, ".procsv", "checkpoints"))
    total_bytes, total_files = dir_size(logdir)

    # the final checkpoint
    problem = verify_checkpoint(logdir, life.last_commit_step) if life.commits else "no checkpoint was committed"
    if problem:
        failures.append(f"final checkpoint: {problem}")

    # ----------------------------------------------------------------- report
    print(f"soak: {wall:.0f} s wall, {life.restarts} restarts ({life.chaos_kills} chaos kills), {life.commits} commits "
          f"(last at step {life.last_commit_step}), launch exit {code}; warm-up: samples before restart {warmup}")
    print(f"{'process':<11} {'pid':>7} {'n':>5} | {'fds first/last/growth':>22} | {'threads first/last/growth':>26} | "
          f"{'RSS MB first/last/growth':>25} | {'mappings first/last/growth':>26}")
    for role, pid, n, a, z, g in rows:
        print(f"{role:<11} {pid:>7} {n:>5} | {a.fds:>8} {z.fds:>6} {g['fds']:>+6g} | "
              f"{a.threads:>10} {z.threads:>7} {g['threads']:>+7g} | "
              f"{a.rss / 2**20:>9.1f} {z.rss / 2**20:>7.1f} {g['rss_mb']:>+7.1f} | "
              f"{a.maps:>10} {z.maps:>7} {g['maps']:>+7g}")
    if logdir_samples:
        after_ld = [s for s in logdir_samples if s[1] >= warmup] or logdir_samples
        print(f"{'logdir':<11} {'':>7} {len(logdir_samples):>5} | size MB first/last/growth: "
              f"{after_ld[0][2] / 2**20:.2f} / {logdir_samples[-1][2] / 2**20:.2f} / "
              f"{(logdir_samples[-1][2] - after_ld[0][2]) / 2**20:+.2f}")
    print(f"logdir at the end: {total_bytes / 2**20:.2f} MB in {total_files} files; logs/ {logs_bytes / 2**10:.0f} KiB "
          f"in {logs_files} files (per-attempt logs kept: "
          f"{', '.join(f'{r} {a}' for r, a in sorted(kept.items()))}); event files {events_bytes / 2**10:.0f} KiB; "
          f"checkpoint manifests {ckpt_files} ({ckpt_bytes / 2**10:.0f} KiB)")
    per_cycle = life_bytes / max(1, life.restarts + life.commits)
    print(f"lifecycle.jsonl: {life_bytes / 2**10:.0f} KiB ({per_cycle:.0f} bytes per restart or commit; not rotated)")
    if life.failed_saves:
        print(f"checkpoint_failed: {len(life.failed_saves)} (a trainer killed while its snapshot was being saved); "
              f"the first: {life.failed_saves[0]['error']}")
    print(f"zombies: {len(zombies)}; leftovers: {len(left_procs)} processes, {len(left_dirs)} runtime directories")
    with open(os.path.join(work, "samples.json"), "w") as fh:  # for a second look (kept with --workdir or a failure)
        json.dump({"warmup_restarts": warmup, "logdir": logdir_samples,
                   "processes": {t.role: {"pid": t.pid, "samples": [x.to_json() for x in t.samples]}
                                 for t in tracked.values()}}, fh)
    for f in failures:
        print(f"soak: FAILED: {f}", file=sys.stderr)
    if not failures and not args.workdir:
        shutil.rmtree(work, ignore_errors=True)
    elif failures:
        print(f"soak: the run's files are in {work}", file=sys.stderr)
    print(f"soak_fd_growth={worst['fds']:g} soak_thread_growth={worst['threads']:g} "
          f"soak_rss_growth_mb={worst['rss_mb']:.1f} zombies={len(zombies)} leftovers={leftovers} "
          f"restarts={life.restarts} commits={life.commits}", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
