"""The chief's notice that the model is ready on the parameter servers, and a worker's wait for it.

Runs in the trainer process of a TF1 graph program under ``procsv launch --ps N --workers M``. The
variables live on the parameter servers; the chief initializes them or restores the newest
checkpoint into them, and the other workers wait until ``ready_op`` reports none uninitialized
(TF's ``SessionManager.wait_for_session``, which sleeps ``recovery_wait_secs``, 30 s by default,
between two looks). Here the chief, once its session is ready, writes the notice
``<logdir>/.procsv/model-ready.json`` (:func:`tell_ready`: its pid, global step and time, written
atomically), and a waiting worker is woken by that file's change (inotify, through
:func:`procsv.common.fswake.wakeups`) and looks at ``ready_op`` again at once
(:func:`wait_until_ready`). ``ready_op`` stays what decides: the notice only says when to look, so
a stale notice (a parameter server restarted since) costs one look, and a notice missed (no logdir,
an observer that cannot start) costs at most the fallback poll.
"""

from __future__ import annotations

import os
import threading
import time
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Callable, ContextManager, Optional

from procsv.common.errors import TrainingStopped
from procsv.common.layout import Layout, write_json

NOTICE = "model-ready.json"
FALLBACK_POLL_SECS = 2.0  # the longest a worker goes without a look when no notice wakes it
STOP_SLICE_SECS = 0.05  # how often a waiting worker looks at the coordinator's stop


def notice_path(layout: Layout) -> str:
    """Where the chief writes its notice."""
    return os.path.join(layout.meta, NOTICE)


def tell_ready(layout: Optional[Layout], step: int) -> None:
    """The chief: the model is initialized (or restored) on the parameter servers at ``step``."""
    if layout is None:
        return
    os.makedirs(layout.meta, exist_ok=True)
    write_json(notice_path(layout), {"pid": os.getpid(), "step": int(step), "time": time.time()}, durable=False)


@dataclass
class Waited:
    """How a worker's wait went: ``ready`` (else the limit was reached), the looks at ``ready_op``,
    how many waits the chief's notice ended (the others ended by the fallback poll), and the time."""

    ready: bool
    looks: int
    woken_by_notice: int
    seconds: float


def wait_until_ready(is_ready: Callable[[], bool], layout: Optional[Layout], poll_secs: float, limit_secs: float,
                     stopped: Callable[[], bool], clock: Callable[[], float] = time.monotonic) -> Waited:
    """Look at ``is_ready`` now, then each time the chief's notice changes or ``poll_secs`` passed,
    until it is true (``Waited.ready``) or ``limit_secs`` passed (not ready). Raises
    :class:`TrainingStopped` when ``stopped()`` turns true meanwhile."""
    start = clock()
    looks = woken = 0
    watch: ContextManager[threading.Event] = nullcontext(threading.Event())
    if layout is not None:
        os.makedirs(layout.meta, exist_ok=True)
        from procsv.common.fswake import wakeups

        watch = wakeups(layout.meta, only=notice_path(layout))
    with watch as notice:  # watched before the first look: a notice written after it is never missed
        while True:
            notice.clear()
            looks += 1
            if is_ready():
                return Waited(True, looks, woken, clock() - start)
            left = start + limit_secs - clock()
            if left <= 0:
                return Waited(False, looks, woken, clock() - start)
            until = clock() + min(poll_secs, left)
            while not notice.wait(min(STOP_SLICE_SECS, max(0.0, until - clock()))):
                if stopped():
                    raise TrainingStopped("a stop was requested while waiting for the chief to initialize the model")
                if clock() >= until:
                    break
            else:
                woken += 1
