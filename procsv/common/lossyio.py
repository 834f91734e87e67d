"""Output a full disk cannot turn into a crash: the stdout and stderr of procsv's services and trainer.

Runs in the checkpoint and the summary service and in the trainer (installed first thing by their
``__main__``). Their stdout and stderr are appended to ``logs/<role>.<attempt>.log`` in the
logdir, so when that filesystem is full every ``print`` raises ``OSError`` (ENOSPC) -- even the
one in the ``except`` clause that reports a failed save, and the service died of its own report,
was restarted, died again and the crash-loop limit ended the run with exit 1; the trainer (and
its standby) died of its program's or procsv's own line (exit 70) and was restarted. :func:`install`
replaces both streams with line-buffered writers that send each line with ``os.write`` to the
same file descriptor and drop (and count) what the kernel refuses.
"""

from __future__ import annotations

import io
import os
import sys
from typing import Any


class LossyFd(io.RawIOBase):
    """A raw writer on a file descriptor it does not own: a write the kernel refuses is dropped,
    counted in :attr:`lost` (bytes), and reported as written."""

    def __init__(self, fd: int) -> None:
        super().__init__()
        self._fd = fd
        self.lost = 0

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._fd

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        total = len(view)
        try:
            while view:
                view = view[os.write(self._fd, view):]
        except OSError:
            self.lost += len(view)
        return total


def install() -> None:
    """Make this process's ``sys.stdout`` and ``sys.stderr`` lossy (:class:`LossyFd`), line-buffered."""
    for name, fd in (("stdout", 1), ("stderr", 2)):
        stream = io.TextIOWrapper(io.BufferedWriter(LossyFd(fd)), encoding="utf-8", errors="backslashreplace",
                                  line_buffering=True, write_through=True)
        setattr(sys, name, stream)
