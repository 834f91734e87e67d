"""Where the time went per task (issue 53, point 4), on a real group: ``procsv launch --nproc 2``
(two trainer processes in MultiWorkerMirroredStrategy) whose worker, then chief, is SIGKILLed (the run of
``tests/test_standby_group.py``'s ``standby_member_worker_then_chief_killed``, made once per session: a
standby member is SIGKILLed before, and the ready standby group replaces the group each time). Each task
(the chief ``trainer``, the worker ``worker1``) has its own breakdown, from what the watchdog
already hears of every member (its spawn, its restore, its Progress, its end): the kinds sum to
each task's wall time within 1 %, and ``procsv report`` prints a row per task and names the one
that cost the most; ``logs/report.json``'s ``run`` holds each task's too."""

from __future__ import annotations

import json
import os

import pytest

from conftest import REPO, lifecycle, quiet_env, run_python
from procsv import goodput as gp
from test_standby_group import standby_member_worker_then_chief_killed

pytestmark = pytest.mark.slow

__all__ = ["standby_member_worker_then_chief_killed"]  # the fixture, used by name


def test_a_group_with_a_killed_worker_breaks_down_per_task_and_the_report_names_the_costliest(
        standby_member_worker_then_chief_killed):
    """Each task of a group whose worker1, then chief, was SIGKILLed has a breakdown of its own whose kinds sum to
    its wall time (productive, startup and redone time in each); ``procsv report`` prints a row per task
    and names the costliest; report.json's ``run`` holds each task's too."""
    logdir, run = standby_member_worker_then_chief_killed
    assert not run["leftovers"], f"processes of the run were left behind: {run['leftovers']}"
    assert run["code"] == 0, run["err"]

    events = lifecycle(logdir)
    trained = sorted((e["role"], e["attempt"]) for e in events if e["event"] == "trained")
    assert trained == [(role, attempt) for role in ("trainer", "worker1") for attempt in (1, 2, 3)], trained
    assert gp.tasks(events) == ["trainer", "worker1"]
    rows = []
    for task in ("trainer", "worker1"):
        launches = gp.launches_from_events(events, task=task)
        assert [len(la.attempts) for la in launches] == [3], (task, launches)
        assert all(a.ready is not None and a.first_step is not None for a in launches[0].attempts), (task, launches)
        _, b = gp.run_breakdown(launches)
        assert abs(sum(b.secs.values()) - b.wall) <= 0.01 * b.wall, (task, b.secs)
        assert abs(b.wall - (launches[0].end - launches[0].start)) <= 1e-6
        for kind in ("productive", "startup", "redone"):
            assert b.secs[kind] > 0, (task, kind, b.secs)
        assert b.secs["unaccounted"] <= 0.1 * b.wall, (task, b.secs)  # its orderly end only
        rows.append((task, b))
    worst = gp.costliest(rows)
    assert worst is not None

    done = run_python(["-m", "procsv", "report", logdir], env=quiet_env(), cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = [line.strip() for line in done.stdout.splitlines()]
    assert any(line.split()[:1] == ["trainer"] for line in lines), done.stdout
    assert any(line.split()[:1] == ["worker1"] for line in lines), done.stdout
    assert any(line.startswith(f"costliest task: {worst[0]}, ") for line in lines), done.stdout
    # report.json's run: each task's whole run too, as the report's rows (issue 66)
    with open(os.path.join(logdir, "logs", "report.json")) as fh:
        run = json.load(fh)["run"]
    assert sorted(run["tasks"]) == ["trainer", "worker1"] and run == gp.run_record(events), run
    assert run["tasks"][worst[0]]["wall_s"] == round(worst[1].wall, 3), (run, worst)
