"""``procsv status DIR --watch``: redraws on status changes (filesystem events) and ends with the run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from conftest import PROGRAMS, REPO, finish, launch, quiet_env, raw_status, wait_for

pytestmark = pytest.mark.slow
TINY = os.path.join(PROGRAMS, "tiny_train.py")


def test_watch_redraws_while_the_run_goes_on_and_ends_with_it(logdir):
    proc = launch(logdir, "--steps", "400", "--step-delay", "0.01", target=TINY,
                  opts=("--standby", "fork"))  # no restart: no hot standby
    watcher = None
    try:
        wait_for(lambda: (raw_status(logdir) or {}).get("state") == "running", 90, what="the run to start")
        watcher = subprocess.Popen([sys.executable, "-m", "procsv", "status", logdir, "--watch"],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=quiet_env(),
                                   cwd=REPO)
        code, _, err = finish(proc)
        assert code == 0, err
        out, werr = watcher.communicate(timeout=30)  # it ends by itself once the run is over
    finally:
        if watcher is not None and watcher.poll() is None:
            watcher.send_signal(signal.SIGKILL)
            watcher.wait()
    assert watcher.returncode == 0, werr
    views = [v for v in out.split("\n\n") if v.strip()]
    assert len(views) >= 3  # the step advanced between redraws
    assert views[0].startswith(f"procsv run in {logdir}: running")
    assert views[-1].startswith(f"procsv run in {logdir}: succeeded")
    steps = [int(v.split("step ")[1].split(",")[0]) for v in views]
    assert steps == sorted(steps) and steps[-1] == 400


def test_watch_reports_a_run_whose_watchdog_was_killed_and_stops(logdir):
    proc = launch(logdir, "--steps", "100000", "--step-delay", "0.01", target=TINY, opts=("--standby", "fork"))
    wait_for(lambda: (raw_status(logdir) or {}).get("step", 0) > 5, 90, what="training to start")
    watcher = subprocess.Popen([sys.executable, "-m", "procsv", "status", logdir, "--watch"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=quiet_env(), cwd=REPO)
    try:
        os.kill(proc.pid, signal.SIGKILL)  # nothing on disk changes now: the liveness re-read must notice
        proc.wait(timeout=30)
        out, werr = watcher.communicate(timeout=30)
    finally:
        if watcher.poll() is None:
            watcher.send_signal(signal.SIGKILL)
            watcher.wait()
    assert watcher.returncode == 0, werr
    views = [v for v in out.split("\n\n") if v.strip()]
    assert views[-1].startswith(f"procsv run in {logdir}: failed")
    assert "the watchdog process died" in views[-1]
