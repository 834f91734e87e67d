"""The watchdog's bring-up: the plumbing its loop waits on, and the launch-time standby choice.

Runs in the ``procsv launch`` process (the watchdog), called from its loop
(:mod:`procsv.watchdog.launcher`). :class:`Plumbing` owns what the loop is built on and takes it
down again in order: the private runtime directory (sockets only this user can reach), the ZeroMQ
context, the PULL socket the children report to (and, on node 0 of a job over hosts, the ROUTER where
``procsv stacks`` asks for the other hosts' stacks), the one poller, the non-blocking sender of
procsv's own scalars (:class:`~procsv.watchdog.publish.runscalars.ScalarSender`), ``--audit``'s DEALER to the
checkpoint service (:meth:`Plumbing.audit_link`) and the wakeup socket
that turns SIGTERM/SIGINT into a readable fd. :func:`standby_choice` says once whether a hot
standby may run (:mod:`procsv.watchdog.rules.standby` holds the pure memory rule).
"""

from __future__ import annotations

import signal
import socket
from types import FrameType
from typing import Any, Callable, Optional, Union

import psutil
import zmq

from procsv.common.layout import RuntimeDir, release_runtime_dir
from procsv.ipc.messages import Message
from procsv.ipc.transport import Endpoints, bind_private, make_socket, send
from procsv.watchdog.audit.auditors import Auditors
from procsv.watchdog.rules import standby
from procsv.watchdog.config import LaunchConfig
from procsv.watchdog.multihost.stackasks import StackAsks, StacksDesk
from procsv.watchdog.publish.runscalars import ScalarSender
from procsv.watchdog.rules.state import TRAINER, RunView

Handler = Union[Callable[[int, Optional[FrameType]], Any], int, signal.Handlers, None]
# SIGHUP (a closed ssh session, a killed tmux pane or terminal) stops the run in order too (exit 129),
# unless the launch inherited it ignored (`nohup procsv launch ...` asks for hang-ups to be ignored,
# and they stay so); every child has it ignored from its start (procsv.common.spawn), so one sent to
# every process of the run ends nothing behind the watchdog's back
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def stop_signals_taken(preempt_signal: Optional[int]) -> tuple[int, ...]:
    """The signals the watchdog takes as a stop: SIGTERM, SIGINT, SIGHUP unless it is ignored (nohup),
    and ``--preempt-signal``."""
    hup_ignored = signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
    taken = tuple(s for s in STOP_SIGNALS if not (s == signal.SIGHUP and hup_ignored))
    return taken + ((preempt_signal,) if preempt_signal is not None else ())


class Plumbing:
    """The runtime directory, the ZeroMQ context and sockets, the poller and the signal wakeup of
    one launch; :meth:`close` restores the signal handlers and removes the runtime directory."""

    def __init__(self, preempt_signal: Optional[int] = None) -> None:
        self.stops = stop_signals_taken(preempt_signal)
        self.runtime_dir = RuntimeDir.create().path  # mode 0700: sockets only we can reach
        self.zctx: zmq.Context[Any] = zmq.Context()
        self.pull = make_socket(self.zctx, zmq.PULL)
        bind_private(self.pull, Endpoints(self.runtime_dir).watchdog)
        self.poller = zmq.Poller()
        self.poller.register(self.pull, zmq.POLLIN)
        self.scalars = ScalarSender(self.zctx, Endpoints(self.runtime_dir).summary)
        self.wake_r, self._wake_w = socket.socketpair()
        self.wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._old_wakeup = signal.set_wakeup_fd(self._wake_w.fileno(), warn_on_full_buffer=False)
        self._old: dict[int, Handler] = {s: signal.signal(s, lambda signum, frame: None) for s in self.stops}
        self.poller.register(self.wake_r.fileno(), zmq.POLLIN)
        self.desk: Optional[StacksDesk] = None  # node 0's of a job over hosts: procsv stacks asks there
        self.holds: Optional[zmq.Socket[Any]] = None  # the audit's DEALER to checkpoint.sock (AuditHold)
        self.audits: Optional[Auditors] = None  # --audit's executor, driven by the loop (set once the executor is)

    def audit_link(self) -> Callable[[Message], None]:
        """The audit's DEALER to ``checkpoint.sock`` and how to send on it, never blocking (AuditHold: the steps
        retention keeps for the audit, an earlier launch's in a launch without ``--audit`` too; a message the queue
        cannot take is dropped, the next says it all)."""
        self.holds = make_socket(self.zctx, zmq.DEALER, sndhwm=16)
        self.holds.connect(Endpoints(self.runtime_dir).checkpoint)
        sock = self.holds

        def tell(msg: Message) -> None:
            send(sock, msg)
        return tell

    def serve_stacks(self, asks: StackAsks, view: RunView) -> str:
        """Node 0 of a job over hosts: bind the ROUTER where ``procsv stacks`` asks for the other hosts'
        members' stacks (:class:`StacksDesk`), in the poller; its endpoint."""
        self.desk = StacksDesk(self.zctx, self.runtime_dir, asks, view)
        self.poller.register(self.desk.sock, zmq.POLLIN)
        return self.desk.endpoint

    def stop_signals(self) -> list[int]:
        """The SIGTERM/SIGINT/SIGHUP (and --preempt-signal) that arrived since the last call (in order)."""
        try:
            data = self.wake_r.recv(64)
        except BlockingIOError:
            return []
        return [signum for signum in data if signum in self.stops]

    def close(self) -> None:
        signal.set_wakeup_fd(self._old_wakeup)
        for s, h in self._old.items():
            signal.signal(s, h)
        self.wake_r.close()
        self._wake_w.close()
        self.pull.close(0)
        if self.desk is not None:
            self.desk.close()
        self.scalars.close()
        if self.holds is not None:
            self.holds.close(0)
        self.zctx.term()
        release_runtime_dir(self.runtime_dir)


def standby_choice(cfg: LaunchConfig, view: RunView) -> Optional[tuple[bool, str, str]]:
    """Whether a hot standby may run: ``(ok, mode, reason)``, or ``None`` while ``--standby auto``
    still waits for the first trainer's first step (the memory rule needs its size)."""
    mode = cfg.standby if cfg.prewarm else "off"
    if mode in ("fork", "off"):
        ok, why = False, f"--standby {mode}" if cfg.prewarm else "no pre-warmed trainer (--no-prewarm)"
    elif mode == "hot":
        ok, why = True, "--standby hot"
    else:
        trainer = view.children.get(TRAINER)
        if trainer is None or trainer.first_step_at is None or not trainer.live:
            return None
        try:
            rss = psutil.Process(trainer.pid).memory_info().rss
        except psutil.Error:
            return None  # it just died: decide with the next one
        ok, why = standby.memory_allows(rss, psutil.virtual_memory().available, cfg.nproc)  # a group: N members
    return ok, "hot" if ok else "fork" if cfg.prewarm else "off", why
