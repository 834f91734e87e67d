"""Who sent a stop signal, and whether a helper process obeys it: a stop is its supervisor's to give.

Runs in the checkpoint and the summary service, the zygote and a hot standby. Slurm's ``scancel``,
``scontrol requeue`` and preemption send SIGTERM to every process of the job at once, and so do
systemd's default ``KillMode=control-group`` and ``kill -TERM -<pgid>`` of each group. A run stops in
an order: the supervisor (the watchdog; for a plain ``python train.py``, the trainer that started
its own services) first stops the trainer, whose emergency checkpoint needs the checkpoint service,
and stops the helpers only then. A helper that ended on the job-wide signal would cost that
checkpoint (and the zygote's end would SIGKILL the trainers it forked). So these processes obey
SIGTERM/SIGINT only from their supervisor, or from anyone once it is gone (:func:`obeys`), and say
in their log that they left any other to it.

A Python signal handler never learns the sender, so the stop signals are blocked in every thread
from the process's start (:func:`block`, before any thread exists: a thread inherits its creator's
mask) and read from a ``signalfd(2)`` (:class:`SignalFd`), whose records carry the sender's pid.
Linux only; elsewhere :func:`block` does nothing and the processes keep their plain handlers.

A hot standby's promotion (:data:`PROMOTE`, SIGUSR1) is read the same way: the zygote forks a
standby with it blocked too, and the standby's wait obeys it only from the watchdog
(:meth:`Authority.sent`: not even once the watchdog is gone, for there is then no run to train
for), so that a ``kill -USR1``, ``scancel --signal=USR1`` or systemd's signal to every process of
the job never starts a second trainer beside the one it stands by for.
"""

from __future__ import annotations

import ctypes
import os
import signal
import struct
from dataclasses import dataclass
from typing import Callable, Optional, Sequence


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
PROMOTE = signal.SIGUSR1  # the watchdog's to a hot standby: become the trainer (procsv.trainer.standby.wait)
_SIGSET_WORDS = 1024 // (8 * ctypes.sizeof(ctypes.c_ulong))
_SFD_NONBLOCK = os.O_NONBLOCK
_SFD_CLOEXEC = os.O_CLOEXEC
_INFO_SIZE = 128  # sizeof(struct signalfd_siginfo)
_INFO_HEAD = struct.Struct("=IiiII")  # ssi_signo, ssi_errno, ssi_code, ssi_pid, ssi_uid


@dataclass(frozen=True)
class StopSignal:
    """One signal as the kernel recorded it (a stop signal, or a standby's :data:`PROMOTE`): its number
    and the pid that sent it (0: the kernel)."""

    signum: int
    sender: int

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name


def obeys(sig: StopSignal, supervisor: int, supervisor_alive: bool) -> bool:
    """Whether a helper stops on ``sig``: its supervisor sent it, or the supervisor is gone (pure)."""
    return sig.sender == supervisor or not supervisor_alive


@dataclass(frozen=True)
class Authority:
    """The process whose stop signals a helper obeys: ``pid``, called ``title`` in the log, and how to
    tell that it is still there (``alive``)."""

    pid: int
    title: str
    alive: Callable[[], bool]

    @staticmethod
    def parent(title: str, parent_pid: Optional[int]) -> "Authority":
        """This process's parent at its start (``parent_pid``: its ``ChildConfig.parent_pid``, from
        ``PROCSV_PARENT_PID``; None: ``getppid()``); gone once this process has been re-parented."""
        pid = parent_pid if parent_pid is not None else os.getppid()
        return Authority(pid, title, lambda: os.getppid() == pid)

    def obeys(self, sig: StopSignal) -> bool:
        return obeys(sig, self.pid, self.alive())

    def sent(self, sig: StopSignal) -> bool:
        """Whether this process itself sent ``sig`` (pure): what a promotion needs, from no one else even
        once it is gone."""
        return sig.sender == self.pid

    def left_line(self, who: str, sig: StopSignal) -> str:
        """The log line for a stop signal left to the supervisor."""
        sender = "the kernel" if sig.sender == 0 else f"pid {sig.sender}"
        return (f"{who}: {sig.name} from {sender} left to {self.title} (pid {self.pid}), which stops this process "
                "when the run has stopped in order")

    def ignored_line(self, who: str, sig: StopSignal, what: str) -> str:
        """The log line for a signal ignored because it did not come from this process (``what`` it
        would have done)."""
        sender = "the kernel" if sig.sender == 0 else f"pid {sig.sender}"
        return f"{who}: {sig.name} from {sender} ignored: {what} only by {self.title} (pid {self.pid})"


def block(signals: Sequence[int] = STOP_SIGNALS) -> bool:
    """Block ``signals`` (the stop signals) in the calling thread, and so in every thread it creates
    from now on; True if they are blocked (False where ``pthread_sigmask`` is missing)."""
    try:
        signal.pthread_sigmask(signal.SIG_BLOCK, signals)
    except (AttributeError, OSError):
        return False
    return True


def unblock(signals: Sequence[int] = STOP_SIGNALS) -> None:
    """Deliver ``signals`` (the stop signals) to the calling thread's handlers again."""
    try:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, signals)
    except (AttributeError, OSError):
        pass


def blocked(signals: Sequence[int] = STOP_SIGNALS) -> bool:
    """Whether the calling thread has ``signals`` (the stop signals: :func:`block` ran at the start)
    blocked."""
    try:
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    except (AttributeError, OSError):
        return False
    return all(s in mask for s in signals)


class SignalFd:
    """A ``signalfd(2)`` over some blocked signals: readable when one is pending; :meth:`read` takes
    them with their senders. Owns the descriptor (close-on-exec, non-blocking)."""

    def __init__(self, fd: int) -> None:
        self._fd = fd

    @staticmethod
    def open(signals: Sequence[int] = STOP_SIGNALS) -> Optional["SignalFd"]:
        """A signalfd for ``signals`` (which the caller has blocked); None where there is none."""
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            make = libc.signalfd
        except (OSError, AttributeError):
            return None
        mask = (ctypes.c_ulong * _SIGSET_WORDS)()
        bits = 8 * ctypes.sizeof(ctypes.c_ulong)
        for s in signals:
            mask[(int(s) - 1) // bits] |= 1 << ((int(s) - 1) % bits)
        fd = make(-1, ctypes.byref(mask), _SFD_NONBLOCK | _SFD_CLOEXEC)
        return None if fd < 0 else SignalFd(fd)

    def fileno(self) -> int:
        return self._fd

    def read(self) -> list[StopSignal]:
        """Every pending signal of the set, oldest first (none if none is pending)."""
        out: list[StopSignal] = []
        while self._fd >= 0:
            try:
                data = os.read(self._fd, _INFO_SIZE * 16)
            except (BlockingIOError, InterruptedError):
                break
            for at in range(0, len(data) - _INFO_SIZE + 1, _INFO_SIZE):
                signo, _errno, _code, pid, _uid = _INFO_HEAD.unpack_from(data, at)
                out.append(StopSignal(signo, pid))
        return out

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def forward_to_handlers(authority: Authority, who: str) -> bool:
    """For a process whose stop signals stay blocked (a group worker forked by the zygote): a daemon
    thread reads them with their senders and hands the ones ``authority`` sent (anyone's once it is
    gone) to this process's Python handlers in the main thread (``_thread.interrupt_main``), and
    says in the log that it left any other to ``authority``. False (nothing started) where the
    senders cannot be read: the caller unblocks the signals then."""
    import _thread
    import select
    import threading

    sfd = SignalFd.open()
    if sfd is None:
        return False

    def run() -> None:
        while True:
            select.select([sfd], [], [])
            for sig in sfd.read():
                if authority.obeys(sig):
                    _thread.interrupt_main(signal.Signals(sig.signum))
                else:
                    print(authority.left_line(who, sig), flush=True)

    threading.Thread(target=run, name="procsv-stop-signals", daemon=True).start()
    return True
