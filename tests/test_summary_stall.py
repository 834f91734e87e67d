"""A summary service that is alive but stuck (SIGSTOP, a hung disk) is found and replaced.

Pure parts: the trainer's :class:`SummarySender` judges its oldest batch in flight against the
deadline (on a fake clock, against the model service of test_summary_restatement.py), and the
watchdog's decision turns the trainer's ``SummaryOverdue`` into a SIGKILL of the summary service
(:mod:`procsv.watchdog.rules.stall`), believed only of a service that has run for a whole deadline.
The same against real processes (a SIGSTOPped service) is in test_summary_crash.py.
"""

from __future__ import annotations

import signal

from procsv.ipc.messages import SummaryOverdue
from procsv.trainer.summaries import SummaryBuffer, SummarySender
from procsv.watchdog import observe
from procsv.watchdog.rules.actions import Cause, Kill, RespawnService
from procsv.watchdog.rules.bookkeeping import request_stop
from procsv.watchdog.rules.state import SUMMARY

from test_summary_restatement import Clock, ModelService
from test_watchdog_decide import Sim, of

DEADLINE = 30.0


def _sender() -> tuple[Clock, ModelService, SummaryBuffer, SummarySender]:
    clock = Clock()
    svc = ModelService()
    buf = SummaryBuffer(clock)
    return clock, svc, buf, SummarySender(buf, svc.send, svc.read_acks, start_step=1, session="S", deadline=DEADLINE)


def _steps(clock: Clock, buf: SummaryBuffer, sender: SummarySender, first: int, secs: float) -> int:
    """Log a scalar a step, a step every 0.1 s, for ``secs``; returns the next step."""
    step = first
    for _ in range(int(secs * 10)):
        buf.scalar("loss", float(step), step, 0.0)
        sender.at_boundary(step)
        clock.t += 0.1
        step += 1
    return step


def test_a_batch_without_an_ack_past_the_deadline_is_overdue_once_then_again_when_the_wait_tripled():
    clock, svc, buf, sender = _sender()
    step = _steps(clock, buf, sender, 1, DEADLINE - 1)  # the service handles nothing: stuck
    assert sender.inflight and sender.overdue is None
    step = _steps(clock, buf, sender, step, 1.5)
    overdue = sender.overdue
    assert isinstance(overdue, SummaryOverdue)
    assert overdue.step == 1 and DEADLINE <= overdue.waited_secs < DEADLINE + 1.5 and overdue.deadline_secs == DEADLINE
    sender.overdue = None  # what the Supervisor does once it told the watchdog
    step = _steps(clock, buf, sender, step, 2 * DEADLINE - 2)
    assert sender.overdue is None  # not before the wait has tripled: the replacement takes time
    step = _steps(clock, buf, sender, step, 3)
    assert sender.overdue is not None and sender.overdue.waited_secs >= 3 * DEADLINE


def test_a_service_that_answers_is_never_overdue_even_across_a_long_step():
    clock, svc, buf, sender = _sender()
    step = 1
    for _ in range(20):
        step = _steps(clock, buf, sender, step, 5.0)
        svc.handle(100)
    assert sender.overdue is None
    buf.scalar("loss", 1.0, step, 0.0)
    sender.at_boundary(step)
    svc.handle(100)  # answered at once, but the trainer is in a 40 s step and reads it only after
    clock.t += 40.0
    sender.at_boundary(step + 1)
    assert sender.overdue is None
    assert all(s.sent_at == clock.t for s in sender.inflight)  # the old batch's ack was read: only a heartbeat just sent


def test_a_replacement_that_asks_for_a_restatement_is_judged_by_the_deadline_alone():
    clock, svc, buf, sender = _sender()
    step = _steps(clock, buf, sender, 1, DEADLINE + 1)
    assert sender.overdue is not None
    sender.overdue = None
    svc.restart(keep=0)  # the watchdog replaced it; the new one asks for everything again
    step = _steps(clock, buf, sender, step, 2.0)
    svc.handle(100)
    step = _steps(clock, buf, sender, step, 1.0)
    assert sender.restatements == 1
    step = _steps(clock, buf, sender, step, DEADLINE + 2)  # ... and then is stuck too
    assert sender.overdue is not None and sender.overdue.waited_secs < DEADLINE + 3


def _overdue(sim: Sim, waited: float = 31.0) -> None:
    observe.heard(sim.view, SummaryOverdue(sim.trainer.pid, 40, waited, DEADLINE), sim.now)


def test_the_watchdog_replaces_a_summary_service_the_trainer_says_is_overdue():
    sim = Sim()
    sim.start_trainer(steps=5)
    sim.tick(60.0)
    first = sim.view.children[SUMMARY]
    _overdue(sim)
    (kill,) = of(sim.tick(0.1), Kill)
    assert kill == Kill(SUMMARY, first.attempt, Cause.STALL, kill.reason)
    assert "had no answer within 30.0 s" in kill.reason
    assert sim.view.last_error is not None and sim.view.last_error.startswith("summary service stalled")
    assert of(sim.tick(0.1), Kill) == []  # never twice
    sim.dies(SUMMARY, -9)
    (respawn,) = of(sim.tick(0.1), RespawnService)
    assert respawn.slot == SUMMARY and sim.view.children[SUMMARY].attempt == first.attempt + 1
    assert sim.view.summary_overdue == ""


def test_an_overdue_about_a_service_younger_than_the_deadline_is_not_believed():
    """The batch may have gone to the service before, whose replacement asks for it again within a
    heartbeat: the trainer says so again when its wait has tripled, if it still has no answer."""
    sim = Sim()
    sim.start_trainer(steps=5)
    sim.tick(10.0)  # the summary service said Hello at 0: 10 s ago
    _overdue(sim)
    assert of(sim.tick(0.1), Kill) == [] and sim.view.summary_overdue == ""
    sim.tick(25.0)
    _overdue(sim, waited=93.0)
    assert of(sim.tick(0.1), Kill) != []


def test_no_summary_service_is_replaced_during_a_stop():
    sim = Sim()
    sim.start_trainer(steps=5)
    sim.tick(60.0)
    request_stop(sim.view, signal.SIGTERM, sim.now, sim.limits.stop_grace_secs)
    _overdue(sim)
    assert not [k for k in of(sim.tick(0.1), Kill) if k.slot == SUMMARY]


def test_an_overdue_about_a_service_that_died_meanwhile_does_not_kill_its_replacement():
    """The message and the service's death can come in one round: the overdue names the attempt it
    was about, and the respawned service is not killed for it."""
    sim = Sim()
    sim.start_trainer(steps=5)
    sim.tick(60.0)
    first = sim.view.children[SUMMARY].attempt
    _overdue(sim)
    sim.dies(SUMMARY, -9)  # it crashed (or a chaos kill) in the same round
    actions = sim.tick(0.1)
    assert of(actions, Kill) == [] and of(actions, RespawnService)
    assert sim.view.children[SUMMARY].attempt == first + 1
    assert [k for k in of(sim.tick(0.1) + sim.tick(60.0), Kill) if k.slot == SUMMARY] == []


def test_a_service_that_lags_behind_a_flood_but_keeps_confirming_is_not_overdue():
    """Its queue's head can wait longer than the deadline while it works through a flood: what
    counts is that acks keep confirming batches, not how old the oldest unconfirmed one is."""
    clock, svc, buf, sender = _sender()
    step = 1
    for _ in range(30):  # 90 s: a batch a step is sent, one batch every 3 s is confirmed
        step = _steps(clock, buf, sender, step, 3.0)
        svc.handle(1)
    assert len(sender.inflight) > 100 and clock.t - sender.inflight[0].sent_at > DEADLINE
    assert sender.overdue is None
    step = _steps(clock, buf, sender, step, DEADLINE + 1.5)  # and now it confirms nothing
    assert sender.overdue is not None and DEADLINE <= sender.overdue.waited_secs < DEADLINE + 1.5
