"""Whether a logdir's event files already hold events at or after a step: what a session's
``SessionLog START`` would purge in TensorBoard's reading. Pure reads of the logdir (the trainer asks
it when a session starts that neither restored nor restarted: a relaunch whose checkpoint was deleted
re-runs steps that earlier event files hold); runs in the trainer process.

Only each record's framing and the head of its ``Event`` are read (``pread``, never the payload):
``wall_time`` (field 1, a double) and ``step`` (field 2, a varint) come first in a serialized Event.
A torn last record (a service killed mid-write) ends the reading of its file, as it ends TensorBoard's.
"""

from __future__ import annotations

import os
import re
import struct
from typing import Optional

_EVENT_FILE = re.compile(r"^events\.out\.tfevents\.")
_HEAD = 24  # bytes of an Event read: wall_time (9) and a step varint (at most 11)


def event_step(head: bytes) -> Optional[int]:
    """The ``step`` of a serialized Event from its first bytes (0 when it has none, as proto3 omits a
    zero); None when the bytes are not an Event's head."""
    pos = 0
    if head[:1] == b"\x09":  # wall_time
        pos = 9
    if head[pos:pos + 1] != b"\x10":  # no step field: step 0
        return 0 if pos <= len(head) else None
    value, shift, pos = 0, 0, pos + 1
    while pos < len(head) and shift < 64:
        byte = head[pos]
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value - (1 << 64) if value >= 1 << 63 else value
        pos, shift = pos + 1, shift + 7
    return None


def _file_holds(path: str, step: int) -> bool:
    """Does the event file at ``path`` hold a whole record of an Event at ``step`` or later?"""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        size, pos = os.fstat(fd).st_size, 0
        while pos + 12 <= size:
            head = os.pread(fd, 12 + _HEAD, pos)
            length = struct.unpack("<Q", head[:8])[0]
            end = pos + 12 + length + 4
            if end > size:  # a torn last record: TensorBoard stops reading here
                return False
            got = event_step(head[12:12 + min(length, _HEAD)])
            if got is not None and got >= step:
                return True
            pos = end
        return False
    finally:
        os.close(fd)


def logged_at_or_after(logdir: str, step: int) -> bool:
    """Does any event file in ``logdir`` hold an event at ``step`` or later (one a ``SessionLog START``
    at ``step`` makes TensorBoard discard)?"""
    try:
        names = os.listdir(logdir)
    except OSError:
        return False
    return any(_file_holds(os.path.join(logdir, n), step) for n in sorted(names) if _EVENT_FILE.match(n))
