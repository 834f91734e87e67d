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


def test_a_signal_stop_is_a_preemption_only_if_the_checkpoint_of_its_last_step_committed():
    # issue 38, point 2: the trainer's exit report claims a preemption only then
    import signal

    from procsv.trainer.outcome import exit_report, of

    saved = of(5, signal.SIGTERM, unsaved=False, saved=True)
    assert saved.preempted and saved.clean_exit_code == EXIT_PREEMPTED
    report = exit_report(saved, 123, "trainer", 2)
    assert report is not None and report["signal"] == "SIGTERM" and report["preempted"] is True
    assert report["pid"] == 123 and report["attempt"] == 2 and report["steps_completed"] == 5
    no_checkpoint = of(5, signal.SIGTERM, unsaved=False, saved=False)  # a program without a checkpoint
    assert not no_checkpoint.preempted and exit_report(no_checkpoint, 1, "trainer", 1) is None
    assert not of(5, signal.SIGINT, unsaved=True, saved=False).preempted
    assert not of(5, False, unsaved=False, saved=True).preempted  # no signal: a 42 would be the program's own
    assert of(3, False, False, True).merge(saved).preempted
    assert not saved.merge(of(1, False, unsaved=True, saved=False)).preempted  # another Supervisor's save failed
