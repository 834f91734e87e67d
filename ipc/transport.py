"""ZeroMQ endpoints and socket helpers shared by every procsv process.

Every endpoint is an ``ipc://`` socket file inside the run's private runtime directory (mode 0700,
created by whoever starts the services, with ``tempfile.mkdtemp``), and :func:`bind_private` makes
each socket file 0600: only the user who launched the run can connect (connecting to a Unix
socket needs write permission on its file, and reaching it, search permission on the directory).
There is no TCP endpoint. Sockets are created with a short linger, a bounded high-water mark and
ZeroMQ's own ``MAXMSGSIZE``, a limit on each incoming frame (a larger one makes ZeroMQ drop the
connection before the frame is allocated): :data:`CONTROL_FRAME_MAX` by default,
:data:`SUMMARY_FRAME_MAX` and :data:`CHECKPOINT_FRAME_MAX` on the two services' ROUTERs, where
payload frames travel. Sends from the trainer are non-blocking. Every receive goes through
:func:`recv` with a timeout (0 for a non-blocking drain): it raises :class:`ReceiveTimeout`,
never waits forever. A request whose reply does not come by its deadline raises
:class:`NoReply` (see ``TrainerChannels.wait_save_result``).

(The watchdog <-> zygote pipe framing lives in :mod:`procsv.ipc.pipe`.)
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import AbstractSet, Any, Iterator, Optional, Sequence, cast

import zmq

from procsv.ipc.codec import ProtocolError, RejectReason, decode, encode
from procsv.ipc.messages import Message

__all__ = [
    "CHECKPOINT_FRAME_MAX", "CONTROL_FRAME_MAX", "SUMMARY_FRAME_MAX",
    "Endpoints", "NoReply", "ReceiveTimeout", "Received", "bind_private", "drain", "make_socket", "recv",
    "recv_message", "send",
]

CONTROL_FRAME_MAX = 1 << 20
"""Bytes per incoming frame on every socket but the services' ROUTERs: JSON headers only (the
largest, a ``TrainerReady`` listing skipped checkpoints, is a few KiB)."""

SUMMARY_FRAME_MAX = 96 << 20
"""On ``summary.sock``: above the trainer's 64 MiB bound on the summary payloads it keeps
(``procsv.trainer.summaries.buffer.ITEM_BYTES_MAX``; a larger image or histogram is dropped and
counted there), so no summary the trainer sends is refused."""

CHECKPOINT_FRAME_MAX = 2 << 30
"""On ``checkpoint.sock``: a frame holds one string or variant tensor (numeric tensors lie in the
shared snapshot memory), or, where no memfd can be made, one numeric tensor. 2 GiB is protobuf's
own limit for a serialized tensor (what a variant frame is); the trainer refuses to send a larger
frame (``TrainerChannels.send_snapshot``) with an error naming the tensor."""


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
    ctx: zmq.Context[Any], kind: int, *, linger_ms: int = 0, sndhwm: int = 1000, identity: Optional[bytes] = None,
    max_frame: int = CONTROL_FRAME_MAX,
) -> zmq.Socket[Any]:
    """Create a socket with procsv's defaults (bounded linger, queue and incoming frame size)."""
    sock: zmq.Socket[Any] = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, linger_ms)
    sock.setsockopt(zmq.SNDHWM, sndhwm)
    sock.setsockopt(zmq.RCVHWM, 10000)
    sock.setsockopt(zmq.MAXMSGSIZE, max_frame)
    if identity is not None:
        sock.setsockopt(zmq.IDENTITY, identity)
    return sock


def bind_private(sock: zmq.Socket[Any], endpoint: str) -> None:
    """Bind ``sock`` to an ``ipc://`` endpoint and make the socket file reachable by its owner only
    (0600, besides the runtime directory's 0700). Anything but ``ipc://`` is refused."""
    if not endpoint.startswith("ipc://"):
        raise ValueError(f"procsv binds only ipc:// endpoints in its private runtime directory, not {endpoint!r}")
    sock.bind(endpoint)
    os.chmod(endpoint[len("ipc://"):], 0o600)


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
    if timeout_ms <= 0:
        # only if one is waiting: the socket's EVENTS option answers that without building a
        # poller (sock.poll's Python side), the cost of a receive that finds nothing at a step boundary
        if not cast(int, sock.get(zmq.EVENTS)) & zmq.POLLIN:
            raise ReceiveTimeout("no message waiting")
    elif not sock.poll(timeout_ms, zmq.POLLIN):
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
    user: Optional[str] = None  # the sender's ZAP User-Id (a CURVE client's public key, Z85), when asked for


def recv_message(sock: zmq.Socket[Any], timeout_ms: int, *, routed: bool = False,
                 accept: Optional[AbstractSet[type[Message]]] = None, user: bool = False) -> Received:
    """Receive and decode one message within ``timeout_ms``; ``routed``: ``sock`` is a ROUTER
    (the first frame names the peer); ``accept``: the message classes this receiver takes (see
    :func:`~procsv.ipc.codec.decode`); ``user``: read the sender's ZAP User-Id (``Received.user``). Raises :class:`ReceiveTimeout`, or :class:`ProtocolError`
    for a malformed message (which is consumed: the next call reads the next message)."""
    frames = recv(sock, timeout_ms, copy=False)
    identity: Optional[bytes] = None
    if routed:
        if len(frames) < 2:
            raise ProtocolError("a routed message without a body", RejectReason.NO_IDENTITY)
        head = frames[0]
        identity = head.bytes if hasattr(head, "bytes") else bytes(head)
        frames = frames[1:]
    who: Optional[str] = None
    if user:
        try:
            who = str(frames[0].get("User-Id"))
        except (zmq.ZMQError, AttributeError, IndexError):  # no ZAP on this socket: nobody named
            who = None
    msg, payload = decode(frames, accept)
    return Received(msg, payload, identity, who)


def drain(sock: zmq.Socket[Any], *, first_timeout_ms: int = 0, limit: Optional[int] = None,
          routed: bool = False, accept: Optional[AbstractSet[type[Message]]] = None, user: bool = False
          ) -> Iterator[Received | ProtocolError]:
    """The messages that are waiting (after waiting up to ``first_timeout_ms`` for the first one),
    at most ``limit``; a malformed one (or one not in ``accept``) is yielded as its
    :class:`ProtocolError` for the caller to count. Never waits beyond ``first_timeout_ms``."""
    timeout = first_timeout_ms
    n = 0
    while limit is None or n < limit:
        n += 1
        try:
            yield recv_message(sock, timeout, routed=routed, accept=accept, user=user)
        except ReceiveTimeout:
            return
        except ProtocolError as exc:
            yield exc
        timeout = 0
