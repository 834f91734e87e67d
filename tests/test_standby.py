"""The hot standby: a second trainer that ran the program up to restoring, promoted on a death.

The rules are pure and driven with the decision function's simulator; the rest with real launches
of the digits example, real SIGKILLs (of the trainer, of the standby, several in a row), the
lifecycle log, and the final weights compared bit for bit with an uninterrupted run; a SIGUSR1 sent
to the standby by the test (anyone but the watchdog) promotes nothing.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from typing import Any, Iterator

import pytest

from procsv.trainer.standby import priority

from conftest import (CLEAN_ARGS, PROGRAMS, final_weights, finish, launch, lifecycle, quiet_env, raw_status, wait_for,
                      wait_role_pid)
from procsv.ipc.messages import StandbyReady
from procsv.watchdog import observe
from procsv.watchdog.rules import standby
from procsv.watchdog.rules.actions import Cause, Kill, Promote, Spawn, StandbyGone
from procsv.watchdog.rules.lifecycle import ProcState
from procsv.watchdog.rules.state import STANDBY, TRAINER, ZygoteState
from test_watchdog_decide import KILLED, Sim, of

ARGS = CLEAN_ARGS


# ---------------------------------------------------------------------------------------- pure
class StandbySim(Sim):
    """The simulator, with the executor's standby: forked for the trainer's next attempt."""

    def __init__(self) -> None:
        super().__init__(zygote=ZygoteState.READY)
        self.view.standby_ok = True

    def spawn(self, slot: str, role: str) -> None:
        if role == STANDBY:
            attempt = self.view.children[TRAINER].attempt + 1
            observe.spawned(self.view, STANDBY, STANDBY, attempt, next(self._pids), self.now, "zygote")
        else:
            super().spawn(slot, role)

    def tick(self, dt: float = 0.0, draw: float = 0.5):  # type: ignore[no-untyped-def]
        actions = super().tick(dt, draw)
        for a in actions:
            if isinstance(a, Kill) and a.slot == STANDBY:
                self.dies(STANDBY, KILLED)
        return actions

    def standby_ready(self) -> None:
        sb = self.view.children[STANDBY]
        observe.heard(self.view, StandbyReady(sb.pid, sb.attempt, 0.5), self.now)


def test_a_standby_is_prepared_only_after_the_trainers_first_step():
    sim = StandbySim()
    assert sim.tick() == [Spawn(TRAINER, TRAINER)]
    sim.ready()
    assert sim.tick(1.0) == []  # restored, no step yet: the start is not competed with
    sim.progress(1)
    assert sim.tick() == [Spawn(STANDBY, STANDBY)]
    sb = sim.view.children[STANDBY]
    assert sb.state == ProcState.STANDBY and sb.attempt == 2 and sim.view.trainers() == [sim.trainer]
    assert sim.tick(5.0) == []  # one at a time


def test_a_due_restart_promotes_a_ready_standby_to_the_next_attempt():
    sim = StandbySim()
    sim.start_trainer()
    sim.tick()
    sim.standby_ready()
    pid = sim.view.children[STANDBY].pid
    sim.dies(TRAINER, KILLED)
    actions = sim.tick(0.1) + sim.tick()
    assert Promote(STANDBY, 2) in actions and not of(actions, Spawn)
    assert sim.trainer.pid == pid and sim.trainer.attempt == 2 and sim.trainer.state == ProcState.STARTING
    assert STANDBY not in sim.view.children and sim.view.attempts[-1] is sim.trainer
    sim.ready()
    sim.progress(1)
    assert sim.tick() == [Spawn(STANDBY, STANDBY)] and sim.view.children[STANDBY].attempt == 3


def test_a_standby_not_ready_yet_is_replaced_by_a_fork():
    sim = StandbySim()
    sim.start_trainer()
    sim.tick()  # the standby is spawned, not ready
    sim.dies(TRAINER, KILLED)
    actions = sim.tick(0.1) + sim.tick()
    assert Kill(STANDBY, 2, Cause.STANDBY_UNREADY) in actions and Spawn(TRAINER, TRAINER) in actions
    assert sim.trainer.attempt == 2
    assert StandbyGone(STANDBY, 2, failed=False) in sim.tick()  # killed by the watchdog: no backoff


def test_a_standby_that_dies_on_its_own_is_replaced_after_a_backoff_and_then_given_up():
    sim = StandbySim()
    sim.start_trainer()
    for n in range(1, standby.GIVE_UP_AFTER + 1):
        assert of(sim.tick(60.0), Spawn) == [Spawn(STANDBY, STANDBY)]
        sim.dies(STANDBY, KILLED)
        assert of(sim.tick(), StandbyGone) == [StandbyGone(STANDBY, 2, failed=True)]
        assert sim.view.standby_after == sim.now + standby.backoff(n)
        assert sim.trainer.live  # the trainer is unaffected
    assert sim.tick(60.0) == []  # five in a row: restarts fork from the zygote from now on


def test_memory_allows_a_standby_beside_a_trainer_only_with_room_to_spare():
    ok, why = standby.memory_allows(300 << 20, 24 << 30)
    assert ok and "300 MiB" in why
    assert not standby.memory_allows(4 << 30, 8 << 30)[0]  # 2 x 4 GiB + 1 GiB > 8 GiB


def test_memory_allows_a_standby_group_for_the_whole_group_and_says_it_is_the_groups_size():
    # a standby group is --nproc more trainers: the rule weighs the group's size (the chief's times N), and
    # its line says so (before: "the trainer uses 715 MiB" for two trainers of 358 MiB each)
    ok, why = standby.memory_allows(358 << 20, 24 << 30, 2)
    assert ok and why.startswith("the group's 2 trainers use 716 MiB (358 MiB the chief) and 24.0 GiB"), why
    assert "twice the group's size plus 1 GiB" in why
    assert not standby.memory_allows(2 << 30, 8 << 30, 2)[0]  # 2 x (2 x 2 GiB) + 1 GiB > 8 GiB
    assert standby.memory_allows(2 << 30, 8 << 30, 1)[0]


# ---------------------------------------------------------------------------------------- the wait alone
WAIT = os.path.join(PROGRAMS, "standby_wait.py")


def _sigusr1_from_another_process(pid: int) -> int:
    """Send ``pid`` a SIGUSR1 from a new process (a user's ``kill -USR1``); that process's pid."""
    sender = subprocess.Popen([sys.executable, "-c", f"import os; os.kill({pid}, {int(signal.SIGUSR1)})"])
    assert sender.wait(30) == 0
    return sender.pid


def _text(path: str) -> str:
    with open(path) as fh:
        return fh.read()


def _waiting_standby(out: str) -> int:
    """The standby's pid once it waits to be promoted."""
    def pid() -> int:
        text = _text(out)
        return int(text.split()[1]) if "waiting to be promoted" in text else 0
    return wait_for(pid, 30, what="the standby waiting")


@contextlib.contextmanager
def _standby_wait(tmp_path: Any, mode: str) -> Iterator[tuple[subprocess.Popen, str]]:
    """``standby_wait.py MODE`` started in a session of its own, its output in a file: the process
    and that file's path; killed (its whole session) if still running at the end."""
    out = str(tmp_path / "out")
    with open(out, "w") as fh:
        proc = subprocess.Popen([sys.executable, WAIT, mode], stdout=fh, stderr=subprocess.STDOUT,
                                env=quiet_env(), start_new_session=True)
    try:
        yield proc, out
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_a_forked_standby_is_promoted_by_its_zygotes_parent_alone(tmp_path):
    with _standby_wait(tmp_path, "forked") as (proc, out):
        pid = _waiting_standby(out)
        other = _sigusr1_from_another_process(pid)
        wait_for(lambda: f"procsv standby: SIGUSR1 from pid {other} ignored: a standby is promoted only by the "
                         f"watchdog (pid {os.getpid()})" in _text(out), 30, what="the ignored line")
        assert proc.poll() is None and "promoted from standby" not in _text(out)  # still waiting
        os.kill(pid, signal.SIGUSR1)  # from the zygote's parent: the watchdog
        assert proc.wait(30) == 0
    text = _text(out)
    assert "procsv: promoted from standby" in text and text.rstrip().endswith("promoted"), text


def test_a_standby_not_forked_by_a_zygote_is_promoted_by_anyone_as_before(tmp_path):
    with _standby_wait(tmp_path, "plain") as (proc, out):
        _sigusr1_from_another_process(_waiting_standby(out))
        assert proc.wait(30) == 0
    text = _text(out)
    assert "procsv: promoted from standby" in text and "ignored" not in text, text


# ---------------------------------------------------------------------------------------- real runs
def _events(logdir: str, name: str) -> list[dict]:
    return [e for e in lifecycle(logdir) if e["event"] == name]


@pytest.mark.slow
def test_a_killed_trainer_is_replaced_by_its_standby_then_by_a_fork_exactly(logdir, clean_weights):
    proc = launch(logdir, *ARGS, opts=("--standby", "hot"), env=quiet_env(PROCSV_MEMORY_SNAPSHOTS="0.01"))
    try:
        ready = wait_for(lambda: _events(logdir, "standby_ready"), 120, what="a ready standby")[0]
        first = wait_role_pid(logdir, "trainer")
        os.kill(first, signal.SIGKILL)
        promoted = wait_for(lambda: [e for e in _events(logdir, "spawned") if e.get("via") == "standby"], 60,
                            what="the promotion")[0]
        assert promoted["pid"] == ready["pid"] and promoted["attempt"] == 2
        # killed again right after its first step, before the next standby is ready: a fork replaces it
        wait_for(lambda: [e for e in _events(logdir, "first_step") if e["pid"] == promoted["pid"]], 60,
                 what="the promoted trainer's first step")
        os.kill(promoted["pid"], signal.SIGKILL)
    finally:
        code, out, err = finish(proc)
    assert code == 0, err
    spawned = [e for e in _events(logdir, "spawned") if e["role"] == "trainer"]
    assert [(e["attempt"], e["via"]) for e in spawned][:3] == [(1, "zygote"), (2, "standby"), (3, "zygote")]
    assert raw_status(logdir)["restarts"] == 2
    assert final_weights(logdir).keys() == clean_weights.keys()
    for key, value in final_weights(logdir).items():
        assert (value == clean_weights[key]).all(), f"{key} differs from the uninterrupted run"


@pytest.mark.slow
def test_a_promoted_standby_traced_its_step_while_it_waited(logdir):
    # the digits example asks for it with Supervisor.warm_up(train_step, <a batch>)
    proc = launch(logdir, "--steps", "400", "--step-delay", "0.01", opts=("--standby", "hot"))
    try:
        ready = wait_for(lambda: _events(logdir, "standby_ready"), 120, what="a ready standby")[0]
        waiting = _thread_policies(ready["pid"])  # prepared, and waiting, at idle CPU priority
        os.kill(wait_role_pid(logdir, "trainer"), signal.SIGKILL)
        wait_for(lambda: len(_events(logdir, "first_step")) >= 2, 60, what="the promoted standby's first step")
        promoted_policies = _thread_policies(ready["pid"])
    finally:
        code, out, err = finish(proc)
    assert code == 0, err
    if priority.reversible():  # root or CAP_SYS_NICE (the test's own rights are the launch's)
        assert set(waiting.values()) == {os.SCHED_IDLE} and len(waiting) > 1, waiting
    else:
        assert set(waiting.values()) == {os.SCHED_OTHER}, waiting
    assert set(promoted_policies.values()) == {os.SCHED_OTHER}, promoted_policies  # every thread, TF's too
    promoted = [e for e in _events(logdir, "spawned") if e.get("via") == "standby"]
    assert [e["pid"] for e in promoted] == [ready["pid"]]
    with open(os.path.join(logdir, "logs", "trainer.2.log")) as fh:
        log = fh.read()
    # traced once, before its first step: at prepare, which a standby reaches before it waits
    assert "finished 400 steps" in log and "traced train_step 1 time(s), 1 before its first step" in log, log
    # and ran once on shadow copies of its variables, so that its first step found its kernels made
    assert "standby ran train_step once on shadow copies of its variables" in log, log


@pytest.mark.slow
def test_killing_the_standby_prepares_another_and_only_the_watchdog_promotes_it(logdir):
    # steps of 20 ms: every wait here is on an event (two standbys' readiness at idle priority, a line,
    # a step more, a first step), and the trainer trains all that while: fewer steps meanwhile
    proc = launch(logdir, "--steps", "100000", "--step-delay", "0.02", opts=("--standby", "hot"))
    try:
        ready = wait_for(lambda: _events(logdir, "standby_ready"), 120, what="a ready standby")[0]
        trainer = wait_role_pid(logdir, "trainer")
        os.kill(ready["pid"], signal.SIGKILL)
        again = wait_for(lambda: _events(logdir, "standby_ready")[1:], 60, what="a second standby")[0]
        assert again["pid"] != ready["pid"] and again["attempt"] == 2  # still prepared for attempt 2
        st = raw_status(logdir)
        assert st["restarts"] == 0 and wait_role_pid(logdir, "trainer") == trainer
        os.kill(trainer, 0)  # alive

        # a SIGUSR1 from anyone but the watchdog (kill -USR1, scancel --signal=USR1, systemd's to every
        # process): before, the standby took it for its promotion and trained beside the trainer
        os.kill(again["pid"], signal.SIGUSR1)
        ignored = f"procsv standby: SIGUSR1 from pid {os.getpid()} ignored: a standby is promoted only by the watchdog"
        log = os.path.join(logdir, "logs", "trainer.2.log")
        wait_for(lambda: ignored in _text(log), 30, what="the standby's line for the ignored SIGUSR1")
        step = raw_status(logdir)["step"]
        st = wait_for(lambda: (s := raw_status(logdir)) and s["step"] > step and s, 30, what="the trainer stepping on")
        procs = {p["role"]: p["pid"] for p in st["processes"]}
        assert procs["trainer"] == trainer and again["pid"] not in procs.values(), procs  # (status lists no standby)
        assert st["restarts"] == 0 and not [e for e in _events(logdir, "spawned") if e.get("via") == "standby"]
        os.kill(again["pid"], 0)  # still there, a standby: the last word of the events on it is its readiness
        assert [e["event"] for e in lifecycle(logdir) if e.get("pid") == again["pid"]][-1] == "standby_ready"
        # the watchdog's own promotion still works: that same standby replaces the killed trainer and trains
        os.kill(trainer, signal.SIGKILL)
        promoted = wait_for(lambda: [e for e in _events(logdir, "spawned") if e.get("via") == "standby"], 60,
                            what="the promotion")
        assert [(e["pid"], e["attempt"]) for e in promoted] == [(again["pid"], 2)]
        wait_for(lambda: [e for e in _events(logdir, "first_step") if e["pid"] == again["pid"]], 60,
                 what="the promoted standby's first step")
    finally:
        proc.send_signal(signal.SIGTERM)
        code, out, err = finish(proc)
    assert code == 128 + signal.SIGTERM, err
    assert raw_status(logdir)["restarts"] == 1  # the watchdog's promotion alone
    assert "the standby trainer" in err  # its end was said, with a backoff
    gone = [e for e in _events(logdir, "exited") if e["pid"] in (ready["pid"], again["pid"])]
    assert len(gone) == 2  # both reaped: the second one at the end of the run, nothing left behind


def _thread_policies(pid: int) -> dict[int, int]:
    """The scheduling policy of each thread of process ``pid``."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            out[int(tid)] = os.sched_getscheduler(int(tid))
        except OSError:
            pass
    return out


@pytest.mark.slow
def test_a_run_that_ended_does_not_echo_its_standbys_preparation_lines(logdir):
    # before: the standby, killed once the run had finished, was echoed at its reap as
    # "[trainer.2] procsv: standby preparing ..." after "procsv: trainer finished", which read as
    # if a new trainer had started
    code, out, err = finish(launch(logdir, "--steps", "300", "--step-delay", "0.01", opts=("--standby", "hot")), 300)
    assert code == 0, err
    assert _events(logdir, "standby_ready"), "the run ended before its standby was ready: make it longer"
    lines = out.splitlines()
    end = [i for i, line in enumerate(lines) if line.startswith("procsv: trainer finished at step 300")]
    assert end and lines[end[0] + 1:] == [], lines[end[0]:]  # the last line
    assert "standby" not in out + err
    with open(os.path.join(logdir, "logs", "trainer.2.log")) as fh:  # what it said is still in its log
        assert "standby ready after" in fh.read()


@pytest.mark.slow
def test_a_promoted_standbys_own_traceback_is_in_the_giving_up_message(logdir):
    # the view keeps a promoted standby's history, but it runs and writes its error file as the
    # trainer's attempt (trainer.2.error.json), which is where the watchdog reads it
    proc = launch(logdir, "--steps", "100000", "--step-delay", "0.02", "--raise-at-step", "600",
                  target=os.path.join(PROGRAMS, "tiny_train.py"), opts=("--standby", "hot", "--max-restarts", "1"))
    try:
        ready = wait_for(lambda: _events(logdir, "standby_ready"), 120, what="a ready standby")[0]
        assert (raw_status(logdir) or {}).get("step", 0) < 600
        os.kill(wait_role_pid(logdir, "trainer"), signal.SIGKILL)  # failure 1: the standby takes over
    finally:
        code, out, err = finish(proc, 300)  # it fails at step 600 in turn: failure 2, the run gives up
    assert code == 1, err
    promoted = {e["attempt"]: e["pid"] for e in _events(logdir, "spawned") if e.get("via") == "standby"}
    failed = {e["attempt"] for e in _events(logdir, "exited") if e["role"] == "trainer" and e.get("code") == 1}
    judged = failed & set(promoted)  # promoted standbys that failed on their own, at step 600
    assert judged, (promoted, failed)
    for n in judged:  # its error file was found and read: the line of its exit names its error
        assert os.path.exists(os.path.join(logdir, "logs", f"trainer.{n}.error.json"))
        # (a second standby, ready before step 600 at load, is promoted at the first failure, restores step 599
        # and fails at once: its line says it failed before completing a step, and still names its error)
        assert re.search(rf"trainer attempt {n} \(pid {promoted[n]}\) exited with code 1( before completing a step)?: "
                         r"ValueError: bad batch at step 600", err), err
    giving_up = err[err.index("procsv: giving up"):]
    assert "ValueError: bad batch at step 600" in giving_up and "Traceback" in giving_up, giving_up


@pytest.mark.slow
def test_a_stopped_zygote_delays_no_exit_and_costs_no_live_trainer(logdir):
    """A forked process's exit status came from the zygote that forked it, so a stopped or slow
    zygote delayed it, and past 2 s without it the watchdog killed the zygote and with it every live
    trainer it had forked (an unasked restart). Since issue 51 the watchdog is every forked
    process's parent and reaps it itself. Here the zygote is stopped (SIGSTOP): (1) the standby is
    SIGKILLed: it is reaped while the zygote is stopped, the trainer trains on, nothing restarts;
    (2) once the zygote has run again and a new standby is ready, the trainer is SIGKILLed: the
    standby is promoted and trains on, one restart, and the killed trainer is reaped while the
    zygote is stopped. The zygote is never given up (it runs again before a fork asked of it is due)."""
    proc = launch(logdir, "--steps", "100000", "--step-delay", "0.01", target=os.path.join(PROGRAMS, "tiny_train.py"),
                  opts=("--standby", "hot"))
    zygote = 0

    def trains_on() -> None:
        step = (raw_status(logdir) or {}).get("step", 0)
        wait_for(lambda: (raw_status(logdir) or {}).get("step", 0) > step + 300, 120, what="300 more steps")
        assert not _events(logdir, "zygote_gone"), _events(logdir, "zygote_gone")

    def reaped(pid: int) -> list[dict]:
        return [e for e in _events(logdir, "exited") if e["pid"] == pid]

    try:
        ready = wait_for(lambda: _events(logdir, "standby_ready"), 120, what="a ready standby")[0]
        zygote = next(e["pid"] for e in _events(logdir, "spawned") if e["role"] == "zygote")
        trainer = wait_role_pid(logdir, "trainer")
        os.kill(zygote, signal.SIGSTOP)  # alive, but it does nothing now
        os.kill(ready["pid"], signal.SIGKILL)
        wait_for(lambda: reaped(ready["pid"]), 60, what="the standby reaped while the zygote is stopped")
        assert wait_role_pid(logdir, "trainer") == trainer and raw_status(logdir)["restarts"] == 0
        os.kill(zygote, signal.SIGCONT)
        trains_on()
        assert wait_role_pid(logdir, "trainer") == trainer and raw_status(logdir)["restarts"] == 0
        nxt = wait_for(lambda: _events(logdir, "standby_ready")[1:], 120, what="the next standby")[0]
        assert [e["pid"] for e in _events(logdir, "exited") if e["role"] == "standby"] == [ready["pid"]]

        os.kill(zygote, signal.SIGSTOP)
        os.kill(trainer, signal.SIGKILL)
        wait_for(lambda: [e for e in _events(logdir, "spawned") if e.get("via") == "standby"], 60, what="the promotion")
        wait_for(lambda: reaped(trainer), 60, what="the killed trainer reaped while the zygote is stopped")
        os.kill(zygote, signal.SIGCONT)
        zygote = 0
        trains_on()
        assert wait_role_pid(logdir, "trainer") == nxt["pid"] and raw_status(logdir)["restarts"] == 1
    finally:
        if zygote:
            os.kill(zygote, signal.SIGCONT)
        proc.send_signal(signal.SIGTERM)
        code, out, err = finish(proc)
    assert code == 128 + signal.SIGTERM, err
    assert "did not report the exit" not in err and not _events(logdir, "zygote_gone")
    assert raw_status(logdir)["restarts"] == 1
    trainers = [(e["pid"], e.get("code"), e.get("signal")) for e in _events(logdir, "exited") if e["role"] == "trainer"]
    assert trainers == [(trainer, None, "SIGKILL"), (nxt["pid"], 42, None)], trainers
