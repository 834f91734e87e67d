"""How often a refused non-finite snapshot is written to ``lifecycle.jsonl``: a pure rule.

Runs in the watchdog (its observation of the trainer's :class:`~procsv.ipc.messages.NonfiniteDetected`).
Under ``--on-nonfinite continue`` a non-finite state stays so, and the trainer refuses every snapshot
of it and says so each time: a ``nonfinite_detected`` record each was about 71 MB of
``lifecycle.jsonl`` a day (a save every 10 steps of 20 ms). So a trainer's detections are
coalesced: its first is written at once, then at most one record every :data:`RECORD_EVERY`
seconds, and the last when the trainer ends or acts on it (a rollback, a skipped step: :func:`ended`;
the next detection is a first again, so ``--on-nonfinite rollback`` keeps a record each). Each record is the newest detection it
stands for, with ``repeats``: how many detections it stands for (itself and the unwritten ones
since the previous record), so the records' ``repeats`` add up to every detection
(``procsv report``); ``status.json`` counts them as they come (``nonfinite_detected``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

RECORD_EVERY = 60.0  # seconds: at most one coalesced nonfinite_detected record a trainer this often


@dataclass
class NonfiniteLog:
    """The detections of one trainer (``pid``) not written yet: the newest one's record fields
    (``pending``), how many (``repeats``), and when the last record was written."""

    pid: Optional[int] = None
    written_at: float = 0.0
    pending: Optional[dict[str, Any]] = None
    repeats: int = 0


def detected(log: NonfiniteLog, pid: int, fields: dict[str, Any], now: float) -> list[dict[str, Any]]:
    """A detection (``fields`` of its record) by the trainer ``pid`` at ``now``: the records to write
    now (another trainer's unwritten last one first), none if it waits to be coalesced."""
    out = _last(log) if log.pid != pid else []
    first = log.pid != pid
    log.pid, log.pending = pid, fields
    log.repeats += 1
    if first or now - log.written_at >= RECORD_EVERY:
        log.written_at = now
        out += _last(log)
    return out


def ended(log: NonfiniteLog) -> list[dict[str, Any]]:
    """The trainer ended, or acted on its detections (a rollback, a skipped step): the record of
    those not written yet, if any; its next detection is written at once."""
    log.pid = None
    return _last(log)


def _last(log: NonfiniteLog) -> list[dict[str, Any]]:
    """The record of the detections not written yet, if any."""
    if log.pending is None:
        return []
    out = {**log.pending, "repeats": log.repeats}
    log.pending, log.repeats = None, 0
    return [out]
