"""Where everything of a run lives on disk, and how procsv writes files there.

Imported by every process. A logdir looks like this (TensorFlow and TensorBoard files at the top,
so that plain TF tools work on it; procsv's own bookkeeping under ``.procsv/`` and ``logs/``)::

    <logdir>/checkpoint                        TF checkpoint state file (text proto)
    <logdir>/model.ckpt-<step>.index|.data-*   TF-native checkpoints
    <logdir>/events.out.tfevents.*             TensorBoard event files
    <logdir>/logs/trainer.<attempt>.log        each attempt's stdout+stderr (the newest launch)
    <logdir>/logs/trainer.<attempt>.error.json the child's own traceback, if it failed
    <logdir>/logs/trainer.<attempt>.stacks.txt every trainer's stacks, taken before it was stopped as hung
    <logdir>/logs/launch-<n>/                  an earlier launch's per-attempt logs and error files
    <logdir>/logs/lifecycle.jsonl              spawned / exited / restarted / committed ...
    <logdir>/logs/report.json                  the recovery report of the last launch
    <logdir>/.procsv/status.json               what ``procsv status`` reads (the watchdog writes it)
    <logdir>/.procsv/summary_stats.json        the summary service's counters (written, dropped, rejected)
    <logdir>/.procsv/checkpoint_stats.json     the checkpoint service's counters (rejected messages)
    <logdir>/.procsv/lock                      flock held by the live launch
    <logdir>/.procsv/checkpoints/*.json        one manifest per committed checkpoint
    <logdir>/.procsv/checkpoint_settings.json  the trainer's retention settings (checkpoint service)
    <logdir>/.procsv/audit.json                --audit's unfinished intervals, for the next launch (the watchdog)
    <logdir>/.procsv/tmp/                      checkpoints being written (cleaned at start)
    <logdir>/.procsv/quarantine/<prefix>/      a checkpoint that failed verification: its files and
                                               manifest, moved aside for a person to look at

A run's runtime directory (private, mode 0700, removed at the end) holds what lives only as long
as the run: the ZeroMQ socket files (:class:`procsv.ipc.transport.Endpoints`) and one
death-notice mutex file per trainer attempt (:class:`RuntimeDir`).

Everything procsv persists goes through :func:`atomic_write`: write aside, fsync, rename, fsync
the directory. Readers therefore see either the old or the new file, never a torn one.

One concern: where a run's files live and how procsv writes them (paths, atomic writes, the lock).
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from typing import Any, Optional

from procsv.common.errors import LogdirLocked, UsageError
from procsv.common.pidfd import ProcessRecord

_UMASK = os.umask(0)
os.umask(_UMASK)


@dataclass(frozen=True)
class Layout:
    """Paths of one logdir."""

    logdir: str

    @property
    def meta(self) -> str:
        return os.path.join(self.logdir, ".procsv")

    @property
    def logs(self) -> str:
        return os.path.join(self.logdir, "logs")

    @property
    def status(self) -> str:
        return os.path.join(self.meta, "status.json")

    @property
    def summary_stats(self) -> str:
        return os.path.join(self.meta, "summary_stats.json")

    @property
    def checkpoint_stats(self) -> str:
        return os.path.join(self.meta, "checkpoint_stats.json")

    @property
    def lock(self) -> str:
        return os.path.join(self.meta, "lock")

    @property
    def manifests(self) -> str:
        return os.path.join(self.meta, "checkpoints")

    @property
    def group_records(self) -> str:
        """The restore records of trainer groups (``procsv.trainer.replica.GroupPin``), cleared at each launch."""
        return os.path.join(self.meta, "group")

    def group_pin(self, job: str, attempt: int) -> str:
        """What a group's chief restored at ``attempt`` of launch ``job``: its workers restore exactly that."""
        return os.path.join(self.group_records, f"{job}.{attempt}.restored.json")

    @property
    def checkpoint_settings(self) -> str:
        """The trainer's checkpoint settings as the checkpoint service last received them."""
        return os.path.join(self.meta, "checkpoint_settings.json")

    @property
    def tmp(self) -> str:
        return os.path.join(self.meta, "tmp")

    @property
    def quarantine(self) -> str:
        """Where checkpoints that failed verification are moved (never deleted)."""
        return os.path.join(self.meta, "quarantine")

    def quarantined(self, prefix: str) -> str:
        """The folder one quarantined checkpoint's files and manifest are moved to."""
        return os.path.join(self.quarantine, prefix)

    @property
    def lifecycle(self) -> str:
        return os.path.join(self.logs, "lifecycle.jsonl")

    @property
    def report(self) -> str:
        """The recovery report of the last launch (``logs/report.json``)."""
        return os.path.join(self.logs, "report.json")

    @property
    def audit_carry(self) -> str:
        """What ``--audit`` left unaudited at a launch's end, for the next launch (the watchdog writes and reads it)."""
        return os.path.join(self.meta, "audit.json")

    @property
    def state_file(self) -> str:
        return os.path.join(self.logdir, "checkpoint")

    def attempt_log(self, role: str, attempt: int) -> str:
        """The newest launch's log of one attempt (an earlier launch's is under :meth:`launch_logs`)."""
        return os.path.join(self.logs, f"{role}.{attempt}.log")

    def launch_logs(self, launch: int) -> str:
        """Where the per-attempt logs and error files of an earlier launch ``launch`` (1, 2, ...)
        are kept once the next launch began (``logs/launch-<n>/``)."""
        return os.path.join(self.logs, f"launch-{launch}")

    def error_file(self, role: str, attempt: int) -> str:
        return os.path.join(self.logs, f"{role}.{attempt}.error.json")

    def stacks_file(self, role: str, attempt: int) -> str:
        """The stacks of the run's trainers taken before attempt ``attempt`` of ``role`` was stopped as hung."""
        return os.path.join(self.logs, f"{role}.{attempt}.stacks.txt")

    def create(self) -> None:
        """Create the logdir and procsv's folders; raise UsageError naming the problem if it cannot."""
        path = self.logdir
        try:
            # the logdir, then every folder procsv writes in, probed: a logs/ left unwritable (another
            # user's, immutable, a read-only mount) failed later, at the lifecycle file's open, with a
            # traceback and exit 1
            for path in (self.logdir, self.meta, self.logs, self.manifests, self.tmp):
                os.makedirs(path, exist_ok=True)
                fd, probe = tempfile.mkstemp(prefix=".write-probe-", dir=path)  # (unique across hosts sharing it)
                try:
                    os.write(fd, b"ok")
                finally:
                    os.close(fd)
                    os.unlink(probe)
        except OSError as exc:
            raise UsageError(_create_problem(self.logdir, exc, path)) from None


def _create_problem(logdir: str, exc: OSError, path: Optional[str] = None) -> str:
    """One line: why ``logdir`` cannot be used (``path``: the folder inside it that failed), and what to do."""
    why = exc.strerror or str(exc)
    if os.path.lexists(logdir) and not os.path.isdir(logdir):
        return f"logdir {logdir!r} is a file, not a directory: pass a directory for --logdir"
    what = f"logdir {logdir!r}" if path in (None, logdir) else f"{path!r} in logdir {logdir!r}"  # (the logdir passed)
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"{what} is not writable ({why}): its filesystem is full; free some space or pass another --logdir"
    if exc.errno == errno.EROFS:
        return f"{what} is not writable ({why}): pass a --logdir on a writable filesystem"
    return f"{what} is not writable ({why}): pass a --logdir you can create and write"


RUNTIME_PREFIX = "procsv-"
RUNTIME_OWNER = "owner"  # "<pid> <create_time>" of the process that created the runtime directory (for people)
RUNTIME_LOCK = "owner.lock"  # flocked by the owner for its whole life: how another process tells it lives
_held: dict[str, int] = {}  # runtime directory -> the fd of the lock this process holds on it


@dataclass(frozen=True)
class RuntimeDir:
    """Paths inside a run's private runtime directory (besides the socket files)."""

    path: str

    @staticmethod
    def create() -> "RuntimeDir":
        """A new private runtime directory (mode 0700) in the temp folder, held by this process.

        The process holds an exclusive ``flock`` on its ``owner.lock`` for as long as it lives (the
        kernel drops it when the process dies, however it dies); the lock file is locked before it
        is renamed into place, so no other process ever sees it unlocked while its owner lives.
        First removes the runtime directories whose owner is gone (a launch killed with SIGKILL
        cannot remove its own): :func:`remove_stale_runtime_dirs`.
        """
        folder = runtime_parent()
        remove_stale_runtime_dirs(folder)
        path = tempfile.mkdtemp(prefix=RUNTIME_PREFIX, dir=folder)
        lock = os.path.join(path, RUNTIME_LOCK)
        fd = os.open(lock + ".new", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.rename(lock + ".new", lock)
        _held[path] = fd  # open until the process ends (or release_runtime_dir)
        with open(os.path.join(path, RUNTIME_OWNER), "w") as fh:
            fh.write(f"{os.getpid()} {_create_time(os.getpid())!r}\n")  # for people: who made it
        return RuntimeDir(path)

    def trainer_mutex(self, attempt: int, rank: int = 0) -> str:
        """The death-notice mutex of one trainer attempt (of the group's trainer ``rank``)."""
        return os.path.join(self.path, f"trainer.{attempt}.mutex" if rank == 0 else f"worker{rank}.{attempt}.mutex")


    def standby_mutex(self, attempt: int, rank: int = 0) -> str:
        """The death-notice mutex of a hot standby prepared to become trainer attempt ``attempt``
        (a standby group's member for the group's trainer ``rank``; several may be prepared for one
        attempt in turn: each replaces the file)."""
        return os.path.join(self.path, f"standby.{attempt}.mutex" if rank == 0 else f"standby{rank}.{attempt}.mutex")


SOCKET_PATH_MAX = 107  # sizeof(sockaddr_un.sun_path) - 1: the longest ipc:// path ZeroMQ can bind
_SOCKET_ROOM = len("/" + RUNTIME_PREFIX + "XXXXXXXX/checkpoint.sock") + 8  # the longest name inside, with room


def runtime_parent() -> str:
    """Where runtime directories go: the temp folder (``TMPDIR``), unless its path is too long for
    the socket paths inside (a Unix socket path is limited to 107 bytes): then ``/tmp``."""
    folder = tempfile.gettempdir()
    if len(os.fsencode(folder)) + _SOCKET_ROOM > SOCKET_PATH_MAX and os.path.isdir("/tmp"):
        return "/tmp"
    return folder


def _create_time(pid: int) -> float:
    """The kernel's start time of ``pid`` (seconds since boot; tells a reused pid apart), or -1."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
        return float(fields[19])  # field 22 of stat: starttime, in clock ticks
    except (OSError, IndexError, ValueError):
        return -1.0


def remove_stale_runtime_dirs(folder: Optional[str] = None) -> list[str]:
    """Remove this user's runtime directories whose owner is gone; return their paths.

    Liveness is the owner's lock (:data:`RUNTIME_LOCK`), never a pid: containers that share ``/tmp``
    see each other's directories, but not each other's pids (a pid of another PID namespace is
    absent here, or another process), while a ``flock`` is the kernel's, across namespaces. A
    directory with no lock file (being created, another program's, or an older procsv's) is kept.
    """
    folder = folder or runtime_parent()
    removed: list[str] = []
    try:
        names = os.listdir(folder)
    except OSError:
        return removed
    for name in names:  # the temp folder may hold tens of thousands of others' files: the prefix first
        if not name.startswith(RUNTIME_PREFIX):
            continue
        path = os.path.join(folder, name)
        if path in _held:
            continue
        try:
            if os.lstat(path).st_uid != os.getuid() or not os.path.isdir(path):
                continue
            fd = os.open(os.path.join(path, RUNTIME_LOCK), os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            continue  # its owner holds it: it lives
        else:
            shutil.rmtree(path, ignore_errors=True)  # under the lock: its owner is gone for good
            removed.append(path)
        finally:
            os.close(fd)
    return removed


def release_runtime_dir(path: str) -> None:
    """Remove a runtime directory this process made, and let go of its lock."""
    shutil.rmtree(path, ignore_errors=True)
    fd = _held.pop(path, None)
    if fd is not None:
        os.close(fd)


def fsync_dir(path: str) -> None:
    """fsync a directory so that renames and unlinks in it are durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: str, data: bytes | str, *, durable: bool = True, mode: Optional[int] = None) -> None:
    """Replace ``path`` with ``data`` atomically: temp file in the same folder, fsync, rename.
    ``mode``: the file's permissions from its first byte (default: what the umask gives)."""
    if isinstance(data, str):
        data = data.encode()
    folder = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=folder)
    try:
        os.fchmod(fd, 0o666 & ~_UMASK if mode is None else mode)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            if durable:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    if durable:
        fsync_dir(folder)


def spilled_error_file(runtime_dir: str, role: str, attempt: int) -> str:
    """Where a child writes its error record when the logdir cannot take it (a full or failing
    filesystem): the run's private runtime directory, which the watchdog reads too."""
    return os.path.join(runtime_dir, f"{role}.{attempt}.error.json")


def promotion_file(runtime_dir: str, attempt: int, rank: int) -> str:
    """Where the watchdog leaves the :class:`~procsv.ipc.messages.Promotion` of the standby that becomes
    member ``rank`` of the trainer's attempt ``attempt``, before its SIGUSR1 (the run's runtime directory)."""
    return os.path.join(runtime_dir, f"promotion.{attempt}.{rank}.msg")


def exit_report_file(runtime_dir: str, role: str, attempt: int) -> str:
    """Where a trainer writes its exit report (a SIGTERM/SIGINT stopped it and its checkpoint
    committed: exit 42 is a preemption) for the watchdog, which reads and removes it at the reap."""
    return os.path.join(runtime_dir, f"{role}.{attempt}.exit.json")


def write_json(path: str, obj: Any, *, durable: bool = True, mode: Optional[int] = None) -> None:
    atomic_write(path, json.dumps(obj, indent=1, sort_keys=True) + "\n", durable=durable, mode=mode)


def read_json(path: str) -> Optional[Any]:
    """Return the parsed file, or None if it does not exist or is not valid JSON (nested too deep
    for the parser included)."""
    try:
        with open(path, "rb") as fh:
            return json.loads(fh.read())
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError, json.JSONDecodeError, UnicodeDecodeError,
            RecursionError):
        return None


class LogdirLock:
    """An exclusive ``flock`` on ``<logdir>/.procsv/lock``, held for a run's lifetime.

    The kernel drops it when the holder dies, so a lock left by a dead launch is simply taken
    over; a live holder makes :meth:`acquire` raise :class:`LogdirLocked` naming its pid.
    """

    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self._fd: Optional[int] = None

    def acquire(self) -> Optional[str]:
        """Take the lock; return the pid a dead holder left in it (a stale lock taken over), else None.

        A holder that ends normally empties the file (:meth:`release`), so a pid found in a free
        lock means its launch died without releasing it (SIGKILL, a crash of the machine).
        """
        fd = os.open(self.layout.lock, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = os.pread(fd, 64, 0).decode(errors="replace").split(" ")[0].strip() or "?"
            os.close(fd)
            if exc.errno in (errno.EAGAIN, errno.EACCES):
                raise LogdirLocked(
                    f"logdir {self.layout.logdir!r} is in use by a live procsv run (pid {holder}); "
                    f"stop it with `procsv stop {self.layout.logdir}` or choose another --logdir"
                ) from None
            raise
        stale = os.pread(fd, 64, 0).decode(errors="replace").split(" ")[0].strip() or None
        os.ftruncate(fd, 0)
        os.pwrite(fd, ProcessRecord.mine().line().encode(), 0)  # who holds it, where, since when
        self._fd = fd
        return stale

    def release(self) -> None:
        if self._fd is not None:
            try:
                os.ftruncate(self._fd, 0)  # an orderly end: nothing stale is left for the next holder
            except OSError:
                pass
            os.close(self._fd)
            self._fd = None

    @staticmethod
    def holder(layout: Layout) -> Optional[int]:
        """The live lock holder's pid (in its PID namespace: see :meth:`held_by`), or None (-1: no pid)."""
        return None if (rec := LogdirLock.held_by(layout)) is None else rec.pid

    @staticmethod
    def held_by(layout: Layout) -> Optional[ProcessRecord]:
        """What the live lock holder recorded of itself (pid, start, host), or None if nobody holds it."""
        try:
            fd = os.open(layout.lock, os.O_RDWR)
        except FileNotFoundError:
            return None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                return ProcessRecord.parse(os.pread(fd, 512, 0).decode(errors="replace"))
            fcntl.flock(fd, fcntl.LOCK_UN)
            return None
        finally:
            os.close(fd)
