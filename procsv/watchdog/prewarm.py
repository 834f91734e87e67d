"""The watchdog's side of the pre-warmed trainer: start the zygote, ask it for trainers.

Runs in the watchdog (and in a node agent). :class:`Zygote` starts ``python -m procsv.zygote`` with a
pair of pipes, learns when it is ready (TensorFlow imported), and turns a trainer spawn into a
:class:`ForkRequest` -- a restart then costs a fork plus the trainer's own set-up instead of a
fresh interpreter and a TensorFlow import. The request never blocks the watchdog's loop: its
:class:`ForkReply` arrives on the pipe like any other message (:meth:`Zygote.answer`), and a
zygote that does not answer within ``FORK_REPLY_TIMEOUT`` is given up for a fresh spawn. Nor
does the request's write block: the request pipe is non-blocking, and what a zygote that does not
read (stopped, with its pipe full) leaves unwritten waits in :class:`Zygote`'s buffer, written on
by every later request and :meth:`Zygote.answer`, until the answer's time is up.

The zygote forks twice over (:mod:`procsv.zygote`): the trainer it names in its reply has been
re-parented to this process (a child subreaper, made one by :class:`Zygote`), so it is this
process's own child, an :class:`Adopted` process reaped here by ``waitpid`` as a ``Popen``'s is;
nothing about it waits on the zygote. If the zygote dies, the watchdog falls back to fresh spawns;
a zygote found dead (its pipe at its end) or killed has both pipes closed at once (what it had sent
is read first), so a lost zygote leaves no file descriptor behind.

:class:`Prewarmed` is what both of its users (the watchdog's executor and a node agent) hold of it: the
zygote in use, those given up on, and each start asked of it and not answered yet (:class:`PendingFork`:
what its fresh start needs if the zygote fails or is late).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Callable, Mapping, Optional, Sequence

from procsv.ipc.codec import ProtocolError
from procsv.ipc.messages import ForkReply, ForkRequest, ZygoteReady, ZygoteStart
from procsv.ipc.pipe import FramedReader, framed, write_framed
from procsv.common import env as envvars
from procsv.common import spawn
from procsv.common.mutex import RobustMutex
from procsv.common.orphans import become_subreaper

FORK_REPLY_TIMEOUT = 10.0


class ZygoteUnavailable(RuntimeError):
    """The zygote is not ready, or died, or did not answer a fork request in time."""


class Zygote:
    """The pre-warmed trainer process and its control pipes (see the module docstring)."""

    def __init__(self, env: Mapping[str, str], log_path: str, cwd: str, preload: Sequence[str] = (),
                 clock: Callable[[], float] = time.monotonic, seed: Optional["ZygoteSeed"] = None) -> None:
        """``seed``: a :class:`ZygoteSeed` to grow into this zygote (no TensorFlow import of its own),
        if it suits ``env`` (:meth:`ZygoteSeed.suits`); else (and without one) ``python -m procsv.zygote``."""
        self.clock = clock
        become_subreaper()  # what it forks is re-parented to this process, not to init
        env = dict(env)
        env[envvars.PRELOAD] = ",".join(preload)
        self.popen: "subprocess.Popen[bytes] | Adopted"
        if seed is not None and seed.suits(env) and seed.start(ZygoteStart(
                {**env, envvars.ZYGOTE_FDS: seed.fds}, log_path, cwd)):
            self._req_w, self._rep_r = seed.req_w, seed.rep_r
            self.popen, self.via = seed.process, "fork"
        else:
            if seed is not None:
                seed.discard()
            self._spawn(env, log_path, cwd)
            self.via = "fresh"
        os.set_blocking(self._req_w, False)  # a zygote that does not read never blocks the watchdog
        self._unsent = bytearray()  # requests the pipe did not take yet
        self.reader = FramedReader(self._rep_r)
        self.ready = False
        self.import_secs = 0.0
        self.replies: dict[tuple[int, int], ForkReply] = {}  # by (attempt, rank), until taken by answer()
        self.due: dict[tuple[int, int], float] = {}  # by (attempt, rank): each request's answer is overdue after

    def _spawn(self, env: dict[str, str], log_path: str, cwd: str) -> None:
        """Start ``python -m procsv.zygote`` with its two pipes and a copy of this process's stderr."""
        req_r, self._req_w = os.pipe()
        self._rep_r, rep_w = os.pipe()
        try:  # where a fork whose log cannot be opened says so: a copy of this process's stderr (-1: none)
            say = os.dup(2)
        except OSError:
            say = -1
        env[envvars.ZYGOTE_FDS] = f"{req_r},{rep_w},{say}"
        # it opens its log itself (spawn.logged_argv): a start never waits on the logdir's filesystem
        self.popen = subprocess.Popen(
            spawn.logged_argv([sys.executable, "-m", "procsv.zygote"], log_path), env=env, cwd=cwd,
            stdin=subprocess.DEVNULL, start_new_session=True, pass_fds=(req_r, rep_w) + ((say,) if say >= 0 else ()))
        os.close(req_r)
        os.close(rep_w)
        if say >= 0:
            os.close(say)

    @property
    def fd(self) -> int:
        """Readable when the zygote has something to say (register it in the poller). The number
        stays what it was once the pipe is closed, so it can still be unregistered."""
        return self.reader.fd

    @property
    def pid(self) -> int:
        return int(self.popen.pid)

    def pump(self) -> None:
        """Read whatever the zygote sent: whether it is ready, its replies (taken by :meth:`answer`)."""
        if self.closed:
            return
        try:
            msgs = self.reader.read_available()
        except (EOFError, ProtocolError):  # closed, or garbage on the pipe: either way, unusable
            self._close_pipes()
            return
        for msg in msgs:
            if isinstance(msg, ZygoteReady):
                self.ready = True
                self.import_secs = msg.import_secs
            elif isinstance(msg, ForkReply):
                self.replies[(msg.attempt, msg.rank)] = msg

    def alive(self) -> bool:
        return not self.closed and self.popen.poll() is None

    def request_fork(self, attempt: int, target: str, args: Sequence[str], env: Mapping[str, str], log_path: str,
                     cwd: str, rank: int = 0) -> float:
        """Ask for a trainer (task ``rank`` of a group; without waiting); returns the time by which
        the answer is due."""
        if not (self.ready and self.alive()):
            raise ZygoteUnavailable("the zygote is not ready")
        argv = ["procsv.trainer", target, *args]
        self._unsent += framed(ForkRequest(attempt, argv, dict(env), log_path, cwd, rank))
        self._flush()
        self.due[(attempt, rank)] = self.clock() + FORK_REPLY_TIMEOUT
        return self.due[(attempt, rank)]

    def _flush(self) -> None:
        """Write what the request pipe takes now of the requests not yet sent (never waits)."""
        while self._unsent and self._req_w >= 0:
            try:
                n = os.write(self._req_w, self._unsent)
            except BlockingIOError:
                return  # the zygote does not read: the rest waits (its answer will be late)
            except OSError as exc:  # EPIPE: it is gone
                raise ZygoteUnavailable(f"the zygote's request pipe: {exc.strerror or exc}") from None
            del self._unsent[:n]

    @property
    def unsent(self) -> int:
        """Bytes of requests the zygote's pipe has not taken yet."""
        return len(self._unsent)

    def answer(self, attempt: int, rank: int = 0) -> Optional["Adopted"]:
        """The trainer forked for ``attempt`` (task ``rank``), once its reply has been pumped; None until then.
        Raises :class:`ZygoteUnavailable` if the fork failed, the zygote died, the answer is overdue
        (``FORK_REPLY_TIMEOUT``), or the pid it names is not this process's child."""
        if self._unsent and self.alive():
            self._flush()
        reply = self.replies.pop((attempt, rank), None)
        due = self.due.pop((attempt, rank), None) if reply is not None else self.due.get((attempt, rank))
        if reply is not None:
            if reply.error or reply.pid <= 0:
                raise ZygoteUnavailable(reply.error or "fork failed")
            try:  # this process's child? (the zygote replies once the intermediate that re-parented it here is
                # reaped; unreaped, a zombie if it died at once: only this process reaps it, so its pid names it)
                os.waitid(os.P_PID, reply.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)  # (reaps nothing)
            except ChildProcessError:
                raise ZygoteUnavailable(f"the forked trainer (pid {reply.pid}) is not this process's child") from None
            return Adopted(reply.pid)
        if not self.alive():
            raise ZygoteUnavailable("the zygote died")
        if due is not None and self.clock() >= due:
            raise ZygoteUnavailable(f"it did not answer the fork request within {FORK_REPLY_TIMEOUT:g} s")
        return None

    def kill(self) -> None:
        """SIGKILL the zygote, read what it had sent, and close its pipes
        (:meth:`close` reaps it). Its group is signalled only while it is unreaped (the watchdog
        reaps it itself: until then its pid, the group's id, cannot be reused)."""
        if self.popen.poll() is None:
            try:
                os.killpg(self.popen.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.pump()
        self._close_pipes()

    def _close_pipes(self) -> None:
        """Close both pipes, once (the numbers are then -1: a later close cannot close a reused one).
        A poller the reply pipe is still registered in reports the closed number as an error, and
        the watchdog's loop unregisters it."""
        for name in ("_req_w", "_rep_r"):
            fd = getattr(self, name)
            if fd >= 0:
                setattr(self, name, -1)
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._unsent.clear()

    @property
    def closed(self) -> bool:
        """True once both pipes are closed: a zygote found dead or killed (a lost zygote)."""
        return self._req_w < 0 and self._rep_r < 0

    def close(self, limit: Optional[float] = None) -> bool:
        """:meth:`kill`, then reap the zygote, waiting at most ``limit`` seconds (None: as long as it
        takes); False if it did not die within that (uninterruptible sleep)."""
        self.kill()
        try:
            self.popen.wait(limit)
        except subprocess.TimeoutExpired:
            return False
        return True


class Adopted:
    """A trainer the zygote forked, re-parented to this process (or a zygote seed it forked itself):
    its own child, reaped here with ``waitpid``, seen through the ``subprocess.Popen`` methods the
    watchdog uses (``poll``, ``wait``)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: Optional[int] = None

    def poll(self) -> Optional[int]:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: Optional[float] = None) -> int:
        """Its exit code, waiting at most ``timeout`` seconds (None: as long as it takes; then
        ``subprocess.TimeoutExpired``)."""
        if timeout is None:
            while self.returncode is None:
                pid, status = os.waitpid(self.pid, 0)
                if pid:
                    self.returncode = os.waitstatus_to_exitcode(status)
            return self.returncode
        deadline = time.monotonic() + timeout
        while (code := self.poll()) is None:
            if time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout)
            time.sleep(0.01)
        return code


class ZygoteSeed:
    """A child ``procsv launch`` forked at its start, when it had imported TensorFlow and had no other
    thread (:func:`procsv.zygote.seed.plant`, which also runs in it), to become the launch's first
    zygote without an import of its own: used once by :class:`Zygote` (:class:`ZygoteStart` on its
    request pipe), or discarded (SIGKILLed and reaped). ``import_env``: what the launch's environment
    had of :data:`spawn.IMPORT_DEFAULTS` (:func:`spawn.import_defaults`), TensorFlow's import's."""

    def __init__(self, pid: int, req_w: int, rep_r: int, fds: str, import_env: dict[str, str]) -> None:
        self.process, self.req_w, self.rep_r, self.fds = Adopted(pid), req_w, rep_r, fds
        self.import_env = import_env

    def suits(self, env: Mapping[str, str]) -> bool:
        """Whether the zygote environment ``env`` is one TensorFlow was imported with here: the
        variables a spawn sets by default when absent (:data:`spawn.IMPORT_DEFAULTS`, read at the
        import) must be what this process had."""
        return spawn.import_defaults(env) == self.import_env

    def start(self, msg: ZygoteStart) -> bool:
        """Tell the seed to become the zygote; False if it is gone (the pipe's reader closed)."""
        try:
            write_framed(self.req_w, msg)  # (a few kB: the empty pipe takes it at once)
        except OSError:
            return False
        return True

    def discard(self) -> None:
        """SIGKILL the unused seed, reap it, close its pipes."""
        try:
            os.kill(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait()
        for fd in (self.req_w, self.rep_r):
            os.close(fd)


@dataclass
class PendingFork:
    """A trainer (or a ``--ps`` parameter server) start asked of the zygote: what the fresh spawn
    needs if the zygote fails."""

    slot: str
    attempt: int
    env: dict[str, str]
    log_path: str
    mutex: Optional[RobustMutex]  # its death-notice mutex (the watchdog's trainers only)
    role: str  # TRAINER, WORKER (a group's task ``rank``), STANDBY or PS
    rank: int  # the key of the zygote's answer: the task, or PS_FORK_RANK + i for parameter server i
    asked: Optional[Zygote] = None  # the zygote it was asked of (its answer is taken there, even once given up)


class Prewarmed:
    """The pre-warmed trainer as the watchdog's executor and a node agent hold it: the zygote in use,
    those given up on, and the starts asked of it and not answered yet."""

    def __init__(self) -> None:
        self.zygote: Optional[Zygote] = None
        self.dead_zygotes: list[Zygote] = []  # given up on (killed, pipes closed); reaped by the sweeps once dead
        self.forks: dict[tuple[int, int], PendingFork] = {}  # by (attempt, rank), the key of the zygote's answer
        # (a trainer forked already is this process's child before its answer is read: the sweep spares it)

    def ask_zygote(self, pending: PendingFork, target: str, args: Sequence[str], cwd: str) -> bool:
        """Ask the zygote, when it is ready, for ``pending``'s process (:meth:`answered` completes it);
        False: start it fresh (a zygote the request failed on is given up)."""
        if self.zygote is None or not self.zygote.ready:
            return False
        try:
            self.zygote.request_fork(pending.attempt, target, args, pending.env, pending.log_path, cwd, pending.rank)
        except (ZygoteUnavailable, OSError) as exc:
            self.drop_zygote(f"procsv: pre-warmed trainer unavailable ({exc}); trainers start fresh")
            return False
        pending.asked = self.zygote
        self.forks[(pending.attempt, pending.rank)] = pending
        return True

    def asking(self, slot: str, attempt: int) -> bool:
        """Whether the start of ``slot``'s ``attempt`` was asked of a zygote and is not answered yet."""
        return any(p.slot == slot and p.attempt == attempt for p in self.forks.values())

    def answered(self) -> list[tuple[PendingFork, Optional[Adopted]]]:
        """The starts asked of the zygote that are done, each with its process, or None where the zygote
        failed, died or is late: then it is given up (not trusted with the next one either) and those
        start fresh. The ones still waiting stay in :attr:`forks`. An answer the zygote gave before it
        was given up (for another start) still names its process: that one is not started twice."""
        done: list[tuple[PendingFork, Optional[Adopted]]] = []
        for key, pending in list(self.forks.items()):
            proc: Optional[Adopted] = None
            asked = pending.asked or self.zygote
            try:
                if asked is not None and (proc := asked.answer(*key)) is None:
                    continue  # still waiting: the loop goes on meanwhile
            except ZygoteUnavailable as exc:
                if asked is self.zygote:
                    self.drop_zygote(f"procsv: pre-warmed trainer unavailable ({exc}); starting a fresh one")
            del self.forks[key]
            done.append((pending, proc))
        return done

    def drop_zygote(self, why: str) -> Optional[Zygote]:
        """Give up on the zygote (``why``): SIGKILL it and close its pipes; trainers start fresh from
        now on. Returns the zygote given up, if there was one."""
        lost, self.zygote = self.zygote, None
        if lost is not None:
            lost.kill()
            self.dead_zygotes.append(lost)
        return lost

    def zygotes(self) -> list[Zygote]:
        """The zygotes not reaped yet (this process's own children, not left-behind ones). One given up on
        is reaped here once dead (never waits; else each lost zygote left a zombie until the end). (An
        intermediate it left in a fork, SIGKILLed with its group and re-parented here, is the sweep's.)"""
        self.dead_zygotes = [z for z in self.dead_zygotes if z.popen.poll() is None]
        return [z for z in [self.zygote, *self.dead_zygotes] if z is not None]


def zygote_env(logdir: str, runtime_dir: str) -> dict[str, str]:
    env = spawn.child_env(role="zygote", attempt=1, logdir=logdir, runtime_dir=runtime_dir, supervised=True)
    env.pop(envvars.ATTEMPT, None)
    return env
