"""The rollback's decisions at a step boundary (procsv.trainer.nonfinite.plan), with plain values:
what is due next and what the boundary after a step does, for a retry, a skip, a bisect and the
steps skipped before (no process runs)."""

from __future__ import annotations

from procsv.trainer.nonfinite.plan import (Action, Plan, after_finite_weights, at_boundary, first_replayed,
                                           input_differs, input_lost, judge, next_due)


def test_nothing_is_due_without_a_bad_step_or_a_step_skipped_before():
    assert next_due(10, Plan()) is None
    assert at_boundary(10, Plan()) == Action.NOTHING


def test_a_retry_keeps_the_state_before_it_then_is_judged_at_its_own_boundary():
    retry = Plan(target=40)
    assert next_due(30, retry) == 39  # the boundary before the retry: its state is kept there
    assert at_boundary(39, retry) == Action.KEEP
    kept = Plan(target=40, kept_for=40)
    assert next_due(39, kept) == 40  # then the retried step's own boundary
    assert at_boundary(40, kept) == Action.JUDGE
    assert judge(None, kept) == Action.FINITE
    assert judge(40, kept) == Action.ROLL_BACK  # non-finite again when retried: roll back for the skip
    assert judge(35, kept) == Action.ROLL_BACK  # a replayed step before it


def test_a_skip_is_due_at_the_boundary_before_the_bad_step_and_a_later_loss_does_not_roll_back():
    skip = Plan(target=40, skipping=True)
    assert next_due(30, skip) == 39
    assert at_boundary(39, skip) == Action.JUDGE
    assert judge(None, skip) == Action.SKIP_OR_BISECT
    assert judge(40, skip) == Action.SKIP_OR_BISECT  # the bad step's own loss is what is skipped
    assert judge(38, skip) == Action.ROLL_BACK


def test_steps_skipped_before_are_skipped_again_before_the_bad_step_only():
    plan = Plan(target=40, skipping=True, skipped=(12, 25, 55))
    assert next_due(0, plan) == 11 and next_due(12, plan) == 24
    assert at_boundary(11, plan) == Action.SKIP_AGAIN and at_boundary(24, plan) == Action.SKIP_AGAIN
    assert next_due(25, plan) == 39  # 55 is after the bad step: not met in this replay
    resumed = Plan(skipped=(12, 55))
    assert next_due(30, resumed) == 54 and at_boundary(54, resumed) == Action.SKIP_AGAIN


def test_bisecting_checks_the_weights_after_every_replayed_step_then_judges_before_the_bad_one():
    plan = Plan(target=40, skipping=True, bisecting=True)
    assert next_due(20, plan) == 20
    assert at_boundary(20, plan) == Action.CHECK_WEIGHTS
    assert after_finite_weights(20, plan) == Action.BISECT_ON
    assert after_finite_weights(39, plan) == Action.JUDGE


def test_the_retry_moves_through_its_own_transitions_and_gives_the_plan_its_course():
    # issue 66: the rollback's course (procsv.trainer.nonfinite.retry) changes only through its methods;
    # the walk and the restore call them, and the decisions read it as a Plan
    from procsv.trainer.nonfinite.retry import Retry

    retry = Retry()
    assert retry.plan(None, ()) == Plan() and retry.rollbacks == 0 and retry.due is None
    retry.aim(40, False)  # a restore before step 40: retry it once
    retry.schedule(next_due(20, retry.plan(None, [25])))  # step 25, skipped before, comes first
    assert retry.plan(None, [25]) == Plan(target=40, skipped=(25,)) and retry.due == 24 and retry.rollbacks == 1
    retry.reached()
    assert retry.due is None
    retry.retried_again(40)  # non-finite again when retried: the next rollback skips it
    assert retry.was_retried(40) and not retry.was_retried(39)
    retry.aim(40, True)
    assert (retry.target, retry.skipping, retry.bisecting, retry.rollbacks) == (40, True, False, 2)
    retry.start_bisecting()  # the weights before it are non-finite: checked after each replayed step
    retry.aim(40, True)  # bisecting stays as it was
    assert retry.bisecting and retry.plan(40, ()) == Plan(40, True, True, 40)
    retry.found_poisoner(33)  # step 33's gradient poisoned them: it is rolled back for and skipped instead
    assert retry.target is None and not retry.bisecting and retry.was_retried(33)
    assert retry.poisoned_by_gradient(33) and not retry.poisoned_by_gradient(40)
    retry.aim(33, True, True)
    retry.stop_bisecting()
    retry.skipped()
    assert (retry.target, retry.bisecting, retry.rollbacks) == (None, False, 4)
    retry.aim(50, False)
    retry.finite()  # the retry was finite
    assert retry.target is None and not retry.skipping
    retry.aim(60, True, True)
    retry.give_up()  # fit cannot replay to it
    assert retry.plan(None, ()) == Plan()


def test_a_replayed_spike_is_judged_at_the_boundary_after_its_detection_step_or_at_once_past_it():
    # (a spike rolled back at a snapshot is replayed; its judgement cannot wait for the next snapshot, which
    # may come only after the loop's end, where no step is left to replay for its skip)
    replay = Plan(spike_checks=(165,))
    assert next_due(163, replay) == 165
    assert at_boundary(164, replay) == Action.NOTHING and at_boundary(165, replay) == Action.JUDGE_SPIKES
    assert next_due(167, replay) == 167 and at_boundary(167, replay) == Action.JUDGE_SPIKES  # past it: now
    skipped = Plan(spike_checks=(165,), skipped=(166,))  # a step skipped before comes first at the same boundary
    assert next_due(163, skipped) == 165 and at_boundary(165, skipped) == Action.SKIP_AGAIN
    busy = Plan(target=170, spike_checks=(165,))  # a non-finite step's rollback under way: its own course only
    assert next_due(163, busy) == 169 and at_boundary(165, busy) == Action.JUDGE


def test_a_replay_tells_nothing_when_a_step_before_the_bad_one_gives_another_loss_bit_for_bit():
    # a retry's or a spike's replay of 61-64 from the state of 60: equal losses (the input came back with the
    # step) leave the verdict to the bad step's own (a transient fault where only it differs); the first step
    # that differs, by one ulp too, is the program's input not coming back (a counter of its own)
    assert first_replayed(60, 65) == range(61, 62)  # the first replayed step only: the restored state's forward pass
    assert not first_replayed(64, 65) and not first_replayed(60, 61)  # (none replayed before the bad step)
    first = {61: 0.25, 62: 0.5, 63: 0.125, 64: 1.0}
    assert input_differs(first, dict(first)) is None
    assert input_differs(first, {61: 0.25, 62: 0.5}) is None  # (63, 64 not replayed yet: not compared)
    assert input_differs({}, {61: 0.3}) is None  # nothing replayed before the bad step: nothing to compare
    assert input_differs(first, {**first, 62: 0.5000000000000001, 64: 2.0}) == (62, 0.5, 0.5000000000000001)
    # said with what it cost (before: it named no cost, and the run stopped on it: now it trains on)
    assert input_lost((61, 0.243535, 0.204187), 65) == (
        "gave other losses than the first run (step 61: 0.243535, then 0.204187): the program's input does not come "
        "back with the restored step (a counter or iterator of its own, or random numbers no checkpoint holds): the "
        "batches of steps 61-65 were not trained again; feed the batch of sv.step for an exact replay")
