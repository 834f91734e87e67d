"""Signals reach only the process meant (issue 39, points 3 and 5).

A pid read from a shared file, or kept after its process was reaped by someone else, may name
another process. Real processes in a fresh PID namespace (``unshare --pid --fork --mount-proc``,
``tests/programs/pidns.py``), where a bystander is placed exactly on such a pid: ``procsv stop``,
``status`` and ``preempt`` run from another host's (namespace's) view of a live run, a lock
outlived by the process it names, and a trainer forked and reaped by a real pre-warmed trainer.
Real ZeroMQ and TensorFlow behind them; root needed (skipped otherwise). The pre-warmed trainer's
request pipe and the closing of a lost one's pipes are tested here too, on real zygotes.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from typing import Any

import psutil
import pytest

from conftest import PROGRAMS, REPO, finish, launch, quiet_env, raw_status, ready_zygote, run_python, wait_for

pytestmark = pytest.mark.slow  # starts TensorFlow processes: not in the quick tier

TINY = os.path.join(PROGRAMS, "tiny_train.py")
PIDNS = os.path.join(PROGRAMS, "pidns.py")

needs_root = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                                reason="needs root and unshare for a PID namespace of its own")


def in_new_pid_namespace(*args: str, timeout: float = 180) -> dict[str, Any]:
    out = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, PIDNS, *args],
                         capture_output=True, text=True, env=quiet_env(), cwd=REPO, timeout=timeout)
    assert out.returncode == 0, out.stdout + out.stderr
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def one_error_line(res: dict[str, Any]) -> str:
    lines = [line for line in res["err"].splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("procsv: error:"), res
    return lines[0]


@needs_root
def test_status_stop_and_preempt_from_another_pid_namespace_see_the_live_run_and_signal_nothing(logdir):
    proc = launch(logdir, "--steps", "100000", "--step-delay", "0.005", target=TINY,
                  opts=("--standby", "fork"))  # no restart: no hot standby
    try:
        wait_for(lambda: (raw_status(logdir) or {}).get("step", 0) > 10, 120, what="training to start")
        st = raw_status(logdir) or {}
        pids = {p["role"]: p["pid"] for p in st["processes"]}
        trainer_start = psutil.Process(pids["trainer"]).create_time()
        # bystanders hold the watchdog's and the trainer's pids in the other namespace
        res = in_new_pid_namespace("other-host", logdir, str(pids["watchdog"]), str(pids["trainer"]))
        assert res["bystanders_alive"] == [True, True], res
        assert res["status_json"]["code"] == 0, res
        seen = json.loads(res["status_json"]["out"])
        assert seen["state"] == "running" and seen["here"] is False
        assert {p["role"]: p["alive"] for p in seen["processes"]}["watchdog"] is True
        assert {p["role"]: p["alive"] for p in seen["processes"]}["trainer"] is None  # not known from there
        assert ": running" in res["status"]["out"] and "watchdog on host" in res["status"]["out"]
        for command in ("preempt", "stop"):
            assert res[command]["code"] == 2, res
            line = one_error_line(res[command])
            assert f"run `procsv {command} {logdir}` on that host" in line and "led by the watchdog on host" in line
        # nothing happened to the run
        assert proc.poll() is None
        assert psutil.Process(pids["trainer"]).create_time() == trainer_start
        # and from its own namespace, procsv stop stops it in order
        out = run_python(["-m", "procsv", "stop", logdir], env=quiet_env(), timeout=200)
        assert out.returncode == 0 and "run stopped" in out.stdout, out.stderr
    finally:
        if proc.poll() is None and (raw_status(logdir) or {}).get("state") == "running":
            proc.send_signal(signal.SIGTERM)  # (a failed check above left it running)
        code, _, err = finish(proc)
    assert code == 128 + signal.SIGTERM, err


@needs_root
def test_stop_never_signals_a_reused_pid_when_the_lock_outlived_the_process_it_names(tmp_path):
    res = in_new_pid_namespace("fork-held-lock", str(tmp_path / "run"))
    assert res["bystander_alive"] is True, res
    assert res["stop"]["code"] == 2, res
    line = one_error_line(res["stop"])
    assert f"pid {res['taker']} is not the process that took it" in line and "nothing was signalled" in line


@needs_root
def test_a_trainer_the_pre_warmed_trainer_forked_and_reaped_is_never_signalled_by_its_reused_pid(tmp_path):
    res = in_new_pid_namespace("reused-forked-pid", str(tmp_path))
    assert res["code"] == 0, res  # its exit status, from the zygote
    assert (res["after_signal"], res["after_group"], res["after_reap"]) == (True, True, True), res
    assert res["pidfd_closed"] is True


@pytest.fixture
def zygote(tmp_path):
    """A real pre-warmed trainer, ready (TensorFlow imported); SIGKILLed and reaped at the end."""
    with ready_zygote(tmp_path) as made:
        yield made


def _pipe_inodes() -> set[int]:
    """The pipes this process has open (by inode)."""
    found = set()
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if target.startswith("pipe:["):
            found.add(int(target[6:-1]))
    return found


def test_a_fork_asked_of_a_stopped_zygote_with_a_full_pipe_never_blocks_and_is_given_up_when_due(zygote, tmp_path):
    from procsv.common import spawn
    from procsv.watchdog.prewarm import FORK_REPLY_TIMEOUT

    z, lay, runtime = zygote
    env = spawn.child_env(role="trainer", attempt=1, logdir=lay.logdir, runtime_dir=runtime, supervised=True)
    env["BIG"] = "x" * 100_000  # two requests are more than the pipe holds (64 KiB)
    os.kill(z.pid, signal.SIGSTOP)
    returned: list[float] = []

    def ask() -> None:
        for attempt in (1, 2, 3):
            returned.append(z.request_fork(attempt, "t.py", [], env, str(tmp_path / "t.log"), str(tmp_path)))

    asker = threading.Thread(target=ask, daemon=True)
    asker.start()
    asker.join(5.0)
    try:
        assert not asker.is_alive(), "request_fork blocked on the stopped zygote's full pipe"
        assert len(returned) == 3 and z.unsent > 0  # what the pipe did not take waits
        assert z.answer(1) is None  # no answer yet, and asking again does not block either
        assert all(due > 0 for due in returned) and FORK_REPLY_TIMEOUT > 0
    finally:
        os.kill(z.pid, signal.SIGCONT)


def test_a_lost_zygotes_pipes_are_closed_when_it_dies_and_when_it_is_killed(zygote, tmp_path):
    from procsv.watchdog.prewarm import Zygote, zygote_env

    z, lay, runtime = zygote
    mine = {os.fstat(fd).st_ino for fd in (z.fd, z._req_w)}
    assert mine <= _pipe_inodes()
    os.kill(z.pid, signal.SIGKILL)  # it dies (a crash): its pipe reads as closed

    def lost() -> bool:
        z.pump()
        return not z.alive()

    wait_for(lost, 30, what="the zygote to be found dead")
    assert not mine & _pipe_inodes() and z.closed
    # one given up on by the watchdog (killed: it did not answer in time)
    other = Zygote(zygote_env(lay.logdir, runtime), str(tmp_path / "zygote2.log"), str(tmp_path))
    try:
        theirs = {os.fstat(fd).st_ino for fd in (other.fd, other._req_w)}
        other.kill()
        assert not theirs & _pipe_inodes() and other.closed
    finally:
        assert other.close(10)
