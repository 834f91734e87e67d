"""Replicas in the trainer process: a worker (``is_chief=False``) waiting for the chief's checkpoint;
a group's record of what its chief restored (:class:`GroupPin`), and of what it is about to restore.

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
    final: bool = True  # False: the chief's intent, published before its restore (:meth:`GroupPin.intend`)


def intent_kept(intent: PinRecord, pinned: PinRecord) -> bool:
    """Whether a worker's restore of the chief's ``intent`` (a checkpoint's path: :meth:`GroupPin.intend`) is what
    the chief then ``pinned``: the same checkpoint. Else the worker restores the pin over it (a later restore of a
    checkpoint assigns every variable again, and TensorFlow's deferred restorations keep the latest restore's), and
    a pin of nothing (the chief initialized) after an intent the worker restored cannot be followed:
    :func:`unfollowable`."""
    return intent.memory_step is None and pinned.memory_step is None and intent.path is not None \
        and intent.path == pinned.path


def unfollowable(intent: PinRecord, pinned: PinRecord) -> bool:
    """Whether a worker that restored the chief's ``intent`` cannot take the chief's ``pinned`` record: the chief
    initialized after all (its intent unrestorable for it and not for the worker: a file read differently on two
    hosts), and what the worker restored cannot be undone."""
    return intent.path is not None and pinned.path is None and pinned.memory_step is None


INTENT = ".intent"  # beside a group's pin: the checkpoint its chief is about to restore (GroupPin.intend)


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
    A chief restoring from disk says first which checkpoint it tries (:meth:`intend`): its workers restore
    that meanwhile and keep it if the record names it too (:func:`intent_kept`).
    """

    def __init__(self, path: str) -> None:
        self.path = path

    def publish(self, record: PinRecord) -> None:
        """The chief: record what it restored (``path`` None and no ``memory_step``: it initialized)."""
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        write_json(self.path, {"path": record.path, "memory_step": record.memory_step,
                               "memory_attempt": record.memory_attempt})

    def intend(self, record: PinRecord) -> None:
        """The chief, before its restore: the checkpoint it is about to restore (``record.path``), so that each
        worker restores it meanwhile (:meth:`wait` with ``early``) instead of after the pin: before, a worker's
        restore began only once the chief's had ended, and the group's first step waited for both in turn. The
        chief may still pass it over (corrupt: an older one, or none): the pin it publishes after says. Not
        durable (read by live processes only; the rename makes it whole)."""
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        write_json(self.path + INTENT, {"path": record.path}, durable=False)

    def wait(self, poll_secs: float = 0.1, early: bool = False) -> PinRecord:
        """A worker: wait for the chief's record and return it (``early``: its intent if that comes first,
        ``final`` False).

        There is no deadline here: the watchdog ends the whole group when the chief dies or hangs.
        A network filesystem may not deliver another host's write as an event: the poll catches it."""
        folder = os.path.dirname(self.path)
        os.makedirs(folder, exist_ok=True)
        with wakeups(folder) as woken:  # (the pin or the intent: this attempt's, in a folder of this launch's)
            while True:
                record = read_json(self.path)
                if isinstance(record, dict) and "path" in record:
                    path, step = record["path"], record.get("memory_step")
                    return PinRecord(path if isinstance(path, str) else None, step if isinstance(step, int) else None,
                                     int(record.get("memory_attempt") or 0))
                intent = read_json(self.path + INTENT) if early else None
                if isinstance(intent, dict) and isinstance(intent.get("path"), str):
                    return PinRecord(intent["path"], final=False)
                woken.wait(poll_secs)
                woken.clear()
