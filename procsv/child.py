"""What every child process of a run (trainer, checkpoint service, summary service) does first.

Runs in the child. The watchdog passes the run's coordinates in environment variables; this
module reads them, ties the child's life to its parent (Linux parent-death signal, so killing the
watchdog -- even with SIGKILL -- takes its children along), and records a failure as data: the
child writes its own traceback to ``logs/<role>.<attempt>.error.json`` (atomically) before dying.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time
import traceback
from dataclasses import dataclass
from typing import Optional

from ipc.transport import Endpoints
from procsv.layout import Layout, write_json

ENV_LOGDIR = "PROCSV_LOGDIR"
ENV_RUNTIME = "PROCSV_RUNTIME_DIR"
ENV_ROLE = "PROCSV_ROLE"
ENV_ATTEMPT = "PROCSV_ATTEMPT"
ENV_PARENT = "PROCSV_PARENT_PID"
ENV_WATCHDOG = "PROCSV_WATCHDOG"  # "1" when a watchdog supervises this child

_PR_SET_PDEATHSIG = 1

# A trainer that a SIGTERM/SIGINT stopped after committing its emergency checkpoint exits with
# this code: "my state is saved, restart me" (TensorFlow's PreemptionCheckpointHandler uses 42 too).
EXIT_PREEMPTED = 42


@dataclass(frozen=True)
class ChildContext:
    """The coordinates of this child inside its run."""

    layout: Layout
    endpoints: Endpoints
    role: str
    attempt: int
    supervised: bool

    @staticmethod
    def from_env() -> Optional["ChildContext"]:
        logdir, runtime = os.environ.get(ENV_LOGDIR), os.environ.get(ENV_RUNTIME)
        if not logdir or not runtime:
            return None
        return ChildContext(
            layout=Layout(logdir),
            endpoints=Endpoints(runtime),
            role=os.environ.get(ENV_ROLE, "trainer"),
            attempt=int(os.environ.get(ENV_ATTEMPT, "1")),
            supervised=os.environ.get(ENV_WATCHDOG) == "1",
        )


_early_signal: Optional[int] = None


def catch_early_stop() -> None:
    """Remember a SIGTERM/SIGINT that arrives before the Supervisor installs its own handlers."""

    def on_signal(signum: int, frame: object) -> None:
        global _early_signal
        _early_signal = signum

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)


def early_stop_signal() -> Optional[int]:
    """The stop signal received before the Supervisor started, if any."""
    return _early_signal


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Ask the kernel to send ``sig`` to this process when its parent dies; exit if it already has."""
    parent = os.environ.get(ENV_PARENT)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the watchdog's process-group kill still applies
        pass
    if parent and parent.isdigit() and os.getppid() != int(parent):
        os._exit(70)  # the parent died before the death signal was armed


def write_error_file(ctx: Optional[ChildContext], exc: BaseException, phase: str) -> None:
    """Record ``exc`` with its traceback as this attempt's error file (best effort, atomic)."""
    if ctx is None:
        return
    record = {
        "role": ctx.role,
        "attempt": ctx.attempt,
        "pid": os.getpid(),
        "time": time.time(),
        "phase": phase,
        "type": type(exc).__name__,
        "message": str(exc),
        "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
    }
    try:
        write_json(ctx.layout.error_file(ctx.role, ctx.attempt), record)
    except OSError as err:
        print(f"procsv: could not write error file: {err}", file=sys.stderr)
