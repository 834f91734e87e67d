"""``procsv logs``: a process's log across attempts, printed and followed, from real runs."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import REPO, finish, launch, launch_and_kill_trainer_once, quiet_env, run_python, wait_for
from pyfork import ForkedRun


def _logs(logdir: str, *flags: str) -> ForkedRun:
    return run_python(["-m", "procsv", "logs", logdir, *flags], env=quiet_env(), cwd=REPO, timeout=60)


@pytest.mark.slow
def test_logs_print_every_attempt_with_a_separator_and_select_one(logdir):
    code, out, err = launch_and_kill_trainer_once(logdir, "--steps", "400", "--save-model-secs", "0.2",
                                                  "--step-delay", "0.005", target="procsv.examples.digits")
    assert code == 0, err
    done = _logs(logdir)
    assert done.returncode == 0, done.stderr
    text = done.stdout
    first = f"==> trainer attempt 1 ({os.path.join(logdir, 'logs', 'trainer.1.log')}) <=="
    second = f"==> trainer attempt 2 ({os.path.join(logdir, 'logs', 'trainer.2.log')}) <=="
    assert first in text and second in text and text.index(first) < text.index(second)
    with open(os.path.join(logdir, "logs", "trainer.2.log")) as fh:
        assert fh.read() in text  # the attempt's own text, as written
    assert "finished 400 steps" in text.split(second)[1]
    only = _logs(logdir, "--attempt", "2").stdout
    assert second in only and first not in only
    assert _logs(logdir, "--attempt", "last").stdout == only
    events = _logs(logdir, "--role", "watchdog").stdout
    assert " exited role=trainer attempt=1 " in events and "signal=SIGKILL" in events and " finished " in events
    missing = _logs(logdir, "--attempt", "7")
    assert missing.returncode == 2 and "no log of trainer attempt 7 (kept: 1, 2" in missing.stderr


@pytest.mark.slow
def test_logs_follow_prints_a_live_run_as_it_goes_and_ends_with_it(logdir):
    proc = launch(logdir, "--steps", "600", "--step-delay", "0.01", "--print-every-steps", "100",
                  opts=("--standby", "fork"))  # no restart: no hot standby
    follower = None
    try:
        try:
            wait_for(lambda: os.path.exists(os.path.join(logdir, "logs", "trainer.1.log")), 90,
                     what="the trainer's log")
            follower = subprocess.Popen([sys.executable, "-m", "procsv", "logs", logdir, "-f"], stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, text=True, env=quiet_env(), cwd=REPO)
            first_line = follower.stdout.readline()
            assert first_line.startswith("==> trainer attempt 1 ")
        finally:
            code, out, err = finish(proc)
        assert code == 0, err
        rest, ferr = follower.communicate(timeout=30)  # it ends by itself once the run is over
        assert follower.returncode == 0, ferr
    finally:  # an assertion above failed: the follower must not outlive the test
        if follower is not None and follower.poll() is None:
            follower.kill()
            follower.communicate()
    assert "digits: step 600 " in rest and "finished 600 steps" in rest
    with open(os.path.join(logdir, "logs", "trainer.1.log")) as fh:
        assert first_line + rest == first_line + fh.read()  # all of it, once, in order


def test_a_standby_that_was_never_promoted_is_left_out_unless_asked_for_by_number(tmp_path):
    import json

    from procsv.common.layout import Layout
    from procsv.logs import show

    layout = Layout(str(tmp_path / "run"))
    os.makedirs(layout.logs)
    for n in (1, 2, 3):
        with open(os.path.join(layout.logs, f"trainer.{n}.log"), "w") as fh:
            fh.write(f"attempt {n}\n")
    events = [{"event": "spawned", "role": "trainer", "attempt": 1, "via": "zygote"},
              {"event": "spawned", "role": "standby", "attempt": 2, "via": "zygote"},
              {"event": "spawned", "role": "trainer", "attempt": 2, "via": "standby"},  # promoted
              {"event": "spawned", "role": "standby", "attempt": 3, "via": "zygote"}]  # still waiting
    with open(layout.lifecycle, "w") as fh:
        fh.writelines(json.dumps(e) + "\n" for e in events)

    def printed(attempt: str) -> str:
        import io

        out = io.StringIO()
        assert show(layout, "trainer", attempt, out) == 0
        return out.getvalue()

    assert "attempt 1\n" in printed("all") and "attempt 2\n" in printed("all") and "attempt 3\n" not in printed("all")
    assert printed("last").startswith("==> trainer attempt 2 (")
    assert printed("3").startswith("==> trainer attempt 3 (a standby, never promoted) (")
