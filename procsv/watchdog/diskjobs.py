"""Work on the logdir done by a thread of its own, its results taken by a loop that never waits.

Runs in the watchdog (``procsv launch``: the reads at a child's end, :mod:`procsv.watchdog.exits`
and :mod:`procsv.watchdog.multihost.remote`) and in a
node agent (:mod:`procsv.watchdog.multihost.agent`: its key file, the job file, log rotation). A
network filesystem that stalls blocks a ``read`` or a ``listdir`` for as long as the stall lasts;
the loop that hands such work to :class:`DiskJobs` goes on, and takes each :class:`Job`'s result
when it is done, or decides without it once its own bound has passed. Jobs run one at a time, in
the order they were handed over; each one done makes :attr:`DiskJobs.fd` readable, so a loop that
waits in a poller wakes at once for the result. A job that raises is done with its ``error``.
"""

from __future__ import annotations

import os
import queue
import threading
from typing import Callable, Generic, Optional, TypeVar

T = TypeVar("T")


class Job(Generic[T]):
    """One piece of work handed to the thread: ``done`` once it returned (``result``) or raised (``error``)."""

    def __init__(self, run: Callable[[], T]) -> None:
        self.run = run
        self.result: Optional[T] = None
        self.error: Optional[BaseException] = None
        self._done = threading.Event()

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def _finish(self) -> None:
        try:
            self.result = self.run()
        except Exception as exc:  # the loop decides without it, as with a job that never returns
            self.error = exc
        self._done.set()


class DiskJobs:
    """A daemon thread doing the jobs it is handed, in order (see the module's docstring)."""

    def __init__(self, name: str) -> None:
        self._queue: "queue.SimpleQueue[Optional[Job[object]]]" = queue.SimpleQueue()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    @property
    def fd(self) -> int:
        """Readable when a job is done since the last :meth:`woken` (register it in the loop's poller)."""
        return self._wake_r

    def submit(self, run: Callable[[], T]) -> Job[T]:
        """Hand ``run`` to the thread; never waits. Once closed, the job is never done."""
        job: Job[T] = Job(run)
        if not self._closed:
            self._queue.put(job)  # type: ignore[arg-type]
        return job

    def woken(self) -> None:
        """Empty the wake-up pipe (the loop saw :attr:`fd` readable)."""
        try:
            while os.read(self._wake_r, 4096):
                pass
        except BlockingIOError:
            pass

    def close(self) -> None:
        """Take no more jobs; the thread ends after those queued (a stuck one is left behind: a daemon)."""
        if not self._closed:
            self._closed = True
            self._queue.put(None)

    def _run(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            job._finish()
            try:
                os.write(self._wake_w, b"!")
            except (BlockingIOError, OSError):
                pass  # the pipe is full (the loop wakes anyway) or closed
