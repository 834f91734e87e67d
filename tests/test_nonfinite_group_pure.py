"""A trainer group's rollback on a non-finite loss, decided by the watchdog's pure rules (no process runs).

A member that finds step B's loss non-finite under ``--on-nonfinite rollback`` reports B
(``NonfiniteDetected``) and exits 5 (``GroupRollback``); the restart policy restarts the group at
once with B to skip (``Restart.skip``), which the bookkeeping adds to the run's skipped steps (the
executor hands them to the next group in ``PROCSV_SKIP_STEPS``). The launch-level tests are in
``test_nonfinite_group.py``.
"""

from __future__ import annotations

from procsv.common.exitcodes import EXIT_GROUP_ROLLBACK
from procsv.ipc.messages import NonfiniteDetected
from procsv.trainer.nonfinite import records
from procsv.watchdog import observe
from procsv.watchdog.rules.actions import GiveUp, Restart, Spawn
from procsv.watchdog.rules.group import blame, rollback_step
from procsv.watchdog.rules.policy import Action, History, RestartPolicy, TrainerExit, decide
from procsv.watchdog.rules.state import TRAINER

from test_group_decide import W1, group
from test_watchdog_decide import of


def reports(sim, slot: str, step: int) -> None:  # type: ignore[no-untyped-def]
    member = sim.member(slot)
    observe.heard(sim.view, NonfiniteDetected(member.pid, step, 1.0, f"the loss of step {step} is NaN or infinite"),
                  sim.now)


def test_the_policy_restarts_a_group_rollback_at_once_skipping_the_step_and_counts_no_failure():
    history = History(restarts=2, failures_without_progress=1, startup_failures_in_a_row=0)
    verdict = decide(RestartPolicy(), history, TrainerExit(EXIT_GROUP_ROLLBACK, True, False, False, rollback_step=70),
                     0.5)
    assert verdict.action == Action.RESTART and verdict.delay == 0.0 and verdict.skip == 70
    assert verdict.history == History(3, 1, 0)
    assert "step 70" in verdict.reason
    # a stop requested meanwhile wins; a 5 whose step never came in is a failure like any other (no skip)
    assert decide(RestartPolicy(), history, TrainerExit(EXIT_GROUP_ROLLBACK, True, False, True, rollback_step=70),
                  0.5).action == Action.STOPPED
    plain = decide(RestartPolicy(), history, TrainerExit(EXIT_GROUP_ROLLBACK, True, False, False), 0.5)
    assert plain.action == Action.RESTART and plain.skip is None and plain.history.failures_without_progress == 2


def test_whichever_members_report_the_group_rolls_back_once_skipping_the_first_step_reported():
    sim = group(2)
    sim.tick(1.0)
    reports(sim, W1, 72)  # the worker's report came first, of a later step
    reports(sim, TRAINER, 70)
    reports(sim, W1, 70)
    assert rollback_step(sim.view, sim.trainer) == 70
    # the worker asked too, and its end came in first; then the chief's
    sim.reaps(W1, EXIT_GROUP_ROLLBACK, "GroupRollback")
    acts = sim.tick(0.01)
    assert not of(acts, Restart) and not of(acts, GiveUp)
    sim.reaps(TRAINER, EXIT_GROUP_ROLLBACK, "GroupRollback")
    acts = sim.tick(0.01)
    restarts = of(acts, Restart)
    assert len(restarts) == 1 and restarts[0].skip == 70 and restarts[0].delay == 0.0, acts
    assert sim.view.skipped_steps == [70]
    assert blame(sim.view, sim.trainer).slot == W1  # the first to ask: the record's pid is its own
    assert of(sim.tick(0.01), Spawn) == [Spawn(TRAINER, TRAINER)]  # the next group, once
    assert sim.tick(0.01) == [] and sim.view.skipped_steps == [70] and sim.view.history.restarts == 1


def test_a_member_that_asks_for_the_rollback_is_the_cause_even_if_its_peers_death_came_in_first():
    sim = group(2)
    sim.tick(1.0)
    reports(sim, TRAINER, 40)
    observe.death_noticed(sim.view, W1, sim.member(W1).attempt, sim.now, 0.0, "UnavailableError")
    assert not of(sim.tick(0.01), Restart)  # the worker failed in its next collective: not the cause
    sim.reaps(W1, 1, "UnavailableError")
    assert not of(sim.tick(0.01), Restart)
    sim.reaps(TRAINER, EXIT_GROUP_ROLLBACK, "GroupRollback")
    restarts = of(sim.tick(0.01), Restart)
    assert [r.skip for r in restarts] == [40] and blame(sim.view, sim.trainer).slot == TRAINER


def test_a_group_that_meets_a_step_it_was_to_skip_gives_up_as_diverging_instead_of_restarting_forever():
    # a program whose loop does not skip (the skip list unread): the same step again after its rollback
    verdict = decide(RestartPolicy(), History(1, 0, 0),
                     TrainerExit(EXIT_GROUP_ROLLBACK, True, False, False, rollback_step=70, skipped=(40, 70)), 0.5)
    assert verdict.action == Action.GIVE_UP and "step 70" in verdict.reason and "again" in verdict.reason
    sim = group(2)
    sim.view.skipped_steps = [70]
    sim.tick(1.0)
    reports(sim, TRAINER, 70)
    sim.reaps(TRAINER, EXIT_GROUP_ROLLBACK, "GroupRollback")
    sim.reaps(W1, 1, "UnavailableError")
    gave_up = of(sim.tick(0.01), GiveUp)
    assert len(gave_up) == 1 and gave_up[0].exit_code == 4 and not of(sim.log, Restart)


def test_a_groups_members_read_the_skipped_steps_the_watchdog_hands_them(monkeypatch):
    monkeypatch.setenv("PROCSV_SKIP_STEPS", "70,40, 70,x,")
    assert records.from_env() == [40, 70]
    monkeypatch.setenv("PROCSV_SKIP_STEPS", "")
    assert records.from_env() == []


def test_a_workers_rollback_is_kept_when_the_chiefs_death_notice_comes_before_its_exit_status():
    # seen with a program whose watched loss is each member's own (tests/programs/group_local_nan.py):
    # only the worker finds step 70; it reports, exits 5; the chief fails in its next collective and its
    # death notice comes in before its exit status. Before: an early restart without the skip, every
    # time (the group met step 70 again and again, never skipping it)
    sim = group(2)
    sim.tick(1.0)
    reports(sim, W1, 70)
    sim.reaps(W1, EXIT_GROUP_ROLLBACK, "GroupRollback")
    sim.tick(0.01)
    sim.notices(TRAINER)
    restarts = of(sim.tick(0.01), Restart)
    assert [r.skip for r in restarts] == [70] and sim.view.skipped_steps == [70], sim.log


def test_a_chiefs_death_notice_waits_for_the_exit_status_of_a_member_that_reported_a_non_finite_step():
    # the other order: the chief's death notice before the reporting worker's exit status
    sim = group(2)
    sim.tick(1.0)
    reports(sim, W1, 70)
    sim.notices(TRAINER)
    assert not of(sim.tick(0.01), Restart)  # whether the worker asks for the group's rollback: its exit status says
    sim.reaps(W1, EXIT_GROUP_ROLLBACK, "GroupRollback")
    restarts = of(sim.tick(0.01), Restart)
    assert [r.skip for r in restarts] == [70] and sim.view.skipped_steps == [70], sim.log


def test_a_members_exit_5_without_its_report_that_ends_the_run_exits_1_as_any_failure_not_4():
    # a program's own exit code 5 (no non-finite step reported): a failure like any other, so the
    # restart limit that ends the run exits 1; before, the launch exited 4, which says "diverging"
    sim = group(2, restart=RestartPolicy(max_restarts=0))
    sim.tick(1.0)
    sim.reaps(W1, EXIT_GROUP_ROLLBACK, "SystemExit")
    sim.tick(0.01)
    sim.reaps(TRAINER, 1, "UnavailableError")
    gave_up = of(sim.tick(0.01), GiveUp)
    assert len(gave_up) == 1 and "restart limit" in gave_up[0].reason and gave_up[0].exit_code == 1, gave_up
