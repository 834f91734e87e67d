"""Filesystem events as a ``threading.Event``: the one way procsv code waits for a file to change.

Used by the CLI (``procsv status --watch``, ``procsv logs -f``) and the trainer (a worker replica
waiting for the chief's checkpoint). The ``watchdog`` package's observer (inotify on Linux) runs
in its own thread while the ``with`` block lasts and sets the event on every change under
``path`` (or, with ``only``, on a change of that one file); the caller clears it, re-checks what it
waits for, and waits again with a timeout of its own as a fallback.
"""

from __future__ import annotations

import os
import threading
from contextlib import contextmanager
from typing import Any, Iterator, Optional


# what the watchdog package (>= 2.3) also reports on Linux that changes nothing: a file opened, or
# closed after reading. Waking on them, a waiter woke itself by reading what it waits for (status.json,
# the logs, a folder's listing) and read again at once: `procsv status --watch` and `procsv logs -f`
# each used more than a whole core beside the training they watched.
NOT_CHANGES = frozenset({"opened", "closed_no_write"})


@contextmanager
def wakeups(path: str, recursive: bool = False, only: Optional[str] = None) -> Iterator[threading.Event]:
    """An event set on each filesystem change under the directory ``path`` (``only``: of that file):
    a file or folder created, written, closed after writing, moved or deleted; never a mere open or read."""
    from watchdog.events import FileSystemEvent, FileSystemEventHandler
    from watchdog.observers import Observer

    woken = threading.Event()
    target = os.path.abspath(only) if only else None

    class Wake(FileSystemEventHandler):
        """Sets the wake event on any filesystem event (or only on events naming ``target``)."""

        def on_any_event(self, event: FileSystemEvent) -> None:
            if event.event_type in NOT_CHANGES:
                return
            if target is None:
                woken.set()
                return
            paths = (event.src_path, getattr(event, "dest_path", ""))
            if any(os.path.abspath(os.fsdecode(p)) == target for p in paths if p):
                woken.set()

    observer: Any = Observer()
    observer.schedule(Wake(), path, recursive=recursive)
    observer.start()
    try:
        yield woken
    finally:
        observer.stop()
        observer.join(timeout=5)
