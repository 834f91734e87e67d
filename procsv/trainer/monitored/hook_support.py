"""What TensorFlow's standard hooks read from their session: its Supervisor, clock and global step.

Runs in the trainer process, in its main thread (the hooks of :mod:`procsv.trainer.monitored.basic_hooks`
and :mod:`procsv.trainer.monitored.observer_hooks` call these from ``begin`` and ``after_create_session``;
the MonitoredSessions reach their Supervisor's port, :func:`front_end_of`, and stop it, :func:`stop_quietly`).
A session may be a raw one with no :class:`procsv.Supervisor` behind it: then there is no logdir to
compare and the clock is TF's, :func:`procsv.trainer.monitored.hooks.wall_clock`.

Graph mode (a TF1 program: TensorFlow is not executing eagerly when a hook's ``begin()`` runs) is
told by :func:`graph_mode`; there the global step is the graph's and is read by running it.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any, Callable, Optional

from procsv.common.clock.watched import is_process_clock
from procsv.trainer.monitored import hooks as api
from procsv.trainer.monitored.hooks import graph_mode

if TYPE_CHECKING:
    from procsv.trainer.frontend.port import FrontEnd


def supervisor_of(session: Any) -> Any:
    """The session's :class:`procsv.Supervisor`, or None for a session without one."""
    return getattr(session, "supervisor", None)


def front_end_of(sv: Any) -> Optional[FrontEnd]:
    """The port of ``sv``, a :class:`procsv.Supervisor` (:mod:`procsv.trainer.frontend.port`); None for a
    session without one, or a supervisor that has none (a test's stand-in)."""
    return getattr(sv, "front_end", None)


def stop_quietly(sv: Any) -> None:
    """Stop ``sv``, re-raising only a diverging stop (:meth:`FrontEnd.stop_quietly`; another
    supervisor's plain ``stop()``)."""
    front = front_end_of(sv)
    if front is not None:
        front.stop_quietly()
    else:
        sv.stop()


def clock_of(session: Any) -> Callable[[], float]:
    """The clock the hooks' timers read: a clock injected into the session's Supervisor (tests
    inject one), else (the Supervisor's default, :func:`~procsv.common.clock.watched.process_clock`) TF's (``time.time``, :func:`procsv.trainer.monitored.hooks.wall_clock`)."""
    front = front_end_of(supervisor_of(session))
    clock = front.clock if front is not None else time.monotonic
    return api.wall_clock if clock is time.monotonic or is_process_clock(clock) else clock


def need_global_step(hook: str) -> Any:
    """The global step variable (in graph mode the default graph's); raises RuntimeError, as TF
    does, if ``hook`` needs one and there is none."""
    gs = api.get_global_step()
    if gs is None:
        raise RuntimeError(f"Global step should be created to use {hook}.")
    return gs


def global_step_fetch(hook: str) -> Any:
    """Graph mode: the tensor a hook fetches to see the global step in a run, TF's own (the graph's
    cached ``global_step + 0`` read, made here if missing: call it in ``begin()``, before the graph
    is finalized). Like TF's, its value may be from before or after the run's increment."""
    from tensorflow.python.training import training_util

    need_global_step(hook)
    return training_util._get_or_create_global_step_read()


def read_global_step(session: Any, gs: Any) -> int:
    """The global step's value now: in graph mode by running it in ``session``, else read eagerly."""
    if graph_mode():
        return int(session.run(gs))
    return api.read_step(gs)


def warn_if_not_logdir(what: str, given: Optional[str], session: Any) -> None:
    """Warn once if a hook was given a folder (``given``) other than the session's logdir."""
    sv = supervisor_of(session)
    if given and sv is not None and sv.logdir is not None and os.path.abspath(given) != os.path.abspath(sv.logdir):
        api.warn_once(f"{what}.dir", f"{what}: {given!r} is not the session's logdir {sv.logdir!r}; procsv's services "
                                     "write there (pass checkpoint_dir to the session creator)")


__all__ = ["supervisor_of", "front_end_of", "stop_quietly", "clock_of", "graph_mode", "need_global_step", "global_step_fetch", "read_global_step", "warn_if_not_logdir"]
