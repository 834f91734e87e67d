"""Starting procsv's child processes: the argv, environment and log file of each role.

Used by the watchdog (``procsv launch``) and by a :class:`procsv.Supervisor` running without a
watchdog (plain ``python train.py``), which starts the two services for itself. Each child gets
its own session (process group), so the watchdog can signal a child and everything it spawned
with one ``killpg``, and a terminal's Ctrl-C reaches only the watchdog, which turns it into an
orderly stop. Children arm a parent-death signal themselves (:func:`procsv.common.bootstrap.die_with_parent`).

Shared by two starters: the watchdog (:mod:`procsv.watchdog.children`) and a standalone Supervisor
(:mod:`procsv.trainer.standalone`), which runs in the trainer process. And a child forked rather
than spawned (a zygote's trainer, a launch's zygote or service seed) becomes in its own process what
a spawn would have started: its log (:func:`open_log`), stdio, environment and working directory
(:func:`take_over`), none of its forker's descriptors (:func:`close_inherited`), an exit that never
returns into its forker's frames (:func:`exit_after`).
"""

from __future__ import annotations

import os
import subprocess
import sys
import traceback
from typing import Any, Callable, Mapping, NoReturn, Optional, Sequence

from procsv.common import env as envvars
from procsv.common.bootstrap import CONFIG_VERSION

SERVICE_MODULES = {"checkpoint": "procsv.services.checkpoint", "summary": "procsv.services.summary",
                   "ps": "procsv.ps_server",  # ps: a parameter-server task (procsv launch --ps N)
                   "server": "procsv.ps_server"}  # a worker task of --coordinator: a server too


def child_env(
    *, role: str, attempt: int, logdir: str, runtime_dir: str, supervised: bool, base: Optional[Mapping[str, str]] = None
) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    env.update(
        {
            envvars.LOGDIR: os.path.abspath(logdir),
            envvars.RUNTIME_DIR: runtime_dir,
            envvars.ROLE: role,
            envvars.ATTEMPT: str(attempt),
            envvars.CONFIG_VERSION: str(CONFIG_VERSION),  # the child refuses a schema it does not read
            envvars.PARENT_PID: str(os.getpid()),
            envvars.SUPERVISOR_PID: str(os.getpid()),  # kept when the zygote forks it (PARENT_PID is not)
            envvars.WATCHDOG: "1" if supervised else "0",
        }
    )
    for name, value in IMPORT_DEFAULTS.items():
        env.setdefault(name, value)
    return env


def inherited_env() -> dict[str, str]:
    """What a child started now inherits of this process's environment (before its own variables are set):
    a launch's service seed is forked with it (:func:`procsv.watchdog.seeds.suits`)."""
    return dict(os.environ)


# set in a child's environment when absent; TF_CPP_MIN_LOG_LEVEL is read at TensorFlow's import
IMPORT_DEFAULTS = {"TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1"}


def import_defaults(env: Mapping[str, str]) -> dict[str, str]:
    """What ``env`` has of :data:`IMPORT_DEFAULTS` (a zygote seed suits a zygote whose part is its own)."""
    return {name: env[name] for name in IMPORT_DEFAULTS if name in env}


def service_argv(role: str) -> list[str]:
    return [sys.executable, "-m", SERVICE_MODULES[role]]


def trainer_argv(target: str, args: Sequence[str]) -> list[str]:
    return [sys.executable, "-m", "procsv.trainer", target, *args]


# The child opens its own log: a /bin/sh that appends its stdout and stderr to the log and execs the
# program (the same pid); it first ignores the run's --preempt-signal (its number in the environment)
# and SIGHUP (a closed ssh session or terminal: the watchdog stops the run in order on it, with its
# checkpoint); an ignored signal stays ignored across exec and fork: only the watchdog handles them. The starter
# (the watchdog's loop) never waits on the log's filesystem: an open on a stalled network
# filesystem blocks the child, not the loop. If the log cannot be opened,
# Python says why in one line (on the starter's stderr) and the program runs with its output
# discarded. $0: the log, $1: this Python, $2: the program that says why, then the argv.
_OPEN_LOG = """log=$0 py=$1 why=$2; shift 2
[ -n "${preempt}" ] && trap '' "${preempt}"
trap '' HUP
if { command exec >>"$log"; } 2>/dev/null; then exec 2>&1
else "$py" -S -c "$why" "$log"; exec >/dev/null 2>&1; fi
exec "$@"
""".replace("{preempt}", envvars.PREEMPT_SIGNAL)
_WHY = """import os, sys
try:
    os.close(os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644))
except OSError as exc:
    print(f"procsv: cannot open {sys.argv[1]} ({exc.strerror or exc}); this process's output is discarded",
          file=sys.stderr, flush=True)
"""


def logged_argv(argv: Sequence[str], log_path: str) -> list[str]:
    """``argv`` run with its stdout and stderr appended to ``log_path``, which the child opens itself
    (see :data:`_OPEN_LOG`): start it with the starter's own stdout and stderr."""
    return ["/bin/sh", "-c", _OPEN_LOG, log_path, sys.executable, _WHY, *argv]


def spawn(argv: Sequence[str], env: Mapping[str, str], log_path: str, cwd: Optional[str] = None) -> subprocess.Popen[bytes]:
    """Start one child in its own session, stdout and stderr appended to ``log_path``, opened by the
    child itself (:func:`logged_argv`): starting it never waits on the logdir's filesystem.

    If the log cannot be opened (EIO, a logs/ folder gone) the child still starts, its output
    discarded, with one line on stderr: a log is never a reason to leave a process down.
    """
    return subprocess.Popen(
        logged_argv(argv, log_path),
        env=dict(env),
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        close_fds=True,
    )


# ------------------------------------------------------------------ in a child forked, not spawned
# A zygote's trainer and a launch's seeds (procsv.zygote.seed, procsv.services.seed) are forks that must end up
# as a spawn through logged_argv would: these give them what the shell and the interpreter's start give it.


THREADS_WAIT_SECS = 60.0  # how long a forked trainer's end waits for the program's non-daemon threads


def exit_after(body: Callable[[], int], ends_as_interpreter: Optional[Callable[[], bool]] = None,
               threads_wait: float = THREADS_WAIT_SECS) -> NoReturn:
    """In a forked child: run ``body`` and end the process with its exit code (a ``SystemExit``'s, its
    message printed on stderr as the interpreter prints it; 1, after its traceback, for an uncaught
    exception), never returning into the frames it was forked in. ``ends_as_interpreter`` (a trainer
    forked by the zygote, which runs a user's program), asked once ``body`` is done: whether the
    process then ends as a fresh interpreter does before it tears its modules down
    (:func:`interpreter_end`): the program's non-daemon threads waited for (``threads_wait`` seconds
    at most), then its ``atexit`` handlers run."""
    code = 70
    try:
        try:
            code = body()
        except SystemExit as exc:
            if isinstance(exc.code, int):
                code = exc.code
            else:
                code = 0 if exc.code is None else 1
                if exc.code is not None:
                    print(exc.code, file=sys.stderr)
        except BaseException:
            traceback.print_exc()
            code = 1
        if ends_as_interpreter is not None and ends_as_interpreter():
            interpreter_end(threads_wait)
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def interpreter_end(threads_wait: float) -> None:
    """What CPython's ``Py_FinalizeEx`` does first, at the end of a process whose main module has
    finished: wait for every non-daemon thread (``threading._shutdown``: the functions registered
    with ``threading._register_atexit`` first, as ``concurrent.futures`` does), then run the
    ``atexit`` handlers, last registered first (an exception in one is printed and the next runs).
    What follows there, the modules' teardown, is skipped: a fork leaves by ``os._exit`` (a file the
    program never closed keeps what its buffer held). Every handler this process inherited was
    registered by an import its forker made (the zygote imports TensorFlow and procsv, and runs
    nothing), as a fresh process's importing them would register.

    One difference, on purpose: the threads are waited for ``threads_wait`` seconds at most (CPython
    waits for good). A thread that never ends (a loader's loop never told to stop, a server thread
    not made a daemon) then costs one line, not a trainer that never exits after its final
    checkpoint, which the watchdog would take for a hang and restart."""
    import atexit
    import signal
    import threading

    def late(signum: int, frame: Any) -> None:
        raise _ThreadsStillRun()

    before = signal.signal(signal.SIGALRM, late)  # (a lock's wait in _shutdown is cut short by the handler)
    signal.setitimer(signal.ITIMER_REAL, threads_wait)
    try:
        threading._shutdown()  # type: ignore[attr-defined]  # (CPython's own, private: no public equivalent)
    except _ThreadsStillRun:
        names = ", ".join(sorted(t.name for t in threading.enumerate() if not t.daemon and t.is_alive()
                                 and t is not threading.current_thread()))
        print(f"procsv: the program's non-daemon threads ({names}) still ran {threads_wait:g} s after its end: "
              "leaving without them (its atexit handlers run now)", file=sys.stderr, flush=True)
    except BaseException:  # (^C while waiting: the handlers still run, as in CPython)
        traceback.print_exc()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)
    atexit._run_exitfuncs()


class _ThreadsStillRun(Exception):
    """The program's non-daemon threads outlived the wait for them (:func:`interpreter_end`)."""


def open_log(path: str, say: int) -> int:
    """The attempt's log, opened for appending; if it cannot be (EIO, ESTALE, a quota, a removed
    ``logs/``), one line on ``say`` (the parent's stderr) and ``/dev/null``: as a fresh spawn, the
    process still starts, its output discarded (a log is never a reason to leave a process down)."""
    try:
        return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    except OSError as exc:
        line = f"procsv: cannot open {path} ({exc.strerror or exc}); this process's output is discarded\n"
        try:
            os.write(say, line.encode(errors="replace"))
        except OSError:
            pass
        return os.open(os.devnull, os.O_WRONLY)


def take_over(log: int, environ: Mapping[str, str], cwd: str) -> None:
    """Become, in a fork, what a process started with ``environ`` in ``cwd`` would be: stdin from
    ``/dev/null``, stdout (line-buffered) and stderr the descriptor ``log`` (closed here), ``os.environ``
    replaced, the working directory changed. (A zygote's forked trainer; a seed its zygote or service.)"""
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.close(null)
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    os.environ.clear()
    os.environ.update(environ)
    os.chdir(cwd)


def close_inherited(keep: tuple[int, ...]) -> None:
    """Let go of every descriptor above 2 but ``keep`` (what a spawn with ``close_fds`` has), each
    number kept by ``/dev/null``: the launch's interpreter may hold one in a Python object (a logging
    FileHandler's stream, a socket) that the fork inherits (a zygote and its trainers, a service);
    closed, the number would be reused (a ZeroMQ eventfd, a checkpoint's file) and that object would
    write into it, or close it."""
    null = os.open(os.devnull, os.O_RDWR)
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > 2 and fd not in keep and fd != null:
            try:
                os.fstat(fd)
            except OSError:
                continue  # (the listing's own descriptor, closed already)
            os.dup2(null, fd)
    os.close(null)


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """``n`` distinct TCP ports free on ``host`` now (bound together, then released for the caller).

    For a trainer group's ``TF_CONFIG``: each attempt gets fresh ports, so a new group never
    meets a port an old member (or anything else) still holds."""
    import socket

    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            socks.append(s)
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()
