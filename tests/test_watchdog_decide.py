"""The watchdog's decision function with a fake clock and scripted observations (no process runs).

Each test plays what the watchdog would observe -- spawns, progress, commits, deaths, signals --
into a :class:`RunView` through the real observation functions, advances a fake monotonic clock,
and checks the actions :func:`decide` returns. A small simulator stands in for the executor: it
notes each action in the view (:func:`note`) and turns a ``Spawn`` into a spawned observation.
"""

from __future__ import annotations

import itertools
import signal
from typing import Optional

import pytest

from procsv.ipc.messages import (Hello, NonfiniteDetected, Progress, SaveOverdue, SaveResult, ServiceLoading,
                                 TrainerReady)
from procsv.watchdog import observe
from procsv.watchdog.publish import recovery
from procsv.watchdog.publish.events import Event, Report
from procsv.watchdog.rules.actions import (Action, ArmChaos, TakeStacks, Cause, Finish, GiveUp, GiveUpService, Kill,
                                     Promote, RespawnService, Restart, Settle, Signal, SkipChaos, Spawn, StopFailing)
from procsv.watchdog.rules.chaos import parse_chaos
from procsv.watchdog.rules.bookkeeping import note
from procsv.watchdog.rules.decide import Limits, decide
from procsv.watchdog.rules.failures import ChildError, ExitReport, Failure
from procsv.watchdog.rules.hang import IDLE_CPU, IDLE_IO, SAMPLE_GAP, HangLimits, looks_kept, stuck_reason
from procsv.watchdog.rules.lifecycle import ProcState, RunState
from procsv.watchdog.rules.policy import RestartPolicy
from procsv.watchdog.rules.state import CHECKPOINT, SUMMARY, TRAINER, Activity, RunView, ZygoteState

KILLED = -signal.SIGKILL


class Sim:
    """A fake executor and a fake clock around the real view, observations and decisions."""

    def __init__(self, limits: Optional[Limits] = None, zygote: ZygoteState = ZygoteState.OFF,
                 chaos_delay: float = 5.0) -> None:
        self.limits = limits or Limits(hang=HangLimits(None, None))
        self.now = 0.0
        self.view = RunView(launch_start=0.0, zygote=zygote)
        self.view.chaos_next_delay = chaos_delay
        self.chaos_delay = chaos_delay
        self._pids = itertools.count(100)
        self.services_say_hello = True  # a spawned service is ready at once (its import takes no time here)
        for role in (SUMMARY, CHECKPOINT):
            self.spawn(role, role)
        self.view.restart_at = 0.0
        self.log: list[Action] = []
        self.stacks_back = True  # the stacks a hang asks for come back at once (False: never)

    # -- the executor's part
    def spawn(self, slot: str, role: str) -> None:
        prev = self.view.children.get(slot)
        observe.spawned(self.view, slot, role, prev.attempt + 1 if prev else 1, next(self._pids), self.now, "fresh")
        if role in (SUMMARY, CHECKPOINT) and self.services_say_hello:
            self.hello(role)

    def hello(self, role: str) -> None:
        c = self.view.children[role]
        observe.heard(self.view, Hello(role, c.pid, c.attempt), self.now)

    def tick(self, dt: float = 0.0, draw: float = 0.5) -> list[Action]:
        """Decide at ``dt`` later and perform the actions. The stacks a hang asks for are back at once
        (``stacks_back``: taking them takes no time here), and the round decides again, as the
        launcher's does when an action made another due."""
        self.now += dt
        actions = decide(self.view, self.now, self.limits, draw)
        for action in actions:
            note(self.view, action, self.now, self.limits)
            if isinstance(action, Spawn):
                self.spawn(action.slot, action.role)
            elif isinstance(action, RespawnService):
                self.spawn(action.slot, action.slot)
            elif isinstance(action, ArmChaos):
                self.view.chaos_next_delay = self.chaos_delay
            elif isinstance(action, TakeStacks) and self.stacks_back:
                observe.stacks_back(self.view, action.slot, action.attempt, {action.slot: "in f (x.py:1)"}, "", "/x.stacks.txt")
        self.log += actions
        if any(isinstance(a, TakeStacks) for a in actions):
            return actions + self.tick(0.0, draw)
        return actions

    # -- what the children do
    @property
    def trainer(self):  # type: ignore[no-untyped-def]
        return self.view.children[TRAINER]

    def ready(self, step: int = 0, save_secs: Optional[float] = None, save_steps: Optional[int] = None) -> None:
        t = self.trainer
        observe.heard(self.view, TrainerReady(t.pid, t.attempt, step, "ckpt" if step else None, 0.1, [],
                                              save_secs, save_steps), self.now)

    def progress(self, step: int, busy: str = "", stepped: bool = True) -> list[Report]:
        """A Progress of ``step`` (``stepped``: its session completed a step; False before any)."""
        return observe.heard(self.view, Progress(self.trainer.pid, step, 0.0, busy, stepped), self.now)

    def train(self, secs: float, every: float = 0.1) -> list[Action]:
        """``secs`` of training: every ``every`` s a step completes (its Progress), then the round decides; the
        actions of all of them."""
        out: list[Action] = []
        end = self.now + secs
        while self.now < end - 1e-9:
            self.now += min(every, end - self.now)
            self.progress(self.trainer.step + 1)
            out += self.tick()
        return out

    def commit(self, step: int) -> None:
        observe.heard(self.view, SaveResult(step, "periodic", True, f"model.ckpt-{step}", None, 0.1), self.now)

    def dies(self, slot: str, code: int, preempted: bool = False) -> None:
        """``slot`` exited with ``code``; ``preempted``: its exit report says a stop signal stopped it
        and its checkpoint committed (a trainer's 42 is a preemption only with it)."""
        c = self.view.children[slot]
        failure = Failure(c.role, c.attempt, c.pid, code, 0.0, "log",
                          exit_report=ExitReport("SIGTERM", 2) if preempted else None)
        observe.reaped(self.view, slot, c.attempt, failure, self.now)

    def notice(self) -> None:
        t = self.trainer
        observe.death_noticed(self.view, TRAINER, t.attempt, self.now, 0.0)

    def start_trainer(self, steps: int = 1) -> None:
        """Spawn (due now), restore, complete ``steps`` steps."""
        assert any(isinstance(a, Spawn) for a in self.tick())
        self.ready()
        for s in range(1, steps + 1):
            self.progress(s)


def of(actions: list[Action], kind: type) -> list[Action]:
    return [a for a in actions if isinstance(a, kind)]


def test_a_run_starts_its_trainer_at_once_without_a_zygote():
    sim = Sim()
    assert sim.tick() == [Spawn(TRAINER, TRAINER)]
    assert sim.tick() == []  # nothing new observed: nothing new to do
    assert sim.trainer.attempt == 1 and sim.trainer.state == ProcState.STARTING


def test_the_first_trainer_waits_for_the_zygote_then_starts_fresh_when_it_is_lost():
    sim = Sim(zygote=ZygoteState.WARMING)
    assert sim.tick() == [] and sim.tick(60.0) == []
    observe.zygote_changed(sim.view, ZygoteState.LOST, 7)
    assert sim.tick(0.01) == [Spawn(TRAINER, TRAINER)]


def test_the_zygote_wait_is_bounded():
    sim = Sim(zygote=ZygoteState.WARMING)
    assert sim.tick(119.0) == []
    assert sim.tick(1.5) == [Spawn(TRAINER, TRAINER)]


def test_a_crash_after_progress_restarts_at_once_then_backs_off_exponentially():
    sim = Sim()
    sim.start_trainer(steps=5)
    sim.commit(5)
    sim.dies(TRAINER, KILLED)
    restart = of(sim.tick(1.0), Restart)
    assert len(restart) == 1 and restart[0].delay == 0.0  # progress since the start: no backoff
    assert sim.tick() == [Spawn(TRAINER, TRAINER)] and sim.trainer.attempt == 2
    delays = []
    for _ in range(4):  # now it fails after steps but without a checkpoint: 1 s, 2 s, 4 s, 8 s
        sim.ready()
        sim.progress(1)
        sim.dies(TRAINER, 1)
        (r,) = of(sim.tick(draw=0.5), Restart)
        delays.append(r.delay)
        assert sim.tick(r.delay - 0.01) == []  # not yet
        assert sim.tick(0.02) == [Spawn(TRAINER, TRAINER)]
    assert delays == [1.0, 2.0, 4.0, 8.0]
    assert sim.view.history.restarts == 5


def test_a_checkpoint_resets_the_failure_count_so_max_restarts_is_never_hit():
    sim = Sim(Limits(restart=RestartPolicy(max_restarts=1), hang=HangLimits(None, None)))
    sim.start_trainer()
    for k in range(6):
        sim.commit(10 * (k + 1))
        sim.dies(TRAINER, KILLED)
        (r,) = of(sim.tick(), Restart)
        assert r.delay == 0.0
        sim.tick()
        sim.ready(10 * (k + 1))
        sim.progress(10 * (k + 1) + 1)
    assert sim.view.run == RunState.RUNNING and sim.view.history.restarts == 6


def test_too_many_failures_without_progress_give_up():
    sim = Sim(Limits(restart=RestartPolicy(max_restarts=2), hang=HangLimits(None, None)))
    sim.start_trainer()
    actions: list[Action] = []
    for _ in range(3):
        sim.dies(TRAINER, 1)
        actions = sim.tick(100.0)
        if of(actions, GiveUp):
            break
        sim.tick(100.0)
        sim.ready()
        sim.progress(1)
    (g,) = of(actions, GiveUp)
    assert "--max-restarts 2" in g.reason
    assert sim.view.run == RunState.FAILED and sim.view.exit_code == 1 and sim.view.finishing


def test_two_deaths_before_a_first_step_are_a_startup_failure():
    sim = Sim()
    assert of(sim.tick(), Spawn)
    sim.dies(TRAINER, 1)
    (r,) = of(sim.tick(), Restart)
    sim.tick(r.delay)
    sim.dies(TRAINER, 1)
    (g,) = of(sim.tick(), GiveUp)
    assert "start-up failure" in g.reason and sim.view.exit_code == 1


def test_a_death_notice_restarts_before_the_reap_and_the_reap_only_reports():
    sim = Sim()
    sim.start_trainer(steps=3)
    sim.commit(3)
    first = sim.trainer
    sim.notice()
    (r,) = of(sim.tick(), Restart)
    assert r.early and first.settled_early
    assert sim.tick() == [Spawn(TRAINER, TRAINER)] and sim.trainer.attempt == 2  # the old one is not reaped yet
    reports = observe.reaped(sim.view, TRAINER, 1, Failure(TRAINER, 1, first.pid, KILLED, 0.0, "log"), sim.now)
    assert any("restarted" in r.say for r in reports) and first.exit_code == KILLED
    assert sim.tick() == []  # the reap decides nothing more


def test_a_death_notice_during_a_stop_waits_for_the_exit_status():
    sim = Sim()
    sim.start_trainer()
    observe.stop_requested(sim.view, signal.SIGTERM, sim.now, 120.0)
    assert of(sim.tick(), Signal) == [Signal(TRAINER, 1, signal.SIGTERM, Cause.STOP)]
    sim.notice()
    assert sim.tick() == []  # a stop is not a restart: the exit status tells how it ended
    sim.dies(TRAINER, 42, preempted=True)
    (f,) = of(sim.tick(), Finish)
    assert f.run == RunState.STOPPED and f.exit_code == 128 + signal.SIGTERM


@pytest.mark.parametrize("code, preempted, saved", [(42, True, True), (0, False, True), (1, False, False),
                                                    (42, False, False), (KILLED, False, False)],
                         ids=["saved_42", "finished_0", "unsaved_1", "42_without_report", "killed_at_grace"])
def test_a_stop_ends_128_plus_the_signal_only_when_the_last_step_is_saved(code, preempted, saved):
    """Issue 51, point 3: 128+N tells a scheduler "stopped in order, nothing lost" (a Kubernetes
    podFailurePolicy ignores 143). A stop whose trainer exited 1 (its emergency checkpoint did not
    commit), 42 without its exit report, or was SIGKILLed at the grace ends with 1."""
    sim = Sim()
    sim.start_trainer(steps=3)
    observe.stop_requested(sim.view, signal.SIGTERM, sim.now, 120.0)
    assert of(sim.tick(), Signal) == [Signal(TRAINER, 1, signal.SIGTERM, Cause.STOP)]
    sim.dies(TRAINER, code, preempted=preempted)
    (f,) = of(sim.tick(), Finish)
    assert f.run == RunState.STOPPED
    assert (f.exit_code, f.unsaved) == ((128 + signal.SIGTERM, False) if saved else (1, True))
    assert sim.view.exit_code == f.exit_code


def test_a_stop_whose_preempted_checkpoint_committed_ends_128_plus_the_signal_though_killed_at_the_grace():
    """A program that outlives the grace after its stop's checkpoint committed (a slow teardown after
    the Supervisor's block) is SIGKILLed, and lost nothing: not exit 1 with 'did not commit'."""
    sim = Sim()
    sim.start_trainer(steps=3)
    observe.stop_requested(sim.view, signal.SIGTERM, sim.now, 120.0)
    assert of(sim.tick(), Signal) == [Signal(TRAINER, 1, signal.SIGTERM, Cause.STOP)]
    observe.heard(sim.view, SaveResult(3, "preempted", True, "model.ckpt-3", None, 0.1), sim.now)
    sim.dies(TRAINER, KILLED)
    (f,) = of(sim.tick(), Finish)
    assert (f.exit_code, f.unsaved) == (128 + signal.SIGTERM, False)


def test_a_stop_before_the_first_step_loses_nothing_and_ends_128_plus_the_signal():
    sim = Sim()
    assert any(isinstance(a, Spawn) for a in sim.tick())
    sim.ready()
    observe.stop_requested(sim.view, signal.SIGTERM, sim.now, 120.0)
    sim.tick()
    sim.dies(TRAINER, -signal.SIGTERM)
    (f,) = of(sim.tick(), Finish)
    assert (f.exit_code, f.unsaved) == (128 + signal.SIGTERM, False)


def test_a_preempted_trainer_restarts_at_once_without_counting_a_failure():
    sim = Sim()
    sim.start_trainer(steps=2)
    sim.dies(TRAINER, 42, preempted=True)  # its exit report: SIGTERM, checkpoint committed
    (r,) = of(sim.tick(), Restart)
    assert r.preempted and r.delay == 0.0 and sim.view.history.failures_without_progress == 0


def test_a_42_the_program_returns_itself_is_a_failure_with_backoff_and_the_restart_limit():
    # issue 38, point 2: sys.exit(42) / os._exit(42) without a stop signal and a procsv commit wrote
    # no exit report; it used to restart at once with the counts reset, forever
    sim = Sim(Limits(restart=RestartPolicy(max_restarts=3, jitter=0.0), hang=HangLimits(None, None)))
    delays = []
    sim.start_trainer(steps=2)
    for attempt in range(1, 4):
        sim.dies(TRAINER, 42)
        (r,) = of(sim.tick(), Restart)
        assert not r.preempted
        delays.append(r.delay)
        sim.now += r.delay
        sim.start_trainer(steps=2)
    assert delays == [0.0, 1.0, 2.0]
    assert "exited with code 42 of its own, not as a preemption" in sim.view.last_error
    sim.dies(TRAINER, 42)
    (g,) = of(sim.tick(), GiveUp)
    assert "the restart limit" in g.reason and "--max-restarts 3" in g.reason


def test_a_42_before_the_first_step_without_an_exit_report_is_a_start_up_failure():
    sim = Sim()
    assert of(sim.tick(), Spawn)
    sim.dies(TRAINER, 42)
    assert not of(sim.tick(), Restart)[0].preempted
    assert of(sim.tick(), Spawn)
    sim.dies(TRAINER, 42)
    (g,) = of(sim.tick(), GiveUp)
    assert "start-up failure rule" in g.reason and "on its own" in g.reason


def test_sigkills_before_the_first_step_are_not_start_up_failures_they_back_off_to_the_restart_limit():
    # issue 38, point 4: kills from outside (the OOM killer, a flapping node) that land before the
    # restarted trainer's first step used to end the run as "a start-up failure" after two
    sim = Sim(Limits(restart=RestartPolicy(max_restarts=4, jitter=0.0), hang=HangLimits(None, None)))
    sim.start_trainer(steps=3)
    sim.dies(TRAINER, KILLED)
    delays = [of(sim.tick(), Restart)[0].delay]
    for _ in range(3):
        assert of(sim.tick(delays[-1]), Spawn)
        sim.ready(step=0)
        sim.notice()  # the death notice comes before the exit status: no verdict yet
        assert sim.tick() == []
        sim.dies(TRAINER, KILLED)
        (r,) = of(sim.tick(), Restart)
        delays.append(r.delay)
        assert sim.view.history.startup_failures_in_a_row == 0
    assert delays == [0.0, 1.0, 2.0, 4.0]
    assert of(sim.tick(delays[-1]), Spawn)
    sim.dies(TRAINER, -signal.SIGTERM)
    (g,) = of(sim.tick(), GiveUp)
    assert "the restart limit" in g.reason and "start-up" not in g.reason


def test_a_kill_between_two_own_start_up_failures_does_not_break_the_row_nor_count():
    sim = Sim()
    assert of(sim.tick(), Spawn)
    sim.dies(TRAINER, 1)
    assert of(sim.tick(), Restart) and of(sim.tick(), Spawn)
    sim.dies(TRAINER, KILLED)
    assert of(sim.tick(), Restart) and sim.view.history.startup_failures_in_a_row == 1
    assert of(sim.tick(5.0), Spawn)
    sim.dies(TRAINER, -signal.SIGSEGV)  # its own fault
    (g,) = of(sim.tick(), GiveUp)
    assert "start-up failure rule" in g.reason


def test_a_hang_kill_before_the_first_step_is_still_a_start_up_failure():
    sim = Sim(Limits(hang=HangLimits(10.0, 5.0), hang_grace_secs=1.0))
    for attempt in (1, 2):
        assert of(sim.tick(), Spawn)
        assert of(sim.tick(5.5), Signal)
        assert of(sim.tick(1.5), Kill)
        sim.dies(TRAINER, KILLED)
        actions = sim.tick()
    (g,) = of(actions, GiveUp)
    assert "start-up failure rule" in g.reason


def test_a_death_notice_before_the_first_step_with_an_error_file_restarts_early_as_its_own_failure():
    sim = Sim()
    assert of(sim.tick(), Spawn)
    observe.death_noticed(sim.view, TRAINER, 1, sim.now, 0.0, ChildError("RuntimeError", "", "", "run"))
    (r,) = of(sim.tick(), Restart)
    assert r.early and r.history.startup_failures_in_a_row == 1


def test_exit_zero_finishes_the_run_and_the_services_are_stopped_then_killed():
    sim = Sim(Limits(stop_grace_secs=10.0, hang=HangLimits(None, None)))
    sim.start_trainer()
    for role in (SUMMARY, CHECKPOINT):
        observe.heard(sim.view, Hello(role, sim.view.children[role].pid, 1), sim.now)
    sim.dies(TRAINER, 0)
    (f,) = of(sim.tick(), Finish)
    assert f.run == RunState.SUCCEEDED and sim.view.exit_code == 0
    stops = sim.tick()
    assert {(a.slot, a.sig) for a in of(stops, Signal)} == {(SUMMARY, signal.SIGTERM), (CHECKPOINT, signal.SIGTERM)}
    sim.dies(SUMMARY, 0)
    assert of(sim.tick(), Settle) == [Settle(SUMMARY, 1)]
    assert sim.tick(1.9) == []
    # again, every stop_resend_secs: a job-wide SIGTERM still pending in it would have swallowed the first
    assert sim.tick(0.1) == [Signal(CHECKPOINT, 1, signal.SIGTERM, Cause.SHUTDOWN)]
    assert sim.tick(7.9) == [Signal(CHECKPOINT, 1, signal.SIGTERM, Cause.SHUTDOWN)]
    assert sim.tick(0.2) == [Kill(CHECKPOINT, 1, Cause.SHUTDOWN)]  # min(stop grace, 30 s) passed
    assert sim.tick(1.0) == []  # killed once; its reap ends it
    sim.dies(CHECKPOINT, KILLED)
    assert sim.tick() == [Settle(CHECKPOINT, 1)] and not sim.view.live_children()


def test_stop_grace_escalates_to_sigkill_and_a_second_interrupt_kills_at_once():
    sim = Sim(Limits(stop_grace_secs=5.0, hang=HangLimits(None, None)))
    sim.start_trainer()
    observe.stop_requested(sim.view, signal.SIGTERM, sim.now, 5.0)
    assert of(sim.tick(), Signal) == [Signal(TRAINER, 1, signal.SIGTERM, Cause.STOP)]
    assert sim.tick(4.9) == []
    assert sim.tick(0.2) == [Kill(TRAINER, 1, Cause.STOP_GRACE)]
    assert sim.tick(10.0) == []  # killed once

    sim2 = Sim(Limits(stop_grace_secs=100.0, hang=HangLimits(None, None)))
    sim2.start_trainer()
    observe.stop_requested(sim2.view, signal.SIGINT, sim2.now, 100.0)
    sim2.tick()
    observe.stop_requested(sim2.view, signal.SIGINT, sim2.now + 1, 100.0)
    assert sim2.tick(1.0) == [Kill(TRAINER, 1, Cause.STOP_GRACE)]


def test_a_stop_while_a_restart_is_pending_stops_the_run():
    sim = Sim()
    sim.start_trainer()
    sim.dies(TRAINER, 1)
    (r,) = of(sim.tick(), Restart)
    observe.stop_requested(sim.view, signal.SIGTERM, sim.now, 120.0)
    (f,) = of(sim.tick(), Finish)
    assert f.run == RunState.STOPPED and not of(sim.log, Spawn)[1:]


def test_a_stop_during_a_hung_trainers_grace_keeps_its_sigkill_due():
    """Issue 69: a stop (a preemption's SIGTERM) that comes after a hung trainer was signalled does not
    put its SIGKILL off to the stop's grace (120 s: it was; a preempted node is gone long before, with the
    in-memory snapshot its checkpoint service persists once the trainer is dead); the run stops after it."""
    sim = Sim(Limits(hang=HangLimits(10.0, 60.0), hang_grace_secs=2.0))
    sim.start_trainer()
    sim.progress(3)
    (take, sig) = sim.tick(10.5)
    assert isinstance(sig, Signal) and sig.cause == Cause.HANG
    observe.stop_requested(sim.view, signal.SIGTERM, sim.now, 120.0)
    assert not of(sim.tick(1.0), Kill)
    assert of(sim.tick(1.1), Kill) == [Kill(TRAINER, 1, Cause.HANG)]
    sim.dies(TRAINER, KILLED)
    (f,) = of(sim.tick(), Finish)
    assert f.run == RunState.STOPPED and not of(sim.log, Restart)


def test_hang_escalation_sigterm_then_sigkill_then_a_restart():
    sim = Sim(Limits(hang=HangLimits(10.0, 60.0), hang_grace_secs=2.0))
    sim.start_trainer()
    assert sim.tick(9.0) == []
    sim.progress(2, busy="final_checkpoint")
    assert sim.tick(100.0) == []  # busy on purpose: the hang clock pauses
    sim.progress(3)
    assert sim.tick(9.0) == []
    (take, sig) = sim.tick(1.5)
    assert take == TakeStacks(TRAINER, 1, sig.reason)  # the stacks first, then the signal
    assert isinstance(sig, Signal) and sig.cause == Cause.HANG and "--hang-timeout 10" in sig.reason
    assert sim.tick(1.0) == []
    assert sim.tick(1.1) == [Kill(TRAINER, 1, Cause.HANG)]
    sim.dies(TRAINER, KILLED)
    (r,) = of(sim.tick(), Restart)
    assert "hang" in sim.view.last_error


def test_a_hung_trainers_sigterm_waits_for_its_stacks_within_their_bound_and_a_step_meanwhile_ends_the_judgement():
    """Rule 4 with the stacks (issue 69): a hung trainer's stacks are asked for first; its SIGTERM waits
    for them, at most ``stacks_secs``; a step reported while they are taken ends that judgement (no
    signal), and the next stall asks for them again; ``stacks_secs`` 0 takes none."""
    sim = Sim(Limits(hang=HangLimits(10.0, 60.0, stacks_secs=5.0), hang_grace_secs=2.0))
    sim.stacks_back = False  # they never come back: the bound decides
    sim.start_trainer()
    sim.progress(3)
    (take,) = sim.tick(10.5)
    assert take == TakeStacks(TRAINER, 1, take.reason) and "--hang-timeout 10" in take.reason
    assert sim.trainer.hang.stacks_asked_at == sim.now and not sim.trainer.hang.cause
    assert sim.tick(4.9) == []  # being taken: no signal, no second capture
    (sig,) = sim.tick(0.2)  # past the bound: signalled without them
    assert sig.cause == Cause.HANG and sig.sig == signal.SIGTERM

    sim = Sim(Limits(hang=HangLimits(10.0, 60.0, stacks_secs=5.0), hang_grace_secs=2.0))
    sim.stacks_back = False
    sim.start_trainer()
    sim.progress(3)
    assert of(sim.tick(10.5), TakeStacks)
    assert sim.tick(1.0) == []
    sim.progress(4)  # a step came while they were taken: the stall passed
    assert sim.tick(3.0) == [] and sim.tick(2.0) == []  # nothing signalled past the bound either
    assert sim.trainer.hang.stacks_asked_at is not None and not sim.trainer.hang.cause
    (again,) = sim.tick(5.6)  # 10.6 s without a step since: another stall, its own stacks
    assert isinstance(again, TakeStacks) and sim.trainer.hang.stacks_asked_at == sim.now
    observe.stacks_back(sim.view, TRAINER, 1, {TRAINER: "in wait (w.py:3)"}, "", "/l/trainer.1.stacks.txt")
    (sig,) = sim.tick(0.1)  # back: signalled at once
    assert sig.cause == Cause.HANG and sim.trainer.hang.where == "in wait (w.py:3)"

    sim = Sim(Limits(hang=HangLimits(10.0, 60.0, stacks_secs=0.0), hang_grace_secs=2.0))
    sim.start_trainer()
    (sig,) = sim.tick(61.0)  # none taken: signalled at once
    assert isinstance(sig, Signal) and sig.cause == Cause.HANG and sim.trainer.hang.stacks_asked_at is None


def _looks(sim: "Sim", slot: str, secs: float, cpu: float = 0.0, io: int = 0, woke: int = 0, state: str = "S",
           every: float = 1.0, kids_cpu: float = 0.0) -> None:
    """Feed ``slot``'s looks from outside over ``secs`` (one each ``every`` s, the clock moving with them):
    per second ``cpu`` CPU-s, ``io`` bytes, ``woke`` switches of its main thread, and ``kids_cpu`` CPU-s
    of its descendants (looked at, as the executor does, when its own counters did not move)."""
    c = sim.view.children[slot]
    if not c.hang.samples:
        observe.looked_at(sim.view, slot, c.attempt, Activity(sim.now, 1.0, 1000, 50, state, "futex"),
                          sim.limits.hang)
    last = c.hang.samples[-1]
    for _ in range(int(round(secs / every))):
        sim.now += every
        own_cpu, own_io = last.cpu + cpu * every, last.io + int(io * every)
        quiet = cpu <= IDLE_CPU and io * every <= IDLE_IO  # (as the executor's look decides it)
        last = Activity(sim.now, own_cpu, own_io, last.woke + int(woke * every), state, "futex",
                        max(0.0, last.kids_cpu) + kids_cpu * every if quiet else -1.0, 0 if quiet else -1)
        observe.looked_at(sim.view, slot, c.attempt, last, sim.limits.hang)  # (kept as the executor keeps them)


def test_a_trainer_stuck_with_no_cpu_no_io_and_a_main_thread_that_never_runs_is_hung_at_stuck_secs():
    """Issue 69: past its first step, no step, no CPU, no I/O and a main thread that never ran for
    --stuck-secs (10) is a hang, whatever --hang-timeout (600) says; found at the first decision after
    10 s, its stacks then its SIGTERM."""
    sim = Sim(Limits(hang=HangLimits(600.0, 1800.0, stuck_secs=10.0), hang_grace_secs=2.0))
    sim.start_trainer(3)
    _looks(sim, TRAINER, 9.0, cpu=0.002)
    assert sim.tick() == []  # 9 s: not yet
    _looks(sim, TRAINER, 1.0, cpu=0.002)
    (take, sig) = sim.tick()
    assert take == TakeStacks(TRAINER, 1, sig.reason, stuck_for=10.0) and sig.cause == Cause.HANG and sig.stuck_for == 10.0
    assert sig.reason.startswith("stuck for 10.0 s (--stuck-secs 10): no step, 0.02 s of CPU, 0 bytes read or "
                                 "written, its main thread asleep in futex"), sig.reason


def test_a_quiet_wait_that_ended_in_a_step_raises_the_stuck_limit_to_twice_it_for_the_slot():
    """A wait of 7 s that ends in a step (a remote call, a sleep, a data loader's slow batch: quiet from
    outside) teaches the rule: from then on, and in the slot's next attempt, the limit is twice the
    longest such wait (14 s), not --stuck-secs (5); a quiet wait before the first step (a standby's, a
    start's) teaches nothing."""
    sim = Sim(Limits(hang=HangLimits(600.0, 1800.0, stuck_secs=5.0, stacks_secs=10.0), hang_grace_secs=2.0))
    sim.start_trainer(3)
    _looks(sim, TRAINER, 6.0, kids_cpu=0.9)
    sim.progress(4)  # 6 s waiting on a child that computes: work, nothing learned (before: 1 s, its last look)
    assert sim.trainer.hang.quiet_max == 0.0
    _looks(sim, TRAINER, 4.0)
    sim.progress(4)  # 4 s quiet, then a step: under --stuck-secs, learned
    assert sim.trainer.hang.quiet_max == 4.0
    _looks(sim, TRAINER, 7.0)  # 7 s quiet: past --stuck-secs, under 2 x 4
    assert sim.tick() == []
    sim.progress(5)  # it went on: the wait was slow work
    assert sim.trainer.hang.quiet_max == 7.0
    _looks(sim, TRAINER, 13.0)
    assert sim.tick() == []  # 13 s < 2 x 7
    _looks(sim, TRAINER, 1.0)
    (take, sig) = sim.tick()
    assert sig.reason.startswith("stuck for 14.0 s (2 x its longest quiet wait that ended in a step, 7.0 s)"), sig.reason
    sim.dies(TRAINER, KILLED)
    sim.tick()
    sim.tick(5.0)  # (its restart's backoff)
    assert sim.trainer.attempt == 2 and sim.trainer.hang.quiet_max == 7.0  # the slot keeps what it learned
    sim.ready(step=5)
    _looks(sim, TRAINER, 30.0)
    sim.progress(6)  # its first step after 30 s quiet: a start, not a wait
    assert sim.trainer.hang.quiet_max == 7.0


def test_a_learned_stuck_limit_past_stuck_secs_still_finds_a_hang():
    """Issue 69, an attack with default settings: a 9 s sleep that ended in a step, then a read that never
    returns. The limit learned is 18 s, and the looks at the trainer are kept that long: the hang is found at
    18 s (before: looks were kept --stuck-secs + 6 s, no window covered 18 s, and the hang waited for
    --hang-timeout, 600 s). What is kept stays within --hang-timeout."""
    sim = Sim(Limits(hang=HangLimits(600.0, 1800.0, stuck_secs=10.0, stacks_secs=10.0), hang_grace_secs=2.0))
    sim.start_trainer(3)
    _looks(sim, TRAINER, 9.0)
    sim.progress(4)
    assert sim.trainer.hang.quiet_max == 9.0
    _looks(sim, TRAINER, 17.0)
    assert sim.tick() == []
    _looks(sim, TRAINER, 1.0)
    (take, sig) = sim.tick()
    assert sig.reason.startswith("stuck for 18.0 s (2 x its longest quiet wait that ended in a step, 9.0 s)"), sig.reason
    sim.trainer.hang.quiet_max = 5000.0  # (a limit learned past --hang-timeout: the looks kept stop there)
    assert looks_kept(sim.view, sim.limits.hang) == 600.0 + 2 * SAMPLE_GAP


def test_a_quiet_wait_judged_stuck_is_given_twice_as_long_in_the_slots_next_attempt_not_killed_at_every_one():
    """Issue 69: a wait of 25 s that ends, quiet from outside (a remote service slow today), recurring at the
    same step after each restore: judged stuck at 10 s, then at 20 s (twice the wait judged), then it ends
    under 40 s and is learned. Before, every attempt was killed at 10 s until the run gave up."""
    sim = Sim(Limits(hang=HangLimits(600.0, 1800.0, stuck_secs=10.0, stacks_secs=10.0), hang_grace_secs=2.0))
    sim.start_trainer(3)
    verdicts = []
    for attempt in (1, 2, 3):
        assert sim.trainer.attempt == attempt
        waited = 0.0
        while waited < 25.0:
            _looks(sim, TRAINER, 1.0)
            waited += 1.0
            sigs = of(sim.tick(), Signal)
            if sigs:
                verdicts.append((attempt, waited, sigs[0].stuck_for, sigs[0].reason))
                break
        else:
            sim.progress(4)  # the wait ended in a step: nothing judged
            break
        sim.dies(TRAINER, KILLED)
        sim.tick()
        sim.tick(5.0)  # (its restart's backoff)
        sim.ready(step=3)
        sim.progress(3)
    assert [(a, w, f) for a, w, f, _ in verdicts] == [(1, 10.0, 10.0), (2, 20.0, 20.0)], verdicts
    assert verdicts[0][3].startswith("stuck for 10.0 s (--stuck-secs 10)"), verdicts
    assert verdicts[1][3].startswith("stuck for 20.0 s (2 x its last stuck limit, 10.0 s)"), verdicts
    assert sim.trainer.attempt == 3 and sim.trainer.hang.judged_max == 20.0 and sim.trainer.hang.quiet_max == 25.0
    assert looks_kept(sim.view, sim.limits.hang) == 50.0 + 2 * SAMPLE_GAP  # (twice the 25 s learned)
    # a hot standby promoted into the slot keeps what the slot learned, as a spawned attempt does (before: forgot it)
    observe.spawned(sim.view, "standby", "standby", 4, 999, sim.now, "zygote")
    note(sim.view, Promote("standby", 4), sim.now, sim.limits)
    assert sim.trainer.pid == 999 and (sim.trainer.hang.judged_max, sim.trainer.hang.quiet_max) == (20.0, 25.0)
    # a deadlock that recurs past the first step: judged at 10, 20, 40, 80 s, then 80 s each time (at most 8 x
    # --stuck-secs: before the cap, doubled up to --hang-timeout, about an hour to give up)
    sim3 = Sim(Limits(hang=HangLimits(600.0, 1800.0, stuck_secs=10.0, stacks_secs=10.0), hang_grace_secs=2.0))
    sim3.start_trainer(3)
    judged = []
    for attempt in range(1, 7):
        assert sim3.trainer.attempt == attempt
        for _ in range(200):
            _looks(sim3, TRAINER, 1.0)
            sigs = of(sim3.tick(), Signal)
            if sigs:
                judged.append(sigs[0].stuck_for)
                break
        sim3.dies(TRAINER, KILLED)
        sim3.tick()
        while sim3.trainer.attempt == attempt:
            sim3.tick(5.0)  # (its restart's backoff, longer each time)
        sim3.ready(step=3)
        sim3.progress(3)
    assert judged == [10.0, 20.0, 40.0, 80.0, 80.0, 80.0], judged
    # a hang-timeout verdict is no stuck wait: it raises nothing
    sim2 = Sim(Limits(hang=HangLimits(10.0, 1800.0, stacks_secs=10.0), hang_grace_secs=2.0))
    sim2.start_trainer(3)
    sig = of(sim2.tick(11.0), Signal)[0]
    assert sig.stuck_for == 0.0 and sim2.trainer.hang.judged_max == 0.0


def test_a_wait_the_program_marks_is_never_stuck_teaches_nothing_and_keeps_the_hang_timeout_from_its_start():
    """``with sv.waiting():`` (Busy.WAITING until the next step): a minute quiet is no stuck verdict, the
    step after it teaches the rule nothing and counts as no snapshot's blocking; --hang-timeout still bounds
    it, from the wait's start."""
    sim = Sim(Limits(hang=HangLimits(100.0, 1800.0, stuck_secs=10.0, stacks_secs=10.0), hang_grace_secs=2.0))
    sim.start_trainer(3)
    sim.progress(3, busy="waiting")
    _looks(sim, TRAINER, 60.0)
    assert sim.tick() == []
    sim.progress(4)  # the wait ended in a step: not learned, not a snapshot's time
    assert sim.trainer.hang.quiet_max == 0.0 and sim.trainer.busy_secs == 0.0
    _looks(sim, TRAINER, 10.0)  # an unmarked wait: --stuck-secs as before
    assert of(sim.tick(), Signal)[0].reason.startswith("stuck for 10.0 s (--stuck-secs 10)")
    sim2 = Sim(Limits(hang=HangLimits(100.0, 1800.0, stuck_secs=10.0, stacks_secs=10.0), hang_grace_secs=2.0))
    sim2.start_trainer(3)
    sim2.progress(3, busy="waiting")
    _looks(sim2, TRAINER, 100.0)
    assert sim2.tick() == []
    _looks(sim2, TRAINER, 1.0)
    (sig,) = of(sim2.tick(), Signal)
    assert sig.stuck_for == 0.0 and sig.reason.startswith(
        "waiting in the program's sv.waiting() for 101.0 s with no step (--hang-timeout 100 s)"), sig.reason


def test_a_hang_in_the_first_step_after_a_restore_is_stuck_at_stuck_secs_not_left_to_the_startup_timeout():
    """Issue 69, an attack: a deadlock at step 50 recurring after each restore. The in-memory snapshot of step 49,
    persisted at the hang's end, is what the next attempt restores, so it hangs in its first step: each attempt
    was left to --startup-timeout (1800 s). An attempt that restored a step past 0 is judged from its restore's
    end; a fresh start before its first step (import, tracing) is not."""
    sim = Sim(Limits(hang=HangLimits(600.0, 1800.0, stuck_secs=10.0, stacks_secs=10.0), hang_grace_secs=2.0))
    sim.start_trainer(49)
    sim.dies(TRAINER, KILLED)
    sim.tick()
    sim.tick(5.0)  # (its restart's backoff)
    assert sim.trainer.attempt == 2
    _looks(sim, TRAINER, 5.0)  # its restore: waits on the checkpoint service, quiet, not judged
    sim.ready(step=49)
    _looks(sim, TRAINER, 9.0)
    assert sim.tick() == []
    _looks(sim, TRAINER, 1.0)
    (take,) = of(sim.tick(), TakeStacks)
    assert take.reason.startswith("stuck for 10.0 s (--stuck-secs 10)") and take.stuck_for == 10.0, take
    fresh = Sim(Limits(hang=HangLimits(600.0, 1800.0, stuck_secs=10.0, stacks_secs=10.0), hang_grace_secs=2.0))
    assert of(fresh.tick(), Spawn)
    fresh.ready(step=0)
    _looks(fresh, TRAINER, 60.0)
    assert fresh.tick() == []


def test_a_stuck_judgement_holds_while_its_stacks_are_taken_though_the_capture_wakes_the_main_thread():
    """py-spy pauses the process to read it: its main thread is switched out and in (a blocking read is
    interrupted and restarted). That is no step: the judgement holds, the signal follows the stacks at
    once (before: the rule no longer saw the main thread asleep and the signal waited for the bound)."""
    sim = Sim(Limits(hang=HangLimits(600.0, 1800.0, stuck_secs=10.0, stacks_secs=10.0), hang_grace_secs=2.0))
    sim.stacks_back = False
    sim.start_trainer(3)
    _looks(sim, TRAINER, 10.0)
    (take,) = sim.tick()
    assert isinstance(take, TakeStacks)
    _looks(sim, TRAINER, 1.0, woke=3)  # the capture's pause
    observe.stacks_back(sim.view, TRAINER, 1, {TRAINER: "in step (t.py:9), waiting in read(pipe:[7])"}, "", "/s.txt")
    (sig,) = sim.tick()
    assert sig.cause == Cause.HANG and sig.reason == take.reason


@pytest.mark.parametrize("work", ["cpu", "io", "woke", "kids", "D", "T", "gap", "busy", "first", "off", "short"])
def test_slow_work_is_never_stuck(work):
    """What is not stuck, however long it lasts without a step (it is left to --hang-timeout): a
    computation (an evaluation, a slow step, tracing: CPU), reading or writing (input, a checkpoint),
    a main thread that runs (a loop that polls), a descendant that computes while the trainer waits
    for it (a data loader's worker process), uninterruptible I/O (D: storage), a stopped or traced
    process (T: SIGSTOP, a debugger), looks that do not cover the time (the watchdog held up), a trainer
    busy on purpose, one before its first step; and --stuck-secs 0, or not long enough."""
    sim = Sim(Limits(hang=HangLimits(600.0, 1800.0, stuck_secs=0.0 if work == "off" else 10.0), hang_grace_secs=2.0))
    if work == "first":
        assert of(sim.tick(), Spawn)
        sim.ready()
    else:
        sim.start_trainer(3)
    if work == "busy":
        sim.progress(3, busy="snapshot")
    kw = {"cpu": {"cpu": 0.3}, "io": {"io": 20000}, "woke": {"woke": 2}, "kids": {"kids_cpu": 0.5}, "D": {"state": "D"},
          "T": {"state": "T"}, "gap": {"every": 4.0}}.get(work, {})
    _looks(sim, TRAINER, 8.0 if work == "short" else 60.0, **kw)
    assert sim.tick() == [], work


def test_a_descendant_that_keeps_running_beside_the_trainer_does_not_hide_its_hang():
    """A child using 2% of a core (a metrics agent, a TensorBoard the trainer started) is not the
    trainer's work: the trainer asleep beside it is stuck at --stuck-secs (helper-74's attack: before,
    the 1% limit applied to its descendants too, and every hang waited for --hang-timeout); a child
    computing (a data loader's worker: most of a core) is."""
    for kids_cpu, stuck in ((0.02, True), (0.5, False)):
        sim = Sim(Limits(hang=HangLimits(600.0, 1800.0, stuck_secs=10.0), hang_grace_secs=2.0))
        sim.start_trainer(3)
        _looks(sim, TRAINER, 11.0, kids_cpu=kids_cpu)
        assert bool(of(sim.tick(), TakeStacks)) == stuck, kids_cpu


def test_stuck_reason_reads_only_the_looks_since_the_last_step():
    """The judgement is of the last ``secs`` before ``now`` and after the last step: a computation that
    ended 11 s ago is no alibi, a step 5 s ago is; a look missing from the window judges nothing."""
    looks = [Activity(float(t), float(min(t, 20)), 0, 7, "S", "", 0.0, 0) for t in range(0, 31)]  # computing until 20
    assert stuck_reason(29.5, looks, last_progress=15.0, secs=10.0) is None  # 19.5..29.5: a second of CPU in it
    assert stuck_reason(30.0, looks, last_progress=15.0, secs=10.0) is not None  # 20..30: quiet
    assert stuck_reason(31.0, looks, last_progress=25.0, secs=10.0) is None  # a step 6 s ago
    assert stuck_reason(31.0, looks[:5] + looks[25:], last_progress=15.0, secs=10.0) is None  # a hole of 20 s
    assert stuck_reason(34.0, looks, last_progress=15.0, secs=10.0) is None  # no look for 4 s: not covered


def test_a_trainer_busy_beyond_its_busy_limit_is_hung_too():
    sim = Sim(Limits(hang=HangLimits(10.0, 60.0, busy_timeout=130.0), hang_grace_secs=2.0))
    sim.start_trainer()
    sim.progress(2, busy="snapshot")
    assert sim.tick(129.0) == []  # a long snapshot is allowed ...
    (take, sig) = sim.tick(2.0)
    assert take == TakeStacks(TRAINER, 1, sig.reason)  # the stacks first, then the signal  # ... but not forever
    assert sig.cause == Cause.HANG and "busy with snapshot" in sig.reason


def test_a_hung_trainer_that_saved_and_exited_42_still_counts_as_a_failure():
    sim = Sim(Limits(hang=HangLimits(10.0, 60.0), hang_grace_secs=2.0))
    sim.start_trainer()
    (take, sig) = sim.tick(11.0)
    assert take == TakeStacks(TRAINER, 1, sig.reason)  # the stacks first, then the signal
    assert sig.cause == Cause.HANG
    sim.dies(TRAINER, 42)  # it handled the SIGTERM: saved and asked for a restart
    (r,) = of(sim.tick(), Restart)
    assert not r.preempted and sim.view.history.failures_without_progress == 1


def test_a_service_crash_loop_ends_the_run_as_failed():
    sim = Sim(Limits(service_restart_limit=0, hang=HangLimits(None, None)))
    sim.start_trainer()
    sim.dies(SUMMARY, KILLED)
    assert of(sim.tick(), GiveUpService)
    sim.tick()
    sim.dies(TRAINER, 42)
    sim.tick()
    assert sim.view.run == RunState.FAILED and sim.view.exit_code == 1


def test_no_first_step_within_the_startup_timeout_is_a_hang():
    sim = Sim(Limits(hang=HangLimits(10.0, 60.0)))
    assert of(sim.tick(), Spawn)
    assert sim.tick(59.0) == []
    (take, sig) = sim.tick(2.0)
    assert take == TakeStacks(TRAINER, 1, sig.reason)  # the stacks first, then the signal
    assert sig.cause == Cause.HANG and "--startup-timeout 60" in sig.reason


def test_the_start_up_snapshot_before_any_step_is_no_first_step_and_the_startup_timeout_still_applies():
    """A TF1 Supervisor's standard services save once as the session becomes ready: the snapshot's
    Progress (busy, then not busy) comes before any step. It is no ``first_step`` (before: it was, at
    step 0, and a slow first run was judged by --hang-timeout from there); the first completed step is,
    with its own step and time, and only then does --hang-timeout apply."""
    sim = Sim(Limits(hang=HangLimits(10.0, 60.0, busy_timeout=20.0)))
    assert of(sim.tick(), Spawn)
    sim.ready(step=0)
    assert sim.progress(0, busy="snapshot", stepped=False) == []
    sim.tick(1.0)
    assert sim.progress(0, stepped=False) == []  # the snapshot is sent: not busy, still no step
    assert sim.trainer.first_step_at is None and sim.trainer.last_work_at is None
    assert sim.tick(30.0) == []  # a first run slower than --hang-timeout: still starting up
    assert sim.tick(27.0) == []
    records = sim.progress(1)
    assert [(r.event, r.fields["step"], r.fields["secs_since_spawn"]) for r in records] == \
        [(Event.FIRST_STEP, 1, 58.0)]
    assert sim.trainer.first_step_at == 58.0 and sim.trainer.work_step == 1
    assert sim.tick(9.0) == []
    (take, sig) = sim.tick(2.0)
    assert take == TakeStacks(TRAINER, 1, sig.reason)  # the stacks first, then the signal
    assert sig.cause == Cause.HANG and "--hang-timeout 10" in sig.reason


def test_a_service_crash_loop_gives_up_and_stops_the_run_in_order():
    sim = Sim(Limits(service_restart_limit=3, service_restart_window=60.0, hang=HangLimits(None, None)))
    sim.start_trainer()
    for k in range(3):
        sim.dies(CHECKPOINT, KILLED)
        (r,) = of(sim.tick(5.0), RespawnService)
        assert len(r.crashes) == k + 1
    assert sim.view.children[CHECKPOINT].attempt == 4
    sim.dies(CHECKPOINT, KILLED)
    (g,) = of(sim.tick(5.0), GiveUpService)
    assert sim.view.exit_code == 1 and sim.view.stop_signal == signal.SIGTERM
    assert of(sim.tick(), Signal) == [Signal(TRAINER, 1, signal.SIGTERM, Cause.STOP)]
    sim.dies(TRAINER, 42)
    (f,) = of(sim.tick(), Finish)
    assert f.run == RunState.STOPPED and sim.view.exit_code == 1  # the give-up's exit code stands


def test_service_crashes_outside_the_window_are_forgotten():
    sim = Sim(Limits(service_restart_limit=2, service_restart_window=10.0, hang=HangLimits(None, None)))
    sim.start_trainer()
    for _ in range(5):
        sim.dies(SUMMARY, KILLED)
        assert of(sim.tick(11.0), RespawnService)


def test_the_service_restart_budget_counts_each_service_alone():
    # before: one window for both services, so two deaths of each within 60 s gave up on the run
    sim = Sim(Limits(service_restart_limit=3, service_restart_window=60.0, hang=HangLimits(None, None)))
    sim.start_trainer()
    for k in range(3):
        for role in (CHECKPOINT, SUMMARY):
            sim.dies(role, KILLED)
            (r,) = of(sim.tick(1.0), RespawnService)
            assert r.slot == role and len(r.crashes) == k + 1
    sim.dies(SUMMARY, KILLED)
    (g,) = of(sim.tick(1.0), GiveUpService)  # the fourth death of one service within the window
    assert g.slot == SUMMARY and len(g.crashes) == 4


def test_a_service_death_procsv_caused_is_not_counted_against_the_restart_budget():
    # before: each stall kill (and chaos kill) of a service counted, so a slow disk's replacements
    # and a chaos schedule ended a healthy run with "service keeps failing"
    sim = Sim(Limits(service_restart_limit=1, service_restart_window=60.0, hang=HangLimits(None, None)))
    sim.start_trainer()
    for _ in range(4):
        c = sim.view.children[CHECKPOINT]
        note(sim.view, Kill(CHECKPOINT, c.attempt, Cause.STALL, "no checkpoint committed"), sim.now, sim.limits)
        sim.dies(CHECKPOINT, KILLED)
        (r,) = of(sim.tick(1.0), RespawnService)
        assert r.crashes == ()
    sim.dies(CHECKPOINT, 1)  # its own failures still count
    (r,) = of(sim.tick(1.0), RespawnService)
    assert len(r.crashes) == 1
    sim.dies(CHECKPOINT, 1)
    assert of(sim.tick(1.0), GiveUpService)


def test_chaos_arms_after_the_first_step_and_fires_on_schedule_never_on_a_busy_trainer():
    sim = Sim(Limits(chaos=parse_chaos("every=5"), hang=HangLimits(None, None)), chaos_delay=5.0)
    assert of(sim.tick(), Spawn)
    assert sim.tick(3.0) == []  # no first step yet: not armed
    sim.ready()
    sim.progress(1)
    (arm,) = sim.tick(1.0)
    assert arm == ArmChaos(TRAINER, 1, 3.0 + 5.0)  # five seconds after its first step
    assert sim.tick(3.9) == []
    (kill,) = sim.tick(0.2)
    assert kill == Signal(TRAINER, 1, signal.SIGKILL, Cause.CHAOS)
    sim.dies(TRAINER, KILLED)
    sim.tick()
    sim.tick()
    sim.ready()
    sim.progress(1)
    (arm2,) = sim.tick()
    assert arm2.attempt == 2
    sim.progress(2, busy="snapshot")
    assert sim.tick(6.0) == []  # busy with a snapshot: spared for now ...
    sim.progress(3)
    assert sim.tick(0.1) == [Signal(TRAINER, 2, signal.SIGKILL, Cause.CHAOS)]  # ... and killed when done
    sim.dies(TRAINER, KILLED)
    assert of(sim.tick(), SkipChaos) == []  # gone: nothing to skip until the next attempt is armed


def test_a_chaos_kill_due_while_a_restart_backs_off_is_skipped():
    sim = Sim(Limits(chaos=parse_chaos("every=5"), restart=RestartPolicy(backoff_base=10.0),
                     hang=HangLimits(None, None)), chaos_delay=5.0)
    sim.start_trainer()
    sim.tick()  # armed for attempt 1
    sim.dies(TRAINER, 1)  # first failure without progress: at once
    sim.tick()
    sim.tick()
    sim.ready()
    sim.progress(1)
    assert of(sim.tick(), ArmChaos) == [ArmChaos(TRAINER, 2, sim.now + 5.0)]
    sim.dies(TRAINER, 1)  # second in a row: a 10 s backoff
    (r,) = of(sim.tick(1.0), Restart)
    assert r.delay == 10.0
    assert sim.tick(4.1) == [SkipChaos(TRAINER)]  # nobody to kill now
    assert sim.tick(6.0) == [Spawn(TRAINER, TRAINER)]


def test_chaos_on_a_service_counts_from_its_start():
    sim = Sim(Limits(chaos=parse_chaos("every=2,target=checkpoint,signal=TERM"), hang=HangLimits(None, None)),
              chaos_delay=2.0)
    actions = sim.tick()
    assert ArmChaos(CHECKPOINT, 1, 2.0) in actions
    assert of(sim.tick(2.0), Signal) == [Signal(CHECKPOINT, 1, signal.SIGTERM, Cause.CHAOS)]


def test_checkpoints_that_stop_while_steps_complete_get_the_checkpoint_service_replaced():
    sim = Sim(Limits(hang=HangLimits(None, None), stall_floor_secs=10.0))
    assert of(sim.tick(), Spawn)
    sim.ready(save_secs=2.0)
    sim.progress(1)
    for k in (1, 2):
        sim.tick(2.0)
        sim.progress(100 * k)
        sim.commit(100 * k)
    sim.progress(500)
    assert sim.train(9.9) == []  # 3 intervals, but not the 10 s floor yet
    (kill,) = sim.train(0.2, every=0.2)
    assert kill.slot == CHECKPOINT and kill.cause == Cause.STALL and "no checkpoint committed for 10.1 s" in kill.reason
    assert sim.train(1.0) == []  # killed once
    sim.dies(CHECKPOINT, KILLED)
    assert of(sim.tick(), RespawnService) and sim.view.children[CHECKPOINT].attempt == 2
    sim.progress(900)
    assert sim.train(8.0) == []  # the replacement gets a whole window of its own
    (again,) = sim.train(3.0, every=3.0)
    assert again == Kill(CHECKPOINT, 2, Cause.STALL, again.reason)


def test_a_step_schedule_stalls_by_steps_and_a_busy_trainer_never_stalls():
    sim = Sim(Limits(hang=HangLimits(None, None), stall_floor_secs=5.0))
    assert of(sim.tick(), Spawn)
    sim.ready(step=100, save_steps=10)
    sim.progress(101)
    sim.progress(125)
    assert sim.tick(60.0) == []  # 25 steps: under 3 x 10
    sim.progress(131)
    (kill,) = sim.tick(0.1)
    assert kill.cause == Cause.STALL and "31 steps" in kill.reason

    quiet = Sim(Limits(hang=HangLimits(None, None), stall_floor_secs=5.0))
    quiet.tick()
    quiet.ready(save_secs=1.0)
    quiet.progress(1)
    quiet.progress(2, busy="final_checkpoint")
    assert quiet.tick(100.0) == []  # waiting for its own last commit: not a stall of training


def test_snapshots_the_trainer_refuses_as_non_finite_are_not_a_stall_of_the_service():
    """Issue 51, point 5: under --on-nonfinite continue every snapshot of a non-finite state is refused
    by the trainer (never sent), so nothing commits; the stall rule SIGKILLed the healthy service
    every three save intervals. The silence counts from the trainer's last refusal (NonfiniteDetected)."""
    sim = Sim(Limits(hang=HangLimits(None, None), stall_floor_secs=10.0))
    assert of(sim.tick(), Spawn)
    sim.ready(save_secs=2.0)
    sim.progress(1)
    sim.commit(1)
    for k in range(1, 31):  # 60 s: a refusal at every save interval
        assert sim.tick(2.0) == [], k
        sim.progress(100 * k)
        observe.heard(sim.view, NonfiniteDetected(sim.trainer.pid, 100 * k, 0.0, "the loss is NaN"), sim.now)
    assert sim.train(9.9) == []  # the refusals end (a rollback): a hung service is still found, from the last one
    (kill,) = sim.train(0.2, every=0.2)
    assert kill == Kill(CHECKPOINT, 1, Cause.STALL, kill.reason) and "10.1 s" in kill.reason


def test_a_service_loading_what_its_commit_needs_is_never_killed_and_its_window_counts_from_readiness():
    """Issue 51, point 7: a checkpoint holding a tf.data iterator makes the checkpoint service import
    TensorFlow at its first commit (8.5 s at load ~5, minutes at its lower priority on a busy
    machine); the stall rule (10 s floor) and the trainer's overdue snapshot killed it, and its
    successor began the same import. A load the service announces (ServiceLoading) is no stall."""
    sim = Sim(Limits(hang=HangLimits(None, None), stall_floor_secs=10.0, loading_limit_secs=900.0))
    assert of(sim.tick(), Spawn)
    sim.ready(save_secs=1.0)
    sim.progress(1)
    service = sim.view.children[CHECKPOINT]
    observe.heard(sim.view, ServiceLoading(CHECKPOINT, service.pid, 1, "TensorFlow"), sim.now)
    for k in range(1, 13):  # two minutes of loading, steps going on
        sim.progress(100 * k)
        assert sim.tick(10.0) == [], k
    assert sim.tick(1.0) == [] and sim.view.failed_saves == 0  # a commit still loading: slow, not stuck
    reports = observe.heard(sim.view, ServiceLoading(CHECKPOINT, service.pid, 1, "TensorFlow", True, 121.0), sim.now)
    assert any("loaded TensorFlow in 121.0 s" in r.say for r in reports)
    sim.progress(2000)
    assert sim.train(9.9) == []  # its window counts from readiness
    (kill,) = sim.train(0.2, every=0.2)
    assert kill == Kill(CHECKPOINT, 1, Cause.STALL, kill.reason)

    stuck = Sim(Limits(hang=HangLimits(None, None), stall_floor_secs=10.0, loading_limit_secs=900.0))
    assert of(stuck.tick(), Spawn)
    stuck.ready(save_secs=1.0)
    stuck.progress(1)
    pid = stuck.view.children[CHECKPOINT].pid
    observe.heard(stuck.view, ServiceLoading(CHECKPOINT, pid, 1, "TensorFlow"), stuck.now)
    assert stuck.tick(899.0) == []
    (kill,) = stuck.tick(2.0)  # a load that never ends is bounded
    assert kill.slot == CHECKPOINT and "loading what its checkpoints need for 901.0 s" in kill.reason


def test_an_overdue_snapshot_replaces_a_loading_checkpoint_service_at_once():
    """A load that makes progress tells the trainer so (CommitLoading: slow, not dead, no SaveOverdue);
    a SaveOverdue during a load says the load stopped (SIGSTOP, a deadlocked import). It was ignored
    for up to loading_limit_secs (900 s), while the trainer counted a failed checkpoint at each
    deadline (three in a row stop training); it replaces the service at once, as at any commit."""
    sim = Sim(Limits(hang=HangLimits(None, None), stall_floor_secs=10.0, loading_limit_secs=900.0))
    assert of(sim.tick(), Spawn)
    sim.ready(save_secs=1.0)
    sim.progress(1)
    service = sim.view.children[CHECKPOINT]
    observe.heard(sim.view, ServiceLoading(CHECKPOINT, service.pid, 1, "TensorFlow"), sim.now)
    sim.progress(100)
    assert sim.tick(20.0) == []
    observe.heard(sim.view, SaveOverdue(sim.trainer.pid, 1, 31.0, 30.0), sim.now)  # no progress at its deadline
    (kill,) = sim.tick(0.1)
    assert kill == Kill(CHECKPOINT, 1, Cause.STALL, kill.reason) and "had no result within 30.0 s" in kill.reason
    assert sim.view.failed_saves == 1


def test_an_overdue_snapshot_replaces_the_checkpoint_service_at_once_and_counts_as_a_failed_save():
    sim = Sim(Limits(hang=HangLimits(None, None), stall_floor_secs=600.0, checkpoint_failure_limit=2))
    assert of(sim.tick(), Spawn)
    sim.ready(save_secs=1000.0)  # the time-based stall rule alone would wait 50 minutes
    sim.progress(1)
    observe.heard(sim.view, SaveOverdue(sim.trainer.pid, 40, 31.0, 30.0), sim.now)
    (kill,) = sim.tick(0.1)
    assert kill == Kill(CHECKPOINT, 1, Cause.STALL, "the snapshot of step 40 had no result within 30.0 s (waited 31.0 s)")
    assert sim.view.last_error.startswith("checkpoint service stalled: the snapshot of step 40")
    assert sim.tick(1.0) == []  # acted on once
    sim.dies(CHECKPOINT, KILLED)
    assert of(sim.tick(), RespawnService)
    assert sim.tick(5.0) == []  # the replacement is not blamed for its predecessor's snapshot
    sim.commit(41)  # the retaken snapshot commits: the failure count starts again
    observe.heard(sim.view, SaveOverdue(sim.trainer.pid, 60, 31.0, 30.0), sim.now)
    assert of(sim.tick(), Kill) and not of(sim.tick(), StopFailing)
    observe.heard(sim.view, SaveOverdue(sim.trainer.pid, 60, 62.0, 30.0), sim.now)
    assert [a.cause for a in of(sim.tick(), StopFailing)] == ["checkpoints"]  # two overdue deadlines in a row: the failure limit


def test_a_trainer_without_checkpoints_never_stalls():
    sim = Sim(Limits(hang=HangLimits(None, None)))
    sim.start_trainer(steps=10_000)
    assert sim.tick(1e6) == []


def test_a_failed_checkpoint_is_the_last_error_at_once():
    sim = Sim()
    sim.start_trainer()
    reports = observe.heard(sim.view, SaveResult(7, "periodic", False, None, "No space left on device", 0.1), sim.now)
    assert [r.event.value for r in reports if r.event] == ["checkpoint_failed"]
    assert sim.view.last_error == "checkpoint at step 7 failed: No space left on device"


def _fail(sim: Sim, step: int, reason: str = "periodic") -> None:
    observe.heard(sim.view, SaveResult(step, reason, False, None, "No space left on device", 0.1), sim.now)


def test_three_failed_commits_in_a_row_stop_the_run_in_order_with_exit_code_3():
    sim = Sim()
    sim.start_trainer()
    _fail(sim, 10)
    _fail(sim, 20)
    sim.commit(30)  # a success in between resets the count
    _fail(sim, 40)
    _fail(sim, 50)
    _fail(sim, 60, reason="lost")  # a snapshot lost with a dead service is retaken: not a failure
    assert of(sim.tick(), StopFailing) == []
    _fail(sim, 70)
    actions = sim.tick()
    assert [(a.cause, a.exit_code) for a in of(actions, StopFailing)] == [("checkpoints", 3)]
    assert "3 checkpoints in a row failed to commit" in sim.view.last_error
    assert of(sim.tick(), Signal) == [Signal(TRAINER, 1, signal.SIGTERM, Cause.STOP)]  # it saves if it can
    sim.dies(TRAINER, 1)
    sim.tick()
    assert sim.view.run == RunState.FAILED and sim.view.exit_code == 3


def test_on_checkpoint_failure_continue_trains_on():
    sim = Sim(Limits(hang=HangLimits(None, None), checkpoint_failure_limit=0))
    sim.start_trainer()
    for k in range(10):
        _fail(sim, k)
    assert sim.tick(1.0) == []


def test_an_error_a_restart_cannot_cure_gives_up_at_once_and_others_are_retried():
    sim = Sim()
    assert of(sim.tick(), Spawn)
    t = sim.trainer
    error = ChildError("NoRestorableCheckpoint", "every committed checkpoint is corrupt", "Traceback ...", "startup")
    observe.reaped(sim.view, TRAINER, 1, Failure(TRAINER, 1, t.pid, 1, 0.0, "log", error), sim.now)
    (g,) = of(sim.tick(), GiveUp)
    assert "cannot start: NoRestorableCheckpoint" in g.reason and sim.view.exit_code == 1

    retry = Sim()
    retry.tick()
    t = retry.trainer
    error = ChildError("UnreadableCheckpoint", "EIO", "Traceback ...", "startup")  # may pass: try again
    observe.reaped(retry.view, TRAINER, 1, Failure(TRAINER, 1, t.pid, 1, 0.0, "log", error), retry.now)
    assert of(retry.tick(), Restart)


def test_a_service_that_crashed_and_restarts_slowly_is_not_taken_for_a_stall():
    sim = Sim(Limits(hang=HangLimits(None, None), stall_floor_secs=10.0))
    assert of(sim.tick(), Spawn)
    sim.ready(save_secs=0.3)
    sim.progress(1)
    sim.commit(1)
    sim.tick(5.0)
    sim.dies(CHECKPOINT, KILLED)  # a crash mid-commit
    sim.services_say_hello = False
    assert of(sim.tick(), RespawnService)
    sim.progress(500)  # the replacement imports TensorFlow slowly on a loaded machine
    assert sim.train(30.0) == []  # past the floor, but it cannot commit yet: not stuck
    sim.hello(CHECKPOINT)  # imported: its window starts now
    sim.progress(900)
    assert sim.train(9.9) == []
    (kill,) = sim.train(0.2, every=0.2)
    assert kill == Kill(CHECKPOINT, 2, Cause.STALL, kill.reason)


def test_a_session_the_program_retries_in_the_same_attempt_does_not_rewrite_that_attempts_recovery():
    # TF's "retry on preemption" loop: the restarted trainer restores step 50, aborts at 170 and
    # restores step 150 in-process. The recovery of attempt 2 is its first restore, not the retry.
    sim = Sim()
    sim.start_trainer(steps=60)
    sim.trainer.signalled_at = sim.now
    sim.notice()
    assert of(sim.tick(0.1), Restart) and sim.tick() == [Spawn(TRAINER, TRAINER)] and sim.trainer.attempt == 2
    sim.now += 0.2
    sim.ready(50)
    sim.now += 0.3
    sim.progress(51)
    sim.now += 15.0
    sim.ready(150)  # the retried session, 15 s later
    sim.progress(151)
    rec = recovery.recoveries(sim.view.attempts)[-1]
    assert rec["attempt"] == 2 and abs(rec["restore_s"] - 0.2) < 1e-9 and abs(rec["first_step_s"] - 0.3) < 1e-9
    assert rec["steps_redone"] == 10  # attempt 1 reached step 60; attempt 2 restored step 50
    assert sim.view.step == 151


def _crash_after_commit_run(disk: bool) -> Sim:
    """max-restarts 1; attempt 1 commits 50 (heard) and crashes; attempt 2 restores 50, commits 100
    and crashes before the watchdog reads the service's notice of it; ``disk``: the watchdog reads
    the manifest of 100 at the death (what procsv.watchdog.exits does)."""
    sim = Sim(Limits(restart=RestartPolicy(max_restarts=1), hang=HangLimits(None, None)))
    sim.start_trainer()
    sim.commit(50)
    sim.dies(TRAINER, 1)
    (r,) = of(sim.tick(), Restart)
    assert r.delay == 0.0
    sim.tick()
    sim.ready(50)
    sim.progress(51)
    if disk:
        observe.committed_on_disk(sim.view, TRAINER, sim.trainer.attempt, 100)
    sim.dies(TRAINER, 1)
    return sim


def test_a_commit_on_disk_whose_notice_the_watchdog_has_not_read_at_the_death_is_progress():
    sim = _crash_after_commit_run(disk=True)
    (r,) = of(sim.tick(), Restart)
    assert r.delay == 0.0 and sim.view.history.failures_without_progress == 1
    sim.commit(100)  # the notice, read after the death: counted once, not as the next attempt's progress
    sim.tick()
    assert sim.trainer.commit_base == 100
    sim.ready(100)
    sim.progress(101)
    assert not sim.trainer.made_progress


def test_without_the_commit_on_disk_the_same_run_gives_up_as_making_no_progress():
    sim = _crash_after_commit_run(disk=False)  # what the watchdog did before (CI at 25e7395)
    (g,) = of(sim.tick(), GiveUp)
    assert "--max-restarts 1" in g.reason


def test_a_late_notice_of_the_previous_attempt_s_commit_is_not_the_next_attempt_s_progress():
    sim = Sim(Limits(restart=RestartPolicy(max_restarts=1), hang=HangLimits(None, None)))
    sim.start_trainer()
    observe.committed_on_disk(sim.view, TRAINER, 1, 50)  # at its death, before the notice
    sim.dies(TRAINER, 1)
    of(sim.tick(), Restart)
    sim.tick()
    assert sim.trainer.attempt == 2 and sim.trainer.commit_base == 50  # what the disk said counts as known
    sim.commit(50)  # the notice arrives now, while attempt 2 restores
    sim.ready(50)
    sim.progress(51)
    assert not sim.trainer.made_progress
    sim.dies(TRAINER, 1)
    (g,) = of(sim.tick(), GiveUp)  # a failure in a row without progress: beyond --max-restarts 1
    assert "1 restarts without a new checkpoint" in g.reason


def test_a_late_notice_of_a_commit_after_one_already_heard_is_not_the_next_attempt_s_progress():
    """Attempt 1 commits 50 (heard) and 100, and dies before the notice of 100 is read: the disk is
    read at every death (above what it is known to have committed), not only at one without known
    progress, so 100 is known before attempt 2 starts, and its notice later is not attempt 2's."""
    sim = Sim(Limits(restart=RestartPolicy(max_restarts=1), hang=HangLimits(None, None)))
    sim.start_trainer()
    sim.commit(50)
    assert sim.trainer.made_progress and observe.unheard_floor(sim.trainer) == 50
    observe.committed_on_disk(sim.view, TRAINER, 1, 100)  # what exits reads above that floor
    sim.dies(TRAINER, 1)
    of(sim.tick(), Restart)
    sim.tick()
    assert sim.trainer.attempt == 2 and sim.trainer.commit_base == 100
    sim.ready(100)
    sim.commit(100)  # the late notice
    sim.progress(101)
    assert not sim.trainer.made_progress
    sim.dies(TRAINER, 1)
    (g,) = of(sim.tick(), GiveUp)
    assert "1 restarts without a new checkpoint" in g.reason


def _restore_below_the_newest_commit(commit: int) -> Sim:
    """max-restarts 1; attempt 1 commits 50 and 100 (heard) and dies; attempt 2 restores 50 (100
    was skipped as corrupt), commits ``commit`` and dies."""
    sim = Sim(Limits(restart=RestartPolicy(max_restarts=1), hang=HangLimits(None, None)))
    sim.start_trainer()
    sim.commit(50)
    sim.commit(100)
    sim.dies(TRAINER, 1)
    of(sim.tick(), Restart)
    sim.tick()
    assert sim.trainer.commit_base == 100
    sim.ready(50)
    assert sim.trainer.commit_base == 50  # it started from what it restored
    sim.progress(51)
    if commit:
        sim.commit(commit)
    sim.dies(TRAINER, 1)
    return sim


def test_an_attempt_that_restored_below_the_newest_commit_makes_progress_with_a_commit_above_its_restore():
    sim = _restore_below_the_newest_commit(75)  # below the corrupt 100, above its restore
    assert sim.view.attempts[1].made_progress
    (r,) = of(sim.tick(), Restart)
    assert sim.view.history.failures_without_progress == 1  # this failure only: the count began again


def test_an_attempt_that_restored_below_the_newest_commit_and_committed_nothing_made_no_progress():
    sim = _restore_below_the_newest_commit(0)
    assert not sim.view.attempts[1].made_progress
    (g,) = of(sim.tick(), GiveUp)
    assert "1 restarts without a new checkpoint" in g.reason


def test_a_held_snapshot_of_the_previous_attempt_persisted_at_the_next_one_s_start_resets_the_count():
    """The in-memory tier: each attempt's work is a held snapshot, persisted when the next attempt
    asks at its start (a commit heard while that one is the trainer). A run that crashes every time
    but keeps saving so is making progress, as it did before the disk check."""
    sim = Sim(Limits(restart=RestartPolicy(max_restarts=1), hang=HangLimits(None, None)))
    sim.start_trainer()
    for k in range(1, 5):
        sim.dies(TRAINER, KILLED)
        (r,) = of(sim.tick(), Restart)
        assert r.delay == 0.0
        sim.tick()
        sim.commit(40 * k)  # the predecessor's held snapshot, persisted at this attempt's recover query
        sim.ready(40 * k)
        sim.progress(40 * k + 1)
    assert sim.view.run == RunState.RUNNING and sim.view.history.failures_without_progress == 1


def test_a_trainer_that_exits_4_diverging_is_final_no_restart_failed_exit_4():
    # issue 41: exit 4 is "diverging": a restart would resume from the newest finite checkpoint and
    # meet the same numbers again. It used to restart like any failure (after progress: at once)
    sim = Sim(Limits(restart=RestartPolicy(max_restarts=10, jitter=0.0), hang=HangLimits(None, None)))
    sim.start_trainer(steps=5)
    sim.commit(5)  # progress: any other failure would restart at once
    sim.dies(TRAINER, 4)
    actions = sim.tick()
    assert not of(actions, Restart) and not of(actions, Spawn)
    (g,) = of(actions, GiveUp)
    assert g.exit_code == 4 and "diverging" in g.reason
    assert sim.view.run == RunState.FAILED and sim.view.exit_code == 4
    for _ in range(5):
        assert not of(sim.tick(10.0), Spawn)


def test_a_death_notice_of_a_diverging_trainer_waits_for_its_exit_status():
    sim = Sim()
    sim.start_trainer(steps=3)
    observe.death_noticed(sim.view, TRAINER, 1, sim.now, 0.0, ChildError("TrainingDiverged", "", "", "run"))
    assert not of(sim.tick(), Restart)
    sim.dies(TRAINER, 4)
    (g,) = of(sim.tick(), GiveUp)
    assert g.exit_code == 4 and sim.view.exit_code == 4


@pytest.mark.parametrize("code", [4, 1], ids=["rollback_gave_up", "the_programs_own"])
def test_an_uncaught_nan_loss_error_is_diverging_exit_4_where_the_rollback_gave_up_else_a_program_failure(code):
    # issue 67: where procsv's rollback gives a NaN up in a session whose NanTensorHook(fail_on_nan_loss=True)
    # watches the loss, the program's run raises the hook's NanLossDuringTrainingError, which exits 4 if let
    # escape (a SystemExit too): the run is diverging, exit 4, never restarted. The hook's own raise (no
    # rollback: --on-nonfinite stop, no checkpoint_dir) exits 1: a failure of the program, given up with exit 1
    sim = Sim(Limits(restart=RestartPolicy(max_restarts=10, jitter=0.0), hang=HangLimits(None, None)))
    sim.start_trainer(steps=5)
    sim.commit(5)  # progress: another failure would restart at once
    error = ChildError("NanLossDuringTrainingError", "NaN loss during training.", "", "run", 5)
    observe.death_noticed(sim.view, TRAINER, 1, sim.now, 0.0, error)
    assert not of(sim.tick(), Restart)  # the death notice waits for the exit status
    c = sim.view.children[TRAINER]
    observe.reaped(sim.view, TRAINER, c.attempt, Failure(c.role, c.attempt, c.pid, code, 0.0, "log", error), sim.now)
    actions = sim.tick()
    assert not of(actions, Restart) and not of(actions, Spawn)
    (g,) = of(actions, GiveUp)
    assert g.exit_code == code and sim.view.exit_code == code
    assert ("diverging" if code == 4 else "NanLossDuringTrainingError: a failure of the program") in g.reason


def test_a_trainer_that_stopped_stepping_is_no_stall_of_the_checkpoint_service():
    # before: a trainer SIGSTOPped (a hang) made no step and asked for no save; 30 s after the last commit
    # (3 x save_model_secs) the healthy checkpoint service was SIGKILLed as stalled, while the hang rule
    # was already stopping the trainer (lifecycle.jsonl: hang_detected, then checkpoint_stalled)
    sim = Sim(Limits(hang=HangLimits(20.0, None)))
    sim.start_trainer()
    sim.ready(0, save_secs=10.0)
    for s in range(2, 40):
        sim.tick(0.25)
        sim.progress(s)
    sim.commit(39)
    for s in range(40, 60):
        sim.tick(0.25)
        sim.progress(s)  # steps 5 s past the commit, then the trainer is stopped
    for _ in range(60):
        assert not [a for a in sim.tick(1.0) if isinstance(a, Kill) and a.slot == CHECKPOINT]
    assert sim.trainer.hang.cause  # the hang rule judged it


def test_the_stall_window_counts_training_time_so_long_steps_and_a_trainer_blocked_in_a_collective_never_stall_the_service():
    """The window of "no checkpoint committed" runs to the trainer's last completed step, not to now: a save is due
    only at a step boundary. Before: a group's chief waiting in a collective for a member that died (fresh-clone
    run Y; no hang found, its peer's death unreported) had its healthy checkpoint service SIGKILLed every 10 s,
    six times in a minute; and a program whose steps take 30 s under ``save_model_secs=1`` had it SIGKILLed 10 s
    after each commit."""
    slow = Sim(Limits(hang=HangLimits(None, None), stall_floor_secs=10.0))
    assert of(slow.tick(), Spawn)
    slow.ready(save_secs=1.0)
    slow.progress(1)
    slow.commit(1)
    for k in range(2, 12):  # 30-s steps, each one's snapshot committed 0.5 s after it
        assert slow.tick(29.5) == [], k
        slow.progress(k)
        assert slow.tick(0.5) == [], k
        slow.commit(k)

    blocked = Sim(Limits(hang=HangLimits(None, None), stall_floor_secs=10.0))
    assert of(blocked.tick(), Spawn)
    blocked.ready(save_secs=1.0)
    blocked.progress(1)
    blocked.commit(1)
    assert blocked.train(2.0) == []  # trains 2 s past the commit, then waits in a collective for good
    for _ in range(120):
        assert blocked.tick(1.0) == []
    assert blocked.train(10.0) == []  # steps again: its first snapshot since has as long as any to commit
    (kill,) = blocked.train(0.2, every=0.2)  # and the service still commits nothing: stalled
    assert kill == Kill(CHECKPOINT, 1, Cause.STALL, kill.reason) and "10.1 s" in kill.reason, kill


def test_a_stop_while_a_start_is_asked_and_never_answered_ends_when_its_grace_does():
    """Rule 2 waits for a start asked and not answered (the view ``forking``: a fork of the zygote, a member
    asked of another host) only until the stop's grace ends. Before, it waited for ever: a StartMembers lost
    on its way to an agent that keeps saying hello is never answered, and SIGTERM could not end the launch."""
    sim = Sim()
    sim.start_trainer()
    sim.dies(TRAINER, 1)
    of(sim.tick(), Restart)
    sim.view.forking = True  # the restart's start asked, its answer never coming
    observe.stop_requested(sim.view, signal.SIGTERM, sim.now, 30.0)
    assert not of(sim.tick(), Finish)
    assert not of(sim.tick(29.0), Finish)  # within the grace: the answer may still come
    (f,) = of(sim.tick(1.5), Finish)
    assert f.run == RunState.STOPPED and f.exit_code == 128 + signal.SIGTERM


def test_a_loop_of_marked_waits_without_a_step_is_bounded_by_the_hang_timeout_from_the_first_waits_start():
    """``while not ready: with sv.waiting(): time.sleep(5)``: each wait's start says WAITING again, with no step
    between. --hang-timeout counts from the first one: a wait repeated is the same wait. (Before, each report
    moved the trainer's last progress: such a loop was never judged hung.)"""
    sim = Sim(Limits(hang=HangLimits(100.0, 1800.0, stuck_secs=10.0, stacks_secs=10.0), hang_grace_secs=2.0))
    sim.start_trainer(3)
    for _ in range(20):  # 20 waits of 5 s, then 1 s more
        sim.progress(3, busy="waiting")
        _looks(sim, TRAINER, 5.0)
        assert sim.tick() == []
    _looks(sim, TRAINER, 1.0)
    (sig,) = of(sim.tick(), Signal)
    assert sig.reason.startswith("waiting in the program's sv.waiting() for 101.0 s with no step "
                                 "(--hang-timeout 100 s)"), sig.reason
