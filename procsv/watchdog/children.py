"""The watchdog's handles on its child processes: start, signal, kill, reap, read their logs.

Runs in the watchdog. A :class:`ChildProcess` is one attempt of one slot: the process (a
``subprocess.Popen``, or an :class:`~procsv.watchdog.prewarm.Adopted` trainer the pre-warmed
trainer forked, re-parented to the watchdog), a pidfd that becomes readable the moment it dies,
its log file, and for a trainer the death-notice watch. Every one is the watchdog's own child,
reaped by the watchdog alone. Every child leads its own process group, so :meth:`kill_group` also
takes whatever the child spawned. Every signal goes through the pidfd (:mod:`procsv.common.pidfd`),
never by pid: once a child is reaped its pid may name another process; its group is signalled only
while the pidfd shows the leader unreaped. Effects only: what to do is decided elsewhere
(:mod:`procsv.watchdog.rules.decide`).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from typing import Callable, Iterable, Optional, Sequence, Union

from procsv.common import faults
from procsv.common import pidfd as pidfds
from procsv.common.env import DEATH_MUTEX
from procsv.common.layout import read_json
from procsv.common.mutex import RobustMutex
from procsv.watchdog.deathwatch import DeathWatch
from procsv.watchdog.prewarm import Adopted, Zygote
from procsv.watchdog.rules.failures import ChildError
from procsv.watchdog.rules.state import STANDBY, Activity

Process = Union["subprocess.Popen[bytes]", Adopted]

ECHO_READ = 1 << 20  # a log's echo reads at most this much a round
REAP_SECS = 5.0  # how long a SIGKILLed child may take to die before the watchdog stops waiting for it

# stderr lines every TF process prints that say nothing about the user's program
_NOISE = re.compile(r"^(WARNING: All log messages before absl|[EWI]0000 |.*(cuda|cuInit|oneDNN|TF-TRT|"
                    r"computation placer|cpu_feature_guard|rebuild TensorFlow with|AVX|Unable to register))")


def death_mutex(path: str, env: dict[str, str]) -> Optional[RobustMutex]:
    """A new death-notice mutex at ``path``, named in the child's ``env``; None if it cannot be made
    (no early notice: the pidfd alone tells of the death)."""
    env.pop(DEATH_MUTEX, None)
    try:
        mutex = RobustMutex(path, create=True)
    except OSError:
        return None
    env[DEATH_MUTEX] = mutex.path
    return mutex


class ChildProcess:
    """One attempt of one slot, as a live process (until :meth:`reap`)."""

    def __init__(self, slot: str, role: str, attempt: int, proc: Process, log_path: str) -> None:
        self.slot = slot
        self.role = role
        self.attempt = attempt
        self.proc = proc
        self.log_path = log_path
        self.pidfd = os.pidfd_open(proc.pid)
        self.watch: Optional[DeathWatch] = None
        self.log_pos = 0
        self.echoes = True  # False once another attempt's process took over its log (see take_over_log)
        self.killed_at: Optional[float] = None  # when it was first SIGKILLed (the watchdog's clock)
        self.dying_at: Optional[float] = None  # when its death notice came: it is ending (a SIGKILL from outside)
        self.look: Optional[Activity] = None  # a node agent's member: the last look at it from /proc (sent to node 0)

    @property
    def pid(self) -> int:
        return int(self.proc.pid)

    def send_signal(self, sig: int) -> None:
        """Signal the process itself (a trainer turns SIGTERM into an orderly stop), through its
        pidfd: nothing is sent once it is reaped."""
        pidfds.send(self.pidfd, sig)

    def unidle(self) -> None:
        """Set every thread of a hot standby back to normal CPU priority, before its promotion or its
        SIGKILL: under ``SCHED_IDLE`` on a loaded CPU a woken standby waits for a core before it can
        raise itself, and a killed one tears its memory down at idle priority, holding kernel locks of
        the memory it shares with the zygote, whose next fork waits for them (seen: 2.3 s at load 10).
        Where this process may not (no ``CAP_SYS_NICE``), the standby raises itself at its promotion."""
        try:
            tids = os.listdir(f"/proc/{self.pid}/task")
        except OSError:
            return
        for tid in tids:
            try:
                os.sched_setscheduler(int(tid), os.SCHED_OTHER, os.sched_param(0))
            except OSError:
                pass

    def kill_group(self, sig: int = signal.SIGKILL) -> None:
        """Signal the child's whole process group (it leads its own session), only while the child
        is unreaped (its pidfd reaches it): then the group's id is still its own. After that, what
        it left behind is the sweep's (:class:`~procsv.common.orphans.Orphans`: the watchdog is
        their subreaper)."""
        pidfds.send_group(self.pidfd, self.pid, sig)

    def kill(self, now: float) -> None:
        """SIGKILL the whole group, remembering when it was first done (see :meth:`unkillable`)."""
        if self.killed_at is None:
            self.killed_at = now
            if self.slot.startswith(STANDBY):
                self.unidle()  # its teardown at normal priority
        self.kill_group(signal.SIGKILL)

    def unkillable(self, now: float, limit: float = REAP_SECS) -> bool:
        """SIGKILLed, or its death noticed (a trainer SIGKILLed from outside: its main thread gone), at least
        ``limit`` seconds ago and still not dead (its pidfd not readable): a process in uninterruptible sleep (I/O
        that does not return, a frozen cgroup), or with one thread of it there while the others have exited."""
        since = min((t for t in (self.killed_at, self.dying_at) if t is not None), default=None)
        return since is not None and now - since >= limit and not self._died_within(0.0)

    def reap(self, timeout: float = 0.0) -> Optional[int]:
        """Take the exit status of a child that died (its pidfd said so) or was SIGKILLed, waiting at most
        ``timeout`` seconds for its death; kill what it left in its group, close the pidfd; for a trainer,
        end its death watch and remove its death-notice mutex. None: it did not die within ``timeout``
        (see :func:`unreaped_line`); it is left as it is and the pidfd stays open."""
        if self.watch is not None:
            self.watch.cancel()
        if self.proc.returncode is None:
            # the death first, on the pidfd, without reaping: the group is killed while its
            # leader is a zombie (its id not yet free), then the exit status is collected
            if not self._died_within(timeout):
                return None
            self.kill_group(signal.SIGKILL)  # anything the child left behind in its group
            if self.proc.poll() is None:  # (dead by its pidfd: its own child's status is there to take)
                return None
        self.kill_group(signal.SIGKILL)  # (a no-op once reaped: the pidfd no longer reaches it)
        if self.pidfd >= 0:
            os.close(self.pidfd)
            self.pidfd = -1
        if self.watch is not None and self.watch.close():
            self.watch = None
        code = self.proc.returncode
        assert code is not None
        return code

    def _died_within(self, secs: float) -> bool:
        """Wait up to ``secs`` for the pidfd to become readable (the process died; not reaped)."""
        if self.pidfd < 0:
            return self.proc.poll() is not None
        import select

        return bool(select.select([self.pidfd], [], [], max(0.0, secs))[0])

    def take_over_log(self, others: Iterable["ChildProcess"]) -> None:
        """Become the only echo of a log file another live process writes too (a standby killed as
        not ready, whose fork replacement is the same attempt and appends to the same file): go on
        from where that one's echo was, and silence it, so no line is echoed twice."""
        for other in others:
            if other is not self and other.log_path == self.log_path and other.echoes:
                self.log_pos = max(self.log_pos, other.log_pos)
                other.echoes = False

    def new_log_lines(self, final: bool = False) -> list[str]:
        """Complete lines its log gained since the last call (at most ``ECHO_READ`` bytes of it),
        without TensorFlow's start-up noise. ``final`` (the process was reaped): the rest of the
        log, its last line too; if more than ``ECHO_READ`` is left, only its last ``ECHO_READ``
        bytes (where a traceback is), after a line saying how much was not echoed."""
        if not self.echoes:
            return []
        skipped = 0
        try:
            with open(self.log_path, "rb") as fh:
                left = os.fstat(fh.fileno()).st_size - self.log_pos
                if final and left > ECHO_READ:
                    skipped = left - ECHO_READ
                fh.seek(self.log_pos + skipped)
                data = fh.read(ECHO_READ)
        except OSError:
            return []
        if final:
            if skipped and b"\n" in data:  # start at a line's start
                cut = data.index(b"\n") + 1
                skipped, data = skipped + cut, data[cut:]
            self.log_pos += skipped + len(data)
            head = [f"procsv: {skipped} bytes of {os.path.basename(self.log_path)} were not echoed "
                    f"(all of it is in {self.log_path})"] if skipped else []
            return head + [line for line in (_shown(seg) for seg in data.split(b"\n"))
                           if line.strip() and not _NOISE.match(line)]
        lines, used = complete_lines(data, at_cap=len(data) == ECHO_READ)
        self.log_pos += used
        return [line for line in lines if line.strip() and not _NOISE.match(line)]


def complete_lines(data: bytes, at_cap: bool) -> tuple[list[str], int]:
    """The complete lines at the start of ``data`` (what a log gained), and how many bytes they and
    what is done with take up. A line is what a terminal would show of it: the text after its last
    carriage return (a progress bar redrawn in place shows its last state, once). The redrawn
    states of a line still open are done with too, so a bar that runs for hours is not read again
    at every round; a chunk of ``ECHO_READ`` bytes with neither is echoed as a line of its own."""
    end = data.rfind(b"\n")
    used = end + 1
    lines = [_shown(seg) for seg in data[:used].split(b"\n")[:-1]]
    cr = data.rfind(b"\r", used, len(data) - 1)  # not a last byte: it may be a CRLF's first half
    if cr >= 0:
        used = cr + 1
    elif used == 0 and at_cap:
        used = _char_boundary(data)
        lines = [_shown(data[:used])]
    return lines, used


def _char_boundary(data: bytes) -> int:
    """Where ``data`` may be cut without splitting a UTF-8 character at its end (the cut of a
    line longer than a read): before that character if it is incomplete, else at the end."""
    i = len(data) - 1
    while i >= 0 and len(data) - i <= 4 and data[i] & 0xC0 == 0x80:
        i -= 1  # continuation bytes: back to their lead byte
    if i <= 0 or len(data) - i > 4:
        return len(data)
    lead = data[i]
    need = 2 if 0xC0 <= lead < 0xE0 else 3 if 0xE0 <= lead < 0xF0 else 4 if 0xF0 <= lead < 0xF8 else 1
    return i if len(data) - i < need else len(data)


def _shown(seg: bytes) -> str:
    return seg.rstrip(b"\r").rsplit(b"\r", 1)[-1].decode(errors="replace")


def process_state(pid: int) -> str:
    """The kernel's one-letter state of ``pid`` (``D``: uninterruptible sleep), ``?`` if unknown."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0].decode()
    except (OSError, IndexError, UnicodeDecodeError):
        return "?"


def unreaped_line(role: str, pid: int, secs: float) -> str:
    """The one line said of a child the watchdog stopped waiting for."""
    return f"procsv: could not reap {role} (pid {pid}, state {process_state(pid)}) within {secs:g} s"


class Unreaped:
    """The children the watchdog stopped waiting for: SIGKILL did not end them within
    ``REAP_SECS`` (uninterruptible sleep). Their SIGKILL is pending: one that dies later is reaped
    by :meth:`reap_dead`; until then the sweeps for left-behind processes leave them alone."""

    def __init__(self) -> None:
        self._handles: list[ChildProcess] = []
        self._pids: set[int] = set()

    @property
    def pids(self) -> set[int]:
        return set(self._pids)

    @property
    def handles(self) -> tuple[ChildProcess, ...]:
        """The children given up on (not reaped: each pid is still theirs)."""
        return tuple(self._handles)

    def add(self, handle: ChildProcess) -> str:
        """Give up on ``handle``; returns the line to say."""
        if handle.watch is not None:
            handle.watch.cancel()  # no death notice is awaited any more
        self._handles.append(handle)
        return self.add_pid(handle.role, handle.pid)

    def add_pid(self, role: str, pid: int) -> str:
        self._pids.add(pid)
        return unreaped_line(role, pid, REAP_SECS)

    def reap_dead(self) -> None:
        for handle in list(self._handles):
            if handle.proc.poll() is not None:
                self._handles.remove(handle)
                self._pids.discard(handle.pid)
                handle.reap()


def end_all(handles: Sequence[ChildProcess], zygotes: Sequence[Zygote], unreaped: Unreaped,
            clock: Callable[[], float]) -> list[str]:
    """SIGKILL and reap every child and zygote left at the end of a launch, waiting at most
    ``REAP_SECS`` for all of them together; returns a line for each one given up on."""
    for z in zygotes:
        z.kill()
    deadline = clock() + REAP_SECS  # one limit for all: each wait is what is left of it
    lines = []
    for handle in handles:
        handle.kill(clock())
        if handle.reap(max(0.0, deadline - clock())) is None:
            lines.append(unreaped.add(handle))
    for z in zygotes:
        if not z.close(max(0.0, deadline - clock())):
            lines.append(unreaped.add_pid("zygote", z.pid))
    return lines


def read_child_error(paths: Sequence[str], pid: int) -> Optional[ChildError]:
    """The first error file of ``paths`` written by ``pid`` (not by an earlier process): the one
    in ``logs/``, then the one a child spilled into the runtime directory when the logdir was full.
    (The fault point ``watchdog:error_read_stall`` stalls it: tests only.)"""
    faults.stall("watchdog", "error_read_stall")
    for path in paths:
        err = read_json(path)
        if isinstance(err, dict) and err.get("pid") == pid:
            steps = err.get("steps_completed")
            return ChildError(str(err.get("type", "")), str(err.get("message", "")),
                              str(err.get("traceback", "")), str(err.get("phase", "")),
                              steps if isinstance(steps, int) and not isinstance(steps, bool) else None,
                              err.get("committed") is True)
    return None
