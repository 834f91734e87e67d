"""What every child process of a run (trainer, checkpoint service, summary service) does first.

Runs in each child (imported by the trainer, both services and the zygote). The watchdog passes the run's coordinates in environment variables; this
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
from typing import Callable, Optional

from procsv.common import env, stopfrom
from procsv.common.layout import Layout, spilled_error_file, write_json
from procsv.ipc.transport import Endpoints


_PR_SET_PDEATHSIG = 1

@dataclass(frozen=True)
class ChildContext:
    """The coordinates of this child inside its run."""

    layout: Layout
    endpoints: Endpoints
    role: str
    attempt: int
    supervised: bool
    rank: int = 0  # this trainer's task in a group launched with --nproc N (0: the chief)
    nproc: int = 1  # the group's size

    @property
    def in_group(self) -> bool:
        """One of several trainers of a ``procsv launch --nproc N`` group."""
        return self.nproc > 1

    @staticmethod
    def from_env() -> Optional["ChildContext"]:
        logdir, runtime = os.environ.get(env.LOGDIR), os.environ.get(env.RUNTIME_DIR)
        if not logdir or not runtime:
            return None
        return ChildContext(
            layout=Layout(logdir),
            endpoints=Endpoints(runtime),
            role=os.environ.get(env.ROLE, "trainer"),
            attempt=int(os.environ.get(env.ATTEMPT, "1")),
            supervised=os.environ.get(env.WATCHDOG) == "1",
            rank=int(os.environ.get(env.RANK, "0") or 0),
            nproc=int(os.environ.get(env.NPROC, "1") or 1),
        )


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Ask the kernel to send ``sig`` to this process when its parent dies; exit if it already has.
    Also ignore the run's ``--preempt-signal`` (:data:`env.PREEMPT_SIGNAL`; the spawn's shell ignores
    it before exec already): the watchdog alone handles it."""
    preempt = os.environ.get(env.PREEMPT_SIGNAL, "")
    if preempt.isdigit():
        signal.signal(int(preempt), signal.SIG_IGN)
    parent = os.environ.get(env.PARENT_PID)
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
    write_error_record(ctx.layout, ctx.role, ctx.attempt, exc, phase, ctx.endpoints.runtime_dir)


def write_error_record(layout: Layout, role: str, attempt: int, exc: BaseException, phase: str,
                       runtime_dir: Optional[str] = None) -> None:
    """Write ``logs/<role>.<attempt>.error.json`` for ``exc`` in this process (best effort, atomic).

    If the logdir cannot take it (a full filesystem, often the very reason the child fails), the
    record goes to the run's runtime directory, where the watchdog looks next, so the root cause
    still reaches the user's terminal."""
    record = {
        "role": role,
        "attempt": attempt,
        "pid": os.getpid(),
        "time": time.time(),
        "phase": phase,
        "type": type(exc).__name__,
        "message": str(exc),
        "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
    }
    try:
        write_json(layout.error_file(role, attempt), record)
        return
    except OSError as err:
        failed = err
    if runtime_dir is not None:
        try:
            write_json(spilled_error_file(runtime_dir, role, attempt), record)
            return
        except OSError:
            pass
    print(f"procsv: could not write error file: {failed}", file=sys.stderr)


def run_service(name: str, main: Callable[[ChildContext], int]) -> int:
    """The whole bootstrap of a service process: block the stop signals, die with the parent, read the
    context, run ``main``.

    The stop signals are blocked first, before any thread exists, so that every thread of the
    service has them blocked and the service's loop reads them with their senders
    (:mod:`procsv.common.stopfrom`): a service stops on its supervisor's SIGTERM, not on one sent
    to every process of the job at once, which would cost the trainer's emergency checkpoint.
    A failure is recorded as this attempt's error file (with the traceback) and re-raised, so the
    process still exits non-zero and the watchdog prints the child's own traceback.
    """
    stopfrom.block()
    die_with_parent()
    ctx = ChildContext.from_env()
    if ctx is None:
        print(f"procsv {name}: {env.LOGDIR} and {env.RUNTIME_DIR} must be set", file=sys.stderr)
        return 2
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        return main(ctx)
    except BaseException as exc:
        write_error_file(ctx, exc, "run")
        raise


def process_age() -> float:
    """Seconds since this process started: its start time in ``/proc/self/stat`` (clock ticks since
    boot) against ``CLOCK_BOOTTIME``. (psutil's ``create_time`` adds the boot time that ``/proc/stat``
    rounds to a whole second, so a wall time made from it can be a second off.)"""
    with open("/proc/self/stat") as fh:
        after_name = fh.read().rsplit(")", 1)[1].split()  # the name may hold spaces and parentheses
    started = int(after_name[19]) / os.sysconf("SC_CLK_TCK")  # field 22, starttime
    return max(0.0, time.clock_gettime(time.CLOCK_BOOTTIME) - started)
