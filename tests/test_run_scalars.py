"""procsv's own TensorBoard scalars (the run ``procsv``): a real run with a SIGKILL read back through a
real TensorBoard server's HTTP API, the summary service's writer read with EventAccumulator, and
the pure rule of which points are due."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from conftest import PROGRAMS, committed_steps, finish, launch, quiet_env, wait_for, wait_role_pid
from procsv.ipc.messages import RunScalars
from procsv.services.summary.procsvrun import DROPPED_TAG, BadRunScalars, ProcsvRun
from procsv.watchdog.rules.lifecycle import RunState
from procsv.watchdog.publish.runscalars import SCALARS_EVERY, Sent, due
from procsv.watchdog.rules.failures import Failure
from procsv.watchdog.rules.state import ChildView, RunView

TINY = os.path.join(PROGRAMS, "tiny_train.py")
TENSORBOARD = os.path.join(os.path.dirname(sys.executable), "tensorboard")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def get(port: int, path: str, **query: str) -> Any:
    url = f"http://127.0.0.1:{port}{path}" + (f"?{urllib.parse.urlencode(query)}" if query else "")
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return json.loads(resp.read())
    except (urllib.error.URLError, ConnectionError, TimeoutError, json.JSONDecodeError):
        return None


@pytest.mark.slow
def test_restarts_recoveries_goodput_and_commits_show_in_a_real_tensorboard(logdir):
    proc = launch(logdir, "--steps", "1200", "--step-delay", "0.01", "--save-steps", "100", target=TINY,
                  opts=("--quiet",))
    try:
        wait_for(lambda: [s for s in committed_steps(logdir) if s >= 200], 120, what="a commit past step 200")
        os.kill(wait_role_pid(logdir, "trainer"), signal.SIGKILL)
    finally:
        code, _, err = finish(proc)
    assert code == 0, err
    assert os.listdir(os.path.join(logdir, "procsv"))  # the run's own folder, beside the user's event files

    port = free_port()
    tb = subprocess.Popen([TENSORBOARD, "--logdir", logdir, "--port", str(port), "--host", "127.0.0.1",
                           "--reload_interval", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          env=quiet_env(), start_new_session=True)
    try:
        runs = wait_for(lambda: (r := get(port, "/data/runs")) and "procsv" in r and r, 120,
                        what="TensorBoard to list the run procsv")
        assert "." in runs  # the user's run, beside it
        want = {"procsv/restarts", "procsv/recovery_secs", "procsv/steps_redone", "procsv/goodput",
                "procsv/checkpoint_commit_secs", "procsv/checkpoint_age_secs", "procsv/summaries_dropped"}
        tags = wait_for(lambda: (t := get(port, "/data/plugin/scalars/tags")) and want <= set(t.get("procsv", {}))
                        and t, 60, what="procsv's scalar tags")
        assert "loss" not in tags["procsv"]  # the user's scalars stay in the user's run

        def series(tag: str) -> list[tuple[int, float]]:
            points = get(port, "/data/plugin/scalars/scalars", run="procsv", tag=tag)
            return [(int(step), float(v)) for _, step, v in points]

        restarts = series("procsv/restarts")
        assert max(v for _, v in restarts) >= 1.0 and restarts[-1][1] == 1.0
        (recovery,) = series("procsv/recovery_secs")
        assert recovery[1] > 0 and 0 < recovery[0] <= 1200  # at the first step of attempt 2
        (redone,) = series("procsv/steps_redone")
        assert redone[0] == recovery[0] and redone[1] >= 0
        goodput = series("procsv/goodput")
        assert len(goodput) >= 2 and all(0 < v <= 1 for _, v in goodput[1:])  # the first may be at step 1: 0
        assert goodput[-1][0] == 1200 and 0 < goodput[-1][1] <= 1  # the final point, at the last step
        commits = series("procsv/checkpoint_commit_secs")
        assert {s for s, _ in commits} >= {100, 200} and all(v > 0 for _, v in commits)
        assert all(v >= 0 for _, v in series("procsv/checkpoint_age_secs"))
        assert all(v == 0 for _, v in series("procsv/summaries_dropped"))
    finally:
        tb.kill()
        tb.wait(timeout=30)


# ----------------------------------------------------------------------------- the summary service's writer

def test_the_service_writes_one_event_per_point_into_the_run_procsv(tmp_path):
    run = ProcsvRun(str(tmp_path), "procsv-test")
    assert not (tmp_path / "procsv").exists()  # created at the first point only
    run.write(RunScalars(301, 1_700_000_000.0, ["procsv/restarts", "procsv/recovery_secs"], [1.0, 0.42]), 0)
    run.write(RunScalars(400, 1_700_000_010.0, ["procsv/goodput", DROPPED_TAG], [0.75, 99.0]), 3)
    with pytest.raises(BadRunScalars):
        run.write(RunScalars(500, 0.0, ["procsv/goodput"], []), 0)
    with pytest.raises(BadRunScalars):
        run.write(RunScalars(500, 0.0, ["procsv/goodput"], [float("inf")]), 0)
    with pytest.raises(BadRunScalars):
        run.write(RunScalars(-1, 0.0, [], []), 0)
    run.close()
    acc = EventAccumulator(str(tmp_path / "procsv"))
    acc.Reload()
    assert set(acc.Tags()["scalars"]) == {"procsv/restarts", "procsv/recovery_secs", "procsv/goodput", DROPPED_TAG}
    assert [(e.step, e.value) for e in acc.Scalars("procsv/restarts")] == [(301, 1.0)]
    assert [(e.step, round(e.value, 3)) for e in acc.Scalars("procsv/recovery_secs")] == [(301, 0.42)]
    # the service's own count, never the sender's
    assert [(e.step, e.value) for e in acc.Scalars(DROPPED_TAG)] == [(301, 0.0), (400, 3.0)]
    assert run.written == 2


# ----------------------------------------------------------------------------- which points are due

def _attempt(n: int, **kw: Any) -> ChildView:
    c = ChildView("trainer", "trainer", n, 100 + n, started=10.0 * n)
    for k, v in kw.items():  # (exit_code: a failure with that code, unless one is given)
        if k == "exit_code":
            k, v = "failure", kw.get("failure") or Failure("trainer", n, 100 + n, v, 0.0, "/x.log")
        setattr(c, k, v)
    return c


def _tags(p: RunScalars) -> dict[str, float]:
    return dict(zip(p.tags, p.values))


def test_nothing_is_due_before_the_first_step():
    view = RunView(launch_start=0.0)
    view.attempts = [_attempt(1, ready_at=3.0)]
    points, sent = due(view, 5.0, 1005.0, Sent())
    assert points == [] and sent == Sent()


def test_periodic_points_every_interval_and_one_at_the_end():
    view = RunView(launch_start=0.0)
    # spawned before it restored (goodput counts its steps from its spawn on)
    a1 = _attempt(1, started=0.5, ready_at=1.0, first_step_at=2.0, last_progress_at=4.0, last_work_at=4.0,
                  work_step=40)
    view.attempts, view.step = [a1], 40
    points, sent = due(view, 4.0, 1004.0, Sent())
    (p,) = points
    assert p.step == 40 and p.wall_time == 1004.0 and _tags(p)["procsv/restarts"] == 0.0
    assert 0 < _tags(p)["procsv/goodput"] <= 1 and "procsv/checkpoint_age_secs" not in _tags(p)
    assert due(view, 4.0 + SCALARS_EVERY - 0.1, 0.0, sent)[0] == []
    view.last_commit_at = 6.0
    points, sent = due(view, 4.0 + SCALARS_EVERY, 0.0, sent)
    assert _tags(points[0])["procsv/checkpoint_age_secs"] == pytest.approx(8.0)
    view.run = RunState.SUCCEEDED
    points, sent = due(view, 15.0, 0.0, sent)  # the outcome is decided: one last point at once
    assert len(points) == 1 and sent.final
    assert due(view, 16.0, 0.0, sent)[0] == []


def test_a_commit_and_a_recovery_each_give_one_point_at_their_step():
    view = RunView(launch_start=0.0)
    a1 = _attempt(1, ready_at=1.0, first_step_at=2.0, last_progress_at=20.0, last_work_at=20.0, work_step=250,
                  ended_at=21.0, exit_code=-9)
    a2 = _attempt(2, started=21.2, ready_at=21.5, restored_step=200)
    view.attempts, view.step = [a1, a2], 200
    view.commits, view.last_commit_at, view.last_commit_step, view.last_commit_secs = 1, 19.0, 200, 0.25
    sent = Sent(next_periodic=100.0)
    points, sent = due(view, 21.6, 0.0, sent)
    (commit,) = points  # attempt 2 has not stepped yet: its recovery is not due
    assert commit.step == 200 and _tags(commit) == {"procsv/checkpoint_commit_secs": 0.25,
                                                    "procsv/checkpoint_age_secs": 0.0}
    assert due(view, 21.7, 0.0, sent)[0] == []  # each commit once
    a2.first_step_at = 21.8
    (recovery,), sent = due(view, 21.9, 0.0, sent)
    assert recovery.step == 201
    assert _tags(recovery) == {"procsv/restarts": 1.0, "procsv/recovery_secs": pytest.approx(0.8),
                               "procsv/steps_redone": 50.0}
    assert due(view, 22.0, 0.0, sent)[0] == []  # each recovery once


def test_an_attempt_that_died_before_its_first_step_does_not_hold_back_the_next_recovery():
    view = RunView(launch_start=0.0)
    a1 = _attempt(1, ready_at=1.0, first_step_at=2.0, last_progress_at=5.0, last_work_at=5.0, work_step=50,
                  ended_at=6.0, exit_code=-9)
    a2 = _attempt(2, started=6.1, ended_at=7.0, exit_code=1)  # died while restoring
    a3 = _attempt(3, started=8.0, ready_at=8.5, restored_step=0, first_step_at=9.0)
    view.attempts = [a1, a2, a3]
    points, sent = due(view, 9.1, 0.0, Sent(next_periodic=100.0))
    (p,) = points
    assert p.step == 1 and _tags(p)["procsv/restarts"] == 2.0 and sent.recovered == 3
