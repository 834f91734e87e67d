"""A trainer group's rollback on a non-finite loss, decided by the watchdog's pure rules (no process runs).

A member that finds step B's loss non-finite under ``--on-nonfinite rollback`` reports B
(``NonfiniteDetected``) and exits 5 (``GroupRollback``); the restart policy restarts the group at
once with B to skip (``Restart.skip``), which the bookkeeping adds to the run's skipped steps (the
executor hands them to the next group in ``PROCSV_SKIP_STEPS``). The launch-level tests are in
``test_nonfinite_group.py``.
"""

from __future__ import annotations

import os
import random
import signal

import pytest

from procsv.common.bootstrap import ChildConfig, Resume
from procsv.common.errors import TrainingDiverged
from procsv.common.exitcodes import EXIT_DIVERGING, EXIT_GROUP_ROLLBACK
from procsv.common.layout import Layout, write_json
from procsv.common.manifests import Manifest, retiring
from procsv.ipc.messages import NonfiniteDetected, SaveResult, SpikeDetected, StepSkipped
from procsv.trainer.checkpoint import group_restore, restore, restore_at_start
from procsv.watchdog import observe
from procsv.watchdog.rules.failures import ChildError
from procsv.watchdog.publish import recovery
from procsv.watchdog.publish.runmetrics import StepRate, restart_counts, take_snapshot
from procsv.watchdog.rules.actions import GiveUp, Restart, Signal, Spawn
from procsv.watchdog.rules.group import blame, rollback_step
from procsv.watchdog.rules.policy import Action, History, RestartPolicy, TrainerExit, decide
from procsv.watchdog.rules.state import TRAINER

from test_group_decide import KILLED, W1, group
from test_watchdog_decide import Sim, of


def reports(sim, slot: str, step: int) -> None:  # type: ignore[no-untyped-def]
    member = sim.member(slot)
    observe.heard(sim.view, NonfiniteDetected(member.pid, step, 1.0, f"the loss of step {step} is NaN or infinite"),
                  sim.now)


def test_the_policy_restarts_a_group_rollback_at_once_skipping_the_step_and_counts_no_failure_nor_restart():
    history = History(restarts=2, failures_without_progress=1, startup_failures_in_a_row=0)
    verdict = decide(RestartPolicy(), history, TrainerExit(EXIT_GROUP_ROLLBACK, True, False, False, rollback_step=70),
                     0.5)
    assert verdict.action == Action.RESTART and verdict.delay == 0.0 and verdict.skip == 70
    assert verdict.history == history  # a rollback: the run counts it as one (RunView.rollbacks), not as a restart
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
    assert sim.tick(0.01) == [] and sim.view.skipped_steps == [70]
    assert sim.view.history.restarts == 0 and sim.view.rollbacks == 1 and sim.view.group_rollbacks() == 1


def spiked(sim, slot: str, onset: int, step: int, action: str) -> None:  # type: ignore[no-untyped-def]
    pid = sim.member(slot).pid
    observe.heard(sim.view, SpikeDetected(pid, step, onset, 5.0, 1.0, 0.1, action, 1.0), sim.now)


def test_a_groups_chief_that_asks_its_groups_rollback_past_a_loss_spike_has_it_skip_the_onset_to_the_detection():
    # issue 68: --on-spike rollback in a group. The chief's SpikeDetected (action rollback) names the onset, the step
    # the group's rollback skips; it told the steps after it skipped itself (StepSkipped) before its exit 5.
    # Before: a spike's record set nothing, so the chief's exit 5 had no step: a failure, restarted without a skip
    sim = group(2)
    sim.tick(1.0)
    spiked(sim, TRAINER, 68, 68, "warn")  # warn (and stop): the group is not rolled back, nothing to skip
    assert rollback_step(sim.view, sim.trainer) is None and sim.trainer.last_report is None
    spiked(sim, TRAINER, 68, 70, "rollback")
    assert rollback_step(sim.view, sim.trainer) == 68 and sim.trainer.last_report == ("spike", 68)
    for step in (69, 70):
        observe.heard(sim.view, StepSkipped(sim.trainer.pid, step, 1.0, step - 67), sim.now)
    sim.reaps(TRAINER, EXIT_GROUP_ROLLBACK, "GroupRollback")
    sim.reaps(W1, 1, "UnavailableError")
    restarts = of(sim.tick(0.01), Restart)
    assert len(restarts) == 1 and restarts[0].skip == 68 and restarts[0].delay == 0.0, restarts
    assert sim.view.skipped_steps == [68, 69, 70] and sim.view.rollbacks == 1 and sim.view.history.restarts == 0
    assert sim.view.rollback_before is not None and sim.view.rollback_before[0] == 68  # restored before the onset
    # procsv report's cause column names the spike (before: "(non-finite loss)", as a NaN's rollback)
    assert of(sim.tick(0.01), Spawn) == [Spawn(TRAINER, TRAINER)]
    sim.group_ready(50)
    sim.group_progress(51)
    summary = recovery.summarize(sim.view.attempts)
    assert [(r["rollback_step"], r["spike"]) for r in summary["recoveries"]] == [(68, True)], summary
    assert "group rollback: step 68 skipped (a loss spike, its onset)" in recovery.render(
        {**summary, "goodput": None, "wall_s": 1.0}), summary


def test_a_single_trainers_spike_rolled_back_in_place_names_no_step_for_a_groups_rollback():
    sim = group(1)
    spiked(sim, TRAINER, 70, 70, "rollback")  # a lone trainer replays in place: its own exit 5 is a failure
    assert sim.trainer.nonfinite_step is None and rollback_step(sim.view, sim.trainer) is None


def test_a_member_that_asks_for_the_rollback_is_the_cause_even_if_its_peers_death_came_in_first():
    sim = group(2)
    sim.tick(1.0)
    reports(sim, TRAINER, 40)
    observe.death_noticed(sim.view, W1, sim.member(W1).attempt, sim.now, 0.0, ChildError("UnavailableError", "", "", "run"))
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


def test_a_groups_members_read_the_skipped_steps_the_watchdog_hands_them():
    assert ChildConfig.parse({"PROCSV_SKIP_STEPS": "70,40, 70,x,"}).resume.skip_steps == (40, 70)
    assert ChildConfig.parse({"PROCSV_SKIP_STEPS": ""}).resume.skip_steps == ()


def test_a_group_started_for_its_rollback_knows_the_step_its_chief_restores_a_state_before_from_the_watchdog_alone(
        tmp_path):
    # before: with no PROCSV_ROLLBACK_BEFORE, a member read "this attempt's" restarting record from
    # logs/lifecycle.jsonl, a file that spans every launch of the logdir (attempts count from 1 in each):
    # after a requeue, an earlier launch's bound. Now the watchdog says it or it is none
    told = ChildConfig.parse({"PROCSV_ROLLBACK_BEFORE": "70", "PROCSV_ATTEMPT": "3"}).resume
    assert told.rollback_before == 70
    assert ChildConfig.parse({"PROCSV_ROLLBACK_BEFORE": "", "PROCSV_ATTEMPT": "3"}).resume.rollback_before is None
    log = tmp_path / "logs" / "lifecycle.jsonl"
    log.parent.mkdir()
    log.write_text('{"event": "restarting", "attempt": 3, "rollback_step": 70}\n')
    assert ChildConfig.parse({"PROCSV_ATTEMPT": "3", "PROCSV_LOGDIR": str(tmp_path)}).resume.rollback_before is None
    # what the watchdog writes is what the child reads back
    said = Resume((40, 70), 70, 12)
    assert ChildConfig.parse(said.environ()).resume == said
    assert ChildConfig.parse(Resume().environ()).resume == Resume()


def test_a_promoted_standby_takes_the_bound_and_the_skips_from_its_promotion_not_from_the_lifecycle_log(
        monkeypatch, tmp_path):
    # seen under load: a standby group forked before worker1's NaN at step 70 was promoted before the
    # watchdog's lifecycle writer had written the restarting record (its writes are off the loop); its chief
    # found no bound, restored the checkpoint of step 90 (step 70 applied) and the rollback skipped nothing.
    # The watchdog now leaves a Promotion for each member before its SIGUSR1
    from procsv.common.bootstrap import ChildContext
    from procsv.common.layout import Layout, promotion_file
    from procsv.ipc.codec import encode
    from procsv.ipc.messages import Promotion
    from procsv.ipc.transport import Endpoints
    from procsv.trainer.standby.wait import take_promotion

    log = tmp_path / "lifecycle.jsonl"
    log.write_text('{"event": "restarting", "attempt": 2, "rollback_step": 40}\n')  # attempt 3's: not yet
    for name in ("PROCSV_SKIP_STEPS", "PROCSV_ROLLBACK_BEFORE", "PROCSV_LAUNCH_START_STEP"):  # take_promotion sets them for a later Supervisor:
        monkeypatch.setenv(name, "")  # recorded, so that they are taken away again after the test (a delenv of
        monkeypatch.delenv(name)  # an absent name records nothing: they leaked into this xdist worker's later launches)
    forked = ChildConfig.parse({"PROCSV_ATTEMPT": "3", "PROCSV_SKIP_STEPS": "40", "PROCSV_STANDBY": "1"})  # the fork's
    ctx = ChildContext(Layout(str(tmp_path)), Endpoints(str(tmp_path)), "worker1", 3, True, rank=1, nproc=2,
                       config=forked)
    assert forked.resume.rollback_before is None  # the race: nothing says 70 yet
    with open(promotion_file(str(tmp_path), 3, 1), "wb") as fh:
        fh.write(encode(Promotion(3, [40, 70], 70, 12))[0])
    promoted = take_promotion(ctx)
    assert promoted.resume == Resume((40, 70), 70, 12)
    assert not promoted.standby and ChildConfig.parse(os.environ).resume == promoted.resume  # ... a later Supervisor's too
    # a promotion with no bound decides too: a restarting record that names one is not read
    log.write_text('{"event": "restarting", "attempt": 3, "rollback_step": 70}\n')
    with open(promotion_file(str(tmp_path), 3, 1), "wb") as fh:
        fh.write(encode(Promotion(3, [40], None))[0])
    promoted = take_promotion(ctx)
    assert promoted.resume == Resume((40,), None, None)
    assert ChildConfig.parse(os.environ).resume == promoted.resume
    # no record: the fork's configuration, and nothing read from the lifecycle log
    promoted = take_promotion(ChildContext(Layout(str(tmp_path)), Endpoints(str(tmp_path)), "worker2", 3, True, rank=2,
                                           nproc=3, config=forked))
    assert promoted.resume == forked.resume and promoted.resume.rollback_before is None and not promoted.standby


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
    # the attempt is judged by the member whose step is skipped: the restart's record, the report's rollback line
    # say worker1's "step 70", not the chief's "step 71 ... skips it"
    assert blame(sim.view, sim.trainer).slot == W1, sim.log


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
    # the attempt is judged by the member whose step is skipped: the restart's record, the report's rollback line
    # say worker1's "step 70", not the chief's "step 71 ... skips it"
    assert blame(sim.view, sim.trainer).slot == W1, sim.log


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


def test_a_group_rollback_is_counted_as_a_rollback_not_a_restart_and_a_kill_after_it_as_a_restart():
    # before: the rollback's restart of the group was a restart (History.restarts, status.json's
    # restarts, procsv_restarts{cause="exit_code"}, the recovery report's count) and "0 rollback(s)"
    sim = group(2)
    sim.tick(1.0)
    reports(sim, TRAINER, 70)
    sim.reaps(TRAINER, EXIT_GROUP_ROLLBACK, "GroupRollback")
    sim.reaps(W1, 1, "UnavailableError")
    restarts = of(sim.tick(0.01), Restart)
    assert [r.skip for r in restarts] == [70]
    assert of(sim.tick(0.01), Spawn) == [Spawn(TRAINER, TRAINER)]
    sim.group_ready(50)
    sim.group_progress(51)
    assert sim.view.history.restarts == 0 and sim.view.rollbacks == 1 and sim.view.group_rollbacks() == 1
    assert restart_counts(sim.view.attempts) == ()
    snap = take_snapshot(sim.view, sim.now, 1000.0, 990.0, StepRate())  # what the metrics endpoint serves
    assert snap.restarts == () and snap.training.rollbacks == 1 and snap.training.steps_skipped == 1
    summary = recovery.summarize(sim.view.attempts)
    assert summary["restarts"] == 0 and summary["group_rollbacks"] == 1
    assert [r["rollback_step"] for r in summary["recoveries"]] == [70]
    # a SIGKILL of the next group is a restart, as ever
    sim.tick(1.0)
    sim.reaps(W1, KILLED)
    sim.tick(0.01)
    sim.reaps(TRAINER, 1, "UnavailableError")
    assert [r.skip for r in of(sim.tick(0.01), Restart)] == [None]
    assert sim.view.history.restarts == 1 and sim.view.rollbacks == 1 and sim.view.group_rollbacks(before=3) == 1
    assert of(sim.tick(0.01), Spawn) == [Spawn(TRAINER, TRAINER)]
    assert recovery.summarize(sim.view.attempts)["restarts"] == 1
    assert sum(n for _, n in restart_counts(sim.view.attempts)) == 1


def test_two_members_reporting_the_same_step_are_one_finding_each_with_its_record():
    # before: status.json's nonfinite_detected and the records' repeats said 2 for the one step 70
    sim = group(3)
    sim.tick(1.0)
    member = sim.member(W1)
    first = observe.heard(sim.view, NonfiniteDetected(sim.trainer.pid, 70, 1.0, "the loss of step 70 is NaN"), sim.now)
    again = observe.heard(sim.view, NonfiniteDetected(member.pid, 70, 1.0, "the loss of step 70 is NaN"), sim.now)
    third = observe.heard(sim.view, NonfiniteDetected(sim.member("worker2").pid, 70, 1.0, "NaN"), sim.now)
    assert sim.view.findings.nonfinite == 1
    records = [r.fields for r in first + again + third if r.event is not None]
    assert [(r["pid"], r["repeats"], r["peer"]) for r in records] == [
        (sim.trainer.pid, 1, None), (member.pid, 0, sim.trainer.pid), (sim.member("worker2").pid, 0, sim.trainer.pid)]
    # another step is another finding
    observe.heard(sim.view, NonfiniteDetected(member.pid, 90, 1.0, "the loss of step 90 is NaN"), sim.now)
    assert sim.view.findings.nonfinite == 2


def test_a_lone_trainers_own_exit_5_after_a_non_finite_report_is_a_failure_not_a_group_rollback():
    # a single trainer rolls back in place (step 20 skipped), then its program exits 5 by itself.
    # Before: judged as a group's rollback of step 20, a step skipped before: gave up with exit 4
    sim = Sim()
    sim.start_trainer(25)
    observe.heard(sim.view, NonfiniteDetected(sim.trainer.pid, 20, 1.0, "the loss of step 20 is NaN"), sim.now)
    sim.view.skipped_steps = [20]
    assert rollback_step(sim.view, sim.trainer) is None
    sim.dies(TRAINER, EXIT_GROUP_ROLLBACK)
    acts = sim.tick(0.01)
    restarts = of(acts, Restart)
    assert not of(acts, GiveUp) and len(restarts) == 1 and restarts[0].skip is None, acts
    assert sim.view.history.restarts == 1 and sim.view.rollbacks == 0


def test_a_rolled_back_groups_late_commit_keeps_the_bound_and_only_a_later_attempts_commit_ends_it():
    # seen under load (tests/test_nonfinite_group.py, group_local_nan.py --save-steps 30): worker1's NaN at
    # step 70 is found at step 100; attempt 1's checkpoint of step 90, slow to write, commits after the group
    # of attempt 2 took its first step. Before: that commit was taken for attempt 2's own, past the bound
    # (the newest step committed at the rollback), and ended it; attempt 2 then failed at step 80 and
    # attempt 3, an ordinary restart, restored attempt 1's step 90, with step 70 applied
    sim = group(2)
    sim.tick(1.0)
    observe.heard(sim.view, SaveResult(60, "steps", True, "model.ckpt-60", None, 0.1, attempt=1), sim.now)
    reports(sim, W1, 70)
    sim.reaps(W1, EXIT_GROUP_ROLLBACK, "GroupRollback")
    sim.reaps(TRAINER, 1, "UnavailableError")
    assert [r.skip for r in of(sim.tick(0.01), Restart)] == [70]
    assert sim.view.rollback_before == (70, 60, 1)
    assert of(sim.tick(0.01), Spawn) == [Spawn(TRAINER, TRAINER)]
    sim.group_ready(60)
    sim.group_progress(61)  # attempt 2 steps: the old rule's sign that a commit is its own
    assert sim.member(TRAINER).attempt == 2
    observe.heard(sim.view, SaveResult(90, "steps", True, "model.ckpt-90", None, 0.1, attempt=1), sim.now)
    assert sim.view.rollback_before == (70, 90, 1)  # late, of the rolled-back timeline: B's update is in it
    observe.heard(sim.view, SaveResult(75, "steps", True, "model.ckpt-75", None, 0.1, attempt=2), sim.now)
    assert sim.view.rollback_before == (70, 90, 1)  # attempt 2's own, but older than attempt 1's step 90
    observe.heard(sim.view, SaveResult(90, "steps", True, "model.ckpt-90", None, 0.1, attempt=2), sim.now)
    assert sim.view.rollback_before is None  # step 90 rewritten in place by attempt 2: nothing newer holds step 70


def test_the_rollback_bound_after_a_commit_is_a_function_of_the_commits_attempt():
    bound = (70, 90, 2)
    assert observe.rollback_bound(bound, 95, 2, None) == (70, 95, 2)  # the rolled-back attempt's: late
    assert observe.rollback_bound(bound, 95, 1, None) == (70, 95, 2)  # an earlier attempt's: late too
    assert observe.rollback_bound(bound, 80, 3, None) == bound  # the next attempt's, below the stale steps
    assert observe.rollback_bound(bound, 90, 3, None) is None
    assert observe.rollback_bound(bound, 120, 4, None) is None
    # a sender that says no attempt: late until the running chief's first step, then past the stale steps only
    assert observe.rollback_bound(bound, 95, 0, None) == (70, 95, 2)


def test_a_second_rollback_while_the_first_bound_holds_keeps_restoring_before_the_first_rolled_back_step():
    # found by the review: worker1's NaN at 70 rolls the group back (bound 70, stale 90: attempt 1's
    # checkpoints of steps 80 and 90 hold step 70's update); attempt 2 meets a NaN at 85 before it commits
    # anything. Before: the bound became 85, and attempt 3's chief restored attempt 1's step 80, with
    # step 70 applied
    sim = group(2)
    sim.tick(1.0)
    observe.heard(sim.view, SaveResult(90, "steps", True, "model.ckpt-90", None, 0.1, attempt=1), sim.now)
    reports(sim, W1, 70)
    sim.reaps(W1, EXIT_GROUP_ROLLBACK, "GroupRollback")
    sim.reaps(TRAINER, 1, "UnavailableError")
    assert [r.skip for r in of(sim.tick(0.01), Restart)] == [70]
    assert sim.view.rollback_before == (70, 90, 1)
    assert of(sim.tick(0.01), Spawn) == [Spawn(TRAINER, TRAINER)]
    sim.group_ready(60)
    sim.group_progress(61)
    sim.tick(1.0)
    reports(sim, W1, 85)
    sim.reaps(W1, EXIT_GROUP_ROLLBACK, "GroupRollback")
    sim.reaps(TRAINER, 1, "UnavailableError")
    assert [r.skip for r in of(sim.tick(0.01), Restart)] == [85]
    assert sim.view.rollback_before == (70, 90, 2)  # still before 70; both steps skipped
    assert sim.view.skipped_steps == [70, 85]
    # a second rollback at a step below the first's bound lowers it
    assert sim.view.rollback_before is not None
    sim2 = group(2)
    sim2.tick(1.0)
    sim2.view.rollback_before = (70, 90, 1)
    reports(sim2, W1, 65)
    sim2.reaps(W1, EXIT_GROUP_ROLLBACK, "GroupRollback")
    sim2.reaps(TRAINER, 1, "UnavailableError")
    assert [r.skip for r in of(sim2.tick(0.01), Restart)] == [65]
    assert sim2.view.rollback_before is not None and sim2.view.rollback_before[0] == 65


def second_rollback(first_commit: int) -> tuple[int, int, int] | None:
    """A group (whose attempt 1 committed ``first_commit``, 0: nothing) rolls back step 70; attempt 2, restored
    before it, skips it, trains on and takes only in-memory snapshots (no commit: nothing ends the bound), then
    rolls back step 110: the bound that attempt 3 is started with."""
    sim = group(2)
    sim.tick(1.0)
    if first_commit:
        observe.heard(sim.view, SaveResult(first_commit, "steps", True, f"model.ckpt-{first_commit}", None, 0.1,
                                           attempt=1), sim.now)
    reports(sim, TRAINER, 70)
    sim.reaps(TRAINER, EXIT_GROUP_ROLLBACK, "GroupRollback")
    sim.reaps(W1, 1, "UnavailableError")
    assert [r.skip for r in of(sim.tick(0.01), Restart)] == [70]
    assert of(sim.tick(0.01), Spawn) == [Spawn(TRAINER, TRAINER)]
    sim.group_ready(50)
    sim.group_progress(105)
    sim.tick(1.0)
    reports(sim, TRAINER, 110)
    sim.reaps(TRAINER, EXIT_GROUP_ROLLBACK, "GroupRollback")
    sim.reaps(W1, 1, "UnavailableError")
    assert [r.skip for r in of(sim.tick(0.01), Restart)] == [110]
    assert sim.view.skipped_steps == [70, 110]
    return sim.view.rollback_before


def test_a_second_rollback_whose_first_bound_keeps_no_checkpoint_out_is_bounded_by_its_own_step():
    # found merging tests: a group of in-memory snapshots (no checkpoint on disk but the final one), NaNs at
    # 70 and 110, the restart path. The first bound (70) never ended (the group after it commits nothing to
    # disk) and the second rollback kept it: attempt 3's chief passed over the group's snapshot of step 100
    # ("not before step 70") and, nothing committed, started again from step 0, losing 100 steps. Nothing
    # the rolled-back timeline committed holds step 70's update (nothing at or after 70): the second
    # rollback's bound is its own step
    assert second_rollback(0) == (110, 50, 2)  # (50: the step attempt 2 restored, from memory)
    assert second_rollback(60) == (110, 60, 2)  # attempt 1's step 60 is before 70: it holds nothing of it
    # attempt 1's checkpoint of step 90 holds step 70's update, not rewritten yet: the first bound still keeps it out
    assert second_rollback(90) == (70, 90, 2)


def test_the_watchdog_reads_the_steps_earlier_launches_skipped_once_at_its_start(tmp_path):
    # issue 52's "a skipped step stays skipped" across a relaunch into the same logdir: the trainer read
    # the step_skipped records of logs/lifecycle.jsonl itself; now the watchdog reads them once, before
    # its own records, and tells every trainer (torn, foreign and other records passed over)
    from procsv.watchdog.publish.events import skipped_steps

    log = tmp_path / "lifecycle.jsonl"
    assert skipped_steps(str(log)) == ()  # no file yet: a first launch
    log.write_text('{"event": "launch", "launch": 1}\n'
                   '{"event": "step_skipped", "step": 70}\n'
                   '{"event": "restarting", "attempt": 3, "rollback_step": 70}\n'
                   '{"event": "step_skipped", "step": "x"}\n'
                   'not json "step_skipped"\n'
                   '{"event": "launch", "launch": 2}\n'
                   '{"event": "step_skipped", "step": 40}\n'
                   '{"event": "step_skipped", "step": 70}\n'
                   '{"event": "step_skipped", "step": 90')
    assert skipped_steps(str(log)) == (40, 70)


# ----------------------------------------------------------------------------- a rollback with nothing below its bound

def test_a_rollback_refuses_only_when_checkpoints_are_committed_and_none_is_below_its_bound():
    """The restore decision of a group restarted to roll back step B, as a function of the committed
    steps and B (issue 66): the newest below B is restored; none committed at all, the initial state
    is the state before B; some committed and none below B (retention deleted them), it refuses,
    in one line, rather than train again from step 0."""
    refusal = restore.rollback_refusal
    assert refusal([30, 60, 90], None) is None  # no rollback
    assert refusal([], 70) is None  # nothing committed: it initializes
    assert refusal([30, 60, 90], 70) is None and refusal([69], 70) is None  # step 60, step 69 restored
    line = refusal([90, 120], 70)
    assert line is not None and "\n" not in line
    assert "rolls back step 70" in line and "2 committed checkpoint(s) (steps 90..120)" in line, line
    assert "exit code 4" in line and "max_to_keep" in line and "from step 120" in line, line
    assert refusal([70], 70) is not None  # step 70's own checkpoint holds its update
    rng = random.Random(66)
    for _ in range(2000):
        steps = sorted(rng.sample(range(0, 200), rng.randrange(0, 6)))
        before = rng.choice([None, rng.randrange(0, 220)])
        refused = refusal(steps, before) is not None
        assert refused == (before is not None and bool(steps) and all(s >= before for s in steps)), (steps, before)


def test_a_restore_for_a_rollback_with_only_checkpoints_past_its_bound_stops_with_exit_4_and_one_line(
        tmp_path, capsys):
    """The trainer's restore at start on a logdir whose manifests are all of step B or later: it says
    so in one line and raises TrainingDiverged (exit code 4) before TensorFlow is imported, nothing
    initialized; the restore lock is released (retention may delete again)."""
    layout = Layout(str(tmp_path))
    os.makedirs(layout.manifests, exist_ok=True)
    for step in (90, 120):
        m = Manifest(step, f"model.ckpt-{step}", {f"model.ckpt-{step}.index": {"size": 1, "crc32c": 0}}, 1.0, "steps")
        write_json(os.path.join(layout.manifests, f"model.ckpt-{step}.json"), m.to_json())
    inits: list[bool] = []
    with pytest.raises(TrainingDiverged) as raised:
        restore_at_start.restore_or_init(None, None, layout, lambda: inits.append(True), allow_reinit=True,
                                         read_retry=restore.ReadRetry(), clock=lambda: 0.0, sleep=lambda s: None,
                                         before=70)
    assert raised.value.code == EXIT_DIVERGING and not inits
    err = capsys.readouterr().err.splitlines()
    assert err == [f"procsv: {raised.value}"] and "rolls back step 70" in err[0], err
    with retiring(layout) as held:  # (an exclusive lock: no restore holds its shared one)
        assert held


def test_a_restore_for_a_rollback_with_nothing_committed_initializes_and_says_so_in_one_line(tmp_path, capsys):
    """Nothing committed and no in-memory snapshot before B: the initial state is the newest before it, and
    the group trains again from step 0, saying so in one line (before: silently, as a group with a stale
    bound did after its second rollback, 100 steps lost unsaid); no rollback, nothing said."""
    layout = Layout(str(tmp_path))
    for before in (70, None):
        inits: list[bool] = []
        restore_at_start.restore_or_init(None, None, layout, lambda: inits.append(True), allow_reinit=False,
                                         read_retry=restore.ReadRetry(), clock=lambda: 0.0, sleep=lambda s: None,
                                         before=before)
        assert inits == [True]
        err = capsys.readouterr().err.splitlines()
        if before is None:
            assert err == [], err
        else:
            assert err == ["procsv: the trainer group rolls back step 70: no checkpoint is committed and no in-memory "
                           "snapshot before step 70 is held; training again from step 0, the newest state before it"], err


def test_a_group_whose_rollback_refused_is_given_up_as_diverging_not_restarted():
    """The chief of the group restarted for its rollback exits 4 at its restore (before its first step):
    the watchdog gives up at once, stops the rest of the group and ends the launch with exit code 4;
    no restart (a restart would meet the same checkpoints), so no storm."""
    sim = group(2)
    sim.tick(1.0)
    reports(sim, TRAINER, 70)
    sim.reaps(TRAINER, EXIT_GROUP_ROLLBACK, "GroupRollback")
    sim.reaps(W1, 1, "UnavailableError")
    assert [r.skip for r in of(sim.tick(0.01), Restart)] == [70]
    assert of(sim.tick(0.01), Spawn) == [Spawn(TRAINER, TRAINER)]
    sim.reaps(TRAINER, EXIT_DIVERGING, "TrainingDiverged")  # its worker waits for the pin meanwhile
    gave_up = of(sim.tick(0.01), GiveUp)
    assert len(gave_up) == 1 and gave_up[0].exit_code == EXIT_DIVERGING and "diverging" in gave_up[0].reason, gave_up
    stopping = of(sim.tick(0.01), Signal)
    assert (W1, signal.SIGTERM) in [(a.slot, a.sig) for a in stopping], sim.log  # the run's stop (the services' too)
    sim.reaps(W1, -signal.SIGTERM)
    sim.tick(5.0)
    sim.tick(60.0)
    assert len(of(sim.log, Restart)) == 1 and len(of(sim.log, Spawn)) == 2, sim.log  # the rollback's, none after
    assert sim.view.finishing and sim.view.exit_code == EXIT_DIVERGING


def test_a_nan_in_one_workers_batch_found_by_the_chief_one_step_later_is_skipped_at_the_workers_step():
    # the ordinary way a NaN reaches a data-parallel group (tests/programs/group_local_nan.py --in-batch):
    # worker1's batch of step 70 is NaN, its gradient all-reduces into every member's weights, so the
    # chief's own loss is first non-finite at 71; the chief finds 71 at its checkpoint (step 90) and exits 5;
    # worker1, whose collective broke, checks its kept losses on its way out and reports 70. Before: the group
    # restarted at the chief's exit skipping 71, met the NaN again at 72, 73, ... and gave up as diverging
    import signal

    from procsv.watchdog.rules import group as group_rules
    from procsv.watchdog.rules.actions import Kill, Signal

    sim = group(2)
    sim.tick(1.0)
    reports(sim, TRAINER, 71)
    sim.reaps(TRAINER, EXIT_GROUP_ROLLBACK, "GroupRollback")
    # a standby group ready would have the survivors SIGKILLed at once; in a rollback they are asked to stop
    assert group_rules.rolling_back(sim.view, sim.member(TRAINER))
    asked = group_rules.group_actions(sim.view, sim.now, 30.0, at_once=True, wait=120.0)
    assert [(a.slot, a.sig) for a in asked if isinstance(a, Signal)] == [(W1, signal.SIGTERM)], asked
    assert not [a for a in asked if isinstance(a, Kill)], asked
    acts = sim.tick(0.01)
    assert not of(acts, Restart), acts  # worker1 has not ended: its first non-finite step may be the group's
    reports(sim, W1, 70)
    sim.reaps(W1, EXIT_GROUP_ROLLBACK, "GroupRollback")
    restarts = of(sim.tick(0.01), Restart)
    assert [r.skip for r in restarts] == [70] and sim.view.skipped_steps == [70], sim.log
    # the attempt is judged by the member whose step is skipped: the restart's record, the report's rollback line
    # say worker1's "step 70", not the chief's "step 71 ... skips it"
    assert blame(sim.view, sim.trainer).slot == W1, sim.log


def test_a_group_without_a_non_finite_report_still_has_its_survivors_sigkilled_at_once_with_a_standby_ready():
    from procsv.watchdog.rules import group as group_rules
    from procsv.watchdog.rules.actions import Cause, Kill

    sim = group(2)
    sim.tick(1.0)
    sim.reaps(TRAINER, 1, "RuntimeError")
    asked = group_rules.group_actions(sim.view, sim.now, 30.0, at_once=True, wait=120.0)
    assert [(a.slot, a.cause) for a in asked if isinstance(a, Kill)] == [(W1, Cause.GROUP_NOW)], asked
    assert not group_rules.rolling_back(sim.view, sim.member(TRAINER))


def test_a_nan_in_one_workers_batch_at_a_group_snapshot_step_rolls_back_even_if_the_chiefs_weights_only_stop_ended_first():
    # group_local_nan.py --in-batch --nan-at 100 (no --save-steps; reproduced: exit 4, nothing skipped): worker1's
    # batch of step 100, a group snapshot step, holds a NaN. At the snapshot of 100 the chief's own losses are
    # finite (its loss of 100 was computed before the update) but its weights are not: "only the weights were found
    # non-finite, at a snapshot: the step that made them so is not known", it exits 4 (TrainingDiverged). worker1
    # found its loss of step 100 non-finite: it knows the step and asks for the group's rollback (exit 5). The chief's
    # end came in first; the group must still roll back skipping 100, not give up as diverging
    sim = group(2)
    sim.tick(1.0)
    member = sim.member(TRAINER)
    observe.heard(sim.view, NonfiniteDetected(member.pid, 100, 1.0, "non-finite values in dense/kernel"), sim.now)
    reports(sim, W1, 100)
    sim.reaps(TRAINER, EXIT_DIVERGING, "TrainingDiverged")
    acts = sim.tick(0.01)
    assert not of(acts, GiveUp) and not of(acts, Restart), acts  # worker1 has not ended: it may ask
    sim.reaps(W1, EXIT_GROUP_ROLLBACK, "GroupRollback")
    acts = sim.tick(0.01)
    assert not of(acts, GiveUp), acts
    restarts = of(acts, Restart)
    assert [r.skip for r in restarts] == [100] and sim.view.skipped_steps == [100], sim.log
    assert blame(sim.view, sim.trainer).slot == W1  # the member that asked for it, and knew the step
    from procsv.watchdog.actionlines import restart_reports
    said = [r.say for r in restart_reports(sim.view, restarts[0]) if r.say]
    assert len(said) == 1 and f"worker1 (pid {sim.member(W1).pid}) found the loss of step 100" in said[0], said


def test_a_member_that_stopped_on_divergence_alone_with_no_peer_asking_still_gives_the_group_up():
    sim = group(2)
    sim.tick(1.0)
    member = sim.member(TRAINER)
    observe.heard(sim.view, NonfiniteDetected(member.pid, 100, 1.0, "non-finite values in dense/kernel"), sim.now)
    sim.reaps(TRAINER, EXIT_DIVERGING, "TrainingDiverged")
    sim.tick(0.01)
    sim.reaps(W1, 1, "UnavailableError")
    gave_up = of(sim.tick(0.01), GiveUp)
    assert len(gave_up) == 1 and gave_up[0].exit_code == EXIT_DIVERGING, sim.log
    assert not of(sim.log, Restart)


@pytest.mark.parametrize("worker_first", [True, False])
def test_members_that_both_stop_on_the_same_steps_nan_give_the_run_up_by_the_chiefs_line_whichever_ended_first(
        worker_first):
    # --on-nonfinite stop, a NaN in the data of step 40 for both members (test_nonfinite_group's stop test): each finds
    # it and exits 4. Seen in a fresh clone's run: worker1's end came in 0.1 s before the chief's, the launch said
    # "worker1 ... ended: stopping the group's chief ...; the whole group restarts together" (it never does: exit 4
    # gives the run up) and its giving-up line repeated worker1's line (which names no checkpoint), not the chief's
    from procsv.watchdog.actionlines import signal_reports
    from procsv.watchdog.rules.limits import Limits

    sim = group(2)
    sim.tick(1.0)
    reports(sim, TRAINER, 40)
    reports(sim, W1, 40)
    first, second = (W1, TRAINER) if worker_first else (TRAINER, W1)
    sim.reaps(first, EXIT_DIVERGING, "TrainingDiverged")
    acts = sim.tick(0.01)
    assert not of(acts, GiveUp), acts
    if worker_first:  # the chief is stopped (SIGTERM): said without a restart that never comes
        signals = [a for a in of(acts, Signal) if a.slot == TRAINER]
        assert len(signals) == 1, acts
        said = [r.say for r in signal_reports(sim.view, signals[0], Limits(), sim.now) if r.say]
        assert said == [f"procsv: worker1 (pid {sim.member(W1).pid}) stopped on non-finite training (exit code 4): "
                        f"stopping the group's chief (pid {sim.member(TRAINER).pid})"], said
    sim.reaps(second, EXIT_DIVERGING, "TrainingDiverged")
    gave_up = of(sim.tick(0.01), GiveUp)
    assert len(gave_up) == 1 and gave_up[0].exit_code == EXIT_DIVERGING, sim.log
    assert not of(sim.log, Restart)
    assert blame(sim.view, sim.trainer).role == TRAINER  # the same step found by both: the chief's line
    # a worker that found an earlier step than the chief is the cause, whichever ended first
    sim = group(2)
    sim.tick(1.0)
    reports(sim, W1, 39)
    reports(sim, TRAINER, 40)
    sim.reaps(TRAINER, EXIT_DIVERGING, "TrainingDiverged")
    sim.tick(0.01)
    sim.reaps(W1, EXIT_DIVERGING, "TrainingDiverged")
    assert len(of(sim.tick(0.01), GiveUp)) == 1 and blame(sim.view, sim.trainer).slot == W1


def _group_stop_line(sim, acts, slot: str) -> str:  # type: ignore[no-untyped-def]
    from procsv.watchdog.actionlines import signal_reports
    from procsv.watchdog.rules.actions import Cause
    from procsv.watchdog.rules.limits import Limits

    signals = [a for a in of(acts, Signal) if a.slot == slot and a.cause == Cause.GROUP]
    assert len(signals) == 1, acts
    said = [r.say for r in signal_reports(sim.view, signals[0], Limits(), sim.now) if r.say]
    assert len(said) == 1, said
    return said[0]


def test_the_group_stop_line_claims_no_restart_once_anything_non_finite_is_in_the_group_whichever_ends_first():
    # (helper-44's attack on the line above) the group's stop is said to be followed by the group's restart only
    # when nothing non-finite is in it: what follows is judged once every member ended, and says so itself.
    # --on-nonfinite stop, worker1 found step 40 and leaves; the chief fails in its next collective, its end first:
    sim = group(2)
    sim.tick(1.0)
    reports(sim, W1, 40)
    sim.reaps(TRAINER, 1, "UnavailableError")
    line = _group_stop_line(sim, sim.tick(0.01), W1)
    assert "restarts together" not in line and "the chief (pid" in line, line
    sim.reaps(W1, EXIT_DIVERGING, "TrainingDiverged")
    sim.tick(0.01)
    assert of(sim.log, GiveUp) and not of(sim.log, Restart), sim.log
    # --on-nonfinite rollback, the chief's weights alone at the snapshot of 100 (exit 4), worker1 asks (exit 5): the
    # group does restart, for its rollback; the stop's line claims nothing, the restart's line says it
    sim = group(2)
    sim.tick(1.0)
    observe.heard(sim.view, NonfiniteDetected(sim.member(TRAINER).pid, 100, 1.0, "non-finite values in dense/kernel"),
                  sim.now)
    reports(sim, W1, 100)
    sim.reaps(TRAINER, EXIT_DIVERGING, "TrainingDiverged")
    line = _group_stop_line(sim, sim.tick(0.01), W1)
    assert "restarts together" not in line and "stopped on non-finite training (exit code 4)" in line, line
    sim.reaps(W1, EXIT_GROUP_ROLLBACK, "GroupRollback")
    assert [r.skip for r in of(sim.tick(0.01), Restart)] == [100], sim.log
    # nothing non-finite: a worker's failure still says the group restarts together
    sim = group(2)
    sim.tick(1.0)
    sim.reaps(W1, 1, "RuntimeError")
    assert _group_stop_line(sim, sim.tick(0.01), TRAINER).endswith("; the whole group restarts together")


# ----------------------------------------------------------------------------- a worker's NaN at the group's last step

@pytest.mark.parametrize("chief_first", [False, True])
def test_a_workers_rollback_of_the_last_step_is_judged_though_the_chief_committed_and_exited_0(chief_first):
    # group_local_nan.py --nan-at 120 --steps 120 (reproduced: exit 0, step 120 never skipped): only worker1's loss
    # of the last step is NaN, with no gradient; worker1 finds it at its end and asks for the group's rollback
    # (exit 5), while the chief, whose losses are finite, commits its final checkpoint of step 120 and exits 0.
    # Before: a chief that exited 0 was judged by itself ("a worker failing after the last step lost nothing"),
    # whichever end came in first: the run finished
    from procsv.watchdog.rules.actions import Finish

    sim = group(2)
    sim.tick(1.0)
    reports(sim, W1, 120)
    if chief_first:
        sim.reaps(TRAINER, 0)
        acts = sim.tick(0.01)
        assert not of(acts, Finish) and not of(acts, Restart), acts  # worker1 reported: its exit status says
    sim.reaps(W1, EXIT_GROUP_ROLLBACK, "GroupRollback")
    if not chief_first:
        sim.tick(0.01)
        sim.reaps(TRAINER, 0)
    acts = sim.tick(0.01)
    assert not of(acts, Finish) and not of(acts, GiveUp), acts
    assert [r.skip for r in of(acts, Restart)] == [120] and sim.view.skipped_steps == [120], sim.log
    assert blame(sim.view, sim.trainer).slot == W1
    assert sim.view.history.restarts == 0 and sim.view.rollbacks == 1
    assert of(sim.tick(0.01), Spawn) == [Spawn(TRAINER, TRAINER)]


def test_a_worker_that_stops_on_its_nan_at_the_last_step_ends_the_run_with_4_though_the_chief_exited_0():
    # the same under --on-nonfinite stop: worker1 finds its loss of step 120 at its end and stops (exit 4).
    # Before: nothing checked a worker's kept losses at its end under stop, and the chief's 0 ended the run 0
    from procsv.watchdog.rules.actions import Finish

    sim = group(2)
    sim.tick(1.0)
    reports(sim, W1, 120)
    sim.reaps(TRAINER, 0)
    assert not of(sim.tick(0.01), Finish)
    sim.reaps(W1, EXIT_DIVERGING, "TrainingDiverged")
    acts = sim.tick(0.01)
    gave_up = of(acts, GiveUp)
    assert len(gave_up) == 1 and gave_up[0].exit_code == EXIT_DIVERGING and "diverging" in gave_up[0].reason, acts
    assert not of(acts, Restart) and not of(acts, Finish), acts
    assert blame(sim.view, sim.trainer).slot == W1 and sim.view.exit_code == EXIT_DIVERGING
    assert "worker1" in (sim.view.last_error or ""), sim.view.last_error


def test_a_workers_own_exit_4_or_5_after_the_chief_exited_0_with_no_step_reported_still_ends_the_run_0():
    # a chief that exited 0 is still judged by itself when no member reported a non-finite step: a worker's exit
    # 4 or 5 after the last step with no report is its program's own, and lost nothing
    from procsv.watchdog.rules.actions import Finish

    for code in (EXIT_GROUP_ROLLBACK, EXIT_DIVERGING):
        sim = group(2)
        sim.tick(1.0)
        sim.reaps(W1, code, "SystemExit")
        sim.tick(0.01)
        sim.reaps(TRAINER, 0)
        acts = sim.tick(0.01)
        assert [type(a) for a in acts] == [Finish] and sim.view.exit_code == 0, acts
        assert blame(sim.view, sim.trainer).slot == TRAINER


@pytest.mark.parametrize("code", [EXIT_GROUP_ROLLBACK, EXIT_DIVERGING])
def test_a_chief_that_exited_0_waits_for_a_workers_late_report_of_the_last_step_and_sends_it_nothing(code):
    # issue 68 (att68's tail_nan.py --loss-nan-at 120 --tail-secs 1): worker1 ends a second after its loop (its
    # program's wind-down inside the session) and only then finds its own loss of step 120 non-finite. Before: the
    # chief's 0 was judged at once, no report having come in: the run finished (rollback: worker1's exit 5 only
    # settled, step 120 kept; stop: the finishing SIGTERM made worker1 skip its check, exit 0 in place of 4)
    from procsv.watchdog.rules.actions import Finish, Kill
    from procsv.watchdog.rules.group import awaits_own_ends

    sim = group(2, stop_grace_secs=10.0)
    sim.tick(1.0)
    sim.reaps(TRAINER, 0)
    for dt in (0.01, 0.2, 1.0):  # nothing judged, and worker1 gets no signal: its end must be its own
        acts = sim.tick(dt)
        assert not of(acts, Finish) and not of(acts, GiveUp) and not of(acts, Restart), acts
        assert not of(acts, Signal) and not of(acts, Kill), acts
        assert awaits_own_ends(sim.view, sim.trainer, sim.now, 10.0)
    assert sim.member(W1).signalled_at is None and sim.member(W1).stop_sent_at is None and not sim.view.finishing
    reports(sim, W1, 120)
    assert not of(sim.tick(0.01), Finish)
    sim.reaps(W1, code, "GroupRollback" if code == EXIT_GROUP_ROLLBACK else "TrainingDiverged")
    acts = sim.tick(0.01)
    assert blame(sim.view, sim.trainer).slot == W1
    if code == EXIT_GROUP_ROLLBACK:
        assert [r.skip for r in of(acts, Restart)] == [120] and sim.view.skipped_steps == [120], acts
        assert not of(acts, Finish) and sim.view.rollbacks == 1
    else:
        gave_up = of(acts, GiveUp)
        assert len(gave_up) == 1 and gave_up[0].exit_code == EXIT_DIVERGING and not of(acts, Restart), acts
        assert sim.view.exit_code == EXIT_DIVERGING


def test_an_ordinary_groups_success_is_judged_as_soon_as_its_workers_end_and_not_later():
    # the wait for the workers' own ends costs an ordinary run nothing: its workers end within milliseconds of the
    # chief, and the chief's 0 is judged in the round the last one's end comes in (a clean 0, or any other end)
    from procsv.watchdog.rules.actions import Finish

    for code, error in ((0, ""), (1, "UnavailableError")):
        sim = group(3)
        sim.tick(1.0)
        sim.reaps(TRAINER, 0)
        sim.reaps(W1, 0)
        assert not of(sim.tick(0.01), Finish)  # worker2 has not ended yet
        sim.reaps("worker2", code, error)
        acts = sim.tick(0.01)
        assert [type(a) for a in acts if isinstance(a, (Finish, GiveUp, Restart))] == [Finish], acts
        assert sim.view.exit_code == 0 and blame(sim.view, sim.trainer).slot == TRAINER
    # a worker's death notice ends its wait too (its exit status tells nothing of a step no report named)
    sim = group(2)
    sim.tick(1.0)
    sim.reaps(TRAINER, 0)
    sim.tick(0.01)
    sim.notices(W1)
    assert of(sim.tick(0.01), Finish) and sim.view.exit_code == 0


def test_a_worker_that_never_ends_after_the_chiefs_0_costs_at_most_the_stop_grace_then_is_stopped_as_before():
    # a worker blocked (in a collective the chief left, say) never ends on its own: the chief's 0 is judged once
    # stop_grace_secs passed since the chief's end, and the run's end stops the worker (SIGTERM, then SIGKILL)
    from procsv.watchdog.rules.actions import Cause, Finish, Kill

    sim = group(2, stop_grace_secs=10.0, services_grace_secs=3.0)
    sim.tick(1.0)
    sim.reaps(TRAINER, 0)
    ended = sim.now
    assert sim.tick(0.01) == []
    assert sim.tick(9.9) == []  # 9.91 s after the chief's end: still waiting, nothing sent
    acts = sim.tick(0.1)  # 10.01 s: judged as before the wait, by the chief alone
    assert [type(a) for a in acts if isinstance(a, (Finish, GiveUp, Restart))] == [Finish], acts
    assert sim.view.exit_code == 0 and sim.now - ended < 10.0 + 0.2
    acts = sim.tick(0.01)
    assert [(a.sig, a.cause) for a in of(acts, Signal) if a.slot == W1] == [(signal.SIGTERM, Cause.SHUTDOWN)], acts
    assert [a.slot for a in of(sim.tick(3.0), Kill) if a.slot == W1] == [W1]


def test_a_chief_that_exited_0_during_a_stop_waits_for_no_worker():
    # a stop (rule 2) stops the workers once the chief ended: no wait for their own ends
    from procsv.watchdog.rules.actions import Cause

    sim = group(2)
    sim.tick(1.0)
    sim.view.stop_signal = signal.SIGTERM
    sim.reaps(TRAINER, 0)
    acts = sim.tick(0.01)
    assert sim.view.finishing and sim.view.exit_code == 128 + signal.SIGTERM, acts


def test_a_group_restored_from_its_in_memory_snapshot_for_a_rollback_passes_over_the_checkpoints_of_the_step_or_later(
        tmp_path):
    """What a rollback of step B restored from the group's in-memory snapshot passes over: the committed checkpoints
    of B or later, with their revisions (the group's commit of such a step is their next revision, rewritten in
    place). Before: only a restore from disk passed them over; the group rolled back from its snapshot of step 100
    for worker1's NaN at the last step, 120, committed its final checkpoint of 120 as revision 0, which the service
    answered "step 120 is committed already; not written again": the newest checkpoint kept step 120 applied."""
    layout = Layout(str(tmp_path))
    os.makedirs(layout.manifests, exist_ok=True)
    for step, revision in ((90, 0), (120, 2)):
        m = Manifest(step, f"model.ckpt-{step}", {f"model.ckpt-{step}.index": {"size": 1, "crc32c": 0}}, 1.0, "steps",
                     revision)
        write_json(os.path.join(layout.manifests, f"model.ckpt-{step}.json"), m.to_json())
    assert [(m.step, m.revision) for m in group_restore.passed_over(layout, 120)] == [(120, 2)]
    assert [m.step for m in group_restore.passed_over(layout, 100)] == [120]
    assert [m.step for m in group_restore.passed_over(layout, 90)] == [90, 120]
    assert group_restore.passed_over(layout, 121) == [] and group_restore.passed_over(layout, None) == []


def test_an_exit_4_on_a_loss_spike_says_a_spike_and_one_on_non_finite_values_says_non_finite():
    # before: every exit 4 was "it stopped with exit code 4 on non-finite values", a spike's stop too (--on-spike
    # stop, or a rollback that could not be). Now the trainer's error file (TrainingDiverged's message) tells which
    from procsv.watchdog.rules.failures import Failure

    said = {}
    for name, message in (("spike", "the loss of step 45 spiked: 15 against a threshold of 1.2 (median 0.3 of the 15 "
                                    "losses before it); --on-spike stop: stopping in order with exit code 4"),
                          ("nan", "non-finite training at step 25: the loss of step 25 is NaN or infinite; "
                                  "--on-nonfinite stop: stopping in order with exit code 4")):
        sim = Sim()
        sim.start_trainer(50)
        t = sim.trainer
        observe.reaped(sim.view, TRAINER, t.attempt, Failure(t.role, t.attempt, t.pid, EXIT_DIVERGING, 0.0, "log",
                                                             error=ChildError("TrainingDiverged", message, "", "run")),
                       sim.now)
        (gave_up,) = of(sim.tick(0.01), GiveUp)
        said[name] = gave_up.reason
    assert "stopped with exit code 4 on a loss spike (a restart would resume from the newest checkpoint before it " \
           "and meet it again)" in said["spike"], said
    assert "stopped with exit code 4 on non-finite values (a restart" in said["nan"], said


# --------------------------------------------------------------------------- the group's verdict at its K-th steps
def test_the_groups_verdict_rolls_back_in_place_only_where_every_member_can_and_holds_the_same_step() -> None:
    """procsv.trainer.nonfinite.group_verdict.decide: the first bad step any member found, restored from the newest
    step before it every member holds a copy of; anything not uniform is the restart, said why."""
    from procsv.trainer.nonfinite.group_verdict import Row, decide

    clean = Row(copies=(50,))
    assert not decide([clean, clean]).found
    # worker1's NaN at 70, the chief's own loss NaN from 71: the group skips 70, from the copies of 50
    v = decide([Row(nan=71, copies=(50,)), Row(nan=70, copies=(0, 50))])
    assert (v.first, v.last, v.restore, v.finder, v.in_place, v.spike) == (70, 70, 50, 1, True, False)
    # the chief's spike: its onset .. its detection
    v = decide([Row(onset=68, detected=70, copies=(50,)), Row(copies=(50,))])
    assert (v.first, v.last, v.restore, v.spike, v.in_place) == (68, 70, 50, True, True)
    # the restart: a copy missing on one member, a member that cannot, a checkpoint holding the bad step's update,
    # a NaN and a spike at one check
    assert "no in-memory copy" in decide([Row(nan=70, copies=(50,)), Row(copies=())]).why
    assert "worker1 cannot" in decide([Row(nan=70, copies=(50,)), Row(able=False, copies=(50,))]).why
    assert "step 90" in decide([Row(committed=90, copies=(50,)), Row(nan=70, copies=(50,))]).why
    assert "step 80" in decide([Row(in_flight=80, copies=(50,)), Row(nan=70, copies=(50,))]).why
    assert decide([Row(committed=60, copies=(50,)), Row(nan=70, copies=(50,))]).in_place  # (60: before 70)
    assert "one check" in decide([Row(onset=60, detected=62, copies=(50,)), Row(nan=70, copies=(50,))]).why
    # only a copy of a step before the bad one: 50's when 100 was found at its own check
    assert decide([Row(nan=100, copies=(50, 100)), Row(copies=(50, 100))]).restore == 50
    # a row goes through the collective as numbers and comes back the same
    row = Row(nan=70, onset=-1, detected=-1, able=True, committed=30, in_flight=-1, copies=(100, 50))
    assert Row.decode(row.encode(3)) == Row(70, -1, -1, True, 30, -1, (50, 100)) or \
        Row.decode(row.encode(3)).copies == (100, 50)


def test_a_groups_rollback_in_place_counts_as_one_of_the_group_and_settles_its_members_reports():
    """The chief's rolled_back of the group (in place): a rollback of the group, not a restart, and the members'
    reports of the step (a spike's onset, a NaN) settled: the group's later end is no rollback of that step."""
    from procsv.ipc.messages import RestoreSource, RolledBack

    sim = group(2)
    sim.tick(1.0)
    reports(sim, TRAINER, 70)
    assert rollback_step(sim.view, sim.trainer) == 70
    said = observe.heard(sim.view, RolledBack(sim.trainer.pid, 70, 50, RestoreSource.MEMORY, "m#0", True, 0.02, 1.0,
                                              group=True), sim.now)
    assert [r.fields.get("group") for r in said if r.fields and "restored_step" in r.fields] == [True], said
    assert rollback_step(sim.view, sim.trainer) is None
    assert sim.view.rollbacks == 1 and sim.view.findings.group_in_place == 1 and sim.view.history.restarts == 0
