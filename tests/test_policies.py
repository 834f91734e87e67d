"""Pure decision functions: the watchdog's restart policy and the checkpoint service's save/retention."""

from __future__ import annotations

from dataclasses import replace

import pytest

from procsv.common.manifests import Manifest
from procsv.watchdog.rules.policy import Action, History, RestartPolicy, TrainerExit, backoff, decide
from procsv.services.checkpoint.policy import retention, save_due

# ----------------------------------------------------------------------------- restart policy

CLEAN_EXIT = TrainerExit(code=0, completed_a_step=True, made_progress=True, stop_requested=False)
CRASH_AFTER_CHECKPOINT = TrainerExit(code=1, completed_a_step=True, made_progress=True, stop_requested=False)
CRASH_NO_PROGRESS = TrainerExit(code=1, completed_a_step=True, made_progress=False, stop_requested=False)
KILLED_NO_PROGRESS = TrainerExit(code=-9, completed_a_step=True, made_progress=False, stop_requested=False)
STARTUP_CRASH = TrainerExit(code=1, completed_a_step=False, made_progress=False, stop_requested=False)

NO_JITTER = RestartPolicy(max_restarts=100, backoff_base=1.0, backoff_factor=2.0, backoff_cap=30.0, jitter=0.0)


def simulate(policy, exits, draw=0.5, history=History()):
    """Feed ``exits`` through decide() as the watchdog would; stop at the first non-restart."""
    decisions = []
    for ex in exits:
        d = decide(policy, history, ex, draw)
        decisions.append(d)
        if d.action is not Action.RESTART:
            break
        history = d.history
    return decisions


def test_exit_code_zero_finishes_without_delay():
    history = History(restarts=3, failures_without_progress=2, startup_failures_in_a_row=0)
    d = decide(RestartPolicy(), history, CLEAN_EXIT, 0.5)
    assert d.action is Action.FINISH
    assert d.delay == 0.0
    assert d.history == history


@pytest.mark.parametrize("code", [0, 1, -15, -9])
def test_any_exit_while_stop_requested_is_stopped(code):
    ex = TrainerExit(code=code, completed_a_step=False, made_progress=False, stop_requested=True)
    history = History(restarts=1, failures_without_progress=1, startup_failures_in_a_row=1)
    d = decide(RestartPolicy(), history, ex, 0.5)
    assert d.action is Action.STOPPED
    assert d.history == history


def test_first_failure_of_a_fresh_run_restarts_at_once():
    d = decide(RestartPolicy(), History(), CRASH_NO_PROGRESS, 0.999)
    assert d.action is Action.RESTART
    assert d.delay == 0.0


def test_first_failure_after_progress_restarts_at_once_even_after_many_failures():
    history = History(restarts=7, failures_without_progress=7)
    d = decide(RestartPolicy(), history, CRASH_AFTER_CHECKPOINT, 0.999)
    assert d.action is Action.RESTART
    assert d.delay == 0.0
    assert d.history.failures_without_progress == 1


def test_death_by_signal_is_a_failure_that_restarts():
    d = decide(RestartPolicy(), History(), KILLED_NO_PROGRESS, 0.5)
    assert d.action is Action.RESTART


def test_consecutive_failures_without_progress_back_off_exponentially_up_to_the_cap():
    decisions = simulate(NO_JITTER, [CRASH_NO_PROGRESS] * 9)
    assert [d.action for d in decisions] == [Action.RESTART] * 9
    assert [d.delay for d in decisions] == [0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]


@pytest.mark.parametrize("failures,expected", [(0, 0.0), (1, 0.0), (2, 0.5), (3, 1.5), (4, 4.5), (5, 10.0), (9, 10.0)])
def test_backoff_is_base_times_factor_to_the_n_minus_2_capped(failures, expected):
    policy = RestartPolicy(backoff_base=0.5, backoff_factor=3.0, backoff_cap=10.0, jitter=0.0)
    assert backoff(policy, failures, 0.5) == pytest.approx(expected)


@pytest.mark.parametrize("failures", range(2, 12))
def test_backoff_jitter_stays_within_plus_minus_jitter(failures):
    policy = RestartPolicy(backoff_base=1.0, backoff_factor=2.0, backoff_cap=30.0, jitter=0.1)
    raw = min(30.0, 2.0 ** (failures - 2))
    low, high = backoff(policy, failures, 0.0), backoff(policy, failures, 0.999)
    assert low == pytest.approx(raw * 0.9)
    assert raw < high <= raw * 1.1
    assert backoff(policy, failures, 0.5) == pytest.approx(raw)


def test_backoff_with_jitter_never_exceeds_cap_plus_jitter():
    policy = RestartPolicy(backoff_base=1.0, backoff_factor=2.0, backoff_cap=30.0, jitter=0.1)
    for failures in range(2, 60):
        for draw in (0.0, 0.25, 0.5, 0.75, 0.999):
            assert 0.0 <= backoff(policy, failures, draw) <= 30.0 * 1.1


def test_backoff_is_never_negative_even_with_jitter_above_one():
    policy = RestartPolicy(backoff_base=1.0, backoff_factor=2.0, backoff_cap=30.0, jitter=1.5)
    assert backoff(policy, 3, 0.0) == 0.0


def test_backoff_stays_capped_after_very_many_failures():
    # --max-restarts is an unbounded int, so failures can exceed 1025, where factor**(n-2) overflows
    # a float (OverflowError) before the cap is applied.
    policy = RestartPolicy(max_restarts=100_000, backoff_cap=30.0, jitter=0.0)
    assert backoff(policy, 1100, 0.5) == 30.0
    d = decide(policy, History(restarts=1100, failures_without_progress=1100), CRASH_NO_PROGRESS, 0.5)
    assert d.action is Action.RESTART and d.delay == 30.0


def test_progress_resets_the_failure_count():
    exits = [CRASH_NO_PROGRESS] * 4 + [CRASH_AFTER_CHECKPOINT, CRASH_NO_PROGRESS, CRASH_NO_PROGRESS]
    decisions = simulate(NO_JITTER, exits)
    assert [d.delay for d in decisions] == [0.0, 1.0, 2.0, 4.0, 0.0, 1.0, 2.0]
    assert decisions[4].history.failures_without_progress == 1


def test_trainer_crashing_after_every_checkpoint_never_gives_up():
    policy = RestartPolicy(max_restarts=3)
    decisions = simulate(policy, [CRASH_AFTER_CHECKPOINT] * 50, draw=0.999)
    assert len(decisions) == 50
    assert all(d.action is Action.RESTART and d.delay == 0.0 for d in decisions)
    assert decisions[-1].history.restarts == 50


PREEMPTED = TrainerExit(code=42, completed_a_step=True, made_progress=False, stop_requested=False, preempted=True)
OWN_42 = TrainerExit(code=42, completed_a_step=True, made_progress=False, stop_requested=False)
KILLED_AT_START = TrainerExit(code=-9, completed_a_step=False, made_progress=False, stop_requested=False,
                              killed_from_outside=True)


def test_a_preemption_restarts_at_once_and_resets_the_counts():
    d = decide(NO_JITTER, History(restarts=4, failures_without_progress=3, startup_failures_in_a_row=1), PREEMPTED, 0.5)
    assert d.action is Action.RESTART and d.delay == 0.0 and d.history == History(5, 0, 0)


def test_a_42_without_the_exit_report_is_a_failure_that_backs_off_and_gives_up():
    decisions = simulate(RestartPolicy(max_restarts=3, jitter=0.0), [OWN_42] * 10)
    assert [d.action for d in decisions] == [Action.RESTART] * 3 + [Action.GIVE_UP]
    assert [d.delay for d in decisions[:3]] == [0.0, 1.0, 2.0]
    assert "--max-restarts 3" in decisions[-1].reason and "restart limit" in decisions[-1].reason


def test_kills_from_outside_before_the_first_step_are_not_start_up_failures():
    decisions = simulate(NO_JITTER, [STARTUP_CRASH] + [KILLED_AT_START] * 5)
    assert [d.action for d in decisions] == [Action.RESTART] * 6
    assert [d.history.startup_failures_in_a_row for d in decisions] == [1] * 6  # neither grown nor reset
    assert [d.delay for d in decisions] == [0.0, 1.0, 2.0, 4.0, 8.0, 16.0]  # the normal backoff
    d = decide(NO_JITTER, decisions[-1].history, STARTUP_CRASH, 0.5)  # its own failure again: the row is 2
    assert d.action is Action.GIVE_UP and "start-up failure rule" in d.reason and "on its own" in d.reason


def test_kills_from_outside_before_the_first_step_end_at_the_restart_limit_naming_it():
    decisions = simulate(RestartPolicy(max_restarts=2, jitter=0.0), [KILLED_AT_START] * 5)
    assert [d.action for d in decisions] == [Action.RESTART] * 2 + [Action.GIVE_UP]
    assert "the restart limit" in decisions[-1].reason and "start-up" not in decisions[-1].reason


def test_two_startup_failures_in_a_row_give_up_mentioning_start_up():
    decisions = simulate(RestartPolicy(max_restarts=10), [STARTUP_CRASH, STARTUP_CRASH])
    assert [d.action for d in decisions] == [Action.RESTART, Action.GIVE_UP]
    assert "start-up" in decisions[1].reason


def test_startup_failure_after_a_run_that_stepped_is_restarted():
    decisions = simulate(RestartPolicy(max_restarts=10), [CRASH_NO_PROGRESS, STARTUP_CRASH])
    assert [d.action for d in decisions] == [Action.RESTART, Action.RESTART]


def test_failure_after_a_successful_step_resets_the_startup_count():
    decisions = simulate(RestartPolicy(max_restarts=10), [STARTUP_CRASH, CRASH_NO_PROGRESS, STARTUP_CRASH])
    assert [d.action for d in decisions] == [Action.RESTART] * 3
    assert decisions[1].history.startup_failures_in_a_row == 0
    assert decisions[2].history.startup_failures_in_a_row == 1


def test_more_than_max_restarts_failures_without_progress_give_up():
    decisions = simulate(RestartPolicy(max_restarts=3), [CRASH_NO_PROGRESS] * 10)
    assert [d.action for d in decisions] == [Action.RESTART] * 3 + [Action.GIVE_UP]
    give_up = decisions[-1]
    assert "max-restarts 3" in give_up.reason
    assert give_up.delay == 0.0
    assert give_up.history.restarts == 3


@pytest.mark.parametrize("ex", [CRASH_NO_PROGRESS, CRASH_AFTER_CHECKPOINT, STARTUP_CRASH],
                         ids=["no-progress", "after-checkpoint", "startup"])
def test_max_restarts_zero_gives_up_at_the_first_failure(ex):
    d = decide(RestartPolicy(max_restarts=0), History(), ex, 0.5)
    assert d.action is Action.GIVE_UP
    assert d.history.restarts == 0


# the same failure again (issue 67: TensorFlow's PTB tutorial under a launch, its error after the last
# epoch restarted ten times with back-off, 446 s): the exception's type, message and innermost frame
RAISED = ("ValueError", "bad shape (#, #)", "/p/train.py:57 in main", 20)  # numbers blanked; after 20 steps
SAME_NO_PROGRESS = replace(CRASH_NO_PROGRESS, fingerprint=RAISED)


@pytest.mark.parametrize("progress", [False, True], ids=["no-progress", "progress"])
def test_the_same_failure_three_times_in_a_row_gives_up_at_once_naming_it(progress):
    # with progress too: each attempt's in-memory snapshot, persisted after its death, is a commit
    decisions = simulate(NO_JITTER, [replace(SAME_NO_PROGRESS, made_progress=progress)] * 5)
    assert [d.action for d in decisions] == [Action.RESTART, Action.RESTART, Action.GIVE_UP]
    assert decisions[-1].delay == 0.0 and decisions[-1].history.same_failures_in_a_row == 3
    assert "failed the same way 3 times in a row" in decisions[-1].reason
    assert "ValueError: bad shape (#, #) at /p/train.py:57 in main, 20 steps after each start" in decisions[-1].reason


@pytest.mark.parametrize("between, gives_up", [
    (replace(SAME_NO_PROGRESS, fingerprint=("ValueError", "bad rank #", *RAISED[2:])), False),  # another message
    (replace(SAME_NO_PROGRESS, fingerprint=(*RAISED[:2], "/p/train.py:58 in main", 20)), False),  # another place
    (replace(SAME_NO_PROGRESS, fingerprint=(*RAISED[:3], 23)), False),  # after other steps: not deterministic
    (CRASH_NO_PROGRESS, False),  # no error file (an exit code, a signal of its own): not known to be the same
    (replace(KILLED_NO_PROGRESS, killed_from_outside=True), True),  # killed from outside in between: the count stays
])
def test_only_the_same_failure_in_a_row_counts(between, gives_up):
    decisions = simulate(NO_JITTER, [SAME_NO_PROGRESS, SAME_NO_PROGRESS, between, SAME_NO_PROGRESS])
    assert (decisions[-1].action is Action.GIVE_UP) == gives_up, decisions[-1]
    assert len(decisions) == 4


def test_the_limit_is_the_policys():
    two = replace(NO_JITTER, same_failure_limit=2)
    assert [d.action for d in simulate(two, [SAME_NO_PROGRESS] * 3)] == [Action.RESTART, Action.GIVE_UP]


def test_the_place_is_the_innermost_frame_of_the_traceback():
    from procsv.watchdog.rules.failures import ChildError

    tb = ('Traceback (most recent call last):\n  File "/p/train.py", line 80, in <module>\n    main()\n'
          '  File "/p/train.py", line 57, in main\n    raise ValueError("bad shape (3, 4)")\nValueError: bad shape (3, 4)\n')
    assert ChildError("ValueError", "bad shape (3, 4)", tb, "run", 20).fingerprint == RAISED
    assert ChildError("ValueError", "bad shape (30, 4.5)", tb, "run", 20).fingerprint == RAISED  # a number: the same
    assert ChildError("SystemExit", "1", "", "run").place == "" and ChildError("E", "", tb, "run").fingerprint is None
    # an attempt whose own checkpoint committed before it failed: progress of its own, never "the same failure"
    # (helper-21's attack: a data stream dropping its connection after 20 batches, a checkpoint every 10)
    assert ChildError("ValueError", "bad shape (3, 4)", tb, "run", 20, committed=True).fingerprint is None


def test_restart_counter_counts_every_restart_across_progress():
    exits = [CRASH_NO_PROGRESS, CRASH_AFTER_CHECKPOINT, STARTUP_CRASH, CRASH_NO_PROGRESS, CRASH_AFTER_CHECKPOINT]
    decisions = simulate(RestartPolicy(max_restarts=10), exits)
    assert [d.history.restarts for d in decisions] == [1, 2, 3, 4, 5]


def test_giving_up_does_not_count_a_restart():
    d = decide(RestartPolicy(max_restarts=2), History(restarts=5, failures_without_progress=2), CRASH_NO_PROGRESS, 0.5)
    assert d.action is Action.GIVE_UP
    assert d.history.restarts == 5


# ----------------------------------------------------------------------------- save_due


@pytest.mark.parametrize("secs", [None, 0, 0.0, -5.0])
def test_save_due_never_when_timed_saving_is_off(secs):
    assert save_due(now=1e9, last_save=0.0, save_model_secs=secs) is False


@pytest.mark.parametrize(
    "now,expected",
    [(1000.0, False), (1599.999, False), (1600.0, True), (1600.001, True), (5000.0, True)],
)
def test_save_due_once_save_model_secs_have_passed_boundary_included(now, expected):
    assert save_due(now=now, last_save=1000.0, save_model_secs=600.0) is expected


# ----------------------------------------------------------------------------- retention

T0 = 1_700_000_000.0
HALF_HOUR = 1800.0


def mk(step, at, reason="timer"):
    prefix = f"model.ckpt-{step}"
    files = {f"{prefix}.index": {"size": 100 + step, "crc32": step},
             f"{prefix}.data-00000-of-00001": {"size": 1000, "crc32": 7}}
    return Manifest(step=step, prefix=prefix, files=files, committed_at=at, reason=reason)


def steps(manifests):
    return sorted(x.step for x in manifests)


def test_retention_keeps_the_newest_max_to_keep_and_deletes_the_rest():
    committed = [mk(s, T0 + s) for s in range(1, 8)]
    plan = retention(committed, max_to_keep=3, keep_every_n_hours=None, last_preserved=T0)
    assert steps(plan.keep) == [5, 6, 7]
    assert steps(plan.delete) == [1, 2, 3, 4]
    assert plan.newly_preserved == []
    assert plan.last_preserved == T0


def test_retention_orders_by_step_not_by_input_order():
    committed = [mk(s, T0 + s) for s in (7, 2, 5, 1, 6, 3, 4)]
    plan = retention(committed, max_to_keep=2, keep_every_n_hours=None, last_preserved=T0)
    assert steps(plan.keep) == [6, 7]
    assert steps(plan.delete) == [1, 2, 3, 4, 5]


@pytest.mark.parametrize("count", [0, 1, 3])
def test_retention_deletes_nothing_with_at_most_max_to_keep(count):
    committed = [mk(s, T0 + s) for s in range(1, count + 1)]
    plan = retention(committed, max_to_keep=3, keep_every_n_hours=None, last_preserved=T0)
    assert steps(plan.keep) == list(range(1, count + 1))
    assert plan.delete == []


@pytest.mark.parametrize("max_to_keep", [0, -1])
def test_retention_with_max_to_keep_at_most_zero_keeps_everything(max_to_keep):
    committed = [mk(s, T0 + s * HALF_HOUR) for s in range(1, 30)]
    plan = retention(committed, max_to_keep=max_to_keep, keep_every_n_hours=1.0, last_preserved=T0)
    assert steps(plan.keep) == list(range(1, 30))
    assert plan.delete == []
    assert plan.newly_preserved == []


def test_retention_preserves_one_checkpoint_every_n_hours_boundary_included():
    # every half hour; 1 hour preservation; the newest two are kept anyway
    committed = [mk(s, T0 + s * HALF_HOUR) for s in range(1, 7)]
    plan = retention(committed, max_to_keep=2, keep_every_n_hours=1.0, last_preserved=T0)
    assert steps(plan.newly_preserved) == [2, 4]  # exactly 1 h and 2 h after T0
    assert steps(plan.keep) == [2, 4, 5, 6]
    assert steps(plan.delete) == [1, 3]
    assert plan.last_preserved == T0 + 4 * HALF_HOUR


def test_retention_never_deletes_a_preserved_manifest():
    committed = [mk(1, T0 + 1, reason="preserved"), mk(2, T0 + 2, reason="preserved")]
    committed += [mk(s, T0 + s) for s in range(3, 10)]
    for hours in (None, 1.0, 1000.0):
        plan = retention(committed, max_to_keep=2, keep_every_n_hours=hours, last_preserved=T0 + 2)
        assert {1, 2} <= set(steps(plan.keep))
        assert not {1, 2} & set(steps(plan.delete))
        assert not {1, 2} & set(steps(plan.newly_preserved))


def test_retention_over_a_long_run_keeps_preserved_and_never_deletes_the_newest():
    """Replay what the checkpoint service does: commit, plan, re-record preserved, delete."""
    max_to_keep, hours = 3, 2.0
    on_disk: dict[int, Manifest] = {}
    ever_preserved: set[int] = set()
    last_preserved = T0
    for step in range(1, 61):  # 30 hours, a commit every half hour
        on_disk[step] = mk(step, T0 + step * HALF_HOUR)
        plan = retention(list(on_disk.values()), max_to_keep, hours, last_preserved)
        newest = sorted(on_disk)[-max_to_keep:]
        assert not set(steps(plan.delete)) & set(newest)
        assert set(steps(plan.keep)) | set(steps(plan.delete)) == set(on_disk)
        assert not set(steps(plan.keep)) & set(steps(plan.delete))
        last_preserved = plan.last_preserved
        for p in plan.newly_preserved:
            on_disk[p.step] = Manifest(p.step, p.prefix, p.files, p.committed_at, "preserved")
            ever_preserved.add(p.step)
        for d in plan.delete:
            del on_disk[d.step]
        assert ever_preserved <= set(on_disk)
    assert sorted(ever_preserved) == list(range(4, 58, 4))  # one every 2 h among those that aged out
    assert sorted(on_disk) == sorted(ever_preserved) + [58, 59, 60]
