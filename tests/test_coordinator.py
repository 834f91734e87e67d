"""procsv.trainer.coordinator: stop requests, the first error, signals, and the looper thread."""

from __future__ import annotations

import threading

import pytest

from procsv.common.errors import TrainingStopped
from procsv.trainer.coordinator import Coordinator, LooperThread

CLEAN = (StopIteration, TrainingStopped)


def test_the_first_non_clean_exception_is_kept_and_raised_at_join():
    coord = Coordinator(CLEAN)
    assert not coord.should_stop()
    coord.request_stop(StopIteration())  # a clean stop: nothing to re-raise
    assert coord.should_stop() and coord.exception is None
    first = ValueError("first")
    coord.request_stop(first)
    coord.request_stop(KeyError("second"))
    assert coord.exception is first
    with pytest.raises(ValueError, match="first"):
        coord.join()


def test_a_signal_only_sets_a_flag_that_should_stop_turns_into_a_stop():
    coord = Coordinator(CLEAN)
    coord.request_stop_from_signal(15)
    assert coord.stop_signal == 15
    assert coord.should_stop() and coord.wait_for_stop(0)


def test_wait_for_stop_times_out_without_a_request():
    assert Coordinator(CLEAN).wait_for_stop(0.01) is False


def test_stop_on_exception_records_the_error_instead_of_raising_it():
    coord = Coordinator(CLEAN)
    with coord.stop_on_exception():
        raise RuntimeError("in a worker")
    assert coord.should_stop() and isinstance(coord.exception, RuntimeError)


def test_looper_calls_its_target_until_a_stop_and_join_waits_for_it():
    coord = Coordinator(CLEAN)
    calls = threading.Semaphore(0)
    looper = LooperThread(coord, 0.001, calls.release)
    looper.start()
    for _ in range(3):
        assert calls.acquire(timeout=10)
    coord.request_stop()
    coord.join(stop_grace_period_secs=10)
    assert not looper.is_alive()


def test_a_failing_looper_target_stops_everyone_and_its_error_comes_out_of_join():
    coord = Coordinator(CLEAN)

    def boom() -> None:
        raise OSError("disk full")

    LooperThread(coord, None, boom).start()
    assert coord.wait_for_stop(10)
    with pytest.raises(OSError, match="disk full"):
        coord.join(stop_grace_period_secs=10)
