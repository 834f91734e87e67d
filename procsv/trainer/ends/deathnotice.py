"""The trainer's half of the death notice: hold the watchdog's robust mutex until a clean exit.

Runs in the trainer. ``procsv.trainer`` calls :func:`hold` first thing (with its configuration's
mutex path); the kernel marks the mutex "owner died" if this process dies any way other than through :func:`release`, which
wakes the watchdog's :class:`procsv.watchdog.deathwatch.DeathWatch` before the process is torn down.
"""

from __future__ import annotations

import errno
from typing import Optional

from procsv.common.mutex import RobustMutex

_held: Optional[RobustMutex] = None


def hold(path: Optional[str]) -> None:
    """In the trainer: take the mutex the watchdog named (``ChildConfig.death_mutex``), if any, for the
    rest of this process."""
    global _held
    if not path:
        return
    try:
        mutex = RobustMutex(path)
    except OSError:
        return  # no notice then; the watchdog still has the pidfd
    if mutex.lock() in (0, errno.EOWNERDEAD):
        _held = mutex


def release() -> None:
    """In the trainer, just before a clean exit: the death that follows is not a crash."""
    global _held
    if _held is not None:
        _held.unlock()
        _held = None
