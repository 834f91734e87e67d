"""ZeroMQ endpoints and socket helpers shared by every procsv process.

Every endpoint is an ``ipc://`` socket file inside the run's private runtime directory (mode 0700,
created by whoever starts the services). Sockets are created with a short linger and a bounded
high-water mark; sends from the trainer are non-blocking; every receive is bounded by a timeout
(:func:`recv` raises :class:`ReceiveTimeout`, never waits forever).
"""

from __future__ import annotations

import os
import select
import struct
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import zmq

from procsv.ipc.codec import decode, encode
from procsv.ipc.messages import Message


class ReceiveTimeout(TimeoutError):
    """No message arrived on a socket within the given timeout."""


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
        """PULL, bound by the summary service; the trainer and checkpoint service PUSH to it."""
        return f"ipc://{os.path.join(self.runtime_dir, 'summary.sock')}"


def make_socket(
    ctx: zmq.Context, kind: int, *, linger_ms: int = 0, sndhwm: int = 1000, identity: Optional[bytes] = None
) -> zmq.Socket:
    """Create a socket with procsv's defaults (bounded linger and queue)."""
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, linger_ms)
    sock.setsockopt(zmq.SNDHWM, sndhwm)
    sock.setsockopt(zmq.RCVHWM, 10000)
    if identity is not None:
        sock.setsockopt(zmq.IDENTITY, identity)
    return sock


def send(sock: zmq.Socket, msg: Message, payload: Sequence[Any] = (), *, block: bool = False,
         prefix: Sequence[bytes] = ()) -> bool:
    """Send ``msg``; return False instead of blocking when the peer's queue is full."""
    frames = [*prefix, *encode(msg, payload)]
    try:
        sock.send_multipart(frames, flags=0 if block else zmq.NOBLOCK, copy=False)
    except zmq.Again:
        return False
    return True


def recv(sock: zmq.Socket, timeout_ms: int, *, copy: bool = True) -> list[Any]:
    """Receive one multipart message within ``timeout_ms`` or raise :class:`ReceiveTimeout`."""
    if not sock.poll(timeout_ms, zmq.POLLIN):
        raise ReceiveTimeout(f"no message within {timeout_ms} ms")
    return sock.recv_multipart(copy=copy)


def recv_message(sock: zmq.Socket, timeout_ms: int) -> tuple[Message, list[Any]]:
    """Receive and decode one message within ``timeout_ms``."""
    return decode(recv(sock, timeout_ms, copy=False))


# ---------------------------------------------------------------------------------------------
# Length-prefixed messages on a pipe (watchdog <-> zygote). ZeroMQ is deliberately not used there:
# the zygote forks trainers, and a forked child must not inherit a live ZeroMQ context.

_LEN = struct.Struct(">I")
MAX_PIPE_MESSAGE = 16 << 20


def write_framed(fd: int, msg: Message) -> None:
    """Write one message (JSON header only, no payload frames) to a blocking pipe."""
    data = encode(msg)[0]
    view = memoryview(_LEN.pack(len(data)) + data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


class FramedReader:
    """Reads length-prefixed messages from a non-blocking pipe; EOF raises EOFError."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._buf = bytearray()
        os.set_blocking(fd, False)

    def read_available(self) -> list[Message]:
        """Every complete message readable now (never blocks)."""
        while True:
            try:
                chunk = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                break
            if not chunk:
                if not self._buf:
                    raise EOFError("pipe closed")
                break
            self._buf += chunk
        out: list[Message] = []
        while len(self._buf) >= _LEN.size:
            (n,) = _LEN.unpack_from(self._buf)
            if n > MAX_PIPE_MESSAGE:
                raise EOFError(f"message of {n} bytes on the pipe: stream is corrupt")
            if len(self._buf) < _LEN.size + n:
                break
            data = bytes(self._buf[_LEN.size:_LEN.size + n])
            del self._buf[:_LEN.size + n]
            out.append(decode([data])[0])
        return out

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the pipe to become readable."""
        ready, _, _ = select.select([self.fd], [], [], max(0.0, timeout))
        return bool(ready)
