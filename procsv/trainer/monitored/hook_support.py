"""What TensorFlow's standard hooks read from their session: its Supervisor, clock and global step.

Runs in the trainer process, in its main thread (the hooks of :mod:`procsv.trainer.monitored.basic_hooks`
and :mod:`procsv.trainer.monitored.observer_hooks` call these from ``begin`` and ``after_create_session``).
A session may be a raw one with no :class:`procsv.Supervisor` behind it: then there is no logdir to
compare and the clock is :func:`time.monotonic`.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable, Optional

from procsv.trainer.monitored import hooks as api


def supervisor_of(session: Any) -> Any:
    """The session's :class:`procsv.Supervisor`, or None for a session without one."""
    return getattr(session, "supervisor", None)


def clock_of(session: Any) -> Callable[[], float]:
    """The monotonic clock the hooks' timers read: the Supervisor's (tests inject one), else the real one."""
    clock: Callable[[], float] = getattr(supervisor_of(session), "_clock", time.monotonic)
    return clock


def need_global_step(hook: str) -> Any:
    """The global step variable; raises RuntimeError, as TF does, if ``hook`` needs one and there is none."""
    gs = api.get_global_step()
    if gs is None:
        raise RuntimeError(f"Global step should be created to use {hook}.")
    return gs


def warn_if_not_logdir(what: str, given: Optional[str], session: Any) -> None:
    """Warn once if a hook was given a folder (``given``) other than the session's logdir."""
    sv = supervisor_of(session)
    if given and sv is not None and sv.logdir is not None and os.path.abspath(given) != os.path.abspath(sv.logdir):
        api.warn_once(f"{what}.dir", f"{what}: {given!r} is not the session's logdir {sv.logdir!r}; procsv's services "
                                     "write there (pass checkpoint_dir to the session creator)")


__all__ = ["supervisor_of", "clock_of", "need_global_step", "warn_if_not_logdir"]
