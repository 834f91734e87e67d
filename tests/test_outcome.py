"""procsv.trainer.outcome: what a trainer process's exit code says about its Supervisors."""

from __future__ import annotations

from procsv.common.exitcodes import EXIT_PREEMPTED
from procsv.trainer.outcome import EXIT_UNSAVED, Outcome


def test_a_normal_return_exits_zero_and_a_start_up_failure_is_named():
    assert Outcome().clean_exit_code == 0 and Outcome().phase == "startup"
    assert Outcome(steps_completed=3).phase == "run"


def test_a_signal_stop_exits_42_only_if_the_emergency_checkpoint_committed():
    assert Outcome(stopped_by_signal=True).clean_exit_code == EXIT_PREEMPTED == 42
    assert Outcome(stopped_by_signal=True, unsaved=True).clean_exit_code == EXIT_UNSAVED == 1


def test_a_normal_return_whose_final_checkpoint_did_not_commit_is_a_failure_not_a_success():
    assert Outcome(steps_completed=300, unsaved=True).clean_exit_code == EXIT_UNSAVED == 1


def test_outcomes_of_several_supervisors_merge():
    total = Outcome(2, False, 1).merge(Outcome(3, True, 1, unsaved=True))
    assert total == Outcome(5, True, 2, True) and total.clean_exit_code == EXIT_UNSAVED
