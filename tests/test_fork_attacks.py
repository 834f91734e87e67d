"""Attacks on the fork path after issue 51's simplifications, as a month-long unattended run meets them.

The zygote double-forks and replies once its intermediate is reaped; the watchdog takes the named
trainer with ``waitid(WNOWAIT)``, reaps it itself, and the death watch's thread removes its mutex as
it returns. Real launches of a tiny TensorFlow program on a loaded machine (CPU burners this test
starts and kills), real SIGKILLs of the trainer, read back through the lifecycle log, ``/proc`` and
the runtime directory.
"""

from __future__ import annotations

import os
import signal

import psutil
import pytest

from conftest import (PROGRAMS, burners, finish, launch, lifecycle, on_one_core, proc_children, quiet_env, raw_status,
                      role_pid, run_processes, runtime_dir, wait_for)

TINY = os.path.join(PROGRAMS, "tiny_train.py")
KILLS = 24


def _events(logdir: str, name: str) -> list[dict]:
    return [e for e in lifecycle(logdir) if e["event"] == name]


def _trainers(logdir: str) -> list[dict]:
    return [e for e in _events(logdir, "spawned") if e["role"] == "trainer"]


def _zombies(pid: int) -> list[int]:
    try:
        return [c.pid for c in psutil.Process(pid).children() if c.status() == psutil.STATUS_ZOMBIE]
    except psutil.Error:
        return []


@pytest.mark.slow
def test_two_dozen_kills_at_load_each_restart_forks_and_leaves_nothing(logdir):
    """Every one of 24 SIGKILLs of the trainer, two CPU burners beside the run, is one restart forked
    by the zygote (no fresh start, no zygote lost, no unasked restart), and after them the watchdog has
    no zombie child and the runtime directory holds only the live attempt's mutex. Each attempt commits
    a checkpoint before its kill, as a long run's attempts do, so no restart waits out a backoff (the
    attacker's first form, without commits, spent ten minutes in backoffs). The burners start once the
    zygote is ready (its TensorFlow import is no kill's), before attempt 1 is forked: every kill is at
    load."""
    load: list = []
    with on_one_core():
        proc = launch(logdir, "--steps", "10000000", "--step-delay", "0.01", "--save-steps", "10", target=TINY,
                      opts=("--standby", "fork", "--quiet", "--max-restarts", "100"))
    try:
        wait_for(lambda: _events(logdir, "zygote_ready"), 180, interval=0.01, what="the zygote to be ready")
        with on_one_core():  # the core the run was started on (the same one: the last this process may use)
            load = burners(2)
        for n in range(1, KILLS + 1):
            spawned = wait_for(lambda: [e for e in _trainers(logdir) if e["attempt"] == n], 120,
                               what=f"attempt {n} spawned")[0]
            wait_for(lambda: [e for e in _events(logdir, "first_step") if e["pid"] == spawned["pid"]], 120,
                     what=f"attempt {n}'s first step")
            commits = len(_events(logdir, "checkpoint_committed"))
            wait_for(lambda: len(_events(logdir, "checkpoint_committed")) > commits, 120,
                     what=f"a checkpoint committed by attempt {n}")
            os.kill(spawned["pid"], signal.SIGKILL)
        live = wait_for(lambda: [e for e in _trainers(logdir) if e["attempt"] == KILLS + 1], 120,
                        what="the last restart")[0]["pid"]
        runtime = runtime_dir(role_pid(logdir, "checkpoint"))
        wait_for(lambda: not _zombies(proc.pid), 30, what="no zombie child of the watchdog")
        wait_for(lambda: len([n for n in os.listdir(runtime) if n.endswith(".mutex")]) <= 1, 30,
                 what="only the live attempt's mutex")
        vias = [(e["attempt"], e.get("via")) for e in _trainers(logdir)]
        assert vias == [(1, vias[0][1])] + [(a, "zygote") for a in range(2, KILLS + 2)], vias
        assert not _events(logdir, "zygote_gone"), lifecycle(logdir)
        # status.json is rewritten after the lifecycle record of the last restart: wait for it to say so
        wait_for(lambda: (raw_status(logdir) or {}).get("restarts", 0) >= KILLS, 30, what=f"{KILLS} restarts in status.json")
        assert raw_status(logdir)["restarts"] == KILLS, raw_status(logdir)
        os.kill(live, 0)
    finally:
        for b in load:
            b.kill()
            b.wait()
        proc.send_signal(signal.SIGTERM)
        code, out, err = finish(proc)
    assert code == 128 + signal.SIGTERM, err


@pytest.mark.slow
def test_a_watchdog_killed_with_a_fork_in_flight_leaves_no_trainer(logdir, tmp_path):
    """The watchdog is SIGKILLed while the zygote's intermediate holds a fork request (held at the fault
    point ``zygote:fork_stall``), so the trainer is forked only after the watchdog is gone, before it can
    arm its parent-death signal on it: it must not run (nothing of the run may outlive its watchdog)."""
    gate = str(tmp_path / "gate")  # the second fork's intermediate (attempt 2's) waits for it
    proc = launch(logdir, "--steps", "100000", "--step-delay", "0.01", target=TINY, opts=("--standby", "fork"),
                  env=quiet_env(PROCSV_FAULT="zygote:fork_stall:2", PROCSV_FAULT_GATE=gate))
    try:
        wait_for(lambda: _events(logdir, "zygote_ready"), 120, what="the zygote to be ready")
        zygote = int(next(e["pid"] for e in _events(logdir, "spawned") if e["role"] == "zygote"))
        first = wait_for(lambda: _trainers(logdir), 60, what="the first trainer")[0]["pid"]
        wait_for(lambda: _events(logdir, "first_step"), 120, what="the first step")
        os.kill(first, signal.SIGKILL)  # attempt 2 is asked of the zygote: its intermediate forks nothing yet
        wait_for(lambda: proc_children(zygote), 60, what="the fork's intermediate (the zygote waits for it)")
        os.kill(proc.pid, signal.SIGKILL)  # the watchdog, with the fork in flight
        proc.wait(30)
        open(gate, "w").close()  # the intermediate forks attempt 2 now, the watchdog gone
        wait_for(lambda: not run_processes(logdir), 60,
                 what="no process of the run left: " + repr([p.pid for p in run_processes(logdir)]))
    finally:
        for p in run_processes(logdir):
            try:
                p.kill()
            except psutil.Error:
                pass
        if proc.poll() is None:
            proc.kill()
        finish(proc)


@pytest.mark.slow
def test_a_stopped_zygote_fails_a_groups_restart_once_and_both_members_start_fresh(logdir):
    """--nproc 2: the chief is SIGKILLed while the zygote is stopped, so both members' forks go
    unanswered. The one deadline (Zygote.answer) fires once, the zygote is given up once, both members
    of attempt 2 start fresh and train; no unasked restart."""
    proc = launch(logdir, "--strategy", "multiworker", "--save-model-secs", "1", "--step-delay", "0.004",
                  "--print-every-steps", "100000", "--steps", "1000000", opts=("--nproc", "2"))
    zygote = 0
    try:
        wait_for(lambda: _events(logdir, "first_step"), 180, what="the group's first step")
        zygote = int(next(e["pid"] for e in _events(logdir, "spawned") if e["role"] == "zygote"))
        chief = int(next(e["pid"] for e in _trainers(logdir) if e["attempt"] == 1))
        os.kill(zygote, signal.SIGSTOP)
        os.kill(chief, signal.SIGKILL)
        wait_for(lambda: _events(logdir, "zygote_gone"), 90, what="the zygote given up (no fork reply in 10 s)")
        wait_for(lambda: len(_events(logdir, "first_step")) >= 2, 180, what="attempt 2's first step")
        step = (raw_status(logdir) or {}).get("step", 0)
        wait_for(lambda: (raw_status(logdir) or {}).get("step", 0) > step + 50, 120, what="50 more steps")
        second = sorted((e["role"], e.get("via")) for e in _events(logdir, "spawned")
                        if e["role"] in ("trainer", "worker1") and e["attempt"] == 2)
        assert second == [("trainer", "fresh"), ("worker1", "fresh")], lifecycle(logdir)
        assert len(_events(logdir, "zygote_gone")) == 1, lifecycle(logdir)
        assert raw_status(logdir)["restarts"] == 1, raw_status(logdir)
    finally:
        if zygote:
            try:
                os.kill(zygote, signal.SIGCONT)
            except ProcessLookupError:
                pass
        proc.send_signal(signal.SIGTERM)
        code, out, err = finish(proc)
    assert code == 128 + signal.SIGTERM, err
    assert err.count("did not answer the fork request") == 1, err


@pytest.mark.slow
def test_a_standby_forked_while_the_trainer_is_restarted(logdir, tmp_path):
    """--standby hot: the standby's fork is held (its intermediate at the fault point ``zygote:fork_stall``)
    and the trainer is SIGKILLed meanwhile. The restart waits for the standby's answer, kills the unready
    standby and forks attempt 2: one restart, the zygote kept, the new trainer trains, nothing left
    unreaped and no mutex but the live ones."""
    gate = str(tmp_path / "gate")  # the second fork's intermediate (the standby's) waits for it
    proc = launch(logdir, "--steps", "100000", "--step-delay", "0.01", target=TINY, opts=("--standby", "hot"),
                  env=quiet_env(PROCSV_FAULT="zygote:fork_stall:2", PROCSV_FAULT_GATE=gate))
    try:
        wait_for(lambda: _events(logdir, "zygote_ready"), 120, what="the zygote to be ready")
        zygote = int(next(e["pid"] for e in _events(logdir, "spawned") if e["role"] == "zygote"))
        first = wait_for(lambda: _trainers(logdir), 60, what="the first trainer")[0]["pid"]
        wait_for(lambda: _events(logdir, "first_step"), 120, what="the first step")
        wait_for(lambda: proc_children(zygote), 60, what="the standby's fork to be in flight (held)")
        os.kill(first, signal.SIGKILL)
        wait_for(lambda: _events(logdir, "restarting"), 60, what="the restart to be due")
        open(gate, "w").close()
        live = wait_for(lambda: [e for e in _trainers(logdir) if e["attempt"] == 2], 60, what="attempt 2")[0]
        wait_for(lambda: [e for e in _events(logdir, "first_step") if e["pid"] == live["pid"]], 120,
                 what="attempt 2's first step")
        step = (raw_status(logdir) or {}).get("step", 0)
        wait_for(lambda: (raw_status(logdir) or {}).get("step", 0) > step + 200, 120, what="200 more steps")
        assert raw_status(logdir)["restarts"] == 1, lifecycle(logdir)
        assert not _events(logdir, "zygote_gone"), lifecycle(logdir)
        assert len([e for e in _trainers(logdir) if e["attempt"] == 2]) == 1, lifecycle(logdir)
        standby = [e for e in _events(logdir, "spawned") if e["role"] == "standby"]
        assert [e["attempt"] for e in standby][:1] == [2], lifecycle(logdir)  # the held fork was answered
        os.kill(live["pid"], 0)
        wait_for(lambda: not _zombies(proc.pid), 30, what="no zombie child of the watchdog")
    finally:
        open(gate, "w").close()
        proc.send_signal(signal.SIGTERM)
        code, out, err = finish(proc)
    assert code == 128 + signal.SIGTERM, err


@pytest.mark.slow
def test_a_zygote_stopped_with_a_fork_pending_is_replaced_and_its_late_resume_answers_nothing(logdir):
    """--standby fork: the zygote is SIGSTOPped and the trainer SIGKILLed: the deadline fires once, attempt
    2 starts fresh, a new zygote is started (rule 13); the old one SIGCONTed after that answers nothing
    (SIGKILLed while stopped), and attempt 3 is forked by the new zygote."""
    # (steps of 50 ms, not 10: the test waits for zygotes and first steps, tens of seconds, and counts no step)
    proc = launch(logdir, "--steps", "100000", "--step-delay", "0.05", target=TINY, opts=("--standby", "fork"))
    zygote = 0
    try:
        wait_for(lambda: _events(logdir, "zygote_ready"), 120, what="the zygote to be ready")
        zygote = int(next(e["pid"] for e in _events(logdir, "spawned") if e["role"] == "zygote"))
        first = wait_for(lambda: _trainers(logdir), 60, what="the first trainer")[0]["pid"]
        wait_for(lambda: _events(logdir, "first_step"), 120, what="the first step")
        os.kill(zygote, signal.SIGSTOP)
        os.kill(first, signal.SIGKILL)
        second = wait_for(lambda: [e for e in _trainers(logdir) if e["attempt"] == 2], 60, what="attempt 2")[0]
        assert second["via"] == "fresh", lifecycle(logdir)
        wait_for(lambda: len(_events(logdir, "zygote_ready")) >= 2, 180, what="a new zygote ready")
        try:
            os.kill(zygote, signal.SIGCONT)  # late: it was SIGKILLed while stopped
        except ProcessLookupError:
            pass
        zygote = 0
        wait_for(lambda: [e for e in _events(logdir, "first_step") if e["pid"] == second["pid"]], 120,
                 what="attempt 2's first step")
        os.kill(second["pid"], signal.SIGKILL)
        third = wait_for(lambda: [e for e in _trainers(logdir) if e["attempt"] == 3], 60, what="attempt 3")[0]
        assert third["via"] == "zygote", lifecycle(logdir)
        wait_for(lambda: [e for e in _events(logdir, "first_step") if e["pid"] == third["pid"]], 120,
                 what="attempt 3's first step")
        assert len(_events(logdir, "zygote_gone")) == 1, lifecycle(logdir)
        assert raw_status(logdir)["restarts"] == 2, raw_status(logdir)
        wait_for(lambda: not _zombies(proc.pid), 30, what="no zombie child of the watchdog")
    finally:
        if zygote:
            try:
                os.kill(zygote, signal.SIGCONT)
            except ProcessLookupError:
                pass
        proc.send_signal(signal.SIGTERM)
        code, out, err = finish(proc)
    assert code == 128 + signal.SIGTERM, err
    assert err.count("did not answer the fork request") == 1, err
