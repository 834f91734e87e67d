"""The names of a logdir's event files (``events.out.tfevents.<T>.<host>.<tag>``): the next one's,
and the one a summary writer kept open across sessions continues. Pure reads of the logdir, shared by
the summary service (which writes the files) and the trainer (which says which file its service
continued); runs in either process.
"""

from __future__ import annotations

import os
import re
import socket
from typing import Optional

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


def continued_file(logdir: str, tag: str) -> Optional[str]:
    """The event file tagged ``tag`` (an earlier summary service's) when it is the newest in ``logdir``:
    one that a writer kept open across sessions continues (appending to an older one would put its
    events before a later file's in TensorBoard's reading order); None otherwise."""
    try:
        names = sorted(n for n in os.listdir(logdir) if _STAMP.match(n))
    except FileNotFoundError:
        return None
    return os.path.join(logdir, names[-1]) if names and names[-1].endswith("." + tag) else None
