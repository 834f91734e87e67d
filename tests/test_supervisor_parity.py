"""Issue #11 section 4: the Supervisor's and the Coordinator's TF1 arguments and methods.

Fast tests: no services are started unless a test says so (those are marked slow)."""

from __future__ import annotations

import sys
import threading
import time

import pytest

from procsv.common.errors import TrainingStopped
from procsv.trainer.coordinator import Coordinator, LooperThread

CLEAN = (StopIteration, TrainingStopped)


# ---------------------------------------------------------------------------------- Coordinator
def test_join_waits_for_healthy_threads_without_a_grace_period_when_no_stop_was_requested():
    coord = Coordinator(CLEAN)
    t = threading.Thread(target=time.sleep, args=(0.3,))
    t.start()
    coord.join([t], stop_grace_period_secs=0)  # TF: the grace starts only at a stop; no RuntimeError
    assert not t.is_alive() and coord.joined and not coord.should_stop()


def test_join_gives_the_grace_period_after_a_stop_then_names_the_live_threads():
    coord = Coordinator(CLEAN)
    release = threading.Event()
    t = threading.Thread(target=release.wait, name="stuck", daemon=True)
    t.start()
    coord.request_stop()
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="threads still running: stuck"):
        coord.join([t], stop_grace_period_secs=0.2)
    assert 0.15 < time.monotonic() - t0 < 5 and coord.joined
    coord.join([t], stop_grace_period_secs=0, ignore_live_threads=True)  # no error
    release.set()


def test_request_stop_accepts_an_exc_info_tuple_and_raise_requested_exception_raises_it():
    coord = Coordinator(CLEAN)
    try:
        raise ValueError("from exc_info")
    except ValueError:
        coord.request_stop(sys.exc_info())
    assert isinstance(coord.exception, ValueError)
    with pytest.raises(ValueError, match="from exc_info"):
        coord.raise_requested_exception()
    with pytest.raises(TypeError):
        coord.request_stop("not an exception")


def test_clear_stop_forgets_the_stop_and_the_exception():
    coord = Coordinator(CLEAN)
    coord.request_stop(ValueError("x"))
    coord.clear_stop()
    assert not coord.should_stop() and coord.exception is None and not coord.joined
    coord.raise_requested_exception()  # nothing


def test_a_looper_stops_at_a_stop_and_join_clears_the_registered_threads():
    coord = Coordinator(CLEAN)
    looper = LooperThread(coord, 0.01, lambda: None)
    looper.start()
    coord.request_stop()
    coord.join(stop_grace_period_secs=10)
    assert not looper.is_alive()
    coord.clear_stop()
    coord.join(stop_grace_period_secs=0)  # the old looper is not joined again
