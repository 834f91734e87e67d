"""ZeroMQ endpoints and socket helpers shared by every procsv process.

Every endpoint is an ``ipc://`` socket file inside the run's private runtime directory (mode 0700,
created by whoever starts the services). Sockets are created with a short linger and a bounded
high-water mark; sends from the trainer are non-blocking. Every receive goes through
:func:`recv` with a timeout (0 for a non-blocking drain): it raises :class:`ReceiveTimeout`,
never waits forever. A request whose reply does not come by its deadline raises
:class:`NoReply` (see ``TrainerChannels.wait_save_result``).

(The watchdog <-> zygote pipe framing lives in :mod:`procsv.ipc.pipe`.)
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Iterator, Optional, Sequence

import zmq

from procsv.ipc.codec import ProtocolError, decode, encode
from procsv.ipc.messages import Message

__all__ = [
    "Endpoints", "NoReply", "ReceiveTimeout", "Received", "drain", "make_socket", "recv", "recv_message", "send",

]


class ReceiveTimeout(TimeoutError):
    """No message arrived on a socket within the given timeout (for a drain: nothing is waiting)."""


class NoReply(TimeoutError):
    """A request got no reply by its deadline: the peer is gone, hung, or too slow.

    Raised by the request side (e.g. ``TrainerChannels.wait_save_result``); you get this, not
    ``None`` and not :class:`ReceiveTimeout`, which only says that one wait came back empty.
    """


@dataclass(frozen=True)
class Endpoints:
    """The socket addresses of one run, derived from its runtime directory."""

    runtime_dir: str

    @property
    def watchdog(self) -> str:
        """PULL, bound by the watchdog (or by nobody in a plain ``python train.py`` run)."""
        return f"ipc://{os.path.join(self.runtime_dir, 'watchdog.sock')}"

    @property
    def checkpoint(self) -> str:
        """ROUTER, bound by the checkpoint service; the trainer connects a DEALER."""
        return f"ipc://{os.path.join(self.runtime_dir, 'checkpoint.sock')}"

    @property
    def summary(self) -> str:
        """ROUTER, bound by the summary service; the trainer and the checkpoint service connect DEALERs
        (the service answers a trainer's batches with acks on the same connection)."""
        return f"ipc://{os.path.join(self.runtime_dir, 'summary.sock')}"


def make_socket(
    ctx: zmq.Context[Any], kind: int, *, linger_ms: int = 0, sndhwm: int = 1000, identity: Optional[bytes] = None
) -> zmq.Socket[Any]:
    """Create a socket with procsv's defaults (bounded linger and queue)."""
    sock: zmq.Socket[Any] = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, linger_ms)
    sock.setsockopt(zmq.SNDHWM, sndhwm)
    sock.setsockopt(zmq.RCVHWM, 10000)
    if identity is not None:
        sock.setsockopt(zmq.IDENTITY, identity)
    return sock


def send(sock: zmq.Socket[Any], msg: Message, payload: Sequence[Any] = (), *, block: bool = False,
         prefix: Sequence[bytes] = ()) -> bool:
    """Send ``msg``; return False instead of blocking when the peer's queue is full."""
    frames = [*prefix, *encode(msg, payload)]
    try:
        sock.send_multipart(frames, flags=0 if block else zmq.NOBLOCK, copy=False)
    except zmq.Again:
        return False
    return True


def recv(sock: zmq.Socket[Any], timeout_ms: int, *, copy: bool = True) -> list[Any]:
    """Receive one multipart message within ``timeout_ms`` (0: only if one is waiting) or raise
    :class:`ReceiveTimeout`. The one place procsv receives from a ZeroMQ socket."""
    if not sock.poll(max(0, timeout_ms), zmq.POLLIN):
        raise ReceiveTimeout(f"no message within {timeout_ms} ms")
    if copy:
        return list(sock.recv_multipart())
    return list(sock.recv_multipart(copy=False))


@dataclass(frozen=True)
class Received:
    """One decoded message; ``identity`` is the sending peer's (ROUTER sockets only, else None)."""

    msg: Message
    payload: list[Any]
    identity: Optional[bytes] = None


def recv_message(sock: zmq.Socket[Any], timeout_ms: int, *, routed: bool = False) -> Received:
    """Receive and decode one message within ``timeout_ms``; ``routed``: ``sock`` is a ROUTER
    (the first frame names the peer). Raises :class:`ReceiveTimeout`, or :class:`ProtocolError`
    for a malformed message (which is consumed: the next call reads the next message)."""
    frames = recv(sock, timeout_ms, copy=False)
    identity: Optional[bytes] = None
    if routed:
        if len(frames) < 2:
            raise ProtocolError("a routed message without a body")
        head = frames[0]
        identity = head.bytes if hasattr(head, "bytes") else bytes(head)
        frames = frames[1:]
    msg, payload = decode(frames)
    return Received(msg, payload, identity)


def drain(sock: zmq.Socket[Any], *, first_timeout_ms: int = 0, limit: Optional[int] = None,
          routed: bool = False) -> Iterator[Received | ProtocolError]:
    """The messages that are waiting (after waiting up to ``first_timeout_ms`` for the first one),
    at most ``limit``; a malformed one is yielded as its :class:`ProtocolError` for the caller to
    report or ignore. Never waits beyond ``first_timeout_ms``."""
    timeout = first_timeout_ms
    n = 0
    while limit is None or n < limit:
        n += 1
        try:
            yield recv_message(sock, timeout, routed=routed)
        except ReceiveTimeout:
            return
        except ProtocolError as exc:
            yield exc
        timeout = 0
