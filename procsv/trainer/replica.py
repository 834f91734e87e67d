"""Replicas in the trainer process: a worker (``is_chief=False``) waiting for the chief's checkpoint;
a group's record of what its chief restored (:class:`GroupPin`).

Runs in the trainer. In TensorFlow 2 the replicas of a ``tf.distribute`` job hold the same
variables; the chief saves them, the other workers only restore. A worker that must start from
the chief's state (``prepare_or_wait_for_session(wait_for_checkpoint=True)``) waits here until a
committed checkpoint is in the shared logdir: woken by filesystem events on the logdir (the
``watchdog`` package: inotify on Linux), with ``recovery_wait_secs`` only as a fallback poll (TF1's
workers polled every 30 s), and ``max_wait_secs`` ending the wait with TensorFlow's
``DeadlineExceededError``.
"""

from __future__ import annotations

import os
import threading
import time
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Callable, Optional

from procsv.common.fswake import wakeups
from procsv.common.layout import Layout, read_json, write_json
from procsv.common.manifests import list_committed


def wait_for_committed(layout: Optional[Layout], max_wait_secs: float, poll_secs: float,
                       clock: Callable[[], float] = time.monotonic, events: bool = True) -> float:
    """Wait until the logdir holds a committed checkpoint; return the seconds waited.

    Raises ``tf.errors.DeadlineExceededError`` after ``max_wait_secs``. ``events=False`` polls only
    (every ``poll_secs``, as TF1's workers did): the baseline ``scripts/bench_group.py`` compares."""
    if layout is None or list_committed(layout):  # no logdir: no checkpoint to wait for (TF waited for none)
        return 0.0
    os.makedirs(layout.logdir, exist_ok=True)  # the chief creates it too: a worker may come first
    t0 = clock()
    deadline = t0 + max_wait_secs
    while True:
        # one folder at a time, not recursively: the deepest of logdir/.procsv/checkpoints that exists
        # (its creation of the next one wakes us: then the next one is watched)
        folder = next(f for f in (layout.manifests, layout.meta, layout.logdir) if os.path.isdir(f))
        with wakeups(folder) if events else nullcontext(threading.Event()) as woken:
            while not list_committed(layout):  # checked again once the observer runs: nothing is missed
                left = deadline - clock()
                if left <= 0:
                    import tensorflow as tf

                    raise tf.errors.DeadlineExceededError(
                        None, None, f"no committed checkpoint appeared in {layout.logdir} within max_wait_secs="
                                    f"{max_wait_secs:g} (is the chief running and saving there?)")
                woken.wait(min(left, max(poll_secs, 0.01)))
                woken.clear()
                if events and folder != layout.manifests and os.path.isdir(layout.manifests if folder == layout.meta
                                                                            else layout.meta):
                    break  # a deeper folder appeared: watch it instead
            else:
                return clock() - t0


@dataclass(frozen=True)
class PinRecord:
    """What a group's chief restored: a checkpoint ``path`` (None: none), or, with ``memory_step``
    set, the group's in-memory snapshot of that step taken by attempt ``memory_attempt`` (each member
    restores its own copy of it from the checkpoint service)."""

    path: Optional[str]
    memory_step: Optional[int] = None
    memory_attempt: int = 0


class GroupPin:
    """What a group's chief restored at one attempt; its workers restore exactly the same.

    In a ``procsv launch --nproc N`` group every trainer restores, and they must all hold the
    same state: a worker that restored a newer checkpoint than the chief (one the checkpoint
    service committed in between, from the dead attempt's last snapshot) would train diverged
    replicas that all-reduce their gradients. So the chief publishes what it restored (a path, or
    ``None`` for a fresh start) atomically at ``path`` (in the shared logdir, named by the job and
    the attempt: ``PROCSV_GROUP_PIN``), and every worker, on any host, waits for that record
    (filesystem events, with a fallback poll) before restoring it. With the group's in-memory tier,
    the record names the step of the in-memory snapshot the chief restored instead (:class:`PinRecord`).
    """

    def __init__(self, path: str) -> None:
        self.path = path

    def publish(self, record: PinRecord) -> None:
        """The chief: record what it restored (``path`` None and no ``memory_step``: it initialized)."""
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        write_json(self.path, {"path": record.path, "memory_step": record.memory_step,
                               "memory_attempt": record.memory_attempt})

    def wait(self, poll_secs: float = 0.1) -> PinRecord:
        """A worker: wait for the chief's record and return it.

        There is no deadline here: the watchdog ends the whole group when the chief dies or hangs.
        A network filesystem may not deliver another host's write as an event: the poll catches it."""
        folder = os.path.dirname(self.path)
        os.makedirs(folder, exist_ok=True)
        with wakeups(folder, only=self.path) as woken:
            while True:
                record = read_json(self.path)
                if isinstance(record, dict) and "path" in record:
                    path, step = record["path"], record.get("memory_step")
                    return PinRecord(path if isinstance(path, str) else None, step if isinstance(step, int) else None,
                                     int(record.get("memory_attempt") or 0))
                woken.wait(poll_secs)
                woken.clear()
