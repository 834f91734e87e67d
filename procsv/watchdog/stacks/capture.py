"""What a run's processes are doing: every thread's Python frames and what it waits in; how much they work.

Runs in the watchdog, in a node agent (its members' stacks, for its master) and in ``procsv stacks``
(:func:`procsv.cli.main`: a live run's stacks on demand). One capture is, per process, py-spy's dump
(``py-spy dump --json``, a dependency: it reads the interpreter's frames from outside, through
``process_vm_readv``, without the process's help, so a process stuck in a TensorFlow op, a collective
or a read holding the GIL is read all the same; its ``--native`` frames pause the process for a second
or more, so only the operator asks for them, ``procsv stacks --native``: at a hang they would delay the
restart as much) plus, from ``/proc`` for each thread, the system call it is in and what its first
argument names when it is a file descriptor (``read`` of a socket, ``futex``, ``poll``...): cheap, and
said even where py-spy cannot read the process. What it reads is :class:`~procsv.ipc.stack_messages.ProcessStacks`,
the type that travels between hosts as it is.

:func:`activity` is a cheap look at a process from ``/proc`` (its CPU, its I/O, whether its main
thread ran): the watchdog takes one of each trainer every second, for the stuck rule
(:func:`procsv.watchdog.rules.hang.stuck_reason`).

A capture never raises: a process that could not be read is one with its ``error`` (failures as
data). :func:`capture_all` reads the processes in parallel (each py-spy its own process), bounded by
``timeout``; :class:`Readings` does it off a loop that must not wait. :func:`render` is the text people
read, innermost frame last as in a Python traceback; :func:`innermost` the one-line name of where a
process's main thread is; :func:`culprit` the member of a group the stacks blame."""

from __future__ import annotations

import json
import os
import subprocess
import sysconfig
import time
import dataclasses
from typing import Any, Callable, Generic, Optional, Sequence, TypeVar

import psutil

from procsv.ipc.stack_messages import Frame, ProcessStacks, ThreadStack
from procsv.watchdog.diskjobs import DiskJobs, Job
from procsv.watchdog.rules.hang import IDLE_CPU, IDLE_IO
from procsv.watchdog.rules.state import Activity

_RESTART = "restart_syscall"  # a wait with a timeout interrupted (by py-spy's pause), resumed by the kernel
# The x86-64 and aarch64 numbers of the system calls a blocked thread is usually in (others print as their number)
_SYSCALLS: dict[str, dict[int, str]] = {
    "x86_64": {0: "read", 1: "write", 7: "poll", 17: "pread64", 18: "pwrite64", 23: "select", 35: "nanosleep",
               43: "accept", 45: "recvfrom", 47: "recvmsg", 61: "wait4", 202: "futex", 232: "epoll_wait",
               230: "clock_nanosleep", 270: "pselect6", 271: "ppoll", 281: "epoll_pwait", 288: "accept4",
               74: "fsync", 75: "fdatasync", 42: "connect", 44: "sendto", 46: "sendmsg", 257: "openat",
               219: _RESTART},
    "aarch64": {63: "read", 64: "write", 67: "pread64", 68: "pwrite64", 73: "ppoll", 72: "pselect6", 101: "nanosleep",
                115: "clock_nanosleep", 202: "accept", 242: "accept4", 207: "recvfrom", 212: "recvmsg", 260: "wait4",
                98: "futex", 22: "epoll_pwait", 82: "fsync", 83: "fdatasync", 203: "connect", 206: "sendto",
                211: "sendmsg", 56: "openat", 128: _RESTART},
}
_PLUMBING = ("libc.", "libpthread", "ld-linux", "libpython")  # native frames that name no op: skipped by innermost
_FD_CALLS = frozenset({"read", "write", "pread64", "pwrite64", "recvfrom", "recvmsg", "accept", "accept4", "fsync",
                       "fdatasync", "connect", "sendto", "sendmsg"})


def to_json(stacks: ProcessStacks) -> dict[str, Any]:
    """``stacks`` as a JSON object (``procsv stacks --json``)."""
    out = dataclasses.asdict(stacks)
    out["secs"] = round(stacks.secs, 3)
    return out


def py_spy() -> Optional[str]:
    """The py-spy installed beside this interpreter (its console scripts' folder), or None."""
    path = os.path.join(sysconfig.get_path("scripts"), "py-spy")
    return path if os.access(path, os.X_OK) else None


def _syscall(pid: int, tid: int, arch: str) -> str:
    """What thread ``tid`` waits in, from /proc (its system call and, for one on a file descriptor, what that names)."""
    try:
        with open(f"/proc/{pid}/task/{tid}/syscall") as f:
            fields = f.read().split()
    except OSError:
        return ""
    if not fields or not fields[0].isdigit():  # "running", or -1: not in a system call
        return ""
    name = _SYSCALLS.get(arch, {}).get(int(fields[0]), f"syscall {fields[0]}")
    if name in _FD_CALLS and len(fields) > 1:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{int(fields[1], 16)}")
        except (OSError, ValueError):
            target = "?"
        return f"{name}({target})"
    return name


LOOK_EVERY = 1.0  # seconds between two looks at a trainer from /proc (the stuck rule's samples; a node agent's too)


def activity(pid: int, at: float, before: Optional[Activity] = None) -> Optional[Activity]:
    """A look at ``pid`` from ``/proc`` at ``at`` (see :class:`Activity`); None once it is gone. Its
    descendants are looked at too when its own CPU and I/O barely moved since ``before``."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
        with open(f"/proc/{pid}/io") as f:
            counts = dict(line.split(": ", 1) for line in f.read().splitlines() if ": " in line)
        woke = 0
        with open(f"/proc/{pid}/task/{pid}/status") as f:
            for line in f:
                if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                    woke += int(line.split()[1])
        cpu = (int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])) / _TICKS  # (+ reaped children's)
        io = int(counts.get("rchar", 0)) + int(counts.get("wchar", 0))
        kids_cpu, kids_io = -1.0, -1
        if before is not None and cpu - before.cpu <= IDLE_CPU * max(at - before.at, 1.0) and io - before.io <= IDLE_IO:
            kids_cpu, kids_io = _descendants(pid)  # (only then: it costs a scan of /proc)
        return Activity(at, cpu, io, woke, fields[0], _syscall(pid, pid, os.uname().machine), kids_cpu, kids_io)
    except (OSError, ValueError, IndexError):
        return None


def _descendants(pid: int) -> tuple[float, int]:
    """The CPU seconds and bytes read and written of ``pid``'s live descendants, in all."""
    cpu, io = 0.0, 0
    try:
        kids = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return 0.0, 0
    for kid in kids:
        try:
            with kid.oneshot():
                t = kid.cpu_times()
                counts = kid.io_counters()
            cpu += t.user + t.system + t.children_user + t.children_system
            io += int(getattr(counts, "read_chars", 0)) + int(getattr(counts, "write_chars", 0))
        except psutil.Error:
            continue
    return cpu, io


_TICKS = os.sysconf("SC_CLK_TCK")


def _stopped(pid: int) -> bool:
    """Whether ``pid`` is stopped (SIGSTOP, or traced) now."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] in ("T", "t")
    except (OSError, IndexError):
        return False


def _waits(pid: int) -> dict[int, str]:
    """What each thread of ``pid`` waits in now (:func:`_syscall`), by thread id: read before py-spy pauses the
    process, since its pause interrupts a wait with a timeout (a ``poll``, a ``futex``), which the kernel then
    resumes as ``restart_syscall`` (x86-64's 219), naming nothing."""
    arch = os.uname().machine
    try:
        tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except (OSError, ValueError):
        return {}
    return {tid: _syscall(pid, tid, arch) for tid in tids}


def _waiting(pid: int, tid: int, arch: str, waits: dict[int, str]) -> str:
    """What thread ``tid`` waits in after py-spy read it: as it is now, or, where py-spy's pause interrupted
    its wait (``restart_syscall``, or not yet back in it: "running", runnable behind others on a loaded
    machine), what it waited in before (``waits``: :func:`_waits`)."""
    now = _syscall(pid, tid, arch)
    return (waits.get(tid) or now) if now in (_RESTART, "") else now


def _parse(role: str, pid: int, out: str, native: bool, secs: float, stopped: bool = False,
           waits: Optional[dict[int, str]] = None) -> ProcessStacks:
    arch = os.uname().machine
    waits = waits or {}
    threads: list[ThreadStack] = []
    for t in json.loads(out):
        frames = list(Frame(str(f.get("name", "?")), str(f.get("filename") or f.get("module") or ""), int(f.get("line") or 0),
                             native=bool(f.get("module")))  # (py-spy names a native frame's shared object)
                       for f in t.get("frames", []))
        tid = int(t.get("os_thread_id") or 0)
        threads.append(ThreadStack(tid, str(t.get("thread_name") or ""), not t.get("active", True), bool(t.get("owns_gil")),
                                   frames, _waiting(pid, tid, arch, waits) if tid else ""))
    threads.sort(key=lambda t: (t.tid != pid, t.tid))
    return ProcessStacks(role, pid, threads, native=native, secs=secs, stopped=stopped)


# (role, pid, its py-spy, or why none started, what each of its threads waited in as it started: _waits)
Reading = tuple[str, int, "subprocess.Popen[str] | str", dict[int, str]]


def start_reading(targets: Sequence[tuple[str, int]], native: bool) -> list[Reading]:
    """Start one py-spy per ``(role, pid)`` of ``targets`` (it never waits: :func:`finish_reading` takes them)."""
    spy = py_spy()
    out: list[Reading] = []
    for role, pid in targets:
        if spy is None:
            out.append((role, pid, "py-spy is not installed beside this Python (pip install py-spy): no stacks", {}))
            continue
        # a stopped process (SIGSTOP) cannot be paused by py-spy: read as it stands, without native frames
        argv = [spy, "dump", "--pid", str(pid), "--json"] + (["--nonblocking"] if _stopped(pid) else
                                                             ["--native"] if native else [])
        waits = _waits(pid)
        try:
            out.append((role, pid, subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True), waits))
        except OSError as exc:
            out.append((role, pid, f"py-spy did not start: {exc}", waits))
    return out


def finish_reading(reading: Sequence[Reading], timeout: float) -> list[ProcessStacks]:
    """The stacks each py-spy of :func:`start_reading` read, waited for at most ``timeout`` seconds in all
    (one not done by then is killed: its process's ``error`` says so)."""
    start = time.monotonic()
    out: list[ProcessStacks] = []
    for role, pid, proc, waits in reading:
        if isinstance(proc, str):
            out.append(_unread(role, pid, proc))
            continue
        try:
            stdout, stderr = proc.communicate(timeout=max(0.1, start + timeout - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            out.append(_unread(role, pid, f"py-spy did not finish within {timeout:g} s", waits=waits))
            continue
        secs = time.monotonic() - start
        if proc.returncode != 0:
            why = next((ln[len("Error:"):].strip() for ln in stderr.splitlines() if ln.startswith("Error:")),
                       f"py-spy exited {proc.returncode}")
            out.append(_unread(role, pid, f"py-spy could not read pid {pid}: {why}", secs, waits))
            continue
        args = list(proc.args) if isinstance(proc.args, (list, tuple)) else []
        try:
            out.append(_parse(role, pid, stdout, "--native" in args, secs, "--nonblocking" in args, waits))
        except (ValueError, TypeError, AttributeError) as exc:
            out.append(_unread(role, pid, f"py-spy's output could not be read: {exc}", secs, waits))
    return out


def _unread(role: str, pid: int, error: str, secs: float = 0.0, waits: Optional[dict[int, str]] = None) -> ProcessStacks:
    """A process whose frames were not read (``error``): its threads as ``/proc`` lists them, each with the
    system call it waits in, without frames."""
    arch = os.uname().machine
    threads: list[ThreadStack] = []
    try:
        tids = sorted((int(t) for t in os.listdir(f"/proc/{pid}/task")), key=lambda t: (t != pid, t))
    except (OSError, ValueError):
        tids = []
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                name = f.read().strip()
        except OSError:
            continue
        waiting = _waiting(pid, tid, arch, waits or {})
        threads.append(ThreadStack(tid, name, bool(waiting), False, [], waiting))
    return ProcessStacks(role, pid, threads, error=error, secs=secs)


def capture_all(targets: Sequence[tuple[str, int]], *, native: bool = False, timeout: float = 10.0) -> list[ProcessStacks]:
    """The stacks of each ``(role, pid)`` in ``targets``, read in parallel, within ``timeout`` seconds."""
    return finish_reading(start_reading(targets, native), timeout)


def innermost(stacks: ProcessStacks) -> str:
    """Where ``stacks``' main thread is, in one line: its innermost Python frame and, when known, the
    native frame or the system call below it (``in Lock.acquire (x.py:3), waiting in futex``)."""
    if stacks.error:  # (what /proc says its main thread waits in, if anything)
        waiting = stacks.main.waiting_in if stacks.main is not None else ""
        return f"{stacks.error}; its main thread waits in {waiting}" if waiting else stacks.error
    main = stacks.main or (stacks.threads[0] if stacks.threads else None)
    if main is None:
        return "no thread was read"
    py = next((f for f in main.frames if not f.native and not f.name.startswith("0x")), None)
    inner = main.frames[:main.frames.index(py)] if py is not None else main.frames
    named = [f for f in inner if f.native and not f.name.startswith(("0x", "syscall", "absl::", "Absl", "__"))
             and not os.path.basename(f.file).startswith(_PLUMBING)]
    below = next((f for f in named if "tensorflow::" in f.name), named[0] if named else None)  # the op, if one
    head = f"in {py.text()}" if py is not None else "in native code only"
    tail = [f"below it {below.name}"] if below is not None else []
    if main.waiting_in:
        tail.append(f"waiting in {main.waiting_in}")
    return ", ".join([head, *tail])


def render(all_stacks: Sequence[ProcessStacks]) -> str:
    """The text of a capture: per process, per thread, its frames outermost first (a traceback's order)."""
    lines: list[str] = []
    for s in all_stacks:
        lines.append(f"{s.role} (pid {s.pid}{f' on host {s.host}' if s.host else ''}{', stopped' if s.stopped else ''}): "
                     f"{innermost(s)}")
        for t in s.threads:
            state = "waiting" if t.idle else "running"
            extra = f", in {t.waiting_in}" if t.waiting_in else ""
            lines.append(f"  thread {t.tid} {t.name!r} ({state}{', holds the GIL' if t.gil else ''}{extra})")
            lines.extend(f"    {f.text()}" for f in reversed(t.frames))
        lines.append("")
    return "\n".join(lines)



# the frames of a thread waiting inside TensorFlow: in a collective (an all-reduce, all-gather, broadcast), or
# running a function or a session's step, whose collectives run on TensorFlow's own threads, which py-spy
# does not list (it reads the threads Python knows)
_IN_TF = ("collective", "all_reduce", "allreduce", "all_gather", "allgather", "nccl", "ringreducer", "ring_reducer",
          "runsync", "eagerexecute", "quick_execute", "tf_sessionrun", "directsession::run", "_call_tf_sessionrun")


def in_tensorflow(thread: ThreadStack) -> bool:
    """Whether ``thread`` waits inside TensorFlow (a collective, a function, a session's run): a frame says so."""
    return any(mark in f.name.lower() for f in thread.frames for mark in _IN_TF)


def culprit(all_stacks: Sequence[ProcessStacks]) -> str:
    """The member of a group its stacks blame (its role), "" if they blame none or it is no group: the
    one stopped (SIGSTOP) when the others are not, else the one whose main thread is not inside
    TensorFlow (where a data-parallel step's collectives wait for every member) while its peers' are."""
    if len(all_stacks) < 2:
        return ""
    stopped = [s.role for s in all_stacks if s.stopped]
    if len(stopped) == 1:
        return stopped[0]
    read = [s for s in all_stacks if not s.error and s.main is not None]
    outside = [s.role for s in read if s.main is not None and not in_tensorflow(s.main)]
    return outside[0] if len(outside) == 1 and len(read) == len(all_stacks) else ""


K = TypeVar("K")
T = TypeVar("T")


class Readings(Generic[K, T]):
    """Captures done off the caller's loop: each one's py-spy processes start in the loop (:meth:`start`:
    their pids are known at once, and a sweep of left-behind children spares them, :meth:`pids`), and
    a thread of its own waits for them and hands what they read to ``then`` (which may wait longer: the
    watchdog's waits for the other hosts' answers too, and writes the file); the loop takes each
    result when it is done (:meth:`done`) and never waits. The watchdog's capture before a hang's kill
    (:class:`~procsv.watchdog.stacks.artifact.Captures`) and a node agent's for its master
    (:class:`~procsv.watchdog.multihost.agent.NodeAgent`) are both one."""

    def __init__(self, thread: str) -> None:
        self._thread = thread
        self._jobs: Optional[DiskJobs] = None
        self._pending: list[tuple[K, Job[T], set[int]]] = []

    def start(self, key: K, targets: Sequence[tuple[str, int]], native: bool, timeout: float,
              then: Callable[[list[ProcessStacks]], T]) -> None:
        """Read ``targets`` (``(role, pid)``) within ``timeout`` seconds; ``then`` of what was read is the result."""
        if self._jobs is None:
            self._jobs = DiskJobs(self._thread)
        reading = start_reading(targets, native)
        job = self._jobs.submit(lambda: then(finish_reading(reading, timeout)))
        self._pending.append((key, job, {r[2].pid for r in reading if not isinstance(r[2], str)}))

    def pids(self) -> set[int]:
        """The py-spy processes of the captures not taken yet (children of this process a sweep spares)."""
        return {pid for *_, pids in self._pending for pid in pids}

    def done(self) -> list[tuple[K, Optional[T], str]]:
        """The captures finished since the last call: ``(key, result, error)`` (one that raised: None and its error)."""
        out = [(key, job.result, "" if job.result is not None else str(job.error)) for key, job, _ in self._pending
               if job.done]
        self._pending = [p for p in self._pending if not p[1].done]
        return out

    def close(self) -> None:
        if self._jobs is not None:
            self._jobs.close()
