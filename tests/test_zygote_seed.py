"""``procsv launch --fork-prewarm`` from an interpreter that has imported TensorFlow grows its first
zygote from a fork of itself.

The launch forks a zygote seed before its watchdog starts any thread (``procsv.zygote.seed``) when
TensorFlow is imported in its interpreter and has run nothing: the seed becomes the first zygote
without importing TensorFlow again. Every launch the suite makes with ``conftest.launch`` is such a launch (a fork of the
worker's fork server); these tests show that its zygote is that fork, that what it forks trains and
restarts as a fresh zygote's forks do, and that a launch without TensorFlow imported, or from an
interpreter that ran a TensorFlow op (its thread pools started: a fork would deadlock), or one that ends
before its zygote, starts it fresh and leaves nothing behind (a zygote environment TensorFlow was not
imported with: ``test_prewarmed_pure``). Real launches, a real SIGKILL.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from typing import Optional

import psutil
import pytest

from conftest import (PROGRAMS, REPO, finish, launch, lifecycle, quiet_env, raw_status, run_processes, run_python,
                      wait_for, wait_role_pid)
from pyfork import ForkedPopen

pytestmark = pytest.mark.slow  # starts TensorFlow processes: not in the quick tier

TINY = os.path.join(PROGRAMS, "tiny_train.py")


def _spawned(logdir: str) -> list[tuple[str, int, str]]:
    return [(e["role"], e["attempt"], e["via"]) for e in lifecycle(logdir) if e["event"] == "spawned"]


def _service(logdir: str, attempt: int) -> int:
    """The pid of the checkpoint service's ``attempt``, once it is up (its stats file names it: written after
    it lowered its priority, just before its Hello)."""
    def up() -> Optional[int]:
        pid = next((e["pid"] for e in lifecycle(logdir) if e["event"] == "spawned" and e["role"] == "checkpoint"
                    and e["attempt"] == attempt), None)
        try:
            with open(os.path.join(logdir, ".procsv", "checkpoint_stats.json")) as fh:
                return pid if pid is not None and json.load(fh).get("pid") == pid else None
        except (OSError, ValueError):
            return None

    pid: int = wait_for(up, 90, what=f"the checkpoint service's attempt {attempt} to be up")
    return pid


def _as_started(pid: int, launch_pid: int) -> dict[str, object]:
    """What a service's start gave it: its parent, session, stdio, signal dispositions (its handlers: of the
    signals it does not block) and mask, nice level,
    working directory, and whether it holds the launch's own stdout or stderr (the harness's pipes)."""
    with open(f"/proc/{pid}/status") as fh:
        status = dict(line.split(":", 1) for line in fh.read().splitlines() if ":" in line)
    fds = {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
    process = psutil.Process(pid)
    # the handlers of signals it does not block: a blocked one's never runs (a service reads its stop signals,
    # blocked from its start, with a signalfd: procsv.common.stopfrom). Seen once in a full run: a seeded
    # service with a handler of SIGTERM, blocked, where its fresh replacement had none (where from: not found)
    caught = f"{int(status['SigCgt'], 16) & ~int(status['SigBlk'], 16):016x}"
    return {"ppid": process.ppid() == launch_pid, "session": os.getsid(pid) == pid,
            "stdin": os.readlink(f"/proc/{pid}/fd/0"), "log": os.readlink(f"/proc/{pid}/fd/1").rsplit(".", 2)[0],
            "stderr=stdout": os.readlink(f"/proc/{pid}/fd/2") == os.readlink(f"/proc/{pid}/fd/1"),
            **{name: status[name].strip() for name in ("SigIgn", "SigBlk")}, "SigCgt (unblocked)": caught,
            "nice": process.nice(),
            "cwd": process.cwd(), "launch's stdio": bool(fds & {os.readlink(f"/proc/{launch_pid}/fd/{fd}")
                                                             for fd in (1, 2)})}


def test_a_warm_launch_grows_its_zygote_from_a_fork_whose_trainers_train_and_restart(logdir):
    """... and its first services from forks too (``services/seed.py``), each started as a fresh one is:
    the checkpoint service's seeded attempt, SIGKILLed, is replaced by a fresh one that matches it."""
    proc = launch(logdir, "--steps", "400", "--step-delay", "0.01", target=TINY)
    assert isinstance(proc, ForkedPopen), "the premise: this launch is a fork of the fork server (TensorFlow imported)"
    seeded = _as_started(_service(logdir, 1), proc.pid)
    assert seeded["log"] == os.path.join(logdir, "logs", "checkpoint") and not seeded["launch's stdio"], seeded
    os.kill(_service(logdir, 1), signal.SIGKILL)
    assert _as_started(_service(logdir, 2), proc.pid) == seeded  # the fresh replacement, started alike
    trainer = wait_role_pid(logdir, "trainer", 90)
    zygote = next(e["pid"] for e in lifecycle(logdir) if e["event"] == "spawned" and e["role"] == "zygote")
    seen = psutil.Process(zygote)
    assert seen.ppid() == proc.pid  # the watchdog's own child, as a spawned zygote is
    assert os.readlink(f"/proc/{zygote}/fd/1") == os.path.join(logdir, "logs", "zygote.1.log")
    assert os.getsid(zygote) == zygote  # a session of its own, as a spawned child's
    assert psutil.Process(trainer).ppid() == proc.pid  # its fork re-parented to the watchdog
    wait_for(lambda: (raw_status(logdir) or {}).get("step", 0) > 0, 90, what="the trainer's first steps")
    os.kill(trainer, signal.SIGKILL)
    code, out, err = finish(proc, 240)
    assert code == 0, err
    spawned = _spawned(logdir)
    assert ("zygote", 1, "fork") in spawned, spawned
    assert {s for s in spawned if s[0] in ("checkpoint", "summary")} == \
        {("checkpoint", 1, "fork"), ("summary", 1, "fork"), ("checkpoint", 2, "fresh")}, spawned
    assert ("trainer", 1, "zygote") in spawned and any(r == "trainer" and a > 1 and v in ("zygote", "standby")
                                                        for r, a, v in spawned), spawned
    assert not [s for s in spawned if s[0] == "zygote" and s[2] == "fresh"], spawned  # no zygote lost
    assert run_processes(logdir) == []


_WARM = """
import json, os, sys
import psutil, tensorflow as tf
from procsv.cli import main
from procsv.zygote.seed import tensorflow_ran, unfit

logdir, tiny, ops = sys.argv[1], sys.argv[2], sys.argv[3]
unfit_at, ran = [unfit()], [tensorflow_ran()]
codes = [main(["launch", os.path.join(logdir, "no_such_program.py"), "--logdir", os.path.join(logdir, "a"),
               "--fork-prewarm"])]
graph = tf.Graph()
with graph.as_default(), tf.compat.v1.Session() as session:  # a graph's session: its tf_ threads
    session.run(tf.constant(2.0) * 3)
unfit_at.append(unfit())
ran.append(tensorflow_ran())
tf.data.Dataset.range(4).map(lambda x: x + 1, num_parallel_calls=2).reduce(tf.constant(0, tf.int64), lambda a, b: a + b)
unfit_at.append(unfit())
ran.append(tensorflow_ran())
# forked from here, its trainers' first op would wait forever (a parallel map and a matmul each step)
codes.append(main(["launch", ops, "--logdir", os.path.join(logdir, "b"), "--fork-prewarm", "--startup-timeout", "30",
                   "--max-restarts", "0", "--", "5"]))
print(json.dumps({"codes": codes, "unfit": unfit_at, "ran": ran, "children": [p.pid for p in psutil.Process().children()]}))
"""


def test_a_launch_without_tensorflow_or_after_its_runtime_ran_or_ended_early_starts_its_zygote_fresh(logdir):
    """A fresh ``procsv launch`` spawns its zygote (its services grow from seeds: no TensorFlow needed); from
    Python with ``--fork-prewarm``, a launch refused after its seeds were planted leaves none, and one from a
    program that ran TensorFlow (a Session, a dataset: its thread pools) says why in one line and spawns
    it and its services (forked, a trainer hangs at its first op)."""
    fresh = subprocess.run([sys.executable, "-m", "procsv", "launch", TINY, "--logdir", os.path.join(logdir, "c"),
                            "--fork-prewarm", "--", "--steps", "5"], capture_output=True, text=True, env=quiet_env(),
                           cwd=REPO, timeout=240)
    assert fresh.returncode == 0, fresh.stderr
    assert ("zygote", 1, "fresh") in _spawned(os.path.join(logdir, "c"))
    # its services grow from seeds all the same (a fork of the CLI's interpreter is sound)
    assert {("checkpoint", 1, "fork"), ("summary", 1, "fork")} <= set(_spawned(os.path.join(logdir, "c")))
    assert "--fork-prewarm: TensorFlow is not imported in this process" in fresh.stderr
    warm = run_python(["-c", _WARM, logdir, TINY, os.path.join(PROGRAMS, "parallel_ops.py")], env=quiet_env(),
                      cwd=REPO, timeout=240)
    assert warm.returncode == 0, warm.stderr
    said = json.loads(warm.stdout.strip().splitlines()[-1])
    assert said["unfit"][0] is None and None not in said["unfit"][1:], said  # (the runtime's threads, or its pools)
    assert said["ran"] == [False, True, True], said
    assert said["codes"][0] == 2 and "no_such_program.py" in warm.stderr  # refused: the seed planted, then discarded
    assert said["codes"][1] == 0, warm.stderr
    assert "procsv: --fork-prewarm: " in warm.stderr and "starts as a fresh process" in warm.stderr
    assert said["children"] == []  # every seed reaped (the zygote's, the services'): none left running or a zombie
    assert ("zygote", 1, "fresh") in _spawned(os.path.join(logdir, "b"))
    assert {("checkpoint", 1, "fresh"), ("summary", 1, "fresh")} <= set(_spawned(os.path.join(logdir, "b")))
    for run in ("b", "c"):
        assert run_processes(os.path.join(logdir, run)) == []


_LOGGING = """
import logging, sys
import tensorflow
from procsv.cli import main

logging.basicConfig(filename=sys.argv[3])  # this program's log: a FileHandler, its descriptor inherited
sys.exit(main(["launch", sys.argv[2], "--logdir", sys.argv[1], "--fork-prewarm"]))
"""


def test_a_seeds_trainer_never_writes_its_launchers_descriptors_reused(logdir, tmp_path):
    """The seed lets go of the descriptors its launching program held, but that program's Python
    objects (a logging FileHandler) live on in the zygote and its trainers: a number closed and reused
    (the trainer's ZeroMQ eventfd, a checkpoint file) was written into by the handler. Each is kept
    by /dev/null."""
    user_log = str(tmp_path / "user.log")
    run = run_python(["-c", _LOGGING, logdir, os.path.join(PROGRAMS, "logs_to_root.py"), user_log],
                     env=quiet_env(), cwd=REPO, timeout=240)
    assert run.returncode == 0, run.stderr
    assert ("zygote", 1, "fork") in _spawned(logdir)
    with open(os.path.join(logdir, "logs", "trainer.1.log")) as fh:
        said = fh.read()
    targets = [line.split(" writes to ", 1)[1] for line in said.splitlines() if " writes to " in line]
    assert targets and all(t in ("/dev/null", user_log) or t.startswith(logdir) for t in targets), said
    assert "Logging error" not in said, said
    assert run_processes(logdir) == []
