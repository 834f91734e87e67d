"""Noticing that the run's logdir was deleted, moved away or replaced while the run is live.

Runs in the watchdog. The loop has the logdir looked at (:func:`look`) every round of its loop and
after a failed checkpoint, by the logdir writer thread (:mod:`procsv.watchdog.publish.diskio`: a
``stat`` on a hung filesystem does not return). A look is a ``stat`` of the path (its device and
inode, or why it failed) and, through the :class:`Anchor` (a descriptor held open on the directory
the run started in), where that directory is now: the kernel keeps an open directory's path through
a rename of it or of any ancestor, and says when it was deleted, so a look names where a moved
logdir went. :class:`LogdirHealth` judges the looks: the logdir is lost at once when it moved, the
path is gone (ENOENT, ENOTDIR) or is another directory, but a look that fails otherwise (EIO,
ESTALE, EACCES: a network filesystem's blip) is only counted, and the logdir is lost only after
``--logdir-timeout`` seconds in which every look failed, or in which a look did not return. What to
do about a lost logdir is decided in :mod:`procsv.watchdog.rules.decide` (rule 9).
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass
from typing import Optional

from procsv.common import faults

Identity = tuple[int, int]  # (st_dev, st_ino)
DEFAULT_TIMEOUT = 60.0  # --logdir-timeout


@dataclass(frozen=True)
class Look:
    """One look at the logdir's path: its identity, or that there is none, or that the look failed."""

    identity: Optional[Identity]  # the directory's (device, inode); None: no directory there, or the look failed
    error: Optional[int] = None  # the errno of a look that failed for another reason than "not there"
    moved_to: Optional[str] = None  # where the directory the run started in is now (it was moved)


class Anchor:
    """A descriptor held open on the logdir the run started in (opened at the start; raises OSError).

    :meth:`where` is that directory's path now, from ``/proc/self/fd`` (the kernel's own record): a
    rename of it or of an ancestor shows there, and a deletion. A path other than the one at the start
    is taken only when a ``stat`` of it leads to this directory: the kernel also names a directory
    whose mount was detached (``umount -l``) by its path inside that mount (``/``, ``/run``), which
    leads elsewhere or nowhere, and marks a deleted one with `` (deleted)``, which a real name may end
    with too. Held open, its inode cannot be given to a new directory created at the old path.
    """

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        st = os.fstat(self.fd)
        self.identity: Identity = (st.st_dev, st.st_ino)
        self.start: Optional[str] = self._link()  # None: no /proc (then only the stat of the path tells)

    def _link(self) -> Optional[str]:
        try:
            return os.readlink(f"/proc/self/fd/{self.fd}")
        except OSError:
            return None

    def where(self) -> Optional[str]:
        """The directory's path now; None once it was deleted, or when no path of this process leads
        to it (its mount was detached)."""
        link = self._link()
        if link is None or link == self.start:
            return self.start  # not moved (or no /proc: the stat of the path tells)
        return link if self.leads_here(link) else None  # not: " (deleted)", a detached mount's inner path

    def leads_here(self, path: str) -> bool:
        """Does ``path`` lead to this directory (a ``stat``)?"""
        try:
            st = os.stat(path)
        except OSError:
            return False
        return (st.st_dev, st.st_ino) == self.identity

    def close(self) -> None:
        os.close(self.fd)


def look(path: str, anchor: Optional[Anchor] = None) -> Look:
    """Look at the directory at ``path`` (one ``stat``) and, with its ``anchor``, where it is now."""
    seen = _stat(path)
    if anchor is not None and (where := anchor.where()) != anchor.start:  # after the stat: a move seen by
        return Look(None, moved_to=where)  # the stat is seen here too, and says where
    return seen


def _stat(path: str) -> Look:
    try:
        if faults.fires("watchdog", "logdir_eio"):
            raise OSError(errno.EIO, os.strerror(errno.EIO), path)
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return Look(None)
    except OSError as exc:
        return Look(None, exc.errno or 0)
    return Look((st.st_dev, st.st_ino) if stat.S_ISDIR(st.st_mode) else None)


class LogdirHealth:
    """The verdict on successive looks at the logdir (pure: the time of each look is passed in).

    Lost at once: the directory moved, the path is gone or is another directory. A failed look is a blip, counted in
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
        if seen.moved_to is not None:
            return f"it was moved to {seen.moved_to}"
        if seen.identity is None:
            return "it was deleted or moved away"
        if seen.identity != self.start:
            return "it was replaced by another directory (deleted or moved, then created again)"
        return None
