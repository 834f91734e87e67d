"""The deadline of a checkpoint in flight: derived from the measured persist rate, with a floor."""

from __future__ import annotations

from procsv.trainer.checkpoint.commits import ASSUMED_PERSIST_RATE, SAVE_DEADLINE_FACTOR, measured_rate, save_deadline


def test_a_small_snapshot_gets_the_floor():
    assert save_deadline(1_000, 100e6, floor=30.0) == 30.0


def test_a_large_snapshot_gets_ten_times_its_expected_persist_time():
    assert save_deadline(10_000_000_000, 100e6, floor=30.0) == SAVE_DEADLINE_FACTOR * 100.0


def test_before_any_commit_a_slow_rate_is_assumed():
    assert save_deadline(int(ASSUMED_PERSIST_RATE) * 50, None, floor=30.0) == SAVE_DEADLINE_FACTOR * 50


def test_one_fast_commit_cannot_shorten_the_deadline_much_but_a_slow_one_lengthens_it_at_once():
    rate = measured_rate(None, 100_000_000, 1.0)
    assert rate == 100e6
    faster = measured_rate(rate, 100_000_000, 0.01)  # 10 GB/s once: page cache, say
    assert faster is not None and faster < 1.5 * rate
    slower = measured_rate(rate, 100_000_000, 10.0)
    assert slower == 10e6


def test_a_result_without_size_or_time_keeps_the_rate():
    assert measured_rate(5e6, 0, 1.0) == 5e6
    assert measured_rate(5e6, 100, 0.0) == 5e6


def test_a_commit_that_keeps_writing_past_its_deadline_gets_another_and_one_that_stops_is_overdue():
    from procsv.ipc.messages import SaveReason
    from procsv.trainer.checkpoint.commits import CommitTracker

    t = CommitTracker(deadline_floor=30.0)
    t.sent(100, SaveReason.PERIODIC, 1_000, now=0.0)
    assert t.overdue_at == 30.0
    assert not t.progressing(0, now=30.0)  # nothing written since it was sent: overdue
    t.sent(101, SaveReason.PERIODIC, 1_000, now=40.0)
    assert t.progressing(4 << 20, now=70.0) and t.overdue_at == 100.0  # slow, not dead: a whole deadline more
    assert t.progressing(0, now=100.0) and t.overdue_at == 130.0  # its files renamed into place: still moving
    assert not t.progressing(0, now=130.0)  # then nothing for a whole deadline: overdue
    assert t.extended == 2


def test_a_commit_the_job_was_suspended_in_measures_the_rate_on_the_trainers_wait_not_the_services_time():
    """The service times a commit on its raw clock: a suspension mid-commit is in its persist_secs. The trainer's wait
    from the hand-off to the answer, on its watched clock, is not: the rate is measured on the shorter."""
    from procsv.ipc.messages import SaveReason
    from procsv.trainer.checkpoint.commits import CommitTracker

    t = CommitTracker(deadline_floor=1.0)
    t.sent(10, SaveReason.PERIODIC, 100_000_000, now=50.0)
    t.answered()
    t.committed(600.5, waited=1.0)  # 0.5 s of writing, a 600 s suspension in it; answered 1.0 s (watched) after
    assert t.persist_rate == 100e6
    t.sent(20, SaveReason.PERIODIC, 100_000_000, now=60.0)
    assert t.overdue_at == 60.0 + SAVE_DEADLINE_FACTOR * 1.0  # (not 6005 s: a stuck commit is still found)
    t.answered()
    t.committed(2.0, waited=2.5)  # a slow disk, no stop: the service's own time
    assert t.persist_rate == 50e6
    t.committed(4.0)  # (a caller that knows no wait)
    assert t.persist_rate == 25e6
