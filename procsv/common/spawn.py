"""Starting procsv's child processes: the argv, environment and log file of each role.

Used by the watchdog (``procsv launch``) and by a :class:`procsv.Supervisor` running without a
watchdog (plain ``python train.py``), which starts the two services for itself. Each child gets
its own session (process group), so the watchdog can signal a child and everything it spawned
with one ``killpg``, and a terminal's Ctrl-C reaches only the watchdog, which turns it into an
orderly stop. Children arm a parent-death signal themselves (:func:`procsv.common.bootstrap.die_with_parent`).

Shared by two starters: the watchdog (:mod:`procsv.watchdog.children`) and a standalone Supervisor
(:mod:`procsv.trainer.standalone`), which runs in the trainer process.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Mapping, Optional, Sequence

from procsv.common import env as envvars

SERVICE_MODULES = {"checkpoint": "procsv.services.checkpoint", "summary": "procsv.services.summary"}


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
            envvars.PARENT_PID: str(os.getpid()),
            envvars.WATCHDOG: "1" if supervised else "0",
        }
    )
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def service_argv(role: str) -> list[str]:
    return [sys.executable, "-m", SERVICE_MODULES[role]]


def trainer_argv(target: str, args: Sequence[str]) -> list[str]:
    return [sys.executable, "-m", "procsv.trainer", target, *args]


def spawn(argv: Sequence[str], env: Mapping[str, str], log_path: str, cwd: Optional[str] = None) -> subprocess.Popen[bytes]:
    """Start one child in its own session, stdout and stderr appended to ``log_path``.

    If the log cannot be opened (EIO, a logs/ folder gone) the child still starts, its output
    discarded, with one line on stderr: a log is never a reason to leave a process down.
    """
    try:
        log = open(log_path, "ab", buffering=0)
    except OSError as exc:
        print(f"procsv: cannot open {log_path} ({exc.strerror or exc}); this process's output is discarded",
              file=sys.stderr, flush=True)
        log = open(os.devnull, "ab", buffering=0)
    with log:
        return subprocess.Popen(
            list(argv),
            env=dict(env),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
        )


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
