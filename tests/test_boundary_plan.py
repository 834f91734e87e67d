"""The checkpoint agent's step-boundary plan with a fake clock and scripted service replies (no
TensorFlow, no process, no socket).

Each test plays what a trainer's checkpoint agent would meet -- boundaries, save requests, the
service's results, time passing -- through the real :class:`BoundaryView`, the real planner
(:func:`plan`, :func:`next_bound`) and the real :class:`CommitTracker`, and checks the actions
planned. A small simulator stands in for the agent's executor: it performs each action as the agent
records it (a snapshot handed over is in flight, a read folds the replies in), with no effect.
The agent's three promises are the first three tests.
"""

from __future__ import annotations

from typing import Optional, Union

from procsv.common.errors import CheckpointError
from procsv.ipc.messages import SaveOverdue, SaveReason, SaveRequest, SaveResult
from procsv.trainer.checkpoint.boundary_plan import (HEARTBEAT_EVERY, NEVER, READ_EVERY, READ_EVERY_STEPS, READ_IDLE,
                                                     Action, BoundaryPolicy, BoundaryView, CheckDeadline,
                                                     CheckGroupLosses, HandOffSummaries, Heartbeat, MemorySnapshot,
                                                     ReadService, Release, Snapshot, Trigger, next_bound, plan)
from procsv.trainer.checkpoint.commits import CommitTracker
from procsv.trainer.checkpoint.revisions import Revisions

Reply = Union[SaveRequest, SaveResult]


class Agent:
    """A fake executor and a fake clock around the real view, plan and commit bookkeeping."""

    def __init__(self, save_steps: Optional[int] = None, failure_limit: int = 3, saving: bool = True,
                 group_every: int = 0) -> None:
        self.now = 0.0
        self.view = BoundaryView(BoundaryPolicy(saving, save_steps, group_every))
        self.commits = CommitTracker(failure_limit, deadline_floor=30.0)
        self.inbox: list[Reply] = []  # what the service sent, taken at the next read
        self.written = 0  # the bytes in the service's unfinished files (what a deadline looks at)
        self.told: list[SaveOverdue] = []  # what the watchdog was told
        self.summaries_written = True  # the summaries of every step are written (a waiting in-memory snapshot may go)
        self.waiting: Optional[int] = None  # the in-memory snapshot copied and waiting for its summaries
        self.log: list[Action] = []

    # -- the agent's part
    def observe(self) -> BoundaryView:
        in_flight = self.commits.step
        self.view.observe(in_flight, self.commits.overdue_at if in_flight is not None else NEVER, False)
        self.view.observe_memory(-1, self.waiting, False, self.waiting is None, NEVER, False,
                                 None if self.summaries_written else -1)
        return self.view

    def boundary(self, step: int, dt: float = 0.0, ahead: float = 0.0) -> list[Action]:
        """The boundary after ``step``, ``dt`` s after the last one: every action planned there, performed."""
        self.now += dt
        self.view.begin(step, self.now)
        done: list[Action] = []
        while True:
            actions = plan(self.observe(), step, self.now, ahead)
            for action in actions:
                self.perform(action, step)
                self.view.did(action)
            done += actions
            if not actions or not isinstance(actions[-1], (ReadService, Release)):
                break
        self.log += done
        return done

    def perform(self, action: Action, step: int) -> None:
        if isinstance(action, Heartbeat):
            self.view.heartbeat_sent(self.now)
        elif isinstance(action, ReadService):
            for msg in self.inbox:
                self.fold(msg)
            self.inbox.clear()
            wait = READ_EVERY if self.commits.step is not None else READ_IDLE
            self.view.read(action.step, self.now + wait)
        elif isinstance(action, CheckDeadline):
            if not self.commits.progressing(self.written, self.now):
                overdue = self.commits.overdue(self.now)
                self.told.append(overdue)
                self.commits.failed(overdue.step, "no result")
        elif isinstance(action, Trigger):
            self.view.requested(action.reason)
        elif isinstance(action, Snapshot):
            self.commits.sent(action.step, action.reason, 1000, self.now)
            self.view.served()
            self.view.answer_awaited(self.now + READ_EVERY)
        elif isinstance(action, Release):
            self.waiting = None

    def fold(self, msg: Reply) -> None:
        """A reply of the service, as the agent folds it in."""
        if isinstance(msg, SaveRequest):
            self.view.requested(msg.reason)
        elif msg.step == self.commits.step:
            self.commits.answered()
            if msg.ok:
                self.view.committed(msg.step)
                self.commits.committed(msg.persist_secs)
            elif msg.reason == SaveReason.LOST:
                self.view.requested(self.commits.reason)
            else:
                self.commits.failed(msg.step, msg.error)

    # -- what the service does
    def commit(self, step: int) -> None:
        self.inbox.append(SaveResult(step, SaveReason.STEPS, True, f"model.ckpt-{step}", None, 0.1))

    def request(self, reason: SaveReason = SaveReason.PERIODIC) -> None:
        self.inbox.append(SaveRequest(reason))


def snapshots(actions: list[Action]) -> list[Snapshot]:
    return [a for a in actions if isinstance(a, Snapshot)]


# --------------------------------------------------------------------------- the three promises
def test_no_snapshot_is_planned_while_one_is_in_flight_however_many_triggers_come() -> None:
    agent = Agent(save_steps=10)
    for step in range(1, 10):
        assert snapshots(agent.boundary(step, dt=0.01)) == []
    assert snapshots(agent.boundary(10, dt=0.01)) == [Snapshot(10, SaveReason.STEPS)]
    assert agent.observe().in_flight == 10
    # the service asks for a save, the program does, the step trigger fires twice: all while step 10 is in flight
    agent.request()
    for step in range(11, 35):
        if step == 15:
            agent.view.requested(SaveReason.FINAL)
        assert snapshots(agent.boundary(step, dt=0.01)) == [], step
    assert agent.observe().in_flight == 10 and agent.view.pending is not None


def test_a_trigger_during_a_flight_is_served_once_at_the_first_boundary_after_the_result() -> None:
    agent = Agent(save_steps=10)
    agent.view.requested(SaveReason.PERIODIC)
    assert snapshots(agent.boundary(3, dt=0.5)) == [Snapshot(3, SaveReason.PERIODIC)]
    agent.view.requested(SaveReason.PERIODIC)  # the program asks, then the step trigger at 10, then the service's timer
    agent.request(SaveReason.PERIODIC)
    for step in range(4, 12):
        agent.boundary(step, dt=0.001)
    assert not any(isinstance(a, Trigger) for a in agent.log)  # a save is pending already: coalesced, not queued
    assert agent.view.pending == SaveReason.PERIODIC and agent.observe().in_flight == 3
    agent.commit(3)
    # the result is read at the next read (due READ_EVERY after the last): that boundary saves its own step, once
    served = {}
    for step in range(12, 40):
        for snap in snapshots(agent.boundary(step, dt=0.004)):
            served[step] = snap
            agent.commit(step)  # (it commits at once: the next trigger is the step trigger at 20, then 30)
    first = min(served)
    assert served[first] == Snapshot(first, SaveReason.PERIODIC)  # the step the result was read at, as it is then
    assert agent.view.last_committed >= 3 and first <= 15
    assert sorted(served) == [first, 20, 30]  # served once: then only the step triggers after it
    assert all(s.reason == SaveReason.STEPS for step, s in served.items() if step != first)


def test_a_passed_deadline_is_a_failed_checkpoint_told_to_the_watchdog_until_the_limit_stops_training() -> None:
    agent = Agent(failure_limit=3)
    agent.view.requested(SaveReason.PERIODIC)
    assert snapshots(agent.boundary(1)) == [Snapshot(1, SaveReason.PERIODIC)]  # sent at t=0: 30 s to commit
    for step in range(2, 31):  # t = 1 .. 29
        assert not any(isinstance(a, CheckDeadline) for a in agent.boundary(step, dt=1.0))
    actions = agent.boundary(31, dt=1.0)  # t = 30: passed
    assert CheckDeadline(1) in actions
    assert [(o.step, o.waited_secs) for o in agent.told] == [(1, 30.0)] and agent.commits.failures_in_a_row == 1
    # the next deadline when the wait has tripled (the service's replacement takes time): t = 90
    for step in range(32, 91):  # t = 31 .. 89
        assert CheckDeadline(1) not in agent.boundary(step, dt=1.0)
    assert CheckDeadline(1) in agent.boundary(91, dt=1.0) and len(agent.told) == 2
    assert agent.commits.failure is None
    agent.boundary(92, dt=180.0)  # t = 270: the third
    assert len(agent.told) == 3 and isinstance(agent.commits.failure, CheckpointError)
    assert snapshots(agent.log) == [Snapshot(1, SaveReason.PERIODIC)]  # never a second one while it is in flight


def test_a_commit_still_writing_at_its_deadline_is_slow_not_failed() -> None:
    agent = Agent()
    agent.view.requested(SaveReason.PERIODIC)
    agent.boundary(1)
    agent.written = 5_000_000  # the service's unfinished files grew
    assert CheckDeadline(1) in agent.boundary(2, dt=30.0)
    assert agent.told == [] and agent.commits.failures_in_a_row == 0
    assert CheckDeadline(1) not in agent.boundary(3, dt=29.0)  # a whole deadline more from then
    assert CheckDeadline(1) in agent.boundary(4, dt=1.0) and len(agent.told) == 1  # nothing moved since: failed


def test_a_service_restarted_with_the_snapshot_in_flight_has_it_taken_again_for_the_same_reason() -> None:
    agent = Agent()
    agent.view.requested(SaveReason.PERIODIC)
    agent.boundary(5, dt=1.0)
    agent.inbox.append(SaveResult(5, SaveReason.LOST, False, None, "lost", 0.0))
    assert snapshots(agent.boundary(6, dt=READ_EVERY)) == [Snapshot(6, SaveReason.PERIODIC)]


# --------------------------------------------------------------------------- the rhythm
def test_a_boundary_reads_the_service_once_even_when_the_next_read_is_due_within_its_slack() -> None:
    agent = Agent()
    agent.view.requested(SaveReason.PERIODIC)
    assert [type(a) for a in agent.boundary(1, dt=1.0)] == [ReadService, HandOffSummaries, Snapshot]
    # in flight: the next read is due READ_EVERY (0.01 s) after a read, well within a 0.05 s slack
    assert agent.boundary(2, dt=READ_EVERY, ahead=0.05) == [ReadService(2)]


def test_the_service_is_heartbeated_every_two_seconds_by_a_saving_trainer_only() -> None:
    agent = Agent()
    assert Heartbeat(1) in agent.boundary(1, dt=HEARTBEAT_EVERY)
    assert Heartbeat(2) not in agent.boundary(2, dt=HEARTBEAT_EVERY / 2)
    assert Heartbeat(3) in agent.boundary(3, dt=HEARTBEAT_EVERY / 2)
    worker = Agent(saving=False, group_every=5)
    assert not any(isinstance(a, Heartbeat) for step in range(1, 20) for a in worker.boundary(step, dt=1.0))


def test_the_step_trigger_never_fires_for_the_step_a_restart_restored() -> None:
    agent = Agent(save_steps=50)
    agent.view.restored(50)
    assert snapshots(agent.boundary(50)) == [] and agent.view.pending is None
    assert snapshots(agent.boundary(51)) == []
    assert snapshots(agent.boundary(100)) == [Snapshot(100, SaveReason.STEPS)]


def test_the_step_trigger_fires_once_for_a_step_whose_boundary_comes_again() -> None:
    # a graph program's runs that advance no step (a read of the global step after each train run) bring the
    # boundary of the step that stands again: step 40's trigger put 40 in flight, and the next boundary at 40
    # triggered again, pending, and saved step 42 as a second "steps" checkpoint (40, 42, 60, 62, ...)
    agent = Agent(save_steps=20)
    assert snapshots(agent.boundary(20)) == [Snapshot(20, SaveReason.STEPS)]
    again = agent.boundary(20, dt=1.0)
    assert not any(isinstance(a, Trigger) for a in again) and agent.view.pending is None, again
    agent.commit(20)
    assert snapshots(agent.boundary(21, dt=1.0)) == [] and snapshots(agent.boundary(22, dt=1.0)) == []
    assert snapshots(agent.boundary(40, dt=1.0)) == [Snapshot(40, SaveReason.STEPS)]


def test_a_step_trigger_with_a_snapshot_in_flight_reads_the_service_once_more_and_saves_if_it_committed() -> None:
    agent = Agent(save_steps=5)
    agent.view.requested(SaveReason.PERIODIC)
    agent.boundary(3)
    assert agent.boundary(4) == []  # no read due yet (READ_EVERY after the hand-over)
    agent.commit(3)
    actions = agent.boundary(5)  # still no read due by the clock: the trigger reads
    assert actions[:2] == [Trigger(SaveReason.STEPS), ReadService(5)]
    assert snapshots(actions) == [Snapshot(5, SaveReason.STEPS)]


def test_the_next_bound_is_every_boundary_while_a_save_is_pending_or_in_flight_and_exact_for_step_triggers() -> None:
    agent = Agent(save_steps=100)
    agent.boundary(1, dt=1.0)
    step_bound, at = next_bound(agent.observe(), 1, agent.now)
    assert step_bound == 100 and at == min(agent.view.next_read, agent.view.last_heartbeat + HEARTBEAT_EVERY)
    assert next_bound(agent.observe(), 7, agent.now)[0] == min(100, agent.view.read_step + READ_EVERY_STEPS)
    agent.view.requested(SaveReason.PERIODIC)
    assert next_bound(agent.observe(), 1, agent.now) == (2, agent.now)
    agent.boundary(2)
    assert agent.observe().in_flight == 2 and next_bound(agent.observe(), 2, agent.now) == (3, agent.now)


# --------------------------------------------------------------------------- the in-memory tier
def test_an_in_memory_snapshot_waiting_for_its_summaries_goes_once_written_and_never_beside_a_disk_one() -> None:
    agent = Agent()
    agent.waiting, agent.summaries_written = 7, False
    assert agent.boundary(8, dt=1.0) == [ReadService(8)]  # its summaries are not written: it waits
    assert next_bound(agent.observe(), 8, agent.now) == (9, agent.now)
    agent.summaries_written = True
    assert agent.boundary(9) == [Release(7)] and agent.waiting is None
    agent.waiting = 9
    agent.view.requested(SaveReason.PERIODIC)  # a disk snapshot due: it goes, the waiting one is the agent's to drop
    assert [type(a) for a in agent.boundary(10, dt=0.5)] == [ReadService, HandOffSummaries, Snapshot]


def test_a_group_member_snapshots_in_memory_and_checks_its_losses_at_every_kth_step_only() -> None:
    agent = Agent(saving=False, group_every=5)
    planned = {step: agent.boundary(step, dt=0.001) for step in range(1, 11)}
    assert [s for s, acts in planned.items() if MemorySnapshot(s) in acts] == [5, 10]
    assert [s for s, acts in planned.items() if CheckGroupLosses(s) in acts] == [5, 10]
    assert next_bound(agent.observe(), 10, agent.now)[0] == 15


def test_a_group_chief_checks_its_losses_at_every_nth_step_even_when_its_snapshot_there_waits_behind_one_in_flight() -> None:
    """The chief (``save_checkpoint_steps`` 10, K 50) whose step-20 commit is slow (a busy machine): its triggers
    at 30 and 40 meet that snapshot in flight and take none, yet its losses are checked there, as where it took one;
    a worker checks at the K-th steps alone. Before: the check went with the snapshot only, and a NaN at step 40
    was found at 40 on a quiet machine, at 50 at load (the CI run at load 6.5: the whole group trained on to 50)."""
    chief = Agent(save_steps=10, group_every=50)
    planned: dict[int, list[Action]] = {}
    for step in range(1, 51):
        if step == 15:
            chief.commit(10)  # step 10 commits; step 20's stays in flight to the end
        planned[step] = chief.boundary(step, dt=0.001)
    assert [s.step for acts in planned.values() for s in snapshots(acts)] == [10, 20]
    assert chief.observe().in_flight == 20 and chief.view.pending == SaveReason.STEPS
    assert [s for s, acts in planned.items() if CheckGroupLosses(s) in acts] == [10, 20, 30, 40, 50]
    worker = Agent(saving=False, save_steps=10, group_every=50)  # (a worker saves nothing, whatever its program asks)
    checked = [s for s in range(1, 101) if CheckGroupLosses(s) in worker.boundary(s, dt=0.001)]
    assert checked == [50, 100]


# --------------------------------------------------------------------------- the revisions of a committed step
def test_a_newer_state_of_a_committed_step_goes_as_its_next_revision_and_is_taken_again_if_not_written() -> None:
    revisions = Revisions()
    assert revisions.take(10, last_committed=5) == 0  # a step not committed yet: no rewrite
    assert revisions.answered(10, ok=True, again=False, revision=0, last_committed=5) is False
    assert revisions.take(10, last_committed=10) == 1  # runs changed the state of step 10: its revision 1
    assert revisions.answered(10, ok=True, again=False, revision=1, last_committed=10) is False
    assert revisions.committed == 1 and revisions.take(10, last_committed=10) == 2
    # the service had that revision already (a dead trainer's snapshot, an answer lost): the state goes again
    assert revisions.answered(10, ok=True, again=True, revision=2, last_committed=10) is True
    assert revisions.take(10, last_committed=10) == 3
    assert revisions.answered(10, ok=False, again=False, revision=0, last_committed=10) is True  # failed: again


def test_a_step_a_rollback_passed_over_is_written_as_the_revision_above_the_one_passed_over() -> None:
    revisions = Revisions()
    revisions.passed_over({30: 0, 40: 2})  # committed after the bound B: never answered "committed already"
    assert revisions.take(30, last_committed=20) == 1 and revisions.take(40, last_committed=20) == 3
    assert revisions.take(35, last_committed=20) == 0
    revisions.answered(40, ok=True, again=False, revision=3, last_committed=20)
    assert revisions.superseded == {30: 0} and revisions.committed == 3
