"""A forked trainer's end (``procsv.trainer.__main__.exit_like_an_interpreter``), the part that needs
no process: the bounded join of the program's non-daemon threads (the whole end, with a real launch:
``tests/test_exit_truth.py``)."""

from __future__ import annotations

import threading
import time

from procsv.trainer.__main__ import join_threads


def test_the_join_waits_for_a_finishing_thread_and_names_one_still_running_after_the_grace():
    stop = threading.Event()
    finishing = threading.Thread(target=time.sleep, args=(0.2,), name="flush")
    stuck = threading.Thread(target=stop.wait, name="stuck-loader")
    daemon = threading.Thread(target=stop.wait, name="a-daemon", daemon=True)
    for t in (finishing, stuck, daemon):
        t.start()
    start = time.monotonic()
    try:
        left = join_threads(0.6, [finishing, stuck, daemon])
        took = time.monotonic() - start
    finally:
        stop.set()
        stuck.join()
    assert left == ["stuck-loader"]  # the daemon thread is not waited for, nor named (as an interpreter's exit)
    assert not finishing.is_alive()
    assert 0.55 <= took < 5  # the grace is the whole wait's, not one per thread
