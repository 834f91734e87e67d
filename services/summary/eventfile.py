"""One append-only TensorBoard event file, as the summary service writes it.

Runs in the summary service process. Every :meth:`EventFile.write` is one ``os.write`` (no
user-space buffer), so what was written survives a crash of the service; :meth:`sync` makes it
durable against a crash of the machine. Each service process starts its own file, named so that
it sorts after every event file already in the logdir: TensorBoard reads a run's files in name
order, and its ``SessionLog START`` purge needs the restarted service's events read last.

On a full disk (or any other refused write) :meth:`EventFile.write` raises ``OSError`` and leaves
the file as it was: a record the kernel took only in part is cut off again, so the file never
holds a torn record that would end TensorBoard's reading of it. The file-version record that
did not fit when the file was made is written before the next record that does.
"""

from __future__ import annotations

import os
import struct
import time
from typing import Optional

from procsv.common.eventnames import continued_file, next_file_name
from procsv.common.layout import fsync_dir
from procsv.services.summary.records import file_version_event, frame

def whole_records(fd: int) -> int:
    """The length of the file's leading whole records (TFRecord framing: length, its CRC, data, CRC)."""
    size, pos = os.fstat(fd).st_size, 0
    while pos + 12 <= size:
        head = os.pread(fd, 8, pos)
        if len(head) < 8 or pos + 12 + struct.unpack("<Q", head)[0] + 4 > size:
            break
        end = pos + 12 + struct.unpack("<Q", head)[0] + 4
        pos = end
    return pos


class EventFile:
    """A new event file in ``logdir``, opened for appending; starts with its file-version event. With
    ``continue_tag`` (a summary writer kept open across a plain python run's sessions: its earlier
    service's tag), that service's file is continued instead when it is the newest, cut back to its
    whole records (:func:`continued_file`)."""

    def __init__(self, logdir: str, tag: str, continue_tag: Optional[str] = None) -> None:
        os.makedirs(logdir, exist_ok=True)
        now = time.time()
        old = continued_file(logdir, continue_tag) if continue_tag else None
        self.path = old or os.path.join(logdir, next_file_name(logdir, now, tag))
        flags = os.O_APPEND | (os.O_RDWR if old else os.O_WRONLY | os.O_CREAT | os.O_EXCL)  # (read: its records)
        self._fd: Optional[int] = os.open(self.path, flags, 0o644)
        self._dirty = False
        self._size = whole_records(self._fd) if old else 0  # bytes of whole records in the file
        if old:
            os.ftruncate(self._fd, self._size)
        self._header: bytes = b"" if old else frame(file_version_event(now))  # before the first record that fits
        try:
            self.write(b"")
            self.sync()
            fsync_dir(logdir)
        except OSError:  # a full disk: the service runs on, and writes the header when there is room
            pass

    def write(self, data: bytes) -> None:
        """Append ``data`` (whole records) with as few ``os.write`` calls as the kernel allows.

        Raises ``OSError`` when the kernel refuses (ENOSPC, EIO); the file is then cut back to its
        last whole record, and ``data`` is not in it."""
        if self._fd is None or not (data or self._header):
            return
        data = self._header + data
        view = memoryview(data)
        try:
            while view:
                n = os.write(self._fd, view)
                view = view[n:]
        except OSError:
            if len(view) != len(data):  # part of it went in: cut it off again
                try:
                    os.ftruncate(self._fd, self._size)
                except OSError:
                    pass
            raise
        self._size += len(data)
        self._header = b""
        self._dirty = True

    def sync(self) -> None:
        """fsync if anything was written since the last sync; raises ``OSError`` as fsync does."""
        if self._fd is not None and self._dirty:
            os.fsync(self._fd)
            self._dirty = False

    def close(self) -> None:
        """Sync (an error doing so is raised after the file is closed) and close."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            try:
                if self._dirty:
                    os.fsync(fd)
            finally:
                os.close(fd)
