"""One append-only TensorBoard event file, as the summary service writes it.

Runs in the summary service process. Every :meth:`EventFile.write` is one ``os.write`` (no
user-space buffer), so what was written survives a crash of the service; :meth:`sync` makes it
durable against a crash of the machine. Each service process starts its own file, named so that
it sorts after every event file already in the logdir: TensorBoard reads a run's files in name
order, and its ``SessionLog START`` purge needs the restarted service's events read last.
"""

from __future__ import annotations

import os
import re
import socket
import time
from typing import Optional

from procsv.common.layout import fsync_dir
from procsv.services.summary.records import file_version_event, frame

_STAMP = re.compile(r"^events\.out\.tfevents\.(\d+)\.")


def next_file_name(logdir: str, now: float, tag: str) -> str:
    """``events.out.tfevents.<T>.<host>.<tag>`` with ``T`` later than every existing file's."""
    newest = 0
    try:
        names = os.listdir(logdir)
    except FileNotFoundError:
        names = []
    for name in names:
        m = _STAMP.match(name)
        if m:
            newest = max(newest, int(m.group(1)))
    stamp = max(int(now), newest + 1)
    return f"events.out.tfevents.{stamp:010d}.{socket.gethostname()}.{tag}"


class EventFile:
    """A new event file in ``logdir``, opened for appending; starts with its file-version event."""

    def __init__(self, logdir: str, tag: str) -> None:
        os.makedirs(logdir, exist_ok=True)
        now = time.time()
        self.path = os.path.join(logdir, next_file_name(logdir, now, tag))
        self._fd: Optional[int] = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
        self._dirty = False
        self.write(frame(file_version_event(now)))
        self.sync()
        fsync_dir(logdir)

    def write(self, data: bytes) -> None:
        """Append ``data`` (whole records) with as few ``os.write`` calls as the kernel allows."""
        if not data or self._fd is None:
            return
        view = memoryview(data)
        while view:
            n = os.write(self._fd, view)
            view = view[n:]
        self._dirty = True

    def sync(self) -> None:
        """fsync if anything was written since the last sync."""
        if self._fd is not None and self._dirty:
            os.fsync(self._fd)
            self._dirty = False

    def close(self) -> None:
        if self._fd is not None:
            self.sync()
            os.close(self._fd)
            self._fd = None
