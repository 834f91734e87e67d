"""The watchdog's terminal output: lines written by a thread, never by the event loop.

Runs in the watchdog. A stalled reader -- a stdout pipe nobody drains, a terminal paused with
Ctrl-S -- would block a ``print`` for as long as it stalls, and with it the loop that notices
deaths. :class:`Terminal` queues each line (bounded) and a daemon thread writes them; when the
queue is full the line is dropped and counted, and the count is reported once output flows again.
At exit, :meth:`Terminal.close` waits a bounded time for the queue to drain.
"""

from __future__ import annotations

import queue
import sys
import threading
import time
from typing import Callable, Optional, TextIO

QUEUE_LINES = 10_000
CLOSE_WAIT_SECS = 2.0


class Terminal:
    """Non-blocking line output to stdout/stderr."""

    def __init__(self, out: Optional[TextIO] = None, err: Optional[TextIO] = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._out = out or sys.stdout
        self._err = err or sys.stderr
        self._clock = clock
        self._queue: "queue.Queue[Optional[tuple[str, bool]]]" = queue.Queue(QUEUE_LINES)
        self.dropped = 0
        self._reported = 0
        self._thread = threading.Thread(target=self._run, name="procsv-terminal", daemon=True)
        self._thread.start()

    def line(self, text: str, err: bool = False) -> None:
        """Queue one line (or several, joined by newlines); drop it if the queue is full."""
        try:
            self._queue.put_nowait((text, err))
        except queue.Full:
            self.dropped += 1

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            text, err = item
            stream = self._err if err else self._out
            try:
                if self.dropped > self._reported:
                    n, self._reported = self.dropped - self._reported, self.dropped
                    stream.write(f"procsv: {n} line(s) of output were dropped while the terminal was not "
                                 "reading (see logs/)\n")
                stream.write(text + "\n")
                stream.flush()
            except (OSError, ValueError):
                pass  # a closed or broken stream: the logs hold everything

    def close(self, wait: float = CLOSE_WAIT_SECS) -> None:
        """Write what is queued, waiting at most ``wait`` seconds; then stop the writer."""
        deadline = self._clock() + wait
        while not self._queue.empty() and self._clock() < deadline:
            time.sleep(0.01)
        try:
            self._queue.put_nowait(None)
        except queue.Full:
            pass
        self._thread.join(max(0.0, deadline - self._clock()))
