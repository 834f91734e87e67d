"""Length-prefixed messages on a pipe: how the watchdog and the zygote (the pre-warmed trainer) talk.

Run in the watchdog and in the zygote. ZeroMQ is deliberately not used there: the zygote forks
trainers, and a forked child must not inherit a live ZeroMQ context. Each message is the JSON
header frame of :func:`procsv.ipc.codec.encode` (no payload frames) behind a 4-byte big-endian
length.
"""

from __future__ import annotations

import os
import select
import struct
from typing import Optional

from procsv.ipc.codec import decode, encode
from procsv.ipc.messages import Message

_LEN = struct.Struct(">I")
MAX_PIPE_MESSAGE = 16 << 20


def framed(msg: Message) -> bytes:
    """One message as it goes on the pipe: the length, then the JSON header (no payload frames)."""
    data: bytes = encode(msg)[0]
    return _LEN.pack(len(data)) + data


def write_framed(fd: int, msg: Message) -> None:
    """Write one message (JSON header only, no payload frames) to a blocking pipe."""
    view = memoryview(framed(msg))
    while view:
        n = os.write(fd, view)
        view = view[n:]


def read_one_framed(fd: int) -> Optional[Message]:
    """One message from ``fd``, waiting for it (None at EOF before it is whole); never reads a byte
    past it, so what follows on the pipe is left for whoever reads next (a zygote seed's
    :class:`~procsv.ipc.messages.ZygoteStart`, then its zygote's :class:`FramedReader`)."""
    head = _read_exactly(fd, _LEN.size)
    if head is None:
        return None
    (n,) = _LEN.unpack(head)
    if n > MAX_PIPE_MESSAGE:
        raise EOFError(f"message of {n} bytes on the pipe: stream is corrupt")
    data = _read_exactly(fd, n)
    return None if data is None else decode([data])[0]


def _read_exactly(fd: int, n: int) -> Optional[bytes]:
    got = b""
    while len(got) < n:
        select.select([fd], [], [])
        try:
            chunk = os.read(fd, n - len(got))
        except BlockingIOError:
            continue
        if not chunk:
            return None
        got += chunk
    return got


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
