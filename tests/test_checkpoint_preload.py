"""The checkpoint service's loader (services/checkpoint/preload.py): what counts as a load at work.

The loader tells the trainer (``CommitLoading``) that a commit waiting for it is slow, not dead. It
must do so only while the import moves (a module more, or CPU time of the loader thread): a
deadlocked import (an import lock, a stalled filesystem) looked alive as long as the service's main
thread lived, so neither the trainer's deadline nor the watchdog's SaveOverdue rule noticed the hang
before ``loading_limit_secs`` (900 s). Real threads here: one that computes, one that waits.
"""

from __future__ import annotations

import threading
import time

from procsv.services.checkpoint.preload import _cpu_secs, progressing


def _cpu_of(work: str) -> float:
    """The CPU seconds a thread doing ``work`` ('compute' or 'wait') uses in 0.5 s, as the loader reads it."""
    stop = threading.Event()

    def compute() -> None:
        while not stop.is_set():
            sum(i * i for i in range(1000))

    thread = threading.Thread(target=compute if work == "compute" else stop.wait, daemon=True)
    thread.start()
    try:
        before = _cpu_secs(thread.ident)
        time.sleep(0.5)  # the interval measured, not a wait for a condition
        return _cpu_secs(thread.ident) - before
    finally:
        stop.set()
        thread.join(5)


def test_an_import_at_work_is_progress_and_a_blocked_one_is_not():
    assert progressing((100, 1.0), (101, 1.0))  # a module more
    assert progressing((100, 1.0), (100, 1.5))  # CPU of the loader thread
    assert not progressing((100, 1.0), (100, 1.0))  # a deadlock: neither
    computing, waiting = _cpu_of("compute"), _cpu_of("wait")
    assert computing > 0.02 and progressing((100, 0.0), (100, computing)), computing
    assert waiting < 0.02 and not progressing((100, 0.0), (100, waiting)), waiting
