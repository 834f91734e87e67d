"""Issue 43: a --ps worker waiting for the chief is woken by the chief's notice, not by a poll.

Real files and real inotify (the ``watchdog`` package's observer, as the trainer runs it); the
``ready_op`` look is a flag the test turns, as the chief's initialization does on the parameter
servers (the same wait with a real ``ready_op`` on a real server:
``test_graph_monitored.py::test_a_worker_under_ps_waits_for_the_chief_up_to_max_wait_secs_then_raises_deadline_exceeded``).
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from procsv.common.errors import TrainingStopped
from procsv.common.layout import Layout, read_json
from procsv.trainer.graph import readiness


def test_a_waiting_worker_looks_again_when_the_chiefs_notice_is_written_not_after_its_poll(tmp_path: Path) -> None:
    layout = Layout(str(tmp_path / "run"))
    readiness.tell_ready(layout, 3)  # a stale notice, from before a parameter server was restarted
    model_ready, looked = threading.Event(), threading.Event()

    def is_ready() -> bool:
        ready = model_ready.is_set()
        looked.set()
        return ready

    def chief() -> None:
        # the worker must be waiting first: its first look done (its watch is set before it). Before, a 0.3 s pace
        # here, which a loaded machine (the quick tier at load 11) outran: the chief was ready before the first look
        looked.wait(30)
        model_ready.set()  # ready_op now reports nothing uninitialized ...
        readiness.tell_ready(layout, 40)  # ... and the chief says so

    t = threading.Thread(target=chief)
    t.start()
    try:
        waited = readiness.wait_until_ready(is_ready, layout, poll_secs=600, limit_secs=1200,
                                            stopped=lambda: False)
    finally:
        t.join()
    # a 600 s poll: only the notice can have ended the wait; the stale notice woke nothing
    assert waited.ready and waited.looks == 2 and waited.woken_by_notice == 1, waited
    notice = read_json(readiness.notice_path(layout))
    assert notice["step"] == 40 and notice["pid"] > 0


def test_without_a_notice_the_worker_looks_every_poll_and_gives_up_at_its_limit(tmp_path: Path) -> None:
    layout = Layout(str(tmp_path / "run"))
    waited = readiness.wait_until_ready(lambda: False, layout, poll_secs=0.1, limit_secs=0.45, stopped=lambda: False)
    assert not waited.ready and waited.woken_by_notice == 0 and waited.looks >= 2, waited
    no_logdir = readiness.wait_until_ready(lambda: False, None, poll_secs=0.1, limit_secs=0.25, stopped=lambda: False)
    assert not no_logdir.ready and no_logdir.looks >= 2  # no logdir: no notice, the poll alone


def test_a_stop_requested_while_waiting_ends_the_wait_as_a_clean_stop(tmp_path: Path) -> None:
    stop = threading.Event()
    threading.Timer(0.2, stop.set).start()
    with pytest.raises(TrainingStopped, match="waiting for the chief"):
        readiness.wait_until_ready(lambda: False, Layout(str(tmp_path / "run")), poll_secs=600, limit_secs=1200,
                                   stopped=stop.is_set)
