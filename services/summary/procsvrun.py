"""The TensorBoard run ``procsv``: procsv's own scalars, in ``<logdir>/procsv/``.

Runs in the summary service process (the only writer of event files). The watchdog sends
:class:`~procsv.ipc.messages.RunScalars` (restarts, recovery times, goodput, checkpoint commit
time and age) by global step; each becomes one ``Event`` in this service's own event file of the
subdirectory ``procsv`` of the logdir, with the service's count of dropped summaries added as
``procsv/summaries_dropped``. TensorBoard lists the subdirectory as a run named ``procsv`` beside
the user's run (``.``), so the two sets of charts can be laid over each other by step.

The file is created at the first message (a plain ``python train.py`` run, which has no watchdog,
gets no such folder). No ``SessionLog START`` is ever written here: after a restart the global
step goes back to the restored checkpoint's, and the points that procsv wrote past it while the
killed attempt ran stay (they describe what happened), so a series may show two values at one step.
"""

from __future__ import annotations

import math
import os
from typing import Optional

from procsv.ipc.messages import RunScalars
from procsv.services.summary import records
from procsv.services.summary.eventfile import EventFile

RUN = "procsv"  # the subdirectory of the logdir, and so the run's name in TensorBoard
DROPPED_TAG = "procsv/summaries_dropped"
TAGS_MAX = 64  # tags per message (the watchdog sends fewer than 15)


class BadRunScalars(ValueError):
    """A :class:`RunScalars` the service will not write (tags and values of different lengths, ...)."""


def check(msg: RunScalars) -> None:
    """Raise :class:`BadRunScalars` unless the message can be written as it is."""
    if len(msg.tags) != len(msg.values):
        raise BadRunScalars(f"{len(msg.tags)} tags but {len(msg.values)} values")
    if len(msg.tags) > TAGS_MAX:
        raise BadRunScalars(f"{len(msg.tags)} tags (at most {TAGS_MAX})")
    if msg.step < 0:
        raise BadRunScalars(f"negative step {msg.step}")
    for tag, value in zip(msg.tags, msg.values):
        if not tag or len(tag) > 256:
            raise BadRunScalars(f"tag {tag[:40]!r} is empty or longer than 256 characters")
        if not math.isfinite(value):
            raise BadRunScalars(f"{tag}: value {value} is not finite")


class ProcsvRun:
    """The ``procsv`` run's event file, opened at the first write."""

    def __init__(self, logdir: str, file_tag: str) -> None:
        self.folder = os.path.join(logdir, RUN)
        self._file_tag = file_tag
        self._file: Optional[EventFile] = None
        self.written = 0  # points written (one per message)

    def write(self, msg: RunScalars, dropped: int) -> None:
        """One event at ``msg.step`` holding its scalars and ``procsv/summaries_dropped`` = ``dropped``.

        Raises :class:`BadRunScalars` for a message that :func:`check` refuses (nothing is written).
        """
        check(msg)
        values = b"".join(records.scalar_summary(tag, value) for tag, value in zip(msg.tags, msg.values)
                          if tag != DROPPED_TAG)
        values += records.scalar_summary(DROPPED_TAG, float(dropped))
        if self._file is None:
            self._file = EventFile(self.folder, f"procsv-{os.getpid()}")
        self._file.write(records.frame(records.summary_event(msg.wall_time, msg.step, values)))
        self.written += 1

    def sync(self) -> None:
        if self._file is not None:
            self._file.sync()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
