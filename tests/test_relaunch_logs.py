"""A relaunch of a logdir echoes only its own output: each launch's per-attempt logs are its own.

Attempt numbers start at 1 at every launch. The newest launch's logs are ``logs/<role>.<n>.log``;
the watchdog moves an earlier launch's into ``logs/launch-<k>/`` when the next one begins, and
``procsv logs --launch K`` shows them.
"""

from __future__ import annotations

import os

import pytest

from conftest import PROGRAMS, REPO, finish, launch, lifecycle, quiet_env, run_python
from pyfork import ForkedRun

TINY = os.path.join(PROGRAMS, "tiny_train.py")


def _logs(logdir: str, *flags: str) -> ForkedRun:
    return run_python(["-m", "procsv", "logs", logdir, *flags], env=quiet_env(), cwd=REPO, timeout=60)


@pytest.mark.slow
def test_a_relaunch_echoes_and_logs_only_its_own_output(logdir):
    code, out1, err1 = finish(launch(logdir, "--steps", "100000", "--step-delay", "0.01", "--raise-at-step", "5",
                                     "--bad-attempts", "all", target=TINY,
                                     opts=("--max-restarts", "0", "--standby", "fork")), 120)
    assert code == 1, err1
    assert "bad batch at step 5" in out1 + err1  # the first launch's trainer failed with its traceback

    code, out2, err2 = finish(launch(logdir, "--steps", "20", "--step-delay", "0.01", target=TINY,
                                     opts=("--standby", "fork")), 120)
    assert code == 0, err2
    second = out2 + err2
    assert "tiny: done at step 20" in second
    assert "bad batch" not in second, second  # not the first launch's traceback as this launch's trainer's
    assert second.count("tiny: attempt 1 starts at step") == 1, second

    logs = os.path.join(logdir, "logs")
    with open(os.path.join(logs, "trainer.1.log")) as fh:
        newest = fh.read()
    assert "bad batch" not in newest and newest.count("tiny: attempt 1 starts") == 1  # not appended to
    with open(os.path.join(logs, "launch-1", "trainer.1.log")) as fh:
        assert "bad batch at step 5" in fh.read()
    assert not os.path.exists(os.path.join(logs, "trainer.1.error.json"))  # the first launch's went with it
    assert os.path.exists(os.path.join(logs, "launch-1", "trainer.1.error.json"))
    assert [e["launch"] for e in lifecycle(logdir) if e["event"] == "launch"] == [1, 2]

    shown = _logs(logdir)  # the newest launch by default
    assert shown.returncode == 0, shown.stderr
    assert "tiny: done at step 20" in shown.stdout and "bad batch" not in shown.stdout
    earlier = _logs(logdir, "--launch", "1")
    assert earlier.returncode == 0, earlier.stderr
    assert "bad batch at step 5" in earlier.stdout and "tiny: done" not in earlier.stdout
    assert os.path.join(logs, "launch-1", "trainer.1.log") in earlier.stdout  # the separator names the file
    assert _logs(logdir, "--launch", "2").stdout == shown.stdout
    listed = _logs(logdir, "--launch", "list").stdout
    assert f"launch 1: {os.path.join(logs, 'launch-1')}" in listed and f"launch 2: {logs} (the newest)" in listed
    missing = _logs(logdir, "--launch", "7")
    assert missing.returncode == 2 and "no logs of launch 7" in missing.stderr
    follow_old = _logs(logdir, "--launch", "1", "-f")
    assert follow_old.returncode == 2 and "follows the newest launch only" in follow_old.stderr


def test_archive_plan_numbers_launches_and_keeps_the_last_ones():
    from procsv.watchdog.logrotate import archive_plan

    assert archive_plan([], 10) == (1, [], [])
    assert archive_plan(["lifecycle.jsonl", "report.json"], 10) == (1, [], [])
    files = ["trainer.1.log", "trainer.1.error.json", "worker1.2.log", "zygote-node1.1.log", "watchdog.1.error.json"]
    assert archive_plan(["lifecycle.jsonl", *files], 10) == (2, sorted(files), [])
    assert archive_plan(["launch-1", "launch-2", "trainer.1.log"], 10) == (4, ["trainer.1.log"], [])
    assert archive_plan(["launch-1", "launch-2", "launch-3", "trainer.1.log"], 2) == (5, ["trainer.1.log"], [1, 2])
    assert archive_plan(["launch-4", "launch-9"], 1) == (10, [], [4])  # a launch that wrote no log gets no folder
