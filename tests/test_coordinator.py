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


@pytest.mark.parametrize("code", [0, None, False])
def test_sys_exit_zero_is_no_error_and_comes_out_of_join_after_everything(code):
    # sys.exit(0)/sys.exit(): the Supervisor must see no error (so it commits its final checkpoint),
    # and the SystemExit still leaves join, so that the program exits where it asked to
    coord = Coordinator(CLEAN)
    asked = SystemExit(code)
    coord.request_stop(asked)
    assert coord.should_stop() and coord.exception is None and coord.exit_request is asked
    with pytest.raises(SystemExit) as raised:
        coord.join(stop_grace_period_secs=0)
    assert raised.value is asked
    coord.clear_stop()
    assert coord.exit_request is None
    coord.join(stop_grace_period_secs=0)  # nothing recorded any more


def test_an_error_wins_over_sys_exit_zero_and_sys_exit_nonzero_is_an_error():
    coord = Coordinator(CLEAN)
    coord.request_stop(SystemExit(0))
    failed = SystemExit(3)
    coord.request_stop(failed)
    assert coord.exception is failed
    with pytest.raises(SystemExit) as raised:
        coord.join(stop_grace_period_secs=0)
    assert raised.value is failed


def test_sys_exit_zero_in_a_looper_thread_is_a_clean_stop_that_join_re_raises():
    coord = Coordinator(CLEAN)

    def leave() -> None:
        raise SystemExit(0)

    LooperThread(coord, 0.001, leave).start()
    assert coord.wait_for_stop(10)
    assert coord.exception is None
    with pytest.raises(SystemExit) as raised:
        coord.join(stop_grace_period_secs=10)
    assert raised.value.code == 0
