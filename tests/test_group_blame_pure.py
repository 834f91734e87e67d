"""Who broke a trainer group (rules/group.py ``blame``, ``late_breaker``) when a member is cut off
(killed by a signal procsv did not send, or its host lost) and a peer's collective failure comes in
first: pure, on the real view, observations and decisions with a fake clock."""

from __future__ import annotations

import signal

from procsv.report import restarts
from procsv.watchdog import observe
from procsv.watchdog.lateblame import breaker_found
from procsv.watchdog.publish.events import Event, Report
from procsv.watchdog.publish.recovery import cause, recoveries
from procsv.watchdog.publish.runmetrics import restart_cause
from procsv.watchdog.rules.actions import Cause, GiveUp, NodeLost, Restart, Signal
from procsv.watchdog.rules.bookkeeping import note
from procsv.watchdog.rules.failures import ChildError, Failure
from procsv.watchdog.rules.group import blame, late_breaker
from procsv.watchdog.rules.policy import RestartPolicy
from procsv.watchdog.rules.state import TRAINER, NodeView

from test_group_decide import W1, GroupSim, group
from test_watchdog_decide import KILLED, of


def _reaps(sim: GroupSim, slot: str, code: int, error: str = "", message: str = "Socket closed") -> list[Report]:
    c = sim.member(slot)
    err = ChildError(error, message, "Traceback ...", "run") if error else None
    failure = Failure(c.slot, c.attempt, c.pid, code, 0.0, "log", err)
    return observe.reaped(sim.view, slot, c.attempt, failure, sim.now) + breaker_found(sim.view)  # (as the loop asks)


def _breakers(reports: list[Report]) -> list[dict[str, object]]:
    return [r.fields for r in reports if r.event == Event.BREAKER]


def test_a_member_killed_by_sigkill_is_blamed_before_the_chiefs_collective_failure_that_came_in_first():
    """Both ends are in when the chief's attempt is judged, the chief's first: worker1's SIGKILL is the
    cause, not the chief's UnavailableError (before: the first to end was blamed)."""
    sim = group(2)
    sim.tick(1.0)
    _reaps(sim, TRAINER, 1, "UnavailableError")
    sim.now += 0.05
    _reaps(sim, W1, KILLED)
    acts = sim.tick(0.01)
    assert of(acts, Restart), acts
    assert blame(sim.view, sim.trainer) is sim.member(W1)
    assert sim.view.last_error == f"{W1} attempt 1 (pid {sim.member(W1).pid}) was killed by SIGKILL"
    assert restart_cause(sim.trainer) == "SIGKILL"


def test_a_member_of_another_host_killed_after_the_chiefs_judgement_is_recorded_as_the_groups_breaker():
    """The chief's collective failure is judged at once (the restart waits for no other host); node 1's
    agent's report of worker1's SIGKILL comes in after: a ``breaker`` record names worker1, last_error and
    the report's cause (report.json's: restart_cause) say so, and the next group starts as before."""
    sim = group(2)
    sim.tick(1.0)
    chief = sim.trainer
    _reaps(sim, TRAINER, 1, "UnavailableError")
    acts = sim.tick(0.01)
    assert of(acts, Restart)
    judged = f"trainer attempt 1 (pid {chief.pid}) exited with code 1: UnavailableError: Socket closed"
    assert sim.view.last_error == judged
    reports = _reaps(sim, W1, KILLED)
    truth = f"{W1} attempt 1 (pid {sim.member(W1).pid}) was killed by SIGKILL"
    assert _breakers(reports) == [{"attempt": 1, "role": W1, "pid": sim.member(W1).pid, "error": truth,
                                   "judged": judged}]
    assert any(r.say.startswith(f"procsv: {truth}: it broke the trainer group's attempt 1") for r in reports)
    assert sim.view.last_error == truth and chief.broken_by is sim.member(W1)
    assert restart_cause(chief) == "SIGKILL" and late_breaker(sim.view, chief) is None  # recorded once
    sim.tick(0.01)
    sim.tick()
    assert sim.trainer.attempt == 2  # the next group started as before


def _chief_judged_then_host_lost() -> GroupSim:
    """A group of 2, worker1 on node 1: the chief's AbortedError judged (the group restarts), then node 1
    found lost (noted as the executor does; the caller asks what that changed)."""
    sim = group(2)
    sim.member(W1).node = 1
    sim.view.nodes[1] = NodeView(1, "10.0.0.11", last_beat=sim.now)
    sim.tick(1.0)
    _reaps(sim, TRAINER, 1, "AbortedError")
    assert of(sim.tick(0.01), Restart)
    note(sim.view, NodeLost(1, 4.2), sim.now, sim.limits)
    return sim


def test_a_host_found_lost_after_the_chiefs_judgement_is_recorded_as_the_groups_breaker():
    sim = _chief_judged_then_host_lost()
    found = _breakers(breaker_found(sim.view))
    assert len(found) == 1 and found[0]["role"] == W1, found
    assert "HostLost: node 1 (10.0.0.11) went silent for 4.2 s" in str(found[0]["error"])
    assert sim.view.last_error == found[0]["error"]


def test_no_breaker_is_recorded_for_a_member_the_watchdog_stopped_nor_over_a_chiefs_own_error():
    """worker1 ended by the group's own SIGTERM after the chief's collective failure: the chief stays the
    cause. A chief that failed on an error of its own (not a collective's) stays the cause of its attempt
    even if a member is SIGKILLed after."""
    sim = group(2)
    sim.tick(1.0)
    _reaps(sim, TRAINER, 1, "UnavailableError")
    sim.tick(0.01)  # the group's SIGTERM to worker1, and the restart
    assert sim.member(W1).signalled_at is not None
    assert _breakers(_reaps(sim, W1, -signal.SIGTERM)) == []
    assert blame(sim.view, sim.trainer).slot == TRAINER

    sim = group(2)
    sim.tick(1.0)
    _reaps(sim, TRAINER, 1, "ValueError")
    sim.now += 0.05
    _reaps(sim, W1, KILLED)
    sim.tick(0.01)
    assert blame(sim.view, sim.trainer).slot == TRAINER
    assert _breakers(breaker_found(sim.view)) == []


def _ev(t: float, event: str, **fields: object) -> dict[str, object]:
    return {"time": t, "event": event, **fields}


def test_the_report_shows_a_groups_breaker_record_in_place_of_its_restarting_records_error():
    events = [
        _ev(0.0, "launch", target="t", args=[], pid=1),
        _ev(1.0, "spawned", role="trainer", attempt=1, pid=10, via="fresh"),
        _ev(1.0, "spawned", role="worker1", attempt=1, pid=20, via="node1"),
        _ev(5.0, "exited", role="trainer", attempt=1, pid=10, noticed=5.0, code=1),
        _ev(5.0, "restarting", attempt=2, delay=0.0, rollback_step=None,
            error="trainer attempt 1 (pid 10) exited with code 1: UnavailableError: Socket closed"),
        _ev(5.4, "exited", role="worker1", attempt=1, pid=20, noticed=5.3, signal="SIGKILL"),
        _ev(5.4, "breaker", attempt=1, role="worker1", pid=20, error="worker1 attempt 1 (pid 20) was killed by SIGKILL",
            judged="trainer attempt 1 (pid 10) exited with code 1: UnavailableError: Socket closed"),
        _ev(7.0, "restored", pid=11, step=40, path="p", secs=0.25, skipped=[], source="memory"),
        _ev(9.0, "exited", role="trainer", attempt=2, pid=11, noticed=9.0, code=1),
        _ev(9.0, "restarting", attempt=3, delay=0.0, rollback_step=None,
            error="trainer attempt 2 (pid 11) exited with code 1: UnavailableError: Socket closed"),
        _ev(13.0, "breaker", attempt=2, role="worker1", pid=21,
            error="worker1 attempt 2 (pid 21) was killed by SIGKILL: HostLost: node 1 (h) went silent for 4.0 s",
            judged="trainer attempt 2 (pid 11) exited with code 1: UnavailableError: Socket closed"),
    ]
    got = restarts(events)
    assert [(r.attempt, r.label, r.cause) for r in got] == [
        (2, "SIGKILL", "worker1 attempt 1 (pid 20) was killed by SIGKILL"),
        (3, "host lost", "worker1 attempt 2 (pid 21) was killed by SIGKILL: HostLost: node 1 (h) went silent for 4.0 s")]


def test_a_chief_cut_off_after_the_groups_sigterm_is_counted_by_its_signal_not_as_chaos():
    """worker1 fails in a collective first; the group's SIGTERM goes to the chief, which is then SIGKILLed
    from outside (the OOM killer) within its grace: the chief, cut off, is blamed, and report.json counts the
    restart by its SIGKILL. Before: counted as "chaos" (the group's SIGTERM taken for chaos's signal)."""
    sim = group(2)
    sim.tick(1.0)
    _reaps(sim, W1, 1, "UnavailableError")
    acts = sim.tick(0.01)
    assert [(a.slot, a.cause) for a in of(acts, Signal)] == [(TRAINER, Cause.GROUP)], acts
    chief = sim.trainer
    sim.now += 0.05
    _reaps(sim, TRAINER, KILLED)
    assert of(sim.tick(0.01), Restart)
    assert chief.broken_by is chief and not chief.chaos_sent
    assert restart_cause(chief) == "SIGKILL"


def test_the_recovery_table_names_the_member_that_broke_the_group_not_the_chiefs_exit():
    """The recovery report's cause column (report.json's ``recoveries``) of a group's restart names the
    breaker, as the restart's line does: worker1 lost with its host, found after the chief's collective
    failure was judged; worker1 SIGKILLed, judged at once. Before: the chief's own end ("exited with code 1",
    "was killed by SIGKILL" of the group's stop), whatever broke the group."""
    sim = _chief_judged_then_host_lost()
    assert _breakers(breaker_found(sim.view))
    sim.tick(0.01)
    sim.tick()
    assert sim.trainer.attempt == 2
    assert [r["cause"] for r in recoveries(sim.view.attempts)] == ["worker1 host lost"]

    sim = group(2, group_grace_secs=0.0)
    sim.tick(1.0)
    _reaps(sim, W1, KILLED)
    sim.tick(0.01)
    _reaps(sim, TRAINER, KILLED)  # the group's stop
    sim.tick(0.01)
    sim.tick()
    assert sim.trainer.attempt == 2
    assert [r["cause"] for r in recoveries(sim.view.attempts)] == ["worker1 was killed by SIGKILL"]
    assert cause(sim.view.attempts[0]) == "worker1 was killed by SIGKILL"


def test_a_member_that_died_of_the_runs_stop_after_the_group_gave_up_is_not_named_its_breaker():
    """The chief's collective failure gives the run up (--max-restarts 0); the watchdog's stop then sends
    worker1 SIGTERM, and worker1 dies of it (a program that re-raises it): no ``breaker`` record, the run's
    last error stays the chief's. Before: worker1 was found "cut off" (no signal of the group's or a hang's
    sent), a breaker record named it killed by SIGTERM, and last_error said so."""
    sim = group(2, restart=RestartPolicy(max_restarts=0))
    sim.tick(1.0)
    _reaps(sim, TRAINER, 1, "UnavailableError")
    assert of(sim.tick(0.01), GiveUp)
    judged = sim.view.last_error
    acts = sim.tick(0.01)
    assert [(a.slot, a.cause) for a in of(acts, Signal) if a.slot == W1] == [(W1, Cause.SHUTDOWN)], acts
    assert _breakers(_reaps(sim, W1, -signal.SIGTERM)) == []
    assert sim.view.last_error == judged and blame(sim.view, sim.trainer).slot == TRAINER


def test_a_members_line_holds_one_line_of_tensorflows_message_the_cause_not_where_the_op_was_defined():
    """A peer's collective failure as TensorFlow words it: "Graph execution error:", then a dozen lines of where the op
    was defined, then what failed, then the node. Before, the member's line, ``last_error`` and the ``breaker``
    record held all of it (measured: a group over two hosts whose worker1 was SIGKILLed, the chief's end judged
    first: 17 lines on node 0's stderr). Now one line: the head and what failed; a message of one line is unchanged."""
    tf_message = ("Graph execution error:\n\nDetected at node adam/CollectiveReduceV2 defined at (most recent call last):\n"
                  '  File "/x/digits.py", line 228, in <module>\n\n  File "/x/digits.py", line 128, in train_step\n\n'
                  "Collective ops is aborted by: recvmsg:Connection reset by peer\nAdditional GRPC error information from "
                  "remote target /job:worker/replica:0/task:1\n\t [[{{node adam/CollectiveReduceV2}}]] [Op:__inference_"
                  "train_step_576]")
    chief = Failure(TRAINER, 1, 42, 1, 0.0, "log", ChildError("UnavailableError", tf_message, "Traceback ...", "run"))
    assert chief.headline() == ("trainer attempt 1 (pid 42) exited with code 1: UnavailableError: Graph execution error: "
                                "Collective ops is aborted by: recvmsg:Connection reset by peer ...")
    other = Failure(TRAINER, 1, 42, 1, 0.0, "log", ChildError("ValueError", "bad shape\n  more of it", "", "run"))
    assert other.headline() == "trainer attempt 1 (pid 42) exited with code 1: ValueError: bad shape ..."
    plain = Failure(TRAINER, 1, 42, 1, 0.0, "log", ChildError("ValueError", "bad shape (3, 4)", "", "run"))
    assert plain.headline() == "trainer attempt 1 (pid 42) exited with code 1: ValueError: bad shape (3, 4)"
    sim = group(2)
    sim.tick(1.0)
    _reaps(sim, TRAINER, 1, "UnavailableError", tf_message)
    assert of(sim.tick(0.01), Restart)
    judged = sim.view.last_error
    assert judged == chief.headline().replace("pid 42", f"pid {sim.trainer.pid}")
    reports = _reaps(sim, W1, KILLED)
    said = [r.say for r in reports if r.say and "it broke the trainer group's attempt 1" in r.say]
    assert len(said) == 1 and "\n" not in said[0] and "Connection reset by peer ..., was its consequence" in said[0], said
    assert [b["judged"] for b in _breakers(reports)] == [judged]
