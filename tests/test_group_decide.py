"""Rule 11 of the decision function, trainer groups (``--nproc N``), with a fake clock (no process runs).

The simulator of ``test_watchdog_decide`` stands in for the executor; here a trainer start is
the whole group's, as in :meth:`procsv.watchdog.executor.Executor.spawn`: the chief in the
``trainer`` slot and a worker per other task, all with the chief's attempt number.
"""

from __future__ import annotations

import signal

from procsv.ipc.messages import GroupCopyHeld, Progress, TrainerReady
from procsv.watchdog import observe
from procsv.watchdog.rules.actions import Cause, Finish, GiveUp, Kill, Restart, Settle, Signal, Spawn, TakeStacks
from procsv.watchdog.rules.decide import Limits
from procsv.watchdog.rules.failures import ChildError, Failure
from procsv.watchdog.rules.group import blame, worker_slot
from procsv.watchdog.rules.hang import HangLimits
from procsv.watchdog.rules.lifecycle import ProcState, RunState
from procsv.watchdog.rules.policy import RestartPolicy
from procsv.watchdog.rules.state import TRAINER, WORKER

from test_watchdog_decide import KILLED, Sim, _looks, of

W1 = worker_slot(1)


class GroupSim(Sim):
    """A group of ``nproc`` trainers: a trainer spawn starts every task."""

    def spawn(self, slot: str, role: str) -> None:
        super().spawn(slot, role)
        if role == TRAINER:
            chief = self.view.children[TRAINER]
            for rank in range(1, self.limits.nproc):
                observe.spawned(self.view, worker_slot(rank), WORKER, chief.attempt, next(self._pids), self.now,
                                "fresh")

    def member(self, slot: str):  # type: ignore[no-untyped-def]
        return self.view.children[slot]

    def group_ready(self, step: int = 0) -> None:
        for slot in [TRAINER] + [worker_slot(r) for r in range(1, self.limits.nproc)]:
            c = self.member(slot)
            observe.heard(self.view, TrainerReady(c.pid, c.attempt, step, None, 0.1, [], 1.0 if slot == TRAINER
                                                  else None, None), self.now)

    def group_progress(self, step: int, slots: tuple[str, ...] = ()) -> None:
        for slot in slots or [TRAINER] + [worker_slot(r) for r in range(1, self.limits.nproc)]:
            observe.heard(self.view, Progress(self.member(slot).pid, step, 0.0, "", True), self.now)

    def reaps(self, slot: str, code: int, error: str = "") -> None:
        c = self.member(slot)
        err = ChildError(error, "boom", "Traceback ...", "run") if error else None
        observe.reaped(self.view, slot, c.attempt, Failure(c.slot, c.attempt, c.pid, code, 0.0, "log", err), self.now)

    def notices(self, slot: str) -> None:
        c = self.member(slot)
        observe.death_noticed(self.view, slot, c.attempt, self.now, 0.0)


def group(nproc: int = 2, **kw: object) -> GroupSim:
    sim = GroupSim(Limits(hang=HangLimits(None, None), nproc=nproc, **kw))  # type: ignore[arg-type]
    assert sim.tick() == [Spawn(TRAINER, TRAINER)]
    sim.group_ready()
    sim.group_progress(1)
    return sim


def test_a_workers_death_stops_the_rest_of_the_group_and_restarts_all_once_every_member_is_reaped():
    sim = group(3)
    sim.tick(1.0)
    sim.notices(W1)  # its death notice: the rest of the group is stopped at once
    acts = sim.tick(0.01)
    assert sorted((a.slot, a.cause) for a in of(acts, Signal)) == [(TRAINER, Cause.GROUP), ("worker2", Cause.GROUP)]
    assert all(a.sig == signal.SIGTERM for a in of(acts, Signal)) and not of(acts, Restart)
    sim.reaps(W1, KILLED)
    assert of(sim.tick(0.01), Settle) == [Settle(W1, 1)]
    assert sim.tick(0.2) == []  # the survivors' grace
    acts = sim.tick(0.4)  # past group_grace_secs (0.5): SIGKILL
    assert sorted(a.slot for a in of(acts, Kill)) == [TRAINER, "worker2"]
    sim.reaps(TRAINER, KILLED)
    acts = sim.tick(0.01)
    restart = of(acts, Restart)
    assert restart and restart[0].slot == TRAINER and not of(acts, Spawn)  # worker2 still holds its port
    assert sim.view.last_error is not None and sim.view.last_error.startswith(f"{W1} attempt 1")
    sim.reaps("worker2", KILLED)
    assert sim.tick(0.01) == [Settle("worker2", 1)]
    assert sim.tick() == [Spawn(TRAINER, TRAINER)]  # the launcher decides again at once after an action
    assert sim.trainer.attempt == 2 and sim.member(W1).attempt == 2 and sim.member("worker2").attempt == 2


def test_a_workers_death_noticed_with_its_error_file_names_the_error_in_the_early_restart():
    """A worker failing at import wrote its error file and died: its death notice (before its reap)
    carries the exception type, and the group's early restart names it (CI saw only "died")."""
    sim = group(2)
    sim.tick(1.0)
    observe.death_noticed(sim.view, W1, sim.member(W1).attempt, sim.now, 0.0, ChildError("ModuleNotFoundError", "", "", "run"))
    sim.tick(0.01)
    sim.reaps(TRAINER, KILLED)
    sim.tick(0.01)
    assert sim.view.last_error is not None and sim.view.last_error.startswith(f"{W1} attempt 1"), sim.view.last_error
    assert "ModuleNotFoundError" in sim.view.last_error, sim.view.last_error


def test_the_chiefs_death_noticed_early_restarts_the_group_once_the_workers_are_gone():
    sim = group(2)
    sim.tick(1.0)
    sim.notices(TRAINER)
    acts = sim.tick(0.01)
    assert of(acts, Restart) and of(acts, Signal) == [Signal(W1, 1, signal.SIGTERM, Cause.GROUP,
                                                             f"the chief (pid {sim.trainer.pid}) ended")]
    assert not of(acts, Spawn)
    sim.reaps(TRAINER, KILLED)
    sim.reaps(W1, 1, "UnavailableError")
    assert sim.tick(0.01) == [Settle(W1, 1)]
    assert sim.tick() == [Spawn(TRAINER, TRAINER)] and sim.trainer.attempt == 2


def test_a_chief_that_stopped_on_non_finite_training_is_the_cause_even_if_its_workers_death_came_in_first():
    """A chief stopping with exit 4 (diverging) leaves the group; its worker fails in its next
    collective, and the worker's death notice can come in before the chief's exit (CI saw it: the
    group was restarted from the newest finite checkpoint, met the same NaN, and only then gave up).
    The chief's stop is the cause: give up with exit 4, no restart."""
    sim = group(2)
    sim.tick(1.0)
    observe.death_noticed(sim.view, W1, sim.member(W1).attempt, sim.now, 0.0, ChildError("UnavailableError", "", "", "run"))
    acts = sim.tick(0.01)
    assert of(acts, Signal) and not of(acts, Restart)
    sim.reaps(TRAINER, 4, "TrainingDiverged")
    acts = sim.tick(0.01)
    assert not of(acts, Restart), acts
    gave_up = of(acts, GiveUp)
    assert gave_up and gave_up[0].exit_code == 4 and "diverging" in gave_up[0].reason, acts
    assert blame(sim.view, sim.trainer).slot == TRAINER
    sim.reaps(W1, 1, "UnavailableError")
    sim.tick(0.01)
    assert sim.view.exit_code == 4 and sim.view.history.restarts == 0


def test_a_worker_that_finished_cleanly_breaks_nothing_and_the_chiefs_success_ends_the_run():
    sim = group(2)
    sim.reaps(W1, 0)
    acts = sim.tick(0.5)
    assert acts == [Settle(W1, 1)]
    sim.reaps(TRAINER, 0)
    acts = sim.tick(0.01)
    assert [type(a).__name__ for a in acts] == ["Finish"] and sim.view.exit_code == 0


def test_a_worker_failing_at_import_gives_up_at_once_naming_the_worker():
    sim = GroupSim(Limits(hang=HangLimits(None, None), nproc=2))
    sim.tick()
    sim.reaps(W1, 1, "SyntaxError")  # before any step: an error a restart cannot cure
    sim.tick(0.01)
    sim.tick(0.6)
    sim.reaps(TRAINER, KILLED)
    acts = sim.tick(0.01)
    gave_up = of(acts, GiveUp)
    assert gave_up and "worker1" in gave_up[0].reason and "SyntaxError" in gave_up[0].reason
    assert blame(sim.view, sim.trainer).slot == W1


def test_a_silent_worker_is_hung_and_its_end_restarts_the_group():
    sim = GroupSim(Limits(hang=HangLimits(5.0, 60.0), nproc=2, hang_grace_secs=1.0))
    sim.tick()
    sim.group_ready()
    sim.group_progress(1)
    sim.tick(3.0)
    sim.group_progress(2, (TRAINER,))  # the chief still reports (a step it completed)
    acts = sim.tick(2.5)
    assert of(acts, Signal) == [Signal(W1, 1, signal.SIGTERM, Cause.HANG, of(acts, Signal)[0].reason)]
    assert sim.member(W1).state == ProcState.STOPPING


def test_the_groups_state_for_procsv_status():
    from procsv.watchdog.rules.group import group_state

    sim = GroupSim(Limits(hang=HangLimits(None, None), nproc=2))
    assert group_state(sim.view) == "starting"
    sim.tick()
    sim.group_ready()
    sim.group_progress(1, (TRAINER,))
    assert group_state(sim.view) == "starting"  # worker1 has not reported a step yet
    sim.group_progress(1, (W1,))
    assert group_state(sim.view) == "running"
    sim.notices(W1)
    assert group_state(sim.view) == "restarting"


def test_of_members_hung_at_once_a_stopped_one_is_signalled_and_blamed_not_the_peers_waiting_for_it():
    sim = GroupSim(Limits(hang=HangLimits(5.0, 60.0), nproc=3, hang_grace_secs=1.0))
    sim.tick()
    sim.group_ready()
    sim.group_progress(1)
    sim.member("worker2").stopped = True  # SIGSTOP: the chief and worker1 wait for it in a collective
    acts = sim.tick(5.5)
    assert [(a.slot, a.cause) for a in of(acts, Signal)] == [("worker2", Cause.HANG)]
    assert [a.slot for a in of(acts, TakeStacks)] == ["worker2"]  # one capture (every member's), for it, first
    assert acts.index(of(acts, TakeStacks)[0]) < acts.index(of(acts, Signal)[0])
    assert not of(sim.tick(0.5), Signal)  # the next rounds too: its peers are waiting, not hung
    sim.reaps(TRAINER, 1, "UnavailableError")  # TF's heartbeat fails the chief first
    acts = sim.tick(0.1)
    restart = of(acts, Restart)
    assert restart and restart[0].slot == TRAINER
    assert sim.view.last_error is not None and sim.view.last_error.startswith("worker2 attempt 1"), sim.view.last_error
    assert "hang" in sim.view.last_error
    assert not [a for a in sim.log if isinstance(a, Signal) and a.slot == "worker1" and a.cause == Cause.HANG]


def test_while_a_killed_members_end_is_read_its_peers_are_not_found_hung():
    """The stopped worker was killed as hung; its exit came in, but what is read at its end (its
    error file, by the reader thread) is not back yet. Its peers, silent past the hang timeout
    while they waited for it, are not signalled as hung meanwhile (before the end was observed at
    once; the chief was then found hung too in the round between), and once its end is observed
    rule 11 stops them."""
    sim = GroupSim(Limits(hang=HangLimits(5.0, 60.0), nproc=2, hang_grace_secs=1.0))
    sim.tick()
    sim.group_ready()
    sim.group_progress(1)
    sim.member(W1).stopped = True
    acts = sim.tick(5.5)
    assert [(a.slot, a.cause) for a in of(acts, Signal)] == [(W1, Cause.HANG)]
    assert [(a.slot, a.cause) for a in of(sim.tick(1.1), Kill)] == [(W1, Cause.HANG)]
    sim.member(W1).stopped = False  # killed: no longer stopped (a zombie until it is reaped)
    observe.end_came(sim.view, W1, 1, sim.now)
    for _ in range(5):  # the rounds until the reads are back
        assert not [a for a in sim.tick(0.1) if isinstance(a, (Signal, Kill)) and a.cause == Cause.HANG]
    sim.reaps(W1, KILLED)
    acts = sim.tick(0.01)
    assert [(a.slot, a.cause) for a in of(acts, Signal)] == [(TRAINER, Cause.GROUP)]


def test_a_hung_member_killed_but_not_yet_seen_exiting_keeps_its_peers_from_being_found_hung():
    """Between the SIGKILL of a stopped member found hung and its exit coming in, it is a zombie:
    no longer seen stopped. Its peers, silent past the hang timeout while they wait for it, are not
    signalled as hung in that round (CI saw the chief blamed too)."""
    sim = GroupSim(Limits(hang=HangLimits(3.0, 60.0), nproc=2, hang_grace_secs=1.0))
    sim.tick()
    sim.group_ready()
    sim.group_progress(1)
    sim.member(W1).stopped = True
    acts = sim.tick(3.5)
    assert [(a.slot, a.cause) for a in of(acts, Signal)] == [(W1, Cause.HANG)]
    assert [(a.slot, a.cause) for a in of(sim.tick(1.1), Kill)] == [(W1, Cause.HANG)]
    sim.member(W1).stopped = False  # SIGKILLed: a zombie, its end not come in yet
    for _ in range(5):
        assert not [a for a in sim.tick(0.1) if isinstance(a, Signal) and a.cause == Cause.HANG]
    sim.reaps(W1, KILLED)
    acts = sim.tick(0.01)
    assert [(a.slot, a.cause) for a in of(acts, Signal)] == [(TRAINER, Cause.GROUP)]


def test_a_trainer_whose_end_came_in_is_not_found_hung():
    sim = GroupSim(Limits(hang=HangLimits(5.0, 60.0), nproc=1, hang_grace_secs=1.0))
    sim.tick()
    sim.group_ready()
    sim.group_progress(1)
    observe.end_came(sim.view, TRAINER, 1, sim.now)
    assert not of(sim.tick(10.0), Signal)


def test_a_workers_end_and_the_chiefs_death_notice_in_one_round_restart_the_group_without_signalling_the_dead_chief():
    # the worker's exit status came in first, then (before the next decision) the chief's death notice:
    # the chief's early restart and rule 11's SIGTERM to it came from one decision, and the SIGTERM's
    # bookkeeping found the chief restarting already (IllegalTransition: the watchdog's internal error,
    # the run stopped with exit 70; seen with a group's rollback, whose chief fails within milliseconds)
    sim = group(2)
    sim.tick(1.0)
    sim.reaps(W1, -9)
    sim.now += 0.001
    sim.notices(TRAINER)
    acts = sim.tick(0.01)
    assert len(of(acts, Restart)) == 1 and not [a for a in of(acts, Signal) if a.slot == TRAINER], acts


def _worker_killed(sim: GroupSim) -> Restart:
    """worker1 SIGKILLed: the chief stopped and reaped; the group's Restart (its spawn follows)."""
    sim.tick(1.0)
    sim.notices(W1)
    sim.tick(0.01)
    sim.reaps(W1, KILLED)
    sim.reaps(TRAINER, KILLED)
    restart = of(sim.tick(0.01), Restart)
    assert len(restart) == 1, restart
    sim.tick(restart[0].delay + 0.01)  # the spawn of the next attempt
    sim.group_ready(50)
    sim.group_progress(51)
    return restart[0]


def test_a_group_attempt_whose_every_members_in_memory_copy_is_held_made_progress_and_its_end_restarts_at_once():
    # the group's snapshots are never committed (a restarted group restores them from the checkpoint
    # service's memory): a copy of a step held for every member is the attempt's progress, as a commit is.
    # Before: each member's death was one more failure without progress (backoff 1, 2, 4, ... 30 s, and
    # --max-restarts such deaths ended the run) however far each group had trained past its restore
    sim = group(2, restart=RestartPolicy(max_restarts=2))
    restarts = [_worker_killed(sim)]
    for _ in range(3):
        attempt = sim.trainer.attempt
        for rank in (0, 1):
            observe.heard(sim.view, GroupCopyHeld(rank, attempt, 100), sim.now)
        restarts.append(_worker_killed(sim))
    assert [r.delay for r in restarts] == [0.0] * 4 and sim.trainer.attempt == 5


def test_a_copy_held_for_one_member_only_or_of_an_older_attempt_is_no_progress():
    sim = group(2)
    _worker_killed(sim)
    observe.heard(sim.view, GroupCopyHeld(0, sim.trainer.attempt, 100), sim.now)  # worker1's never came
    observe.heard(sim.view, GroupCopyHeld(1, sim.trainer.attempt - 1, 100), sim.now)  # the dead attempt's
    observe.heard(sim.view, GroupCopyHeld(1, sim.trainer.attempt, 50), sim.now)  # of the step it restored: none past
    assert not sim.trainer.made_progress
    assert _worker_killed(sim).delay > 0  # the second failure in a row without progress: the backoff


def _stopped_while_the_restart_is_pending(sim: GroupSim) -> list[object]:
    """worker1 SIGKILLed, the chief reaped: the group's Restart decided; a SIGTERM before the next group starts."""
    sim.tick(1.0)
    sim.notices(W1)
    sim.tick(0.01)
    sim.reaps(W1, KILLED)
    sim.reaps(TRAINER, KILLED)
    assert of(sim.tick(0.01), Restart)
    observe.stop_requested(sim.view, signal.SIGTERM, sim.now, 120.0)
    return sim.tick(0.01)


def test_a_stop_while_the_groups_restart_is_pending_drops_its_in_memory_snapshot_and_says_so_with_exit_1():
    # the group's copies of step 100 are held in the checkpoint service's memory, never committed: the restart
    # would have restored them, the stop ends the run without them. Before: exit 143, which says nothing was
    # lost (seen: SIGTERM 20 ms after worker1's SIGKILL with a standby group ready, exit 143, no commit at all)
    sim = group(2)
    for rank in (0, 1):
        observe.heard(sim.view, GroupCopyHeld(rank, 1, 100), sim.now)
    finish = of(_stopped_while_the_restart_is_pending(sim), Finish)
    assert finish == [Finish(TRAINER, 1, RunState.STOPPED, 1, sim.view.history, unsaved=True)], finish


def test_a_stop_while_the_groups_restart_is_pending_with_nothing_held_past_the_newest_commit_exits_128_plus_n():
    sim = group(2)
    finish = of(_stopped_while_the_restart_is_pending(sim), Finish)
    assert [(f.run, f.exit_code, f.unsaved) for f in finish] == [(RunState.STOPPED, 128 + signal.SIGTERM, False)]


def test_a_stop_during_the_groups_restart_sends_the_starting_chief_its_sigterm_again_until_it_ends():
    # the restarted chief has brought MultiWorkerMirroredStrategy up, whose preemption notifier (a C handler
    # put in place under Python's) swallows a SIGTERM that comes before the Supervisor's handlers replace it.
    # Before: the chief's one SIGTERM was lost and the group trained on to the grace's SIGKILL (exit 1: every
    # step since the restore lost); now it is sent again every stop_resend_secs, as to the group's workers
    sim = group(2, stop_grace_secs=30.0)
    sim.tick(1.0)
    sim.notices(W1)
    sim.tick(0.01)
    sim.reaps(W1, KILLED)
    sim.reaps(TRAINER, KILLED)
    assert of(sim.tick(0.01), Restart)
    sim.tick(0.01)  # the next group is spawned (its chief starting: no Hello, no step yet)
    chief = sim.member(TRAINER)
    assert chief.attempt == 2 and chief.state == ProcState.STARTING
    observe.stop_requested(sim.view, signal.SIGTERM, sim.now, 30.0)
    assert of(sim.tick(0.01), Signal) == [Signal(TRAINER, 2, signal.SIGTERM, Cause.STOP)]
    resend = sim.limits.stop_resend_secs
    assert not of(sim.tick(resend - 0.1), Signal)  # the first is given its time
    assert of(sim.tick(0.1), Signal) == [Signal(TRAINER, 2, signal.SIGTERM, Cause.STOP)]
    assert of(sim.tick(resend), Signal) == [Signal(TRAINER, 2, signal.SIGTERM, Cause.STOP)]
    sim.reaps(TRAINER, 128 + signal.SIGTERM)  # (a lone trainer's is sent once: test_watchdog_decide)
    assert not [a for a in of(sim.tick(resend), Signal) if a.slot == TRAINER]


def test_a_worker_still_running_once_its_stopped_chief_ended_is_killed_after_the_group_grace_not_the_services():
    # a promoted standby group still preparing when the stop came: its chief ended in its wait (exit 0, nothing
    # to save), its worker went on waiting for the chief's restore pin, which never comes. Before: rule 11's
    # SIGKILL after group_grace_secs was not applied once the run's outcome was decided, and the worker was
    # killed only at the services' grace (seen: 30 s); now rule 6 gives it rule 11's grace
    sim = group(2, stop_grace_secs=40.0)
    observe.stop_requested(sim.view, signal.SIGTERM, sim.now, 40.0)
    assert of(sim.tick(0.01), Signal) == [Signal(TRAINER, 1, signal.SIGTERM, Cause.STOP)]
    sim.reaps(TRAINER, 0)
    acts = sim.tick(0.01) + sim.tick(0.01)
    assert W1 in [a.slot for a in of(acts, Signal)], acts  # (rule 11's SIGTERM, or rule 6's: whichever came first)
    assert [f.run for f in of(acts, Finish)] == [RunState.STOPPED]
    assert not of(sim.tick(0.3), Kill)
    assert of(sim.tick(0.3), Kill) == [Kill(W1, 1, Cause.SHUTDOWN)]  # past group_grace_secs (0.5)


def test_a_member_stopping_for_the_runs_stop_when_its_group_breaks_is_killed_after_the_group_grace_from_the_break():
    # SIGTERM reached node 0 and, at the same moment, node 1's host was lost: the chief, stopping in order for the
    # run's stop, waits in a collective for the dead worker. Before: rule 11 killed only members it had signalled
    # itself, and the chief was killed at the stop's grace (120 s by default; seen in a fresh-clone run: the launch
    # outlived its test's 60 s in one run of three); now it gets rule 11's grace from the break
    sim = group(2, stop_grace_secs=120.0)
    sim.tick(1.0)
    observe.stop_requested(sim.view, signal.SIGTERM, sim.now, 120.0)
    assert of(sim.tick(0.01), Signal) == [Signal(TRAINER, 1, signal.SIGTERM, Cause.STOP)]
    sim.tick(0.1)
    sim.notices(W1)  # (a lost host's members count as dead)
    assert not of(sim.tick(0.01), Kill)
    assert not of(sim.tick(0.3), Kill)  # within group_grace_secs (0.5) of the break
    assert [(k.slot, k.cause) for k in of(sim.tick(0.3), Kill)] == [(TRAINER, Cause.GROUP)]


def test_a_standby_group_member_failing_its_shadow_run_while_the_run_finishes_is_not_a_stopping_failure():
    # a successful group run ends while its standby group runs the step on shadows: the standby chief,
    # its peers stopped, fails that run and exits EXIT_NO_SHADOW_RUN; the run's outcome is decided, and a
    # standby is no trainer of it: no "while stopping" line (the chief failing on its own then still has one)
    from procsv.common.exitcodes import EXIT_NO_SHADOW_RUN
    from procsv.watchdog.rules.state import STANDBY

    sim = group(2)
    observe.spawned(sim.view, STANDBY, STANDBY, 2, 9001, sim.now, "fork")
    sim.view.run = RunState.SUCCEEDED
    err = ChildError("UnavailableError", "collective failed", "Traceback ...", "shadow run")
    said = observe.reaped(sim.view, STANDBY, 2, Failure(STANDBY, 2, 9001, EXIT_NO_SHADOW_RUN, 0.0, "log", err), sim.now)
    assert not [r for r in said if r.say and "while stopping" in r.say], said
    chief = sim.member(TRAINER)
    said = observe.reaped(sim.view, TRAINER, chief.attempt,
                          Failure(TRAINER, chief.attempt, chief.pid, 1, 0.0, "log", err), sim.now)
    assert [r.say for r in said if r.say and "while stopping" in r.say], said


def test_members_silent_at_once_get_one_capture_of_their_stacks_and_none_other_while_it_is_taken():
    """Issue 69: the group's members hang at once (one waits for the other in a collective): one
    TakeStacks (it reads every member), for the first judged; while it is taken no member asks for
    another nor is signalled; once it is back, that member is signalled and the group stops (rule 11)."""
    sim = GroupSim(Limits(hang=HangLimits(5.0, 60.0, stacks_secs=8.0), nproc=2, hang_grace_secs=1.0))
    sim.stacks_back = False
    sim.tick()
    sim.group_ready()
    sim.group_progress(1)
    acts = sim.tick(5.5)
    assert [a.slot for a in of(acts, TakeStacks)] == [TRAINER] and not of(acts, Signal)
    assert not of(sim.tick(1.0), TakeStacks) and not of(sim.tick(1.0), Signal)
    # they blame worker1 (in plain Python while the chief waits inside TensorFlow): it is the one signalled
    observe.stacks_back(sim.view, TRAINER, 1, {TRAINER: "in quick_execute (execute.py:53)",
                                               W1: "in Lock.acquire (w.py:3)"}, W1, "/l/trainer.1.stacks.txt")
    acts = sim.tick(0.1)
    assert [(a.slot, a.cause) for a in of(acts, Signal)] == [(W1, Cause.HANG)]
    assert "at trainer, which waits for it" in of(acts, Signal)[0].reason
    assert sim.member(W1).hang.where == "in Lock.acquire (w.py:3)" and sim.member(W1).hang.culprit == W1
    assert sim.member(W1).hang.stacks == "/l/trainer.1.stacks.txt" and sim.member(W1).hang.cause
    assert not of(sim.tick(0.1), TakeStacks) and not of(sim.tick(0.1), Signal)  # rule 11 stops the chief
    sim.reaps(W1, -15, "")  # it ends of the SIGTERM; the chief is stopped with the group (rule 11) and ends
    sim.tick(0.1)
    sim.reaps(TRAINER, 1, "UnavailableError")
    restart = of(sim.tick(0.1), Restart)
    assert restart and sim.view.last_error is not None and sim.view.last_error.startswith("worker1 attempt 1")
    assert "hang" in sim.view.last_error, sim.view.last_error


def test_a_member_in_the_programs_marked_wait_leaves_its_quiet_peers_unjudged():
    """The chief in ``with sv.waiting():`` (a remote service), worker1 quiet in a collective waiting for it:
    neither is stuck (before: the worker, quiet, was judged stuck with its quiet peer)."""
    sim = GroupSim(Limits(hang=HangLimits(600.0, 1800.0, stuck_secs=10.0), nproc=2, hang_grace_secs=1.0))
    sim.tick()
    sim.group_ready()
    sim.group_progress(1)
    observe.heard(sim.view, Progress(sim.member(TRAINER).pid, 1, 0.0, "waiting", True), sim.now)
    for _ in range(30):
        _looks(sim, TRAINER, 1.0)
        sim.now -= 1.0
        _looks(sim, W1, 1.0)
        assert not of(sim.tick(), TakeStacks) and not of(sim.tick(), Signal)


def test_a_restored_group_is_judged_before_its_first_step_only_once_every_member_restored():
    """Issue 69, an attack: a group restored from step 49 hangs in its first step (a member deadlocked, the
    other waiting in the step's collective): judged at --stuck-secs once both restored (before: left to
    --startup-timeout, 1800 s); while worker1 still restores (waiting on the checkpoint service, quiet) the
    chief, restored and waiting for it, is not judged."""
    sim = GroupSim(Limits(hang=HangLimits(600.0, 1800.0, stuck_secs=10.0), nproc=2, hang_grace_secs=1.0))
    sim.tick()
    c = sim.member(TRAINER)
    observe.heard(sim.view, TrainerReady(c.pid, c.attempt, 49, "model.ckpt-49", 0.1, [], 1.0, None), sim.now)
    for _ in range(20):  # worker1 restores for 20 s, quiet; the chief waits for it
        _looks(sim, TRAINER, 1.0)
        sim.now -= 1.0
        _looks(sim, W1, 1.0)
        assert not of(sim.tick(), TakeStacks), sim.now
    w = sim.member(W1)
    observe.heard(sim.view, TrainerReady(w.pid, w.attempt, 49, None, 0.1, [], None, None), sim.now)
    for _ in range(10):  # then both quiet in the first step
        _looks(sim, TRAINER, 1.0)
        sim.now -= 1.0
        _looks(sim, W1, 1.0)
    (take,) = of(sim.tick(), TakeStacks)
    assert take.reason.startswith("stuck for 10.0 s (--stuck-secs 10)") and "(its group's members too)" in take.reason


def test_a_group_is_stuck_only_when_every_member_is_quiet():
    """Issue 69 in a group: a member waiting in a collective while its peer computes (an evaluation of
    a minute on the chief) is waiting, not stuck; once every member is quiet for --stuck-secs, one
    capture is taken, then the member it blames is signalled."""
    sim = GroupSim(Limits(hang=HangLimits(600.0, 1800.0, stuck_secs=10.0), nproc=2, hang_grace_secs=1.0))
    sim.tick()
    sim.group_ready()
    sim.group_progress(1)
    for _ in range(60):  # a minute: the chief computes, worker1 waits for it, quiet
        _looks(sim, TRAINER, 1.0, cpu=0.9, woke=3)
        sim.now -= 1.0
        _looks(sim, W1, 1.0)
        assert not of(sim.tick(), TakeStacks) and not of(sim.tick(), Signal)
    for _ in range(10):  # then both quiet
        _looks(sim, TRAINER, 1.0)
        sim.now -= 1.0
        _looks(sim, W1, 1.0)
    acts = sim.tick()
    assert [a.slot for a in of(acts, TakeStacks)] == [TRAINER]
    assert "(its group's members too)" in of(acts, TakeStacks)[0].reason
    sigs = of(acts, Signal) or of(sim.tick(), Signal)
    assert sigs and sigs[0].stuck_for == 10.0, acts
    # judged stuck: every member's next limit is twice this wait (any of them could have been judged first)
    assert sim.member(TRAINER).hang.judged_max == sim.member(W1).hang.judged_max == 10.0


def test_a_stop_that_drops_a_members_start_kills_the_chief_waiting_for_it_after_the_group_grace():
    """The stop's SIGTERM reaches a chief waiting in its first collective for worker1, asked of node 1 and never
    started; rule 12 drops that start (``StartsDropped``: worker1 never started, dead). The chief has no step to save
    and its wait does not end by a SIGTERM: rule 11 SIGKILLs it ``group_grace_secs`` after the break. Before, only a
    group member signalled by rule 11 itself was killed so: the chief was left to the stop's grace (120 s)."""
    from procsv.watchdog.rules.actions import StartsDropped
    from procsv.watchdog.rules.bookkeeping import note
    from procsv.watchdog.rules.state import NodeView

    sim = GroupSim(Limits(hang=HangLimits(None, None), nproc=2))
    assert sim.tick() == [Spawn(TRAINER, TRAINER)]
    w1 = sim.member(W1)
    w1.pid, w1.node = 0, 1  # (asked of node 1's agent: in the view once dropped, pid 0)
    sim.view.nodes[1] = NodeView(1, host="10.0.0.2")
    sim.tick(1.0)
    observe.stop_requested(sim.view, signal.SIGTERM, sim.now, 120.0)
    assert [(a.slot, a.cause) for a in of(sim.tick(0.01), Signal)] == [(TRAINER, Cause.STOP)]
    note(sim.view, StartsDropped(1, (f"{W1}.1",), 1.0), sim.now, sim.limits)
    assert not of(sim.tick(0.2), Kill)  # (the group's grace)
    (kill,) = of(sim.tick(0.4), Kill)
    assert (kill.slot, kill.cause) == (TRAINER, Cause.GROUP), kill
