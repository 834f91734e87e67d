"""A service seed: the launch's first checkpoint or summary service, grown from a fork of the launch.

Runs in the launch (``procsv launch``, which becomes the watchdog), where :func:`plant` forks one seed
per service before the watchdog starts any thread (:func:`procsv.zygote.seed.fork_hazard` said None),
and in each seed from then on. A fresh service is a ``/bin/sh`` that opens its log and execs ``python
-m procsv.services.<role>`` (:func:`procsv.common.spawn.spawn`): an interpreter's start, then the
service's imports, about 0.2 s of CPU for the checkpoint service and 0.3 s for the summary service. A
seed is a fork of an interpreter that has procsv's CLI imported already (and, in a warm launch --
a test harness, a program that imported TensorFlow -- numpy too): it imports only what its service
adds (:func:`preload`), while the watchdog goes on with its own start, then waits for one
:class:`~procsv.ipc.messages.ServiceStart` on its pipe.

It is set up in the order a fresh service is: a session of its own (the spawn's ``start_new_session``),
the signal handlers an interpreter starts with (:func:`_fresh_handlers`), SIGHUP and the run's
``--preempt-signal`` ignored (the spawn's shell), the parent-death signal armed
and the stop signals blocked before any thread exists, an import's native ones included
(:func:`~procsv.common.bootstrap.run_service`'s first steps, taken again there), every descriptor it
inherited let go but its pipe and a copy of the launch's stderr, each number kept by ``/dev/null``
(:func:`~procsv.common.spawn.close_inherited`: a ``spawn`` closes them). At the message it becomes
what ``python -m procsv.services.<role>`` started with that environment, log and working directory
would be: stdin from ``/dev/null``, stdout and stderr appended to the log (or discarded, with one
line on the watchdog's stderr, when the log cannot be opened), ``os.environ`` replaced (the service
reads it only through :mod:`procsv.common.bootstrap`), the working directory changed, its random
generators reseeded, then ``run_service(role, main)`` as the module's ``__main__`` runs it; it never
returns into the launch's frames it was forked in (it leaves by ``os._exit``:
:func:`~procsv.common.spawn.exit_after`). EOF on its pipe before the message (the watchdog did not use
it, or is gone) ends it with 0; a launch that dies takes it along (its parent-death signal).

What a fork keeps that a fresh interpreter would not have: the modules the launch had imported (in a
warm launch TensorFlow, which the checkpoint service still loads as a fresh one does before a commit
that needs it, its import a look-up: :func:`procsv.services.checkpoint.preload.loaded`), the hash seed,
``/proc/PID/cmdline`` and ``/proc/PID/environ`` (the launch's). The watchdog uses a seed only where the
environment the service gets differs from the launch's in what no import reads
(:func:`procsv.watchdog.seeds.suits`).
"""

from __future__ import annotations

import os
import random
import signal
import sys
from types import ModuleType
from typing import NamedTuple, NoReturn, Optional

from procsv.common import bootstrap, spawn, stopfrom
from procsv.ipc.messages import ServiceStart
from procsv.ipc.pipe import read_one_framed
from procsv.services.checkpoint import __main__ as checkpoint_entry
from procsv.services.summary import __main__ as summary_entry

ENTRIES: dict[str, ModuleType] = {"checkpoint": checkpoint_entry, "summary": summary_entry}  # each a preload, a main


class Planted(NamedTuple):
    """A service seed, as the launch holds it: its role, its pid and its pipe's write end."""

    role: str
    pid: int
    req_w: int


def plant(role: str, preempt_signal: int) -> Planted:
    """Fork ``role``'s seed (in ``procsv launch``, before its watchdog starts any thread; a fork is sound
    here: :func:`procsv.zygote.seed.fork_hazard` said None)."""
    req_r, req_w = os.pipe()
    try:  # where a seed whose log cannot be opened says so: a copy of the launch's stderr (-1: none)
        say = os.dup(2)
    except OSError:
        say = -1
    parent = os.getpid()
    for stream in (sys.stdout, sys.stderr):  # what they hold would be written twice: by the launch and the seed
        stream.flush()
    pid = os.fork()
    if pid == 0:
        os.close(req_w)
        grow(role, req_r, say, parent, preempt_signal)
    for fd in (req_r, say):
        if fd >= 0:
            os.close(fd)
    return Planted(role, pid, req_w)


def grow(role: str, req_fd: int, say_fd: int, parent_pid: int, preempt_signal: int) -> NoReturn:
    """In the seed, right after the fork: set up, import, wait for its :class:`ServiceStart`, then run
    the service (see the module docstring); ends the process."""
    spawn.exit_after(lambda: _grown(role, req_fd, say_fd, parent_pid, preempt_signal))


def _grown(role: str, req_fd: int, say_fd: int, parent_pid: int, preempt_signal: int) -> int:
    os.setsid()
    _fresh_handlers()
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    stopfrom.block()  # before the imports: a thread one makes (numpy's BLAS pool) has them blocked too
    bootstrap.die_with_parent(parent_pid=parent_pid, preempt_signal=preempt_signal)
    spawn.close_inherited((req_fd, say_fd))
    entry = ENTRIES[role]
    entry.preload()
    start = _read_start(req_fd)
    if start is None:
        return 0
    os.close(req_fd)
    return _become_service(role, entry, start, say_fd)


def _fresh_handlers() -> None:
    """The signal handlers a fresh service has: the launching program's Python handlers (a harness's,
    a program's) back to the default (SIGINT's: ``KeyboardInterrupt``), its wakeup descriptor let go;
    what it ignores stays ignored, as it would across an ``exec``, but for the stop signals. The seed is
    forked before the watchdog takes SIGTERM and SIGINT (``procsv.watchdog.bringup.Plumbing``), and a
    fresh service is spawned after, by a process that catches them: its ``exec`` gives it both at their
    default, even where the launch inherited them ignored (``procsv launch ... &`` in a script ignores
    SIGINT). Ignored, they would be discarded, not read by the service's signalfd. SIGPIPE and SIGXFSZ
    ignored, as every interpreter's start leaves them, whatever the launching program made of them."""
    signal.set_wakeup_fd(-1)
    for sig in signal.valid_signals():
        try:
            handler = signal.getsignal(sig)
        except (OSError, ValueError):
            continue
        if sig in stopfrom.STOP_SIGNALS or (callable(handler) and handler is not signal.default_int_handler):
            signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)
    for sig in (signal.SIGPIPE, signal.SIGXFSZ):  # as every interpreter's start sets them (an EPIPE raises)
        signal.signal(sig, signal.SIG_IGN)


def _read_start(req_fd: int) -> Optional[ServiceStart]:
    """The seed's one message, or None at EOF (a message of another kind is a bug: it raises)."""
    msg = read_one_framed(req_fd)
    if msg is not None and not isinstance(msg, ServiceStart):
        raise TypeError(f"a service seed got {type(msg).__name__}, not ServiceStart")
    return msg


def _become_service(role: str, entry: ModuleType, start: ServiceStart, say_fd: int) -> int:
    """Take the service's log, environment and working directory, and run it (its exit code)."""
    log = spawn.open_log(start.log_path, say_fd)
    if say_fd >= 0:
        os.close(say_fd)
    spawn.take_over(log, start.env, start.cwd)
    random.seed()  # as in a fresh process: the launch's generators are not shared across forks
    np = sys.modules.get("numpy")
    if np is not None:
        np.random.seed()
    sys.argv = [str(entry.__file__)]
    return bootstrap.run_service(role, entry.main)
