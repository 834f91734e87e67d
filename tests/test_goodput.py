"""Where the time went (issue 53), on a real run: two SIGKILLs of the trainer, a preemption
(SIGTERM to the launch) and a relaunch of the same logdir. The kinds of ``procsv.goodput`` sum to
each launch's wall time and to the run's (gaps included) within 1 %, each kind the run had is
there, and ``procsv report`` prints the table; ``report.json`` and ``status.json`` carry the
last launch's, and ``report.json`` the whole run's too (``run``: every launch of the logdir, the
numbers of the table ``procsv report`` prints)."""

from __future__ import annotations

import json
import os
import signal
import time

import psutil
import pytest

from conftest import (PROGRAMS, REPO, committed_steps, finish, launch, lifecycle, quiet_env, raw_status, run_python,
                      wait_for, wait_role_pid)
from procsv import goodput as gp

pytestmark = pytest.mark.slow
TINY = os.path.join(PROGRAMS, "tiny_train.py")
ENV = quiet_env(PROCSV_MEMORY_SNAPSHOTS="0")  # restores from disk: the killed attempts re-do steps


def _first_steps(logdir: str) -> int:
    return sum(1 for e in lifecycle(logdir) if e["event"] == "first_step")


def _kill_past_a_commit(logdir: str, attempt: int) -> None:
    """SIGKILL the trainer of ``attempt`` once it committed a checkpoint and stepped 30 past it."""
    wait_for(lambda: _first_steps(logdir) >= attempt, 120, what=f"attempt {attempt}'s first step")
    base = max(committed_steps(logdir) or [0])
    newest = wait_for(lambda: [s for s in committed_steps(logdir) if s > base], 120, what="a new commit")[-1]
    wait_for(lambda: (raw_status(logdir) or {}).get("step", 0) >= newest + 30, 60, what=f"step {newest + 30}")
    pid = wait_role_pid(logdir, "trainer")
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: any(e["event"] == "exited" and e.get("pid") == pid for e in lifecycle(logdir)), 60,
             what="the kill's exit record")


def test_kinds_sum_to_the_wall_time_across_kills_a_preemption_and_a_relaunch(logdir):
    args = ("--step-delay", "0.01", "--save-steps", "100")
    proc = launch(logdir, "--steps", "100000", *args, target=TINY, env=ENV)
    try:
        _kill_past_a_commit(logdir, 1)
        _kill_past_a_commit(logdir, 2)
        wait_for(lambda: _first_steps(logdir) >= 3, 120, what="attempt 3's first step")
        proc.send_signal(signal.SIGTERM)  # a preemption: the launch saves and stops
    finally:
        code, out, err = finish(proc)
    assert code == 128 + signal.SIGTERM, err
    time.sleep(1.0)  # the time between the preemption and the relaunch: `stopped`
    resumed = max(committed_steps(logdir))
    code, out, err = finish(launch(logdir, "--steps", str(resumed + 150), *args, target=TINY, env=ENV))
    assert code == 0, err

    events = lifecycle(logdir)
    assert sum(1 for e in events if e["event"] == "trained") == 4  # one per trainer attempt of either launch
    launches = gp.launches_from_events(events)
    assert [la.stopped for la in launches] == [True, False] and [len(la.attempts) for la in launches] == [3, 1]
    per, total = gp.run_breakdown(launches)
    for la, b in zip(launches, per):
        assert abs(sum(b.secs.values()) - (la.end - la.start)) <= 0.01 * (la.end - la.start), b.secs
    assert abs(sum(total.secs.values()) - total.wall) <= 0.01 * total.wall, total.secs
    assert abs(total.wall - (launches[1].end - launches[0].start)) <= 0.01 * total.wall
    s = total.secs
    for kind in ("productive", "startup", "restoring", "redone", "restart", "stopped"):
        assert s[kind] > 0, (kind, s)
    assert s["stopped"] >= launches[1].start - launches[0].end >= 1.0
    # every second of the launch with the kills and the preemption has a kind; in the relaunch, only
    # its orderly end (the last step to the services' exits) is left unaccounted
    assert per[0].secs["unaccounted"] <= 0.01 * per[0].wall, per[0].secs
    last_step_at = max(e["step_at"] for e in events if e["event"] == "trained")
    assert per[1].secs["unaccounted"] <= launches[1].end - last_step_at + 0.01, (per[1].secs, last_step_at)
    # each kill was 30+ steps (10 ms each) past the checkpoint the next attempt restored
    assert s["redone"] >= 2 * 30 * 0.01, s

    done = run_python(["-m", "procsv", "report", logdir], env=quiet_env(), cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert any(line.split()[:2] == ["launch", "1"] for line in lines), done.stdout
    assert any(line.split()[:3] == ["all", "2", "launches"] for line in lines), done.stdout
    assert any(line.strip().startswith("cumulative: productive ") for line in lines), done.stdout

    with open(os.path.join(logdir, "logs", "report.json")) as fh:
        report = json.load(fh)
    # the whole run's, machine-readable: what `procsv report` computes from the lifecycle records (the
    # relaunch wrote its report after its last record), and the numbers of the rows it printed
    run = report["run"]
    assert run == gp.run_record(events), (run, gp.run_record(events))
    assert [r["launch"] for r in run["launches"]] == [1, 2] and run["total"]["launches"] == 2, run
    assert run["total"]["wall_s"] == round(total.wall, 3) and "tasks" not in run, run
    for name, row in (("launch 1", run["launches"][0]), ("launch 2", run["launches"][1]),
                      ("all 2 launches", run["total"])):
        printed = next(line.split()[len(name.split()):] for line in lines if line.split()[:len(name.split())] == name.split())
        shown = [float(x) for x in printed[:-1]] + [float(printed[-1].rstrip("%")) / 100]
        saved_row = [row[f"{k}_s"] for k in gp.KINDS] + [row["wall_s"], row["goodput"]]
        # (the table rounds to 0.1 s and 0.1 %, report.json to 1 ms and 0.01 %)
        assert all(abs(x - y) <= 0.0501 for x, y in zip(shown[:-1], saved_row[:-1])), (printed, row)
        assert abs(shown[-1] - saved_row[-1]) <= 0.000501 and len(shown) == len(saved_row), (printed, row)
    saved = report["breakdown"]  # the last launch's, as the watchdog saw it
    assert abs(sum(saved[f"{k}_s"] for k in gp.KINDS) - saved["wall_s"]) <= 0.01 * saved["wall_s"], saved
    # the watchdog's own view of its launch and the lifecycle records agree: the same start (the
    # launch record's time is the watchdog's start), and the report is taken as the watchdog closes
    # its plumbing, a moment after its last record
    assert 0 <= saved["wall_s"] - per[1].wall <= 0.01 * per[1].wall + 0.5, (saved, per[1].wall)
    for kind in ("productive", "restoring", "checkpoint", "redone", "restart"):
        assert abs(saved[f"{kind}_s"] - per[1].secs[kind]) <= 0.01 * per[1].wall + 0.1, (kind, saved, per[1].secs)
    shown = (raw_status(logdir) or {}).get("breakdown")
    assert shown is not None and shown["productive_s"] > 0, shown


def test_a_sigkilled_watchdogs_kept_steps_count_as_productive_after_the_relaunch(logdir):
    """The watchdog SIGKILLed (its trainer dies with it, no ``trained`` record), then a relaunch of
    the logdir: the relaunch restored the killed launch's last commit, so the killed attempt's steps
    up to its last ``checkpoint_committed`` record were kept (productive), not re-done."""
    args = ("--step-delay", "0.01", "--save-steps", "100")
    proc = launch(logdir, "--steps", "100000", *args, target=TINY, env=ENV)
    try:
        wait_for(lambda: any(e["event"] == "checkpoint_committed" and e["step"] >= 300 for e in lifecycle(logdir)),
                 180, what="the commit of step 300 recorded")
        trainer = psutil.Process(wait_role_pid(logdir, "trainer"))
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        finish(proc)

    def gone() -> bool:
        try:
            return trainer.status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    wait_for(gone, 60, what="the trainer's end after its watchdog's")
    time.sleep(1.0)  # the time between the watchdog's death and the relaunch
    code, out, err = finish(launch(logdir, "--steps", str(max(committed_steps(logdir)) + 100), *args, target=TINY,
                                   env=ENV))
    assert code == 0, err

    events = lifecycle(logdir)
    launches = gp.launches_from_events(events)
    assert [len(la.attempts) for la in launches] == [1, 1], launches
    first = launches[0].attempts[0].first_step
    resumed = launches[1].attempts[0].restored_step
    ends = [i for i, e in enumerate(events) if e["event"] == "launch"][1]
    kept = [e for e in events[:ends] if e["event"] == "checkpoint_committed" and e["step"] <= resumed]
    assert first is not None and kept and resumed >= 300, (resumed, kept)
    per, total = gp.run_breakdown(launches)
    b = per[0]
    assert abs(sum(b.secs.values()) - b.wall) <= 0.01 * b.wall, b.secs
    # the first step to the last commit the relaunch restored from: kept steps
    assert b.secs["productive"] >= 0.99 * (kept[-1]["time"] - first), (b.secs, kept[-1], first)
    # only what follows the last record the launch wrote can have been re-done
    assert b.secs["redone"] <= launches[0].end - kept[-1]["time"] + 0.01, (b.secs, kept[-1])
    # the watchdog's death to the relaunch was no preemption: no record bounds it (its trainer
    # stepped on after the launch's last record until it noticed its watchdog gone)
    gap = launches[1].start - launches[0].end
    assert total.secs["stopped"] == pytest.approx(b.secs["stopped"] + per[1].secs["stopped"]), total.secs
    assert gap > 0.5 and total.secs["unaccounted"] >= gap, (total.secs, gap)


def test_the_steps_an_in_place_rollback_undid_are_redone_and_its_restore_is_restoring(logdir):
    """--on-nonfinite rollback (the default under procsv launch): step 38's loss is NaN twice, and
    each time the trainer restores step 33 in place (``rolled_back``) and trains 34.. again; the
    steps undone are ``redone``, the in-place restores ``restoring``, in the report's breakdown
    and in the watchdog's own (``report.json``), not ``productive``."""
    delay = 0.1  # each step sleeps this long: a lower bound on its time
    code, out, err = finish(launch(logdir, "--nan-at", "38", "--save-steps", "20", "--step-delay", str(delay),
                                   "--steps", "60", target=os.path.join(PROGRAMS, "nan_train.py")), 300)
    assert code == 0, out + err
    events = lifecycle(logdir)
    rolled = [e for e in events if e["event"] == "rolled_back"]
    undone = sum(e["step"] - e["restored_step"] for e in rolled)
    assert len(rolled) == 2 and undone >= 2, rolled
    launches = gp.launches_from_events(events)
    (b,), _ = gp.run_breakdown(launches)
    assert abs(sum(b.secs.values()) - b.wall) <= 0.01 * b.wall, b.secs
    assert b.secs["redone"] >= 0.9 * undone * delay, (b.secs, undone)
    ready = next(e for e in events if e["event"] in ("restored", "initialized"))
    assert b.secs["restoring"] >= ready["secs"] + sum(e["secs"] for e in rolled) - 0.001, (b.secs, rolled)
    with open(os.path.join(logdir, "logs", "report.json")) as fh:
        saved = json.load(fh)["breakdown"]
    assert saved["redone_s"] >= 0.9 * undone * delay, (saved, undone)
    assert abs(saved["redone_s"] - b.secs["redone"]) <= 0.01 * b.wall + 0.1, (saved, b.secs)
