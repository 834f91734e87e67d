"""The standby group's rules (``--nproc N`` on one host), with a fake clock (no process runs).

The group simulator of ``test_group_decide`` with the executor's standby group: a ``Spawn`` of the
standby forks one member per task (slots ``standby``, ``standby1``, ...) for the group's next attempt.
"""

from __future__ import annotations

import signal

from procsv.ipc.messages import StandbyReady
from procsv.watchdog import observe
from procsv.watchdog.rules import standby
from procsv.watchdog.rules.actions import Cause, Kill, Promote, Restart, Signal, Spawn, StandbyGone
from procsv.watchdog.rules.decide import Limits
from procsv.watchdog.rules.hang import HangLimits
from procsv.watchdog.rules.lifecycle import ProcState
from procsv.watchdog.rules.failures import Failure
from procsv.watchdog.rules.state import STANDBY, TRAINER, WORKER, ZygoteState

from test_group_decide import W1, GroupSim
from test_watchdog_decide import KILLED, of

S1 = standby.slot(1)


class StandbyGroupSim(GroupSim):
    """A group of ``nproc`` trainers whose hot standby is a standby group of ``nproc``."""

    def __init__(self, nproc: int = 2) -> None:
        super().__init__(Limits(hang=HangLimits(None, None), nproc=nproc), zygote=ZygoteState.READY)
        self.view.standby_ok = True
        self.one_by_one = False  # the zygote's answers for a standby group come in one round
        self.rest: list[int] = []

    def spawn(self, slot: str, role: str) -> None:
        if role != STANDBY:
            super().spawn(slot, role)
            return
        self.rest = list(range(self.limits.nproc))
        self.answer(1 if self.one_by_one else self.limits.nproc)

    def answer(self, n: int) -> None:
        """The zygote answers for the next ``n`` members of the standby group (one at a time, in task order)."""
        attempt = self.view.children[TRAINER].attempt + 1
        for rank in self.rest[:n]:
            observe.spawned(self.view, standby.slot(rank), STANDBY, attempt, next(self._pids), self.now, "zygote")
        self.rest = self.rest[n:]

    def standby_ready(self, *slots: str) -> None:
        for slot in slots or [standby.slot(r) for r in range(self.limits.nproc)]:
            sb = self.view.children[slot]
            observe.heard(self.view, StandbyReady(sb.pid, sb.attempt, 0.5), self.now)

    def started(self) -> "StandbyGroupSim":
        """The first group spawned, restored and stepped."""
        assert self.tick() == [Spawn(TRAINER, TRAINER)]
        self.group_ready()
        self.group_progress(1)
        return self


def test_a_standby_group_is_prepared_once_the_group_stepped_one_member_per_task_for_the_next_attempt():
    sim = StandbyGroupSim(3)
    assert sim.tick() == [Spawn(TRAINER, TRAINER)]
    sim.group_ready()
    assert sim.tick(1.0) == []  # restored, no step yet
    sim.group_progress(1)
    assert sim.tick() == [Spawn(STANDBY, STANDBY)]
    sbs = standby.members(sim.view)
    assert [(c.slot, c.attempt, c.state) for c in sbs] == [(s, 2, ProcState.STANDBY) for s in ("standby", S1, "standby2")]
    assert sim.tick(5.0) == []  # one standby group at a time
    assert not standby.promotable(sim.view, 3)
    sim.standby_ready("standby", S1)
    assert not standby.promotable(sim.view, 3)  # only whole
    sim.standby_ready("standby2")
    assert standby.promotable(sim.view, 3)


def test_a_workers_death_with_the_standby_group_ready_kills_the_survivors_at_once_and_promotes_the_whole_group():
    sim = StandbyGroupSim().started()
    sim.tick()
    sim.standby_ready()
    pids = {s: sim.view.children[s].pid for s in (STANDBY, S1)}
    sim.notices(W1)
    acts = sim.tick(0.01)
    assert of(acts, Kill) == [Kill(TRAINER, 1, Cause.GROUP_NOW, of(acts, Kill)[0].reason)]  # no SIGTERM, no grace
    assert not of(acts, Signal)
    sim.reaps(W1, KILLED)
    sim.reaps(TRAINER, KILLED)
    acts = sim.tick(0.01) + sim.tick()
    assert of(acts, Restart) and of(acts, Promote) == [Promote(STANDBY, 2), Promote(S1, 2)]
    assert not of(acts, Spawn)
    chief, worker = sim.view.children[TRAINER], sim.view.children[W1]
    assert (chief.pid, chief.attempt, chief.role, chief.state) == (pids[STANDBY], 2, TRAINER, ProcState.STARTING)
    assert (worker.pid, worker.attempt, worker.role, worker.state) == (pids[S1], 2, WORKER, ProcState.STARTING)
    assert sim.view.attempts[-1] is chief and not standby.members(sim.view)
    sim.group_ready(100)
    sim.group_progress(101)
    assert sim.tick() == [Spawn(STANDBY, STANDBY)]  # the next standby group, for attempt 3
    assert [c.attempt for c in standby.members(sim.view)] == [3, 3]


def test_a_chiefs_death_promotes_the_standby_group_too():
    sim = StandbyGroupSim().started()
    sim.tick()
    sim.standby_ready()
    sim.notices(TRAINER)
    acts = sim.tick(0.01)
    assert [(a.slot, a.cause) for a in of(acts, Kill)] == [(W1, Cause.GROUP_NOW)]
    sim.reaps(W1, KILLED)
    sim.reaps(TRAINER, KILLED)
    acts = sim.tick(0.01) + sim.tick()
    assert of(acts, Promote) == [Promote(STANDBY, 2), Promote(S1, 2)] and not of(acts, Spawn)


def test_a_standby_group_not_whole_ready_leaves_the_survivors_their_grace_and_the_restart_forks():
    sim = StandbyGroupSim().started()
    sim.tick()
    sim.standby_ready(STANDBY)  # standby1 still building
    sim.notices(W1)
    acts = sim.tick(0.01)
    assert [(a.slot, a.cause, a.sig) for a in of(acts, Signal)] == [(TRAINER, Cause.GROUP, signal.SIGTERM)]
    sim.reaps(W1, KILLED)
    sim.reaps(TRAINER, KILLED)
    acts = sim.tick(0.01) + sim.tick()
    assert Kill(STANDBY, 2, Cause.STANDBY_UNREADY) in acts and Kill(S1, 2, Cause.STANDBY_UNREADY) in acts
    assert Spawn(TRAINER, TRAINER) in acts and not of(acts, Promote)


def test_a_standby_member_dying_on_its_own_takes_the_rest_along_and_another_group_is_prepared_after_the_backoff():
    sim = StandbyGroupSim().started()
    sim.tick()
    sim.standby_ready()
    sim.dies(S1, KILLED)  # from outside, before any promotion
    acts = sim.tick()
    assert Kill(STANDBY, 2, Cause.STANDBY_LOST) in acts and StandbyGone(S1, 2, failed=True) in acts
    assert not standby.promotable(sim.view, 2)
    sim.dies(STANDBY, KILLED)
    assert of(sim.tick(), StandbyGone) == [StandbyGone(STANDBY, 2, failed=False)]  # killed by the watchdog
    assert sim.view.standby_failures == 1 and sim.view.children[TRAINER].live and sim.view.children[W1].live
    assert sim.tick(standby.backoff(1) / 2) == []
    sim.one_by_one = True  # the zygote answers for the new standby before the new standby1: the old one, settled,
    assert sim.tick(standby.backoff(1)) == [Spawn(STANDBY, STANDBY)]  # still holds its slot meanwhile
    assert sim.tick() == []  # (not a broken group: nothing is killed)
    sim.answer(1)
    assert [(c.slot, c.attempt, c.live) for c in standby.members(sim.view)] == [(STANDBY, 2, True), (S1, 2, True)]
    assert sim.tick() == []


def test_a_restart_due_while_a_broken_standby_group_is_settled_forks_the_next_group():
    sim = StandbyGroupSim().started()
    sim.tick()
    sim.dies(S1, KILLED)
    sim.tick()
    sim.dies(STANDBY, KILLED)
    sim.tick()
    sim.notices(W1)
    acts = sim.tick(0.01)
    assert [(a.slot, a.cause) for a in of(acts, Signal)] == [(TRAINER, Cause.GROUP)]  # no standby: the grace
    sim.reaps(W1, KILLED)
    sim.reaps(TRAINER, KILLED)
    acts = sim.tick(0.01) + sim.tick()
    assert Spawn(TRAINER, TRAINER) in acts and not of(acts, Promote) and not of(acts, Kill)


def test_the_at_once_kill_lines_name_the_member_that_ended_and_each_member_killed():
    # three members: worker2 ends with the standby group ready; the line for each survivor says which one it
    # is and why (before: "killing the group's worker process at once" for worker1, whichever had ended)
    from procsv.watchdog.actionlines import kill_reports

    sim = StandbyGroupSim(3).started()
    sim.tick()
    sim.standby_ready()
    sim.notices("worker2")
    kills = of(sim.tick(0.01), Kill)
    said = sorted(r.say for k in kills for r in kill_reports(sim.view, k, sim.limits))
    pid = sim.view.children["worker2"].pid
    assert said == [f"procsv: a member of the trainer group ended (worker2 (pid {pid}) ended) and the standby group "
                    f"is ready; killing the group's {slot} process at once" for slot in ("trainer", W1)], said


def test_a_member_whose_shadow_run_did_not_complete_has_the_group_replaced_at_once_and_the_next_ones_skip_it():
    # its peers may wait in the step's collective for good (never ready): the rest is killed, it is no failure
    # of the standby (no backoff), and every later standby group of the run is prepared "without shadow run"
    from procsv.common.exitcodes import EXIT_NO_SHADOW_RUN

    sim = StandbyGroupSim().started()
    assert sim.tick() == [Spawn(STANDBY, STANDBY)] and sim.view.shadow_runs
    sim.standby_ready(STANDBY)  # (a member may have said ready before; the one stuck never does)
    sim.dies(S1, EXIT_NO_SHADOW_RUN)
    acts = sim.tick()
    assert Kill(STANDBY, 2, Cause.STANDBY_LOST) in acts
    assert StandbyGone(S1, 2, failed=False, no_shadow=True) in acts
    assert not sim.view.shadow_runs and sim.view.standby_failures == 0
    sim.dies(STANDBY, KILLED)
    assert of(sim.tick(), StandbyGone) == [StandbyGone(STANDBY, 2, failed=False)]
    assert sim.tick(0.01) == [Spawn(STANDBY, STANDBY)]  # at once: no backoff
    sim.standby_ready()
    assert standby.promotable(sim.view, 2) and not sim.view.shadow_runs  # for the rest of the run
    sim.notices(W1)
    acts = sim.tick(0.01)
    assert [(a.slot, a.cause) for a in of(acts, Kill)] == [(TRAINER, Cause.GROUP_NOW)]
    sim.reaps(W1, KILLED)
    sim.reaps(TRAINER, KILLED)
    acts = sim.tick(0.01) + sim.tick()
    assert of(acts, Promote) == [Promote(STANDBY, 2), Promote(S1, 2)] and not of(acts, Spawn)


def test_the_exit_code_of_no_shadow_run_counts_only_from_a_member_that_ended_on_its_own():
    from procsv.common.exitcodes import EXIT_NO_SHADOW_RUN

    sim = StandbyGroupSim().started()
    sim.tick()
    sb = sim.view.children[S1]
    sb.failure = Failure(S1, 2, sb.pid, EXIT_NO_SHADOW_RUN, 0.0, "")
    sb.killed = True  # the watchdog's kill, whatever code it ended with
    assert standby.gone(sim.view, sb) == StandbyGone(S1, 2, failed=False, no_shadow=False)
    sb.killed = False
    sim.view.stop_signal = signal.SIGTERM  # a stop under way: nothing to prepare again
    assert standby.gone(sim.view, sb) == StandbyGone(S1, 2, failed=False, no_shadow=False)
    sim.view.stop_signal = None
    assert standby.gone(sim.view, sb) == StandbyGone(S1, 2, failed=False, no_shadow=True)
    sb.failure = Failure(S1, 2, sb.pid, 1, 0.0, "")
    assert standby.gone(sim.view, sb) == StandbyGone(S1, 2, failed=True, no_shadow=False)


def test_a_standby_that_cannot_hold_the_programs_own_server_ends_the_runs_standbys_without_backoff():
    # issue 67 point 4: EXIT_NO_STANDBY (the program's own tf.train.Server on the trainer's port) is no
    # failure of the standby: none is prepared for the rest of the run; a kill or a stop is as before
    from procsv.common.exitcodes import EXIT_NO_STANDBY

    sim = StandbyGroupSim().started()
    sim.tick()
    sb = sim.view.children[S1]
    sb.failure = Failure(S1, 2, sb.pid, EXIT_NO_STANDBY, 0.0, "")
    sb.killed = True
    assert standby.gone(sim.view, sb) == StandbyGone(S1, 2, failed=False)
    sb.killed = False
    assert standby.gone(sim.view, sb) == StandbyGone(S1, 2, failed=False, unsuitable=True)
    sim.dies(S1, EXIT_NO_STANDBY)
    acts = sim.tick()
    assert StandbyGone(S1, 2, failed=False, unsuitable=True) in acts
    assert sim.view.standby_ok is False and sim.view.standby_failures == 0
    sim.dies(STANDBY, KILLED)
    sim.tick()
    assert not of(sim.tick(60.0), Spawn)  # none again, however long the run trains on
