"""Signals that reach only the process meant: by pidfd, never by a pid read later.

Runs in every process that signals another one it did not just spawn: the watchdog (its children,
the trainers the pre-warmed process forked among them), a node agent (its members) and
the ``procsv`` CLI (``stop``, ``preempt``). A pid names a process only while that process is
unreaped; once reaped, the number is reused, so a signal sent by number later may reach an
unrelated process. A pidfd stays bound to the process it was opened on: a signal through it reaches
that process or nothing. A process group is signalled only while its leader's pidfd still reaches
the leader (alive, or a zombie not yet reaped): while it is unreaped its pid, and so the group's
id, cannot be reused.

:func:`host_id` names the pids a process can see (one kernel boot, one PID namespace): a pid
recorded under another ``host_id`` (another host of a ``--nnodes`` job, another container sharing
the logdir) means nothing here and is never signalled.
"""

from __future__ import annotations

import os
import signal
from typing import NamedTuple, Optional

_host_id: Optional[str] = None


def host_id() -> str:
    """``<boot id>:<PID namespace inode>``: equal for two processes exactly when they see the
    same pids (the same kernel since the same boot, the same PID namespace)."""
    global _host_id
    if _host_id is None:
        try:
            with open("/proc/sys/kernel/random/boot_id") as fh:
                boot = fh.read().strip()
        except OSError:
            boot = "?"
        try:
            ns = str(os.stat("/proc/self/ns/pid").st_ino)
        except OSError:
            ns = "?"
        _host_id = f"{boot}:{ns}"
    return _host_id


def start_ticks(pid: int) -> Optional[int]:
    """When ``pid`` started, in clock ticks since boot (``/proc/<pid>/stat`` field 22): exact,
    unlike a start time in seconds since the epoch; None if there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return int(fh.read().rsplit(b")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def send(pidfd: int, sig: int) -> bool:
    """Signal the process of ``pidfd``; False if it is gone (reaped) or the fd is closed (-1)."""
    if pidfd < 0:
        return False
    try:
        signal.pidfd_send_signal(pidfd, sig)
    except (ProcessLookupError, OSError):
        return False
    return True


def send_group(pidfd: int, pgid: int, sig: int) -> bool:
    """Signal process group ``pgid`` only if its leader is still the process of ``pidfd`` (alive
    or a zombie not yet reaped); False, and nothing sent, otherwise."""
    if not send(pidfd, 0):
        return False
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def open_recorded(pid: int, ticks: Optional[int] = None, create_time: Optional[float] = None,
                  tolerance: float = 1.0) -> Optional[int]:
    """A pidfd of ``pid`` if it is the process recorded: started at ``ticks`` (exact) or within
    ``tolerance`` seconds of ``create_time`` (psutil's); None if it is gone or another process
    (a reused pid). The start is read after the pidfd is opened and the pidfd checked again after,
    so the pidfd returned is the process whose start was compared. The caller closes it."""
    if pid <= 0 or (ticks is None and create_time is None):
        return None
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return None
    same = False
    if ticks is not None:
        same = start_ticks(pid) == ticks
    else:
        import psutil

        try:
            same = create_time is not None and abs(psutil.Process(pid).create_time() - create_time) < tolerance
        except psutil.Error:
            same = False
    if same and send(fd, 0):
        return fd
    os.close(fd)
    return None


class ProcessRecord(NamedTuple):
    """A process as a shared file records it (the logdir lock's one line:
    ``<pid> <start ticks> <host id> <hostname>``). The pid means something only where
    :func:`host_id` is ``host``, and is that process only if it started at ``ticks``. An older
    procsv wrote the pid alone (``ticks`` and ``host`` None)."""

    pid: int
    ticks: Optional[int] = None
    host: Optional[str] = None
    hostname: str = "?"

    @staticmethod
    def mine() -> "ProcessRecord":
        import socket

        return ProcessRecord(os.getpid(), start_ticks(os.getpid()), host_id(), socket.gethostname() or "?")

    def line(self) -> str:
        ticks = "?" if self.ticks is None else str(self.ticks)
        return f"{self.pid} {ticks} {self.host or '?'} {self.hostname}\n"

    @staticmethod
    def parse(text: str) -> "ProcessRecord":
        parts = text.split()
        pid = int(parts[0]) if parts and parts[0].isdigit() else -1
        ticks = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None
        host = parts[2] if len(parts) > 2 and parts[2] != "?" else None
        return ProcessRecord(pid, ticks, host, parts[3] if len(parts) > 3 else "?")

    def here(self) -> bool:
        """True if the pid is one of this host's (same boot, same PID namespace)."""
        return self.host == host_id()

    def open(self) -> Optional[int]:
        """A pidfd of the recorded process, if it runs here and is the one that started at
        ``ticks``; None otherwise (elsewhere, gone, or a reused pid)."""
        return open_recorded(self.pid, ticks=self.ticks) if self.here() and self.ticks is not None else None
