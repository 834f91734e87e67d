"""A child that SIGKILL cannot end (uninterruptible sleep) does not keep ``procsv launch`` alive.

The real fault: a process frozen by the cgroup-v1 freezer is in state D and does not die of
SIGKILL until it is thawed, as a process stuck in I/O that never returns (a hung NFS server, a
dead disk). The launch must end anyway, with the outcome it had, after one line naming it, and
run ``--on-failure``.
"""

from __future__ import annotations

import os
import signal
import uuid
from typing import Iterator

import pytest

from conftest import PROGRAMS, finish, launch, wait_for, wait_role_pid

pytestmark = pytest.mark.slow  # starts TensorFlow processes: not in the quick tier

FREEZER = "/sys/fs/cgroup/freezer"


def _write(path: str, text: str) -> None:
    with open(path, "w") as fh:
        fh.write(text)


@pytest.fixture
def frozen_cgroup() -> Iterator[str]:
    """A fresh freezer cgroup; at teardown whatever is in it is SIGKILLed and thawed (so it dies)."""
    if not os.access(FREEZER, os.W_OK):
        pytest.skip("no writable cgroup-v1 freezer here")
    path = os.path.join(FREEZER, f"procsv-test-{uuid.uuid4().hex[:8]}")
    os.mkdir(path)
    try:
        yield path
    finally:
        with open(os.path.join(path, "cgroup.procs")) as fh:
            pids = [int(p) for p in fh.read().split()]
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        _write(os.path.join(path, "freezer.state"), "THAWED")

        def empty() -> bool:
            with open(os.path.join(path, "cgroup.procs")) as fh:
                return not fh.read().strip()

        wait_for(empty, 10, what="the frozen processes to die once thawed")
        os.rmdir(path)


def _freeze(cgroup: str, pid: int) -> None:
    _write(os.path.join(cgroup, "cgroup.procs"), str(pid))
    _write(os.path.join(cgroup, "freezer.state"), "FROZEN")
    wait_for(lambda: open(os.path.join(cgroup, "freezer.state")).read().strip() == "FROZEN", 10,
             what="the cgroup to freeze")


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().rsplit(")", 1)[1].split()[0]


def test_an_unkillable_service_does_not_keep_a_failed_launch_alive(logdir, tmp_path, frozen_cgroup):
    calls = tmp_path / "calls.txt"
    proc = launch(logdir, "--steps", "1000000", "--step-delay", "0.01", target=os.path.join(PROGRAMS, "tiny_train.py"),
                  opts=("--max-restarts", "0", "--stop-grace-secs", "2", "--standby", "fork",
                        "--on-failure", f"echo called >> {calls}"))
    try:
        summary = wait_role_pid(logdir, "summary", 60)
        trainer = wait_role_pid(logdir, "trainer", 60)
        _freeze(frozen_cgroup, summary)
        # one thread of the trainer's, not its main thread, stuck too (cgroup v1 moves a single thread): the
        # SIGKILL ends the main thread, whose death notice comes at once, while the process stays (a zombie
        # leader and a thread in D) as one whose data loader thread waits on a hung NFS server
        _write(os.path.join(frozen_cgroup, "tasks"), str(next(t for t in os.listdir(f"/proc/{trainer}/task")
                                                              if int(t) != trainer)))
        os.kill(trainer, signal.SIGKILL)  # no restarts left: the run fails and stops its services
        code, _, err = finish(proc, 60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert _state(summary) == "D"  # still there, frozen: the launch ended without it
    assert code == 1, err
    assert f"procsv: could not reap summary (pid {summary}, state D) within 5 s" in err
    # before, the launch waited for the trainer for good: its death noticed, it was the watchdog's kill no more
    assert f"procsv: could not reap trainer (pid {trainer}, state " in err, err
    assert calls.read_text() == "called\n"  # --on-failure ran once
    assert "left behind" not in err  # the final sweep leaves the given-up child alone


def test_an_unkillable_trainer_does_not_keep_a_stopped_launch_alive(logdir, frozen_cgroup):
    # a fresh trainer (--no-prewarm): frozen while it starts, before its first step, so that the stop loses no
    # step and its outcome is a stop's (128+15); a forked one is past step 30 by then, and the stop (its last
    # step not committed) rightly exits 1
    proc = launch(logdir, "--steps", "1000000", "--step-delay", "0.01", target=os.path.join(PROGRAMS, "tiny_train.py"),
                  opts=("--stop-grace-secs", "2", "--no-prewarm", "--standby", "off"))
    try:
        trainer = wait_role_pid(logdir, "trainer", 60)
        _freeze(frozen_cgroup, trainer)
        os.kill(proc.pid, signal.SIGTERM)  # the trainer cannot save: it is frozen, then SIGKILLed in vain
        code, _, err = finish(proc, 60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert f"procsv: could not reap trainer (pid {trainer}, state D) within 5 s" in err, err
    assert code == 128 + signal.SIGTERM, err  # the outcome a stop by SIGTERM has
