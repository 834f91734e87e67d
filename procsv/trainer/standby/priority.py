"""A hot standby's CPU priority: idle while it prepares and waits, normal once promoted.

Runs in the trainer process while it is a hot standby (``PROCSV_STANDBY=1``). A standby imports
the program, loads its data and builds its model while the real trainer trains: on a small
machine that work competes with the trainer for the CPU. So the standby runs under ``SCHED_IDLE``
(it gets CPU only when nothing else wants it) from its first line, and its threads are set back
to ``SCHED_OTHER`` when it is promoted.

Linux lets a process leave ``SCHED_IDLE`` only if its nice value is within its ``RLIMIT_NICE`` or
it holds ``CAP_SYS_NICE`` (root does): without either, a promoted standby would stay idle-priority
for good. So the standby is lowered only when :func:`reversible` says the promotion can undo it;
otherwise it prepares at normal priority (``procsv launch`` says which in the standby's log).
"""

from __future__ import annotations

import os
import resource

CAP_SYS_NICE = 23


def reversible() -> bool:
    """Whether this process may go back from ``SCHED_IDLE`` to ``SCHED_OTHER`` at its nice value."""
    if os.geteuid() == 0 or _has_capability(CAP_SYS_NICE):
        return True
    soft, _ = resource.getrlimit(resource.RLIMIT_NICE)
    return soft == resource.RLIM_INFINITY or 20 - os.getpriority(os.PRIO_PROCESS, 0) <= soft


def lower() -> bool:
    """Put every thread of this process under ``SCHED_IDLE`` if :func:`reversible`; True if done."""
    return reversible() and idle_for_good()


def idle_for_good() -> bool:
    """Put every thread of this process under ``SCHED_IDLE`` for the rest of its life (an auditor, issue 71:
    never promoted, so nothing needs undoing); True if done. Threads made later inherit it."""
    if not hasattr(os, "SCHED_IDLE"):
        return False
    try:
        _set_all(os.SCHED_IDLE)
    except OSError:
        return False
    return True


def restore() -> None:
    """Every thread back to ``SCHED_OTHER`` (the promotion); threads created meanwhile inherited the idle policy."""
    try:
        _set_all(os.SCHED_OTHER)
        _set_own_cache(os.SCHED_OTHER)
    except OSError as exc:  # not expected (lower() checked reversible()); say it rather than fail the promotion
        import sys

        print(f"procsv: warning: the promoted standby could not leave idle CPU priority ({exc})", file=sys.stderr,
              flush=True)


def policies() -> dict[int, int]:
    """The scheduling policy of each thread of this process, by thread id."""
    out: dict[int, int] = {}
    for tid in _threads():
        try:
            out[tid] = os.sched_getscheduler(tid)
        except OSError:
            pass  # the thread ended meanwhile
    return out


def _set_all(policy: int) -> None:
    for tid in _threads():
        try:
            os.sched_setscheduler(tid, policy, os.sched_param(0))
        except ProcessLookupError:
            pass  # the thread ended meanwhile


def _set_own_cache(policy: int) -> None:
    """Set the calling thread's policy through ``pthread_setschedparam`` too. glibc keeps a copy of a
    thread's policy in its descriptor once it was set or read through pthreads, and a thread it
    creates then takes that copy, not the kernel's. Seen here: after a standby had run its step once
    (:func:`procsv.trainer.standby.warmup.run_on_shadows`), the ZeroMQ threads it made once promoted set
    themselves to ``SCHED_IDLE`` at start (strace), though every thread had been set back with
    ``sched_setscheduler``. Raises OSError if glibc refuses."""
    import ctypes

    class _Param(ctypes.Structure):
        _fields_ = [("sched_priority", ctypes.c_int)]

    libc = ctypes.CDLL(None, use_errno=True)
    libc.pthread_self.restype = ctypes.c_ulong
    libc.pthread_setschedparam.argtypes = [ctypes.c_ulong, ctypes.c_int, ctypes.POINTER(_Param)]
    err = libc.pthread_setschedparam(libc.pthread_self(), policy, ctypes.byref(_Param(0)))
    if err:
        raise OSError(err, os.strerror(err))


def _threads() -> list[int]:
    try:
        return [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        return [0]


def _has_capability(bit: int) -> bool:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> bit & 1)
    except OSError:
        pass
    return False
