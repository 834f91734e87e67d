"""A stop signal that wakes a loop blocked in a ZeroMQ poll at once.

Runs in the checkpoint and the summary service, whose loops wait for their next message in a
ZeroMQ poll with a timeout. pyzmq retries a poll that a signal interrupted, with its whole timeout
again (measured with pyzmq 27: a SIGTERM 50 ms into a 500 ms poll returned after 550 ms), so a
handler that only sets a flag is seen one poll timeout late: the service outlived the trainer by
that much at the end of every run. :class:`StopWake` routes SIGTERM/SIGINT through
``signal.set_wakeup_fd`` into a socket pair polled beside the service's socket: the poll returns as
the signal arrives, and the loop sees its flag. The handler only records the signal (it runs
between two Python bytecodes, so it never interrupts a commit half-way).

Given an :class:`~procsv.common.stopfrom.Authority` in a process that blocked the stop signals at
its start (:func:`procsv.common.stopfrom.block`: the services' bootstrap), the signals are read from
a ``signalfd`` instead, with their senders, and only the authority's (or any, once it is gone) stop
the loop; another is left to it with one line in the log. The handlers stay installed for a thread
that did not block them (none does in procsv's services): such a signal stops the loop as before.
"""

from __future__ import annotations

import signal
import socket
import sys
from typing import Any, Callable, Optional

import zmq

from procsv.common.stopfrom import STOP_SIGNALS, Authority, SignalFd, blocked


class StopWake:
    """SIGTERM/SIGINT as ``on_stop(signum)`` and a readable fd; :meth:`wait` polls ``sock`` beside it.

    Installs its handlers and the process's wakeup fd at construction (main thread only);
    :meth:`close` puts the previous ones back. With ``authority`` (and the stop signals blocked),
    only a stop signal :meth:`Authority.obeys` reaches ``on_stop``; ``who`` names this process in
    the line said for any other.
    """

    def __init__(self, sock: zmq.Socket[Any], on_stop: Callable[[int], None],
                 authority: Optional[Authority] = None, who: str = "procsv") -> None:
        self._r, self._w = socket.socketpair()
        self._r.setblocking(False)
        self._w.setblocking(False)
        self._poller = zmq.Poller()
        self._sock = sock
        self._others: list[zmq.Socket[Any]] = []
        self._poller.register(sock, zmq.POLLIN)
        self._poller.register(self._r.fileno(), zmq.POLLIN)
        self._on_stop = on_stop
        self._who = who
        sfd = SignalFd.open() if authority is not None and blocked() else None
        self._senders: Optional[tuple[SignalFd, Authority]] = None
        if sfd is not None and authority is not None:
            self._senders = (sfd, authority)
            self._poller.register(sfd.fileno(), zmq.POLLIN)
        self._old_wakeup: Optional[int] = signal.set_wakeup_fd(self._w.fileno(), warn_on_full_buffer=False)
        self._old = {s: signal.signal(s, lambda signum, frame: on_stop(signum)) for s in STOP_SIGNALS}

    def also(self, *socks: zmq.Socket[Any]) -> None:
        """Wait for a message on ``socks`` too (:meth:`wait` is True for any)."""
        for sock in socks:
            self._others.append(sock)
            self._poller.register(sock, zmq.POLLIN)

    def wait(self, timeout_ms: int) -> bool:
        """Wait up to ``timeout_ms`` for a message on the socket (or one given to :meth:`also`) or a
        stop signal, whichever comes first; True if a message is waiting (the signal's handler has
        run by the time this returns)."""
        ready = dict(self._poller.poll(timeout_ms))
        if self._r.fileno() in ready:
            try:
                self._r.recv(64)  # the signal numbers: the handler has recorded them
            except BlockingIOError:
                pass
        if self._senders is not None and self._senders[0].fileno() in ready:
            sfd, authority = self._senders
            for sig in sfd.read():
                if authority.obeys(sig):
                    self._on_stop(sig.signum)
                else:
                    print(authority.left_line(self._who, sig), file=sys.stderr, flush=True)
        return self._sock in ready or any(sock in ready for sock in self._others)

    def close(self) -> None:
        if self._old_wakeup is not None:
            signal.set_wakeup_fd(self._old_wakeup)
            self._old_wakeup = None
        for s, h in self._old.items():
            signal.signal(s, h)
        self._old = {}
        if self._senders is not None:
            self._senders[0].close()
            self._senders = None
        self._r.close()
        self._w.close()
