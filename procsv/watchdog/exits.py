"""How the ends of the run's children reach the watchdog's loop, and what is made of them.

Runs in the ``procsv launch`` process (the watchdog), called from its loop
(:mod:`procsv.watchdog.launcher`). :class:`ChildEnds` owns three ways a death comes in: a pidfd
per child in the loop's poller (readable the moment the child dies), death notices that the
death-watch threads (:mod:`procsv.watchdog.deathwatch`) hand over through a queue and a pipe; every child, a trainer
the zygote forked too, is the watchdog's own and reaped by it at its pidfd. Each becomes an observation (:func:`procsv.watchdog.observe.death_noticed`,
:func:`procsv.watchdog.observe.reaped`) for the decision function once what is read at the end
(:mod:`procsv.watchdog.endreads`: the error file, the exit report, a commit not heard of yet) has
come from the logdir reader thread, or :data:`~procsv.watchdog.endreads.READ_WAIT` has passed
without it: the loop never reads the logdir itself. Ends are observed in the order they came in
(a death notice before its child's exit), each once.
"""

from __future__ import annotations

import os
import queue
import signal
from collections import deque
from dataclasses import dataclass
from typing import Callable, Optional

import zmq

from procsv.common.layout import Layout, exit_report_file, spilled_error_file
from procsv.watchdog import observe
from procsv.watchdog.diskjobs import DiskJobs, Job
from procsv.watchdog.endreads import READ_WAIT, EndReads, read_end, taken
from procsv.watchdog.lateblame import breaker_found
from procsv.watchdog.rules.bookkeeping import find
from procsv.watchdog.children import ChildProcess
from procsv.common.clock.watched import WatchedClock
from procsv.watchdog.executor import Executor
from procsv.watchdog.rules.failures import Failure
from procsv.watchdog.publish.reporting import Reporter
from procsv.watchdog.rules.state import STANDBY, TRAINER, RunView


@dataclass(frozen=True)
class _End:
    """A death notice (``code`` None) or an exit, its reads asked of the reader thread."""

    handle: ChildProcess
    code: Optional[int]
    at: float  # when it came in (the loop's clock)
    wall: float
    reads: Job[EndReads]
    due: float  # decided without the reads after this


class ChildEnds:
    """The children's ends (their pidfds are in the loop's poller: the executor's) and the death notices not yet read.

    ``heard_all`` reads every message still queued (a dead child's last words come before its
    exit); ``left_behind`` sweeps for processes a reaped child left behind.
    """

    def __init__(self, poller: zmq.Poller, view: RunView, layout: Layout, out: Reporter,
                 clock: WatchedClock, wall: Callable[[], float],
                 heard_all: Callable[[], None], left_behind: Callable[[], None], reader: DiskJobs) -> None:
        self.poller = poller
        self.view = view
        self.layout = layout
        self.out = out
        self.clock = clock
        self.wall = wall
        self._heard_all = heard_all
        self._left_behind = left_behind
        self._notices: "queue.SimpleQueue[tuple[ChildProcess, bool, float, float]]" = queue.SimpleQueue()
        self.notice_fd, self._notice_w = os.pipe()  # readable when a death notice waits (drain_notices)
        os.set_blocking(self._notice_w, False)
        self.reader = reader
        self._ends: "deque[_End]" = deque()  # in the order they came in, their reads asked for
        poller.register(self.notice_fd, zmq.POLLIN)

    def reading(self, role: str) -> set[int]:
        """The attempts of ``role`` whose end is still being read (log rotation keeps their files)."""
        return {e.handle.attempt for e in self._ends if e.handle.role == role}

    @property
    def pending(self) -> bool:
        """An end waits for its reads: the launch is not over before it is observed."""
        return bool(self._ends)

    def post_notice(self, handle: ChildProcess, died: bool, at: float) -> None:
        """Runs in a death-watch thread: hand the notice to the main loop."""
        self._notices.put((handle, died, at, self.wall()))
        try:
            os.write(self._notice_w, b"!")
        except BlockingIOError:
            pass

    def drain_notices(self, ex: Executor) -> None:
        try:
            os.read(self.notice_fd, 4096)
        except BlockingIOError:
            pass
        while not self._notices.empty():
            handle, died, at, wall = self._notices.get()
            if died and handle.dying_at is None:  # (what it waits for, its exit status, is bounded from here on)
                handle.dying_at = at
            if died and handle.pidfd >= 0:
                self._ask(handle, None, at, wall, ex)

    def on_exit(self, handle: ChildProcess, ex: Executor) -> None:
        """A pidfd became readable: reap the child (the watchdog's own, forked or spawned) and record
        how it ended."""
        self.poller.unregister(handle.pidfd)
        code = handle.reap()
        if code is None:  # dead by its pidfd, yet no status to take (never seen)
            ex.give_up(handle)
            code = -signal.SIGKILL
        ex.handles.pop((handle.slot, handle.attempt), None)
        self._ended(handle, ex, code)

    def check_unkillable(self, ex: Executor) -> None:
        """A child that SIGKILL has not ended for ``REAP_SECS`` (uninterruptible sleep: I/O that
        does not return, a frozen cgroup), or a trainer not dead ``REAP_SECS`` after its death notice (SIGKILLed
        from outside while a thread of it is stuck so), is given up on: it counts as killed (its SIGKILL is
        pending) and the run goes on without waiting for it, so a stop or a failure still ends the
        launch with its outcome (and ``--on-failure`` runs). One that dies later is reaped then."""
        ex.unreaped.reap_dead()
        for handle in list(ex.handles.values()):
            if handle.unkillable(self.clock()):
                self.poller.unregister(handle.pidfd)  # (the executor registered it: Executor.handle_for)
                ex.give_up(handle)
                self._ended(handle, ex, -signal.SIGKILL)

    def _ended(self, handle: ChildProcess, ex: Executor, code: int) -> None:
        self._heard_all()  # all it said before dying (a last checkpoint result), before its exit
        self._ask(handle, code, self.clock(), self.wall(), ex)
        self._left_behind()  # what it left behind

    def _ask(self, handle: ChildProcess, code: Optional[int], at: float, wall: float, ex: Executor) -> None:
        """Hand the reads at ``handle``'s end to the reader thread (:func:`~procsv.watchdog.endreads.read_end`);
        :meth:`settle` observes the end when they are done. A trainer's commit on disk counts from
        when its attempt began, above what the watchdog has heard of: the commit it may have waited
        for is on disk before the service's notice of it is read (the notice and the death come by
        different ways; on a loaded machine the death can come first)."""
        observe.end_came(self.view, handle.slot, handle.attempt, at)
        child = find(self.view, handle.slot, handle.attempt)
        since = None
        if child is not None and child.role == TRAINER:
            since = (observe.attempt_began_wall(child, self.out.started_wall, self.wall(), self.clock(),
                                                self.clock.unwatched_since(child.started)),
                     observe.unheard_floor(child))
        # the exit report: only a chief's counts (a promoted standby's too: it wrote it as the trainer it
        # became); a group's worker never commits a checkpoint, so its 42 is no preemption
        report = exit_report_file(ex.runtime.path, TRAINER, handle.attempt) \
            if code is not None and handle.role in (TRAINER, STANDBY) else None
        paths = (self.layout.error_file(handle.role, handle.attempt),
                 spilled_error_file(ex.runtime.path, handle.role, handle.attempt))
        layout, pid = self.layout, handle.pid
        job = self.reader.submit(lambda: read_end(layout, paths, pid, report, since))
        self._ends.append(_End(handle, code, at, wall, job, self.clock() + READ_WAIT))

    def settle(self, ex: Executor) -> None:
        """Observe the ends whose reads are done, or past :data:`~procsv.watchdog.endreads.READ_WAIT`
        (decided without them), in the order they came in (the reader does the reads in that order)."""
        while self._ends:
            end = self._ends[0]
            if not end.reads.done and self.clock() < end.due:
                return
            self._ends.popleft()
            reads, unread = taken(end.reads)
            handle = end.handle
            if reads is not None and reads.committed is not None:
                observe.committed_on_disk(self.view, handle.slot, handle.attempt, reads.committed)
            err = reads.error if reads is not None else None
            if end.code is None:
                self.out.record(observe.death_noticed(self.view, handle.slot, handle.attempt, end.at, end.wall, err))
                self.out.changed()
                continue
            self._heard_all()  # what arrived while the reads were done: still before its exit
            if not (handle.slot.startswith(STANDBY) and self.view.finishing):
                # a standby never promoted, ended with the run: its preparation lines stay in its log (echoed
                # after "trainer finished", they read as if a new trainer had started)
                self.out.echo(handle, final=True)
            failure = Failure(handle.role, handle.attempt, handle.pid, end.code, end.wall, handle.log_path, err,
                              reads.report if reads is not None else None, unread)
            self.out.record(observe.reaped(self.view, handle.slot, handle.attempt, failure, end.at) + breaker_found(self.view))
            self.out.changed()
