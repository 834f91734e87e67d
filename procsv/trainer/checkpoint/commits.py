"""The checkpoint agent's bookkeeping of the snapshot in flight to disk, and of failed commits.

Runs in the trainer's main thread, owned by :class:`procsv.trainer.checkpoint.agent.CheckpointAgent`.
Pure bookkeeping: nothing here sends, prints to a socket or reads a clock; the agent passes the
time in and performs what is decided (the :class:`SaveOverdue` to the watchdog, for one).

**Every snapshot in flight has a deadline** (:func:`save_deadline`: ten times what its size takes
at the persist rate measured on earlier commits, never under ``save_deadline_floor``). A commit
still making progress when its deadline passes (the bytes in the service's unfinished files changed
since the last look: written, or renamed into place; or the service said the load of what the commit
needs moved, :class:`CommitLoading`: :meth:`CommitTracker.progressing`) is slow, not dead: it gets a whole deadline
more, as often as it keeps growing (storage 10x slower than measured is slow storage). Each time a
deadline passes without a result and without progress (the deadline, then each time the wait has tripled: the service's
replacement takes time), that counts as a failed checkpoint and the watchdog is told
(:class:`SaveOverdue`): it replaces the checkpoint service, whose successor reports the snapshot
``lost``, and it is taken again. After ``failure_limit`` failed commits in a row the tracker holds
a :class:`CheckpointError`, with which the Supervisor stops training.
"""

from __future__ import annotations

import os
import sys
from typing import Optional

from procsv.common.errors import CheckpointError
from procsv.ipc.messages import CommitLoading, SaveOverdue, SaveReason

CHECKPOINT_FAILURE_LIMIT = 3  # failed commits in a row that stop training, unless the program or the launch says
SAVE_DEADLINE_FLOOR = 30.0  # seconds: no snapshot is declared overdue sooner (a loaded disk's fsync)
SAVE_DEADLINE_FACTOR = 10.0  # ... nor before this many times its expected persist time
ASSUMED_PERSIST_RATE = 10e6  # bytes/s before any commit was measured (a slow network filesystem)


def save_deadline(nbytes: int, rate: Optional[float], floor: float = SAVE_DEADLINE_FLOOR) -> float:
    """Seconds a snapshot of ``nbytes`` may take to commit, given the measured persist ``rate``
    (bytes/s; None before the first commit)."""
    expected = nbytes / (rate if rate and rate > 0 else ASSUMED_PERSIST_RATE)
    return max(floor, SAVE_DEADLINE_FACTOR * expected)


def measured_rate(previous: Optional[float], nbytes: int, persist_secs: float) -> Optional[float]:
    """The persist rate (bytes/s) after one more commit of ``nbytes`` in ``persist_secs``.

    Averaged as time per byte, and never faster than the new measurement: one slow commit
    lengthens the deadlines at once, one fast commit (the page cache, say) shortens them by at most
    a third."""
    if nbytes <= 0 or persist_secs <= 0:
        return previous
    per_byte = persist_secs / nbytes
    if previous is None:
        return 1.0 / per_byte
    return 1.0 / max(per_byte, 0.7 / previous + 0.3 * per_byte)


class CommitTracker:
    """The snapshot in flight to disk (at most one) and what its commits tell.

    Owns the step in flight (``step``, None when none), why it was taken, its size, when it was sent
    and when it is (next) declared overdue; the persist rate measured on commits; and the failed
    commits in a row, with the :class:`CheckpointError` (``failure``) once they reach
    ``failure_limit`` (0: never). Times are the agent's clock, passed in.
    """

    def __init__(self, failure_limit: int = CHECKPOINT_FAILURE_LIMIT,
                 deadline_floor: float = SAVE_DEADLINE_FLOOR) -> None:
        self.failure_limit = failure_limit  # failed commits in a row that stop training (0: never)
        self.failures_in_a_row = 0
        self.failure: Optional[CheckpointError] = None  # set once they did: the Supervisor stops with it
        self.deadline_floor = deadline_floor
        self.persist_rate: Optional[float] = None  # bytes/s measured on commits
        self.step: Optional[int] = None  # the snapshot in flight
        self.reason = SaveReason.PERIODIC  # ... why it was taken (taken again for the same reason if lost)
        self.nbytes = 0
        self.since = 0.0  # when it was sent
        self.overdue_at = 0.0  # when it is (next) declared overdue
        self.written = 0  # the bytes in its commit's unfinished files at the last deadline (progressing)
        self.extended = 0  # deadlines it passed while making progress
        self.loading = ""  # what the service said its commit waits for (CommitLoading), "" if it said nothing
        self.loads_told = 0  # ... the CommitLoading messages since the last look (progressing)

    def sent(self, step: int, reason: SaveReason, nbytes: int, now: float) -> None:
        """The snapshot of ``step`` (``nbytes``) was handed to the service at ``now``."""
        self.step = step
        self.reason = reason
        self.nbytes = nbytes
        self.since = now
        self.overdue_at = now + save_deadline(nbytes, self.persist_rate, self.deadline_floor)
        self.written = self.extended = self.loads_told = 0
        self.loading = ""

    def load_moved(self, msg: CommitLoading) -> None:
        """The service says the load of what the commit of ``msg.step`` needs began or moved."""
        if msg.step == self.step:
            self.loading = msg.what
            self.loads_told += 1

    def answered(self) -> None:
        """The result of the snapshot in flight arrived: none is in flight now (its size and reason
        stay readable for :meth:`committed` and a retake)."""
        self.step = None

    def progressing(self, written: int, now: float) -> bool:
        """A deadline of the snapshot in flight passed at ``now``, and its commit has written
        ``written`` bytes in its unfinished files: True if that changed since the last look (the
        first: since it was sent, with none): bytes written, or files renamed into place; or if the
        service said its load moved since (:meth:`load_moved`). Then it is slow, not dead: its next
        deadline is a whole deadline from ``now``."""
        moved = written != self.written or self.loads_told > 0
        self.written, self.loads_told = written, 0
        if moved:
            self.extended += 1
            self.overdue_at = now + save_deadline(self.nbytes, self.persist_rate, self.deadline_floor)
        return moved

    def overdue(self, now: float, stopped: float = 0.0) -> SaveOverdue:
        """A deadline of the snapshot in flight passed at ``now``: the next is due when the wait has
        tripled (the service's replacement takes time). Returns what to tell the watchdog; the
        caller then counts the failure (:meth:`failed`). ``stopped``: the seconds the clock left out
        of the wait (this process stopped: a suspended job), said to the watchdog."""
        assert self.step is not None
        waited = now - self.since
        deadline = save_deadline(self.nbytes, self.persist_rate, self.deadline_floor)
        self.overdue_at = now + 2 * waited
        return SaveOverdue(os.getpid(), self.step, waited, deadline, stopped)

    def committed(self, persist_secs: float, waited: Optional[float] = None) -> None:
        """The snapshot in flight committed, persisted in ``persist_secs`` (the service's raw clock), answered
        ``waited`` after it was sent (this process's clock, which leaves out the time it was stopped). The rate is
        measured on the shorter: a suspension of the job mid-commit is in the service's time, not in the wait (a
        stop of S s in a commit of t s made its rate (t + S)/t times too slow, every next deadline that much longer)."""
        self.failures_in_a_row = 0
        persisted = persist_secs if waited is None or waited <= 0 else min(persist_secs, waited)
        self.persist_rate = measured_rate(self.persist_rate, self.nbytes, persisted)

    def failed(self, step: int, error: Optional[str]) -> None:
        """The checkpoint of ``step`` failed (or is overdue): one more in a row, said on stderr."""
        self.failures_in_a_row += 1
        if 0 < self.failure_limit <= self.failures_in_a_row and self.failure is None:
            self.failure = CheckpointError(
                f"{self.failures_in_a_row} checkpoints in a row failed to commit, the last at step {step}: "
                f"{error}; training stops rather than go on without any way to keep its progress "
                "(fix the cause and run again, or pass --on-checkpoint-failure continue)")
        print(f"procsv: checkpoint at step {step} failed: {error}", file=sys.stderr, flush=True)


def bytes_being_written(tmp: str) -> int:
    """The bytes in the checkpoint service's unfinished files (``.procsv/tmp/``, a commit's first
    step), read at a commit's deadline only; 0 if none can be read."""
    total = 0
    try:
        with os.scandir(tmp) as entries:
            for entry in entries:
                total += bytes_being_written(entry.path) if entry.is_dir(follow_symlinks=False) \
                    else entry.stat(follow_symlinks=False).st_size
    except OSError:
        pass
    return total
