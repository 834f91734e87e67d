"""A fork the zygote made but never answered (issue 51, point 1, reviewed): the late trainer.

Since the zygote double-forks, a trainer its intermediate forked is the watchdog's child at once,
whether or not the zygote's reply naming it is ever read. A zygote stopped between handing the
request to its intermediate and replying leaves such a trainer running unknown to the watchdog; at
the reply's limit the watchdog starts the same attempt fresh, and the left-behind sweep kills the
late one. The two are the same attempt of the same slot (same log, same death-notice mutex): the
sweep's kill must not be taken for the death of the fresh replacement. A real launch of a tiny
TensorFlow program; the fork's intermediate is held at a fault point (``zygote:fork_stall``) and the
zygote stopped with SIGSTOP.
"""

from __future__ import annotations

import os
import signal

import pytest

from conftest import (PROGRAMS, finish, launch, lifecycle, proc_children, quiet_env, raw_status, wait_for,
                      wait_role_pid)

TINY = os.path.join(PROGRAMS, "tiny_train.py")


def _events(logdir: str, name: str) -> list[dict]:
    return [e for e in lifecycle(logdir) if e["event"] == name]


def _cont(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:
        pass


@pytest.mark.slow
def test_the_sweep_of_an_unanswered_fork_is_not_the_replacements_death(logdir, tmp_path):
    """Before: the fresh attempt 2 was given the death-notice mutex the late one held; the sweep's kill
    of the late one was noticed as attempt 2's death (its first step then started an unasked attempt 3
    beside it, never reaped), and the launch did not end on SIGTERM within 180 s."""
    gate = str(tmp_path / "gate")  # the second fork's intermediate (attempt 2's) waits for it
    proc = launch(logdir, "--steps", "100000", "--step-delay", "0.01", target=TINY, opts=("--standby", "fork"),
                  env=quiet_env(PROCSV_FAULT="zygote:fork_stall:2", PROCSV_FAULT_GATE=gate))
    stopped: list[int] = []
    try:
        wait_for(lambda: _events(logdir, "zygote_ready"), 120, what="the zygote to be ready")
        zygote = int(next(e["pid"] for e in _events(logdir, "spawned") if e["role"] == "zygote"))
        first = wait_role_pid(logdir, "trainer")
        wait_for(lambda: (raw_status(logdir) or {}).get("step", 0) > 20, 120, what="the first trainer's steps")
        os.kill(first, signal.SIGKILL)  # attempt 2 is asked of the zygote
        wait_for(lambda: proc_children(zygote), 60, what="the fork's intermediate (the zygote waits for it)")
        os.kill(zygote, signal.SIGSTOP)  # it will not reply
        stopped.append(zygote)
        open(gate, "w").close()  # the intermediate forks attempt 2 and exits: the watchdog's child
        wait_for(lambda: _events(logdir, "zygote_gone"), 60, what="the zygote given up (no reply in 10 s)")
        wait_for(lambda: [e for e in _events(logdir, "spawned") if e["role"] == "trainer" and e["attempt"] == 2],
                 30, what="attempt 2 started fresh")
        wait_for(lambda: _events(logdir, "orphans_killed"), 30, what="the late trainer swept")
        fresh = next(e["pid"] for e in _events(logdir, "spawned") if e["role"] == "trainer" and e["attempt"] == 2)
        wait_for(lambda: len(_events(logdir, "zygote_ready")) > 1, 120, what="a new zygote ready")
        step = (raw_status(logdir) or {}).get("step", 0)
        wait_for(lambda: (raw_status(logdir) or {}).get("step", 0) > step + 300, 120, what="300 more steps")
        assert raw_status(logdir)["restarts"] == 1, lifecycle(logdir)  # the one asked for: the first trainer's kill
        assert not [e for e in _events(logdir, "death_noticed") if e["attempt"] == 2], lifecycle(logdir)
        os.kill(fresh, 0)  # the fresh attempt 2 lives on
        # the late one never ran: the zygote was killed before it named it (before, it ran attempt 2 beside the fresh
        # one until the sweep: over hosts, a late worker joined the group's collectives first, and its kill broke it)
        with open(os.path.join(logdir, "logs", "trainer.2.log")) as fh:
            late = fh.read()
        assert "pre-warmed trainer ended before it named this process" in late and \
            "exiting without running" in late, late
    finally:
        for pid in stopped:
            _cont(pid)
        proc.send_signal(signal.SIGTERM)
        code, out, err = finish(proc)
    assert code == 128 + signal.SIGTERM, err


def _zombies(pid: int) -> list[int]:
    out = []
    for child in proc_children(pid):
        try:
            with open(f"/proc/{child}/stat") as fh:
                if fh.read().rsplit(")", 1)[1].split()[0] == "Z":
                    out.append(child)
        except OSError:
            pass
    return out


@pytest.mark.slow
def test_a_lost_zygote_leaves_no_zombie(logdir, tmp_path):
    """Before: a zygote given up on (here SIGKILLed, during a fork held at its intermediate) was reaped
    only at the launch's end, and so was its intermediate (re-parented to the watchdog at the zygote's
    end): two zombies per lost zygote for the rest of a run that may last a month."""
    gate = str(tmp_path / "gate")  # never made: each zygote's second fork stays held
    proc = launch(logdir, "--steps", "100000", "--step-delay", "0.01", target=TINY, opts=("--standby", "fork"),
                  env=quiet_env(PROCSV_FAULT="zygote:fork_stall:2", PROCSV_FAULT_GATE=gate))
    try:
        for lost in (1, 2):
            wait_for(lambda: len(_events(logdir, "zygote_ready")) >= lost, 120, what=f"zygote {lost} ready")
            zygote = _events(logdir, "zygote_ready")[-1]["pid"]
            while not proc_children(zygote):  # until its second fork is in flight, held at its intermediate
                trainers = wait_for(lambda: [e for e in _events(logdir, "spawned") if e["role"] == "trainer"], 120,
                                    what="a trainer")
                last, pid = max((e["attempt"], e["pid"]) for e in trainers)
                wait_for(lambda: [e for e in _events(logdir, "first_step") if e["pid"] == pid], 120,
                         what=f"attempt {last}'s first step")
                os.kill(pid, signal.SIGKILL)  # the next attempt is asked of this zygote
                wait_for(lambda: proc_children(zygote) or [e for e in _events(logdir, "spawned")
                                                           if e["role"] == "trainer" and e["attempt"] > last],
                         60, what=f"attempt {last + 1} forked or held")
            os.kill(zygote, signal.SIGKILL)
            wait_for(lambda: len(_events(logdir, "zygote_gone")) >= lost, 30, what=f"zygote {lost} given up")
        wait_for(lambda: not _zombies(proc.pid), 10, what="no zombie child of the watchdog")
    finally:
        proc.send_signal(signal.SIGTERM)
        code, out, err = finish(proc)
    assert code == 128 + signal.SIGTERM, err


@pytest.mark.slow
def test_an_intermediate_killed_after_it_forked_the_trainer_fails_the_fork_at_once(logdir, tmp_path):
    """Before: the trainer holds its end of the socket pair the intermediate says its pid on (it waits there
    for the zygote's EOF), so an intermediate killed between the trainer's fork and its pid (the OOM killer,
    an operator's kill) left the zygote blocked on a read that only the trainer's 30 s adoption wait could
    end: no reply, the fork given up at the 10 s limit instead of failed at once (10 s more down)."""
    gate = str(tmp_path / "gate")  # never made: the second fork's intermediate holds its pid
    proc = launch(logdir, "--steps", "100000", "--step-delay", "0.01", target=TINY, opts=("--standby", "fork"),
                  env=quiet_env(PROCSV_FAULT="zygote:pid_stall:2", PROCSV_FAULT_GATE=gate))
    try:
        wait_for(lambda: _events(logdir, "zygote_ready"), 120, what="the zygote to be ready")
        zygote = int(_events(logdir, "zygote_ready")[-1]["pid"])
        first = wait_role_pid(logdir, "trainer")
        wait_for(lambda: (raw_status(logdir) or {}).get("step", 0) > 20, 120, what="the first trainer's steps")
        os.kill(first, signal.SIGKILL)  # attempt 2 is asked of the zygote
        middle = wait_for(lambda: proc_children(zygote), 60, what="the fork's intermediate")[0]
        wait_for(lambda: proc_children(middle), 60, what="the trainer it forked (its pid held)")
        os.kill(middle, signal.SIGKILL)
        wait_for(lambda: _events(logdir, "zygote_gone"), 60, what="the zygote given up")
        wait_for(lambda: [e for e in _events(logdir, "spawned") if e["role"] == "trainer" and e["attempt"] == 2],
                 30, what="attempt 2 started fresh")
        step = (raw_status(logdir) or {}).get("step", 0)
        wait_for(lambda: (raw_status(logdir) or {}).get("step", 0) > step + 100, 120, what="100 more steps")
        assert raw_status(logdir)["restarts"] == 1, lifecycle(logdir)
    finally:
        proc.send_signal(signal.SIGTERM)
        code, out, err = finish(proc)
    assert code == 128 + signal.SIGTERM, err
    assert "did not answer the fork request" not in err, err  # the fork failed at the intermediate's death
    assert "pre-warmed trainer unavailable (fork failed" in err, err
