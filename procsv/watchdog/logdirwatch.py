"""Noticing that the run's logdir was deleted, moved away or replaced while the run is live.

Runs in the watchdog. :class:`LogdirWatch` runs the ``watchdog`` package's observer on the
logdir's parent folder (not recursive: only entries of that folder, so the run's own writes
inside the logdir cost nothing). An event that deletes the logdir or moves it away is the answer
(:attr:`LogdirWatch.seen`: "it was moved to DEST" when the event says where); it wakes the
watchdog's loop through a pipe. The loop also compares the path's identity (device and inode)
with the one at the start every round of its loop and after a failed checkpoint (:func:`lost_reason`),
which catches what no event of the parent reports (an ancestor moved or deleted, a move out of
the parent folder, which inotify reports late). What to do about it is decided in
:mod:`procsv.watchdog.rules.decide` (rule 9).
"""

from __future__ import annotations

import os
from typing import Any, Optional

Identity = tuple[int, int]  # (st_dev, st_ino)


def identity(path: str) -> Optional[Identity]:
    """The (device, inode) of the directory at ``path``, or None if there is none."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino) if os.path.isdir(path) else None


def lost_reason(path: str, start: Identity) -> Optional[str]:
    """Why ``path`` is no longer the logdir the run started with (one phrase), or None if it is."""
    now = identity(path)
    if now is None:
        return "it was deleted or moved away"
    if now != start:
        return "it was replaced by another directory (deleted or moved, then created again)"
    return None


class LogdirWatch:
    """Filesystem events about ``logdir`` (through its parent folder) as bytes on a pipe.

    ``fd`` becomes readable after such an event; the reader drains it with :meth:`drain`.
    A watch that cannot start (no inotify left, the parent unreadable) is simply off: the loop's
    own check every round still applies.
    """

    def __init__(self, logdir: str) -> None:
        self.logdir = os.path.abspath(logdir)
        self._r, self._w = os.pipe()
        os.set_blocking(self._r, False)
        os.set_blocking(self._w, False)
        self._observer: Any = None
        self.error: Optional[str] = None
        self.seen: Optional[str] = None  # what an event said happened to the logdir (set once)
        self.moved_to: Optional[str] = None  # where an event said it was moved

    @property
    def fd(self) -> int:
        return self._r

    def start(self) -> None:
        from watchdog.events import FileSystemEvent, FileSystemEventHandler
        from watchdog.observers import Observer

        target, wake, watch = self.logdir, self._w, self

        class _OnLogdir(FileSystemEventHandler):
            """Writes a byte to the pipe when the logdir itself is deleted or moved."""

            def on_any_event(self, event: FileSystemEvent) -> None:
                if os.path.abspath(os.fsdecode(event.src_path)) != target:
                    return
                dest = os.fsdecode(getattr(event, "dest_path", "") or "")
                if event.event_type == "moved" and dest:
                    seen = f"it was moved to {os.path.abspath(dest)}"
                    watch.moved_to = watch.moved_to or os.path.abspath(dest)
                elif event.event_type in ("deleted", "moved"):
                    seen = "it was deleted or moved away"
                else:
                    return
                if watch.seen is None:
                    watch.seen = seen
                try:
                    os.write(wake, b"!")
                except (BlockingIOError, OSError):
                    pass  # a wakeup is pending already (or the watch is closing)

        try:
            observer = Observer()
            observer.schedule(_OnLogdir(), os.path.dirname(self.logdir) or "/", recursive=False)
            observer.daemon = True
            observer.start()
            self._observer = observer
        except OSError as exc:
            self.error = str(exc)

    def drain(self) -> None:
        try:
            while os.read(self._r, 4096):
                pass
        except BlockingIOError:
            pass

    def close(self) -> None:
        if self._observer is not None:
            self._observer.stop()
            self._observer.join(timeout=2.0)
            self._observer = None
        for fd in (self._r, self._w):
            try:
                os.close(fd)
            except OSError:
                pass
