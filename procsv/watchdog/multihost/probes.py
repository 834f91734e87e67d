"""Both ends of the probes that tell a slow agent from a silent host (rule 12, :mod:`procsv.watchdog.rules.hosts`).

:class:`ProbePort` runs in each node agent (``procsv launch --node-rank R``, R > 0): a plain TCP socket
listening on the agent's host address, named in every :class:`~procsv.ipc.node_messages.NodeHello`
(``probe``). Its host's kernel completes a handshake to it whether or not the agent runs at that moment (stopped,
starved of CPU, blocked), and queues nothing for the agent to accept (``TCP_DEFER_ACCEPT``: a handshake without
data stays a request, which the probe's reset drops), so that a probe port answers a stopped agent's probes
however long the stop; the agent accepts and closes what queued anyway (a connection that sent data), each turn
of its loop.

:class:`Prober` runs in node 0's watchdog: it connects to the probe ports of the hosts rule 12 says are due
(:func:`~procsv.watchdog.rules.hosts.probes_due`), without blocking, and reports what came back: a
handshake (the port is there), a reset (the host is up, its agent's port closed) or nothing (no answer
within ``PROBE_TIMEOUT``, or an error on the way: unreachable), with when each probe was sent and when it
looked. It decides nothing; the view records what it sends and sees (:func:`~procsv.watchdog.observe.probe_sent`,
:func:`~procsv.watchdog.observe.probes_looked`).
"""

from __future__ import annotations

import errno
import select
import socket
import struct
from typing import Callable

from procsv.watchdog.rules.hosts import PROBE_TIMEOUT

BACKLOG = 128  # connections the kernel queues for a probe port while its agent does not turn (a probe queues none)
DEFER_SECS = 5  # TCP_DEFER_ACCEPT: a handshake without data stays a request until then (a probe resets it first)
LINGER_RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() resets the connection (an RST, no FIN)
POLL_MS = 10  # node 0's loop polls this often while a probe is out (else every 100 ms): its answer is read soon


class ProbePort:
    """A node agent's probe port: listening on ``host``, port chosen by the kernel."""

    def __init__(self, host: str) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind((host, 0))
        # a probe's handshake completes (its ACK is dropped: no data), and its reset then drops the request:
        # nothing reaches the accept queue, which a stopped agent never empties (it filled after 129 probes:
        # 6.5 s of a suspected host's, and the next probes' SYNs were dropped, a stopped agent found "silent")
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_DEFER_ACCEPT, DEFER_SECS)
        self.sock.listen(BACKLOG)
        self.sock.setblocking(False)
        self.address = f"{host}:{self.sock.getsockname()[1]}"

    def take(self) -> None:
        """Accept and close what queued (the kernel answered each already)."""
        for _ in range(BACKLOG):
            try:
                conn, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            conn.close()

    def close(self) -> None:
        self.sock.close()


class Prober:
    """Node 0's probes of other hosts' probe ports, in flight: ``node -> [(socket, sent at)]``."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.out: dict[int, list[tuple[socket.socket, float]]] = {}

    @property
    def busy(self) -> bool:
        return any(self.out.values())

    def send(self, node: int, address: str) -> float:
        """Start a handshake with ``address`` (``HOST:PORT``); an error at once is an answer of nothing. Returns
        when it was sent: the clock read once its first packet is out (never before: a probe is credited with
        no more time to be answered than it had)."""
        host, _, port = address.rpartition(":")
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        code = s.connect_ex((host, int(port)))
        sent = self.clock()
        if code not in (0, errno.EINPROGRESS, errno.ECONNREFUSED):
            s.close()  # (unreachable at once: no answer)
            return sent
        self.out.setdefault(node, []).append((s, sent))
        return sent

    def answers(self) -> tuple[float, list[tuple[int, float, bool]]]:
        """A look at the probes out: when it looked (the clock read before: a probe still out had at least
        that long) and those answered, ``(node, sent, handshake)`` (handshake False: a reset); the ones that
        failed otherwise or are older than ``PROBE_TIMEOUT`` are dropped unanswered."""
        now = self.clock()
        got: list[tuple[int, float, bool]] = []
        socks = [s for flying in self.out.values() for s, _ in flying]
        if not socks:
            return now, got
        _, ready, _ = select.select([], socks, [], 0)
        done = set(ready)
        for node, flying in self.out.items():
            kept = []
            for s, sent in flying:
                if s in done:
                    code = s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                    if code in (0, errno.ECONNREFUSED):
                        got.append((node, sent, code == 0))
                    _reset(s)
                elif now - sent > PROBE_TIMEOUT:
                    s.close()
                else:
                    kept.append((s, sent))
            flying[:] = kept
        return now, got

    def forget(self, node: int) -> None:
        """Drop the probes of ``node`` in flight (it was found lost)."""
        for s, _ in self.out.pop(node, []):
            s.close()

    def close(self) -> None:
        for node in list(self.out):
            self.forget(node)


def _reset(s: socket.socket) -> None:
    """Close a probe's socket with a reset: its handshake, held as a request by the probe port
    (``TCP_DEFER_ACCEPT``), is dropped there, never queued for the agent to accept."""
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, LINGER_RESET)
    except OSError:
        pass
    s.close()
