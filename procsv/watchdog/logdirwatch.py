"""Noticing that the run's logdir was deleted, moved away or replaced while the run is live.

Runs in the watchdog. :class:`LogdirWatch` runs the ``watchdog`` package's observer on the
logdir's parent folder (not recursive: only entries of that folder, so the run's own writes
inside the logdir cost nothing). An event that deletes the logdir or moves it away is the answer
(:attr:`LogdirWatch.seen`: "it was moved to DEST" when the event says where); it wakes the
watchdog's loop through a pipe. The loop also has the path looked at (:func:`look`: its device
and inode) every round of its loop and after a failed checkpoint, by the logdir writer thread
(:mod:`procsv.watchdog.publish.diskio`: a ``stat`` on a hung filesystem does not return), which
catches what no event of the parent reports (an ancestor moved or deleted, a move out of the parent
folder, which inotify reports late). :class:`LogdirHealth` judges the looks: the logdir is lost at
once when the path is gone (ENOENT, ENOTDIR) or is another directory, but a look that fails
otherwise (EIO, ESTALE, EACCES: a network filesystem's blip) is only counted, and the logdir is lost
only after ``--logdir-timeout`` seconds in which every look failed, or in which a look did not
return. What to do about a lost logdir is decided in
:mod:`procsv.watchdog.rules.decide` (rule 9).
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass
from typing import Any, Optional

from procsv.common import faults

Identity = tuple[int, int]  # (st_dev, st_ino)
DEFAULT_TIMEOUT = 60.0  # --logdir-timeout


@dataclass(frozen=True)
class Look:
    """One look at the logdir's path: its identity, or that there is none, or that the look failed."""

    identity: Optional[Identity]  # the directory's (device, inode); None: no directory there, or the look failed
    error: Optional[int] = None  # the errno of a look that failed for another reason than "not there"


def look(path: str) -> Look:
    """Look at the directory at ``path`` (one ``stat``)."""
    try:
        if faults.fires("watchdog", "logdir_eio"):
            raise OSError(errno.EIO, os.strerror(errno.EIO), path)
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return Look(None)
    except OSError as exc:
        return Look(None, exc.errno or 0)
    return Look((st.st_dev, st.st_ino) if stat.S_ISDIR(st.st_mode) else None)


def identity(path: str) -> Optional[Identity]:
    """The (device, inode) of the directory at ``path``, or None if there is none (or it cannot be seen)."""
    return look(path).identity


class LogdirHealth:
    """The verdict on successive looks at the logdir (pure: the time of each look is passed in).

    Lost at once: the path is gone or is another directory. A failed look is a blip, counted in
    :attr:`errors`; only ``timeout`` seconds in which every look failed make the logdir lost.
    """

    def __init__(self, start: Identity, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.start = start
        self.timeout = timeout
        self.errors = 0  # looks that failed (transient errors) during the launch
        self.last_error: Optional[str] = None  # the errno name of the last one
        self.failing_since: Optional[float] = None  # the first of the failed looks in a row

    def judge_pending(self, since: float, now: float) -> Optional[str]:
        """Why the logdir is lost, or None while it is not, when a look asked for at ``since`` has not
        returned by ``now`` (a ``stat`` on a hung filesystem): after ``timeout`` it is lost."""
        if now - since < self.timeout:
            return None
        return (f"a look at it has not returned for {now - since:.0f} s (--logdir-timeout {self.timeout:g}: its "
                "filesystem hangs)")

    def judge(self, seen: Look, now: float) -> Optional[str]:
        """Why the logdir is lost (one phrase), or None while it is not."""
        if seen.error is not None:
            self.errors += 1
            self.last_error = errno.errorcode.get(seen.error, str(seen.error))
            if self.failing_since is None:
                self.failing_since = now
            if now - self.failing_since >= self.timeout:
                return (f"it could not be looked at for {now - self.failing_since:.0f} s ({self.last_error} on every "
                        f"look; --logdir-timeout {self.timeout:g})")
            return None
        self.failing_since = None
        if seen.identity is None:
            return "it was deleted or moved away"
        if seen.identity != self.start:
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
