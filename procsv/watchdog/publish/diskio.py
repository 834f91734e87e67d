"""The watchdog's I/O on the logdir, done by one thread: the event loop never waits on a disk.

Runs in the watchdog (``procsv launch``). A network filesystem stalls (a metadata stall while a
large checkpoint is written, a hard-mounted NFS server that died): a ``stat``, a ``write`` or an
``open`` then blocks for as long as it lasts, and the loop that beats to the other hosts' agents,
notices deaths and takes decisions must not block with it. :class:`DiskIO` takes the loop's work
on the logdir and a daemon thread does it, in the order it was handed over:

- lifecycle records (:class:`~procsv.watchdog.publish.events.EventLog`): never coalesced, never
  reordered; each keeps the wall time at which the loop recorded it;
- ``status.json`` records: latest wins (one write is queued at a time; a newer record replaces the
  one not written yet), and none is written after a look found the logdir gone or replaced;
- echoes of a child's log (:meth:`~procsv.watchdog.children.ChildProcess.new_log_lines`): the
  thread reads the new lines and hands them to the terminal's writer;
- looks at the logdir (:func:`~procsv.watchdog.logdirwatch.look`): one at a time; the loop reads
  :meth:`DiskIO.take_look` and :attr:`DiskIO.look_since` (a look that has not returned for
  ``--logdir-timeout`` counts as failing);
- other writes (the final ``logs/report.json``, the watchdog's own error record).

A ``status.json`` write reads the newest committed checkpoint (its ``last_checkpoint``) and keeps it
in :attr:`DiskIO.newest`, which the metrics snapshot takes until the launch commits one of its own.
Reads whose result the loop waits for (the error file and exit report at a child's end) go to a
second thread, :attr:`DiskIO.reads`
(:class:`~procsv.watchdog.diskjobs.DiskJobs`), so that they do not queue behind writes.

The watchdog's own terminal lines go straight to the terminal's writer, unless an echo or a line is
still queued here: then they queue behind it, so a child's lines and the watchdog's keep their
order. The queue is bounded (:data:`QUEUE_ITEMS`); what does not fit is dropped and counted
(:attr:`DiskIO.dropped`, said once). :meth:`DiskIO.close` waits a bounded time for the queue; a
thread that is still stuck then is left behind (a daemon), and the lines it did not get to are
written to the terminal directly.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, Union

from procsv.common.layout import Layout
from procsv.common.manifests import Manifest, newest_committed
from procsv.watchdog.children import ChildProcess
from procsv.watchdog.diskjobs import DiskJobs
from procsv.watchdog.logdirwatch import Anchor, Look, look
from procsv.watchdog.publish.events import Event, EventLog, check
from procsv.watchdog.publish.output import Terminal
from procsv.watchdog.publish.statusfile import StatusWriter

QUEUE_ITEMS = 100_000
CLOSE_WAIT_SECS = 10.0  # at the end, how long the loop waits for what is queued to be written


@dataclass(frozen=True)
class _Job:
    """Work on the disk; ``terminal``: it hands lines to the terminal too (an echo)."""

    run: Callable[[], object]
    terminal: bool = False


@dataclass(frozen=True)
class _Line:
    """One of the watchdog's own terminal lines, queued behind an echo or another line."""

    text: str
    err: bool


_Item = Union[_Job, _Line, None]


class DiskIO:
    """The logdir writer thread and what the loop hands it (see the module's docstring)."""

    def __init__(self, layout: Layout, term: Terminal, clock: Callable[[], float] = time.monotonic) -> None:
        self.layout = layout
        self.term = term
        # status.json: its complaints come from this thread, straight to the terminal
        self.status = StatusWriter(layout, clock, complain=lambda text: term.line(text, True))
        self.clock = clock
        self.events: Optional[EventLog] = None
        self.anchor: Optional[Anchor] = None  # the logdir the run started in (set by the logdir guard)
        self.dropped = 0  # items the full queue refused (reported once)
        self._queue: "queue.Queue[_Item]" = queue.Queue(QUEUE_ITEMS)
        self._sent = 0  # terminal items queued (loop)
        self._done = 0  # terminal items done (thread)
        self._record: Optional[tuple[dict[str, Any], bool]] = None  # the newest status record not written yet
        self._status_queued = False
        self.newest: Optional[Manifest] = None  # the newest commit on disk, as the last status write read it
        self.look_since: Optional[float] = None  # a look asked for at this time has not returned yet
        self._looked: Optional[tuple[Look, float]] = None  # the newest look's result and when it returned
        self._gone = False  # the newest look saw no logdir, or another one: status.json is not written
        self._closed = False  # closed: lines go straight to the terminal, nothing else is taken
        self._thread = threading.Thread(target=self._run, name="procsv-logdir-io", daemon=True)
        self._thread.start()
        self.reads = DiskJobs("procsv-logdir-read")  # reads whose results the loop takes when done

    # ------------------------------------------------------------------ the loop's side
    def _put(self, item: _Item) -> bool:
        if self._closed:
            return False
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            self.dropped += 1
            if self.dropped == 1:
                self.term.line("procsv: the logdir's writes are far behind (its filesystem stalls?): records of "
                               "lifecycle.jsonl and lines are dropped until they catch up", True)
            return False
        return True

    def event(self, event: Event, fields: dict[str, Any], wall: float) -> None:
        """Append a lifecycle record (recorded at ``wall``), after everything queued before it."""
        check(event, fields)  # here: a record outside the schema is the loop's bug, raised in the loop
        log, record = self.events, dict(fields)  # a copy: the loop may reuse its dict
        if log is not None:
            self._put(_Job(lambda: log.write(event, at=wall, **record)))

    def line(self, text: str, err: bool = False) -> None:
        """One of the watchdog's terminal lines: straight to the terminal, or behind a queued echo."""
        if self._closed or self._sent == self._done:
            self.term.line(text, err)
        elif self._put(_Line(text, err)):
            self._sent += 1

    def echo(self, handle: ChildProcess, final: bool = False) -> None:
        """Echo a child's new log lines (``final``: the rest of its log); a non-final echo is skipped
        while terminal work is queued (the next round asks again)."""
        if not final and self._sent != self._done:
            return

        def run() -> None:
            for line in handle.new_log_lines(final):
                self.term.line(f"[{handle.role}.{handle.attempt}] {line}")

        if self._put(_Job(run, terminal=True)):
            self._sent += 1

    def write_status(self, record: dict[str, Any], durable: bool = False) -> None:
        """Write ``record`` as ``status.json`` (its ``last_checkpoint`` read by the thread); a record
        not written yet is replaced."""
        self._record = (record, durable)
        if not self._status_queued:
            self._status_queued = True
            if not self._put(_Job(self._write_status)):
                self._status_queued = False

    def ask_look(self) -> None:
        """Look at the logdir (unless a look is in progress); its result comes from :meth:`take_look`."""
        if self.look_since is None:
            self.look_since = self.clock()
            if not self._put(_Job(self._look)):
                self.look_since = None

    def take_look(self) -> Optional[tuple[Look, float]]:
        """The result of the newest look not taken yet, and when it returned."""
        got, self._looked = self._looked, None
        return got

    def call(self, fn: Callable[[], object]) -> None:
        """Any other write into the logdir, in order."""
        self._put(_Job(fn))

    def close(self, wait: float = CLOSE_WAIT_SECS) -> bool:
        """Stop after what is queued, waiting at most ``wait`` seconds. False: the thread is stuck (its
        filesystem hangs); the lines it did not get to are written to the terminal now."""
        self.reads.close()
        deadline = self.clock() + wait
        while not self._put(None) and self.clock() < deadline:
            time.sleep(0.01)
        self._closed = True
        self._thread.join(max(0.0, deadline - self.clock()))
        if not self._thread.is_alive():
            if self.anchor is not None:
                self.anchor.close()  # no look is left to take
            return True
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if isinstance(item, _Line):
                self.term.line(item.text, item.err)
        self.term.line(f"procsv: writes into {self.layout.logdir} did not finish in {wait:g} s (its filesystem "
                       "hangs?): status.json and lifecycle.jsonl may lack the last records", True)
        return False

    # ------------------------------------------------------------------ the thread's side
    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            try:
                if isinstance(item, _Line):
                    self.term.line(item.text, item.err)
                else:
                    item.run()
            except Exception as exc:  # a bug here must not end the thread: the loop depends on it
                self.term.line(f"procsv: internal error in the logdir writer: {type(exc).__name__}: {exc}", True)
            finally:
                if isinstance(item, _Line) or item.terminal:
                    self._done += 1

    def _write_status(self) -> None:
        self._status_queued = False  # before taking the record: a newer one queues another write
        got, self._record = self._record, None
        if got is None or self._gone:
            return
        record, durable = got
        self.newest = newest = newest_committed(self.layout)
        record["last_checkpoint"] = None if newest is None else {"step": newest.step,
                                                                 "path": newest.path(self.layout.logdir)}
        self.status.write(record, durable)

    def _look(self) -> None:
        anchor = self.anchor
        seen = look(self.layout.logdir, anchor)
        self._gone = seen.error is None and anchor is not None and seen.identity != anchor.identity
        self._looked = (seen, self.clock())
        self.look_since = None
