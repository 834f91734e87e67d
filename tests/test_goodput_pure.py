"""``procsv.goodput`` on hand-made lifecycle records: each kind is bounded by the records
docs/observability.md names, and the kinds sum to the wall time (issue 53)."""

from __future__ import annotations

from typing import Any

import pytest

from procsv import goodput as gp


def _ev(t: float, event: str, **fields: Any) -> dict[str, Any]:
    return {"time": t, "event": event, **fields}


def _launch_with_a_kill_and_a_preemption() -> list[dict[str, Any]]:
    """Launch 1 at 0: attempt 1 (pid 11) spawned at 2, restored step 0 in 0.5 s at 4, first step
    (step 1) at 5, its last step 101 at 15 (1 s of it blocked by snapshots), SIGKILLed and noticed
    at 15.5; attempt 2 (pid 12) spawned at 17.5 restores step 51 in 1 s at 19.5, first step 52 at
    20, preempted at 30: its last step 152 at 30 then a final checkpoint from 30 to 31, ends 31.5;
    the services stop at 32. Launch 2 at 40: attempt 1 (pid 21) restores step 152 and ends at 50."""
    return [
        _ev(0, "launch", target="t", args=[], pid=1, launch=1),
        _ev(2, "spawned", role="trainer", attempt=1, pid=11, via="zygote"),
        _ev(4, "initialized", pid=11, step=0, path=None, secs=0.5, skipped=[]),
        _ev(5, "first_step", pid=11, step=1, secs_since_spawn=3),
        _ev(15.5, "death_noticed", role="trainer", attempt=1, pid=11, noticed=15.5),
        _ev(15.6, "trained", role="trainer", attempt=1, pid=11, step=101, step_at=15, busy_secs=1.0, busy_from=None),
        _ev(15.6, "exited", role="trainer", attempt=1, pid=11, noticed=15.5, signal="SIGKILL"),
        _ev(15.6, "restarting", attempt=2, delay=2.0, error="x"),
        _ev(17.5, "spawned", role="trainer", attempt=2, pid=12, via="zygote"),
        _ev(19.5, "restored", pid=12, step=51, path="p", secs=1.0, skipped=[]),
        _ev(20, "first_step", pid=12, step=52, secs_since_spawn=2.5),
        _ev(30, "preempted", signal="SIGTERM"),
        _ev(31.5, "trained", role="trainer", attempt=2, pid=12, step=152, step_at=30, busy_secs=0.0, busy_from=30.0),
        _ev(31.5, "exited", role="trainer", attempt=2, pid=12, noticed=31.5, code=42),
        _ev(31.6, "finished", state="stopped", exit_code=143, step=152),
        _ev(32, "exited", role="checkpoint", attempt=1, pid=3, noticed=32, code=0),
        _ev(40, "launch", target="t", args=[], pid=2, launch=2),
        _ev(41, "spawned", role="trainer", attempt=1, pid=21, via="fresh"),
        _ev(44, "restored", pid=21, step=152, path="p", secs=1.0, skipped=[]),
        _ev(45, "first_step", pid=21, step=153, secs_since_spawn=4),
        _ev(49, "trained", role="trainer", attempt=1, pid=21, step=193, step_at=49, busy_secs=0.0, busy_from=None),
        _ev(49, "exited", role="trainer", attempt=1, pid=21, noticed=49, code=0),
        _ev(49.1, "finished", state="succeeded", exit_code=0, step=193),
        _ev(50, "exited", role="summary", attempt=1, pid=4, noticed=50, code=0),
    ]


def test_each_kind_is_bounded_by_its_records_and_they_sum_to_the_wall_time():
    launches = gp.launches_from_events(_launch_with_a_kill_and_a_preemption())
    assert [(la.start, la.end, la.stopped, la.number) for la in launches] == [(0, 32, True, 1), (40, 50, False, 2)]
    per, total = gp.run_breakdown(launches)
    one = per[0].secs
    # launch to spawn 2; spawn to restore start 1.5; restore end to first step 1; attempt 2: 1 + 0.5
    assert one["startup"] == pytest.approx(2 + 1.5 + 1 + 1 + 0.5)
    assert one["restoring"] == pytest.approx(0.5 + 1.0)
    # attempt 1 stepped 5..15 with 1 s blocked: 9 s over steps 1..101, of which 1..51 were kept
    # (attempt 2 restored 51): 4.5 s kept, 4.5 s re-done, plus 15..15.5 lost with the kill
    assert one["checkpoint"] == pytest.approx(1.0 + 1.5)  # attempt 2's final checkpoint: 30 to its end 31.5
    assert one["productive"] == pytest.approx(4.5 + 10)  # attempt 2's steps, all kept by launch 2
    assert one["redone"] == pytest.approx(4.5 + 0.5)
    assert one["restart"] == pytest.approx(17.5 - 15.5)
    assert one["stopped"] == pytest.approx(32 - 31.5)
    assert one["unaccounted"] == pytest.approx(0)
    assert sum(one.values()) == pytest.approx(32)
    two = per[1].secs
    assert (two["startup"], two["restoring"], two["productive"], two["unaccounted"]) == pytest.approx((1 + 2 + 1, 1, 4, 1))
    assert total.wall == pytest.approx(50) and total.secs["stopped"] == pytest.approx(0.5 + 8)
    assert sum(total.secs.values()) == pytest.approx(50)
    assert total.goodput == pytest.approx((14.5 + 4) / 50)
    text = gp.render([(1, per[0]), (2, per[1])], total)
    assert "all 2 launches" in text and "cumulative: productive 37.0%" in text


def test_a_relaunch_that_restores_an_older_step_makes_the_last_launch_s_tail_redone():
    events = _launch_with_a_kill_and_a_preemption()
    events = [dict(e, step=132) if e["event"] == "restored" and e["pid"] == 21 else e for e in events]
    per, _ = gp.run_breakdown(gp.launches_from_events(events))
    # attempt 2 of launch 1 stepped 52..152 in 10 s; 132 kept: 8 s productive, 2 s re-done
    assert per[0].secs["productive"] == pytest.approx(4.5 + 8)
    assert per[0].secs["redone"] == pytest.approx(4.5 + 0.5 + 2)


def test_a_hung_attempt_s_wait_for_its_kill_is_detection():
    events = [
        _ev(0, "launch", target="t", args=[], pid=1, launch=1),
        _ev(1, "spawned", role="trainer", attempt=1, pid=11, via="zygote"),
        _ev(2, "initialized", pid=11, step=0, path=None, secs=0.0, skipped=[]),
        _ev(3, "first_step", pid=11, step=1, secs_since_spawn=2),
        _ev(40, "hang_detected", pid=11, attempt=1, step=20, reason="no step"),
        _ev(41, "trained", role="trainer", attempt=1, pid=11, step=20, step_at=10, busy_secs=0.0, busy_from=None),
        _ev(41, "exited", role="trainer", attempt=1, pid=11, noticed=41, signal="SIGKILL"),
        _ev(43, "spawned", role="trainer", attempt=2, pid=12, via="zygote"),
        _ev(44, "initialized", pid=12, step=0, path=None, secs=0.0, skipped=[]),
    ]
    b = gp.breakdown(gp.launches_from_events(events, now=50.0)[0])
    assert b.secs["restart"] == pytest.approx((40 - 10) + (43 - 40))
    assert b.secs["redone"] == pytest.approx(7)  # steps 1..20 (3 to 10): attempt 2 started again from 0
    assert sum(b.secs.values()) == pytest.approx(50)


def test_a_live_launch_s_running_attempt_is_stepping_until_now():
    events = _launch_with_a_kill_and_a_preemption()[:-4]  # launch 2 goes on: its trainer stepped from 45
    b = gp.breakdown(gp.launches_from_events(events, now=60.0)[-1])
    assert b.wall == pytest.approx(20) and b.secs["productive"] == pytest.approx(60 - 45)
    assert b.secs["unaccounted"] == pytest.approx(0) and sum(b.secs.values()) == pytest.approx(20)


def test_a_groups_worker_is_broken_down_from_its_trained_records_and_the_costliest_task_is_named():
    """A --nproc 2 launch at 0: the chief (pid 11) and worker1 (pid 12) spawned at 1; the chief
    restores step 0 at 3 and steps 4..10; worker1 (no restored/first_step records: its trained
    record holds them) is ready at 5, steps 6..8 (steps 1..41), then SIGKILLed and noticed at 8.5; the chief is
    stopped by procsv and exits at 10. The group restarts at 12 (pids 21, 22), both restore step 21 at 14,
    first step at 15, done at 20; the services stop at 21."""
    evs = [
        _ev(0, "launch", target="t", args=[], pid=1, launch=1),
        _ev(1, "spawned", role="trainer", attempt=1, pid=11, via="zygote"),
        _ev(1, "spawned", role="worker1", attempt=1, pid=12, via="zygote"),
        _ev(3, "initialized", pid=11, step=0, path=None, secs=0.5, skipped=[]),
        _ev(4, "first_step", pid=11, step=1, secs_since_spawn=3),
        _ev(8.5, "death_noticed", role="worker1", attempt=1, pid=12, noticed=8.5),
        _ev(8.6, "trained", role="worker1", attempt=1, pid=12, step=41, step_at=8, busy_secs=0.0, busy_from=None,
            ready_at=5, restored_step=0, restore_secs=0.5, first_at=6, first_step=1),
        _ev(8.6, "exited", role="worker1", attempt=1, pid=12, noticed=8.5, signal="SIGKILL"),
        _ev(10, "trained", role="trainer", attempt=1, pid=11, step=41, step_at=8, busy_secs=0.0, busy_from=None,
            ready_at=3, restored_step=0, restore_secs=0.5, first_at=4, first_step=1),
        _ev(10, "exited", role="trainer", attempt=1, pid=11, noticed=10, signal="SIGTERM"),
        _ev(12, "spawned", role="trainer", attempt=2, pid=21, via="zygote"),
        _ev(12, "spawned", role="worker1", attempt=2, pid=22, via="zygote"),
        _ev(14, "restored", pid=21, step=21, path="p", secs=1.0, skipped=[]),
        _ev(15, "first_step", pid=21, step=22, secs_since_spawn=3),
        _ev(20, "trained", role="worker1", attempt=2, pid=22, step=70, step_at=20, busy_secs=0.0, busy_from=None,
            ready_at=14, restored_step=21, restore_secs=1.0, first_at=15, first_step=22),
        _ev(20, "exited", role="worker1", attempt=2, pid=22, noticed=20, code=0),
        _ev(20, "trained", role="trainer", attempt=2, pid=21, step=70, step_at=20, busy_secs=0.0, busy_from=None,
            ready_at=14, restored_step=21, restore_secs=1.0, first_at=15, first_step=22),
        _ev(20, "exited", role="trainer", attempt=2, pid=21, noticed=20, code=0),
        _ev(20.5, "finished", state="succeeded", exit_code=0, step=70),
        _ev(21, "exited", role="checkpoint", attempt=1, pid=3, noticed=21, code=0),
    ]
    assert gp.tasks(evs) == ["trainer", "worker1"]
    rows = [(t, gp.run_breakdown(gp.launches_from_events(evs, task=t))[1]) for t in gp.tasks(evs)]
    for _, b in rows:
        assert b.wall == 21 and sum(b.secs.values()) == pytest.approx(21)
    chief, worker = rows[0][1].secs, rows[1][1].secs
    # the worker: steps 1..41 over 6..8, 1..21 kept (attempt 2 restored 21): 1 s kept, 1 s re-done;
    # its restore 4.5..5; its start-up 0..1 (launch), 1..4.5, 5..6, 12..13, 14..15
    assert worker["productive"] == pytest.approx(1.0 + 5.0)
    assert worker["restoring"] == pytest.approx(0.5 + 1.0)
    assert worker["startup"] == pytest.approx(1 + 3.5 + 1 + 1 + 1)
    assert worker["redone"] == pytest.approx(1.0 + 0.5)  # and 8..8.5: the step in progress at the kill
    assert worker["restart"] == pytest.approx(12 - 8.5)
    # the chief stepped 4..8 (2 s kept), then waited for procsv to stop it (re-done), its restart from 10
    assert chief["productive"] == pytest.approx(2.0 + 5.0)
    assert chief["redone"] == pytest.approx(2.0 + 2.0) and chief["restart"] == pytest.approx(2.0)
    assert gp.costliest(rows) == rows[1]
    text = gp.render_tasks(rows)
    assert "costliest task: worker1, 15.0 s of 21.0 s not kept steps (startup 7.5 s, restart 3.5 s" in text, text


def test_a_month_long_run_s_table_keeps_its_columns_aligned():
    month = 30 * 24 * 3600.0  # 2,592,000 s: wider than the 8 characters of a short run's columns
    b = gp.Breakdown(wall=month)
    b.secs.update(productive=month - 3600.0, startup=3600.0)
    short = gp.Breakdown(wall=100.0)
    short.secs.update(productive=90.0, startup=10.0)
    for text in (gp.render([(1, b), (2, short)], b), gp.render_tasks([("trainer", b), ("worker1", short)])):
        head, *rows = [line for line in text.splitlines()[:3]]
        ends = [i + 1 for i, c in enumerate(head) if c != " " and (i + 1 == len(head) or head[i + 1] == " ")]
        for row in rows:  # each figure ends where its column's name ends
            assert [i + 1 for i, c in enumerate(row) if c != " " and (i + 1 == len(row) or row[i + 1] == " ")][-10:] \
                == ends[-10:], (head, row)


def test_an_attempt_that_stepped_with_no_restore_record_still_sums_to_the_wall_time():
    # a first step heard with no TrainerReady before it (the watchdog records first_step on the
    # first Progress whatever came before): start-up runs to the first step, not to the attempt's end
    la = gp.Launch(0.0, 20.0, attempts=(gp.Attempt(spawned=1.0, first_step=5.0, first_step_no=1, last_at=15.0,
                                                   last_step=101, ended=16.0),))
    b = gp.breakdown(la)
    assert sum(b.secs.values()) == pytest.approx(20.0), b.secs
    assert b.secs["startup"] == pytest.approx(5.0) and b.secs["productive"] == pytest.approx(10.0), b.secs


def test_the_run_record_of_report_json_holds_each_launchs_breakdown_and_the_whole_runs():
    """``logs/report.json``'s ``run`` (issue 66): the numbers of ``procsv report``'s table, as data."""
    events = _launch_with_a_kill_and_a_preemption()
    per, total = gp.run_breakdown(gp.launches_from_events(events))
    run = gp.run_record(events)
    assert run == {"launches": [{"launch": 1, **per[0].to_json()}, {"launch": 2, **per[1].to_json()}],
                   "total": {"launches": 2, **total.to_json()}}
    assert run["total"]["wall_s"] == 50.0 and run["total"]["stopped_s"] >= 8.0  # the gap from 32 to 40 included
    # a group whose workers step: each task's whole run too
    worker = [dict(e, role="worker1", pid=e["pid"] + 1000) for e in events if e.get("event") == "trained"]
    spawned = [dict(e, role="worker1", pid=e["pid"] + 1000) for e in events
               if e.get("event") == "spawned" and e.get("role") == "trainer"]
    grouped = sorted(events + worker + spawned, key=lambda e: e["time"])
    run = gp.run_record(grouped)
    assert sorted(run["tasks"]) == ["trainer", "worker1"]
    assert run["tasks"]["trainer"] == total.to_json()
    assert run["tasks"]["worker1"] == gp.run_breakdown(gp.launches_from_events(grouped, task="worker1"))[1].to_json()
