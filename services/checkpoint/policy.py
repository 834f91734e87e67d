"""Pure save and retention decisions of the checkpoint service (no clock, no files).

Run in the checkpoint service. Every function takes the time it needs as an argument, so tests
drive them with plain numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

from procsv.common.manifests import Manifest


def save_due(now: float, last_save: float, save_model_secs: Optional[float]) -> bool:
    """True when a timed checkpoint is due (never when timed saving is off)."""
    return save_model_secs is not None and save_model_secs > 0 and now - last_save >= save_model_secs


@dataclass(frozen=True)
class RetentionPlan:
    """What retention keeps and deletes among the committed checkpoints, and what it newly preserves."""

    keep: list[Manifest]
    delete: list[Manifest]
    newly_preserved: list[Manifest]  # to be re-recorded with reason "preserved"
    last_preserved: float


def retention(
    committed: Sequence[Manifest],
    max_to_keep: int,
    keep_every_n_hours: Optional[float],
    last_preserved: float,
    held: frozenset[int] = frozenset(),
) -> RetentionPlan:
    """TensorFlow's rule: keep the newest ``max_to_keep``; of the older ones keep one every N hours.
    An older one whose step is in ``held`` (an audit still needs it: the watchdog's
    :class:`~procsv.ipc.messages.AuditHold`) is kept too, not preserved: the first retention after it
    leaves ``held`` deletes it.

    ``max_to_keep <= 0`` keeps everything. ``last_preserved`` is the commit time of the last
    checkpoint preserved by the every-N-hours rule (or the run's start). A preserved checkpoint
    carries reason "preserved" in its manifest and is kept for good.
    """
    ordered = sorted(committed, key=lambda m: (m.step, m.committed_at))
    if max_to_keep <= 0 or len(ordered) <= max_to_keep:
        return RetentionPlan(list(ordered), [], [], last_preserved)
    old, newest = ordered[:-max_to_keep], ordered[-max_to_keep:]
    keep_old: list[Manifest] = []
    delete: list[Manifest] = []
    newly: list[Manifest] = []
    for m in old:
        if m.reason == "preserved" or m.step in held:
            keep_old.append(m)
        elif keep_every_n_hours is not None and m.committed_at - last_preserved >= keep_every_n_hours * 3600:
            keep_old.append(m)
            newly.append(m)
            last_preserved = m.committed_at
        else:
            delete.append(m)
    return RetentionPlan(keep_old + newest, delete, newly, last_preserved)
