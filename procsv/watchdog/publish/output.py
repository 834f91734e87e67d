"""The watchdog's terminal output: lines written by a thread, never by the event loop.

Runs in the watchdog. A stalled reader -- a stdout pipe nobody drains, a terminal paused with
Ctrl-S -- would block a ``print`` for as long as it stalls, and with it the loop that notices
deaths. :class:`Terminal` queues each line (bounded) and a daemon thread writes them; when the
queue is full the line is dropped and counted, and the count is reported once output flows again.
At exit, :meth:`Terminal.close` waits a bounded time for the queue to drain.

:meth:`Terminal.status` sets the live status line (:mod:`procsv.watchdog.publish.liveline`; called
only where it is drawn: a terminal, no ``--quiet``): the writer erases it (``\r`` and erase-line), writes each line
of output, and draws it again below, so output scrolls above it. The loop only stores the newest
text and queues one redraw if none is pending: a terminal that stops reading costs it nothing, and
the redraws it missed are dropped, not queued.
"""

from __future__ import annotations

import os
import queue
import shutil
import sys
import threading
import time
from typing import Callable, Optional, TextIO

QUEUE_LINES = 10_000
CLOSE_WAIT_SECS = 2.0
ERASE = "\r\x1b[K"  # to the start of the line, erase to its end
_REDRAW = ("", False)  # the queue item that redraws the live line (compared by identity)


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
        self._live_text = ""  # the newest live line (set by the loop)
        self._live_pending = False  # a redraw is queued (set by the loop, cleared by the writer)
        self._shown = ""  # the live line on the screen now (writer thread only)
        self._thread = threading.Thread(target=self._run, name="procsv-terminal", daemon=True)
        self._thread.start()

    def line(self, text: str, err: bool = False) -> None:
        """Queue one line (or several, joined by newlines); drop it if the queue is full."""
        try:
            self._queue.put_nowait((text, err))
        except queue.Full:
            self.dropped += 1

    def status(self, text: str) -> None:
        """Set the live line; never waits, never queues a second redraw."""
        if text == self._live_text:
            return
        self._live_text = text
        if not self._live_pending:
            self._live_pending = True
            try:
                self._queue.put_nowait(_REDRAW)
            except queue.Full:
                self._live_pending = False

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                self._erase()
                return
            try:
                if item is _REDRAW:
                    self._live_pending = False  # before reading the text: a newer one queues a redraw
                    self._draw(self._live_text)
                    continue
                text, err = item
                stream = self._err if err else self._out
                self._erase()
                if self.dropped > self._reported:
                    n, self._reported = self.dropped - self._reported, self.dropped
                    stream.write(f"procsv: {n} line(s) of output were dropped while the terminal was not "
                                 "reading (see logs/)\n")
                stream.write(text + "\n")
                stream.flush()
                self._draw(self._shown)
            except (OSError, ValueError):
                pass  # a closed or broken stream: the logs hold everything

    def _erase(self) -> None:
        if self._shown:
            try:
                self._out.write(ERASE)
                self._out.flush()
            except (OSError, ValueError):
                pass

    def width(self) -> int:
        """The terminal's width in columns (80 if stdout is not a terminal)."""
        try:
            return os.get_terminal_size(self._out.fileno()).columns or 80
        except (OSError, ValueError, AttributeError):
            return shutil.get_terminal_size().columns

    def _draw(self, text: str) -> None:
        """Draw the live line in place, cut to the terminal's width (a wrapped line cannot be redrawn)."""
        if not text:
            return
        width = self.width()
        if len(text) >= width:
            text = text[:max(0, width - 1)]
        self._out.write(ERASE + text)
        self._out.flush()
        self._shown = text

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
