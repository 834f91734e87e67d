"""The checkpoint service's counters and their record, ``<logdir>/.procsv/checkpoint_stats.json``.

Runs in the checkpoint service. :class:`ServiceStats` counts the in-memory snapshots this process
held for its trainer (how many; the steps of the first and the last) and writes the record
(atomically: :func:`procsv.common.layout.write_json`) with the refused messages' counts
(:class:`~procsv.ipc.rejections.Rejections`) and a group's copies (``group``): at start, at most
every :data:`STATS_SECS` while the counts change, and at exit. ``procsv status`` shows it.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable, Optional

from procsv.common.layout import Layout, write_json
from procsv.ipc.rejections import Rejections

STATS_SECS = 1.0  # checkpoint_stats.json is rewritten at most this often while its counts change


class ServiceStats:
    """What ``checkpoint_stats.json`` says, and when it was last written (on the service's ``clock``).
    ``group`` gives the group's copies' part and how many it held; ``say`` prints a line."""

    def __init__(self, layout: Layout, rejections: Rejections, group: Callable[[], tuple[dict[str, Any], int]],
                 clock: Callable[[], float], say: Callable[[str], None]) -> None:
        self._path = layout.checkpoint_stats
        self._rejections, self._group, self._clock, self._say = rejections, group, clock, say
        self.held_count = 0  # in-memory snapshots held here for the trainer
        self.held_steps: Optional[tuple[int, int]] = None  # ... the steps of the first and the last
        self._written: Optional[tuple[int, int]] = None  # (rejections, snapshots held: any) last written
        self._next = clock()

    def held(self, step: int) -> None:
        """The service holds the trainer's in-memory snapshot of ``step``."""
        self.held_count += 1
        self.held_steps = (self.held_steps[0] if self.held_steps else step, step)

    def _counts(self) -> tuple[int, int]:
        return self._rejections.total, self.held_count + self._group()[1]

    def maybe_write(self) -> None:
        """Write the record if its counts changed and :data:`STATS_SECS` passed since the last write."""
        if self._counts() != self._written and self._clock() >= self._next:
            self.write(durable=False)

    def write(self, durable: bool) -> None:
        """Replace ``checkpoint_stats.json`` (its ``pid`` says which process the counts are of)."""
        self._next = self._clock() + STATS_SECS
        self._written = self._counts()
        first, last = self.held_steps or (None, None)
        memory = {"held": self.held_count, "first_step": first, "last_step": last}
        try:
            write_json(self._path, {"pid": os.getpid(), "rejected": self._rejections.record(),
                                    "memory": memory, "group": self._group()[0], "updated_at": time.time()},
                       durable=durable)
        except OSError as exc:
            self._say(f"procsv checkpoint: could not write {self._path}: {exc}")
