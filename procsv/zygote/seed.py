"""A zygote seed: the launch's first zygote, forked from a watchdog that had imported TensorFlow.

Runs in the seed, a child ``procsv launch`` forked (:func:`plant`, the one function here that runs in
the launch, which becomes the watchdog) before it started any thread, when TensorFlow was already
imported in its interpreter: a launch started from a
warm interpreter (a program or a test harness that calls ``procsv.cli.main`` after ``import
tensorflow``, a fork of such a process). The seed then needs no import of its own: ``python -m
procsv.zygote`` spends about 2.3 s of CPU importing TensorFlow, the seed a fork.

The seed takes a session of its own at once (as a spawned child does), arms its parent-death signal,
ignores SIGHUP and the run's ``--preempt-signal`` (as a spawn's shell does before its exec), lets go
of every descriptor it inherited but its two pipes and the copy of the watchdog's stderr (each number
kept by ``/dev/null``: :func:`procsv.common.spawn.close_inherited`), and waits for
one :class:`ZygoteStart` on its request pipe. Then it becomes what ``python -m procsv.zygote`` started
with that message's environment, log and working directory would be: stdin from ``/dev/null``, stdout
and stderr appended to the log (or discarded, with one line on the watchdog's stderr, when the log
cannot be opened), ``os.environ`` replaced, the working directory changed, and the zygote's own
:func:`procsv.zygote.__main__.main` run; it never returns into the watchdog's frames it was forked in
(it leaves by ``os._exit``). EOF on the request pipe before the message (the watchdog did not use it,
or is gone) ends it with 0.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import NamedTuple, NoReturn, Optional

from procsv.ipc.messages import ZygoteStart
from procsv.ipc.pipe import read_one_framed
from procsv.common import bootstrap, spawn
from procsv.zygote import __main__ as zygote


class Planted(NamedTuple):
    """A seed, as the launch holds it: its pid, its request pipe's write end and reply pipe's read
    end, and ``PROCSV_ZYGOTE_FDS`` as the seed numbers its ends."""

    pid: int
    req_w: int
    rep_r: int
    fds: str


IMPORT_THREADS = 1  # native threads a process that only imported TensorFlow (2.x) has beside its own


def unfit() -> Optional[str]:
    """Why a fork of this process cannot stand for ``python -m procsv.zygote`` (None: it can).
    TensorFlow not imported (a seed would import it as a fresh zygote does), or any
    :func:`fork_hazard`: the zygote forks every trainer with TensorFlow's import-time thread alone."""
    if "tensorflow" not in sys.modules:
        return "TensorFlow is not imported in this process"
    return fork_hazard()


def fork_hazard() -> Optional[str]:
    """Why a fork of this process would not be a sound start for a child (None: it would; the launch's
    service seeds, :mod:`procsv.services.seed`, ask this alone). A second Python thread (a fork copies
    only this one: a lock another held stays held in the child); TensorFlow's runtime started
    (:func:`tensorflow_ran`), or more native threads than its import leaves (:data:`IMPORT_THREADS`):
    forked after an op, the child's first op waits forever."""
    if threading.active_count() > 1:
        return f"this process runs {threading.active_count() - 1} thread(s) besides its own"
    if tensorflow_ran() or len(os.listdir("/proc/self/task")) - threading.active_count() > IMPORT_THREADS:
        return "TensorFlow has run here (an op, a dataset, a session): a fork of it would deadlock"
    return None


def plant(preempt_signal: int) -> Planted:
    """Fork the seed (in ``procsv launch``, before its watchdog starts any thread; :func:`unfit` said
    None)."""
    req_r, req_w = os.pipe()
    rep_r, rep_w = os.pipe()
    try:  # where a fork whose log cannot be opened says so: a copy of the launch's stderr (-1: none)
        say = os.dup(2)
    except OSError:
        say = -1
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:
        os.close(req_w)
        os.close(rep_r)
        grow(req_r, rep_w, say, parent, preempt_signal)
    for fd in (req_r, rep_w, say):
        if fd >= 0:
            os.close(fd)
    return Planted(pid, req_w, rep_r, f"{req_r},{rep_w},{say}")


def grow(req_fd: int, rep_fd: int, say_fd: int, parent_pid: int, preempt_signal: int) -> NoReturn:
    """In the seed, right after the fork: wait for its :class:`ZygoteStart`, then run the zygote
    (see the module docstring); ends the process."""
    spawn.exit_after(lambda: _grown(req_fd, rep_fd, say_fd, parent_pid, preempt_signal))


def _grown(req_fd: int, rep_fd: int, say_fd: int, parent_pid: int, preempt_signal: int) -> int:
    os.setsid()
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    bootstrap.die_with_parent(parent_pid=parent_pid, preempt_signal=preempt_signal)
    spawn.close_inherited((req_fd, rep_fd, say_fd))
    start = _read_start(req_fd)
    return 0 if start is None else _become_zygote(start, say_fd)


def tensorflow_ran() -> bool:
    """Whether TensorFlow's runtime has started in this process (an eager op, a ``tf.function``, a
    dataset, a Keras model built: its eager context initialized, which a fork keeps; a ``Session``:
    its ``tf_`` threads): a fork of it has the runtime's thread pools without their threads."""
    context = sys.modules.get("tensorflow.python.eager.context")
    ctx = getattr(context, "_context", None)
    if ctx is not None and getattr(ctx, "_initialized", False):
        return True
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as fh:
                if fh.read().startswith("tf_"):
                    return True
        except OSError:
            pass  # (a thread that ended meanwhile)
    return False


def _read_start(req_fd: int) -> Optional[ZygoteStart]:
    """The seed's one message, or None at EOF (a message of another kind is a bug: it raises)."""
    msg = read_one_framed(req_fd)
    if msg is not None and not isinstance(msg, ZygoteStart):
        raise TypeError(f"a zygote seed got {type(msg).__name__}, not ZygoteStart")
    return msg


def _become_zygote(start: ZygoteStart, say_fd: int) -> int:
    """Take the zygote's log, environment and working directory, and run it (its exit code)."""
    spawn.take_over(spawn.open_log(start.log_path, say_fd), start.env, start.cwd)
    sys.argv = [zygote.__file__]
    return zygote.main()
