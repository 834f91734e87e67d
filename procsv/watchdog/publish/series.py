"""The global step over wall time, kept bounded for the recovery report's timeline.

Runs in the watchdog: every ``Progress`` of a completed step is offered to :class:`StepSeries`
(a ``(wall time, step)`` point, ~10 a second), and at the end of a launch its points go into
``logs/report.json`` as ``series``, which ``procsv report DIR --plot`` draws. Pure: no clock, no
I/O; the caller passes each point's time.

Bounded by halving: points are kept at least ``spacing`` seconds apart (the newest offered point is
held aside, so the series always ends at the latest step); when more than ``max_points`` are kept,
every other one is dropped and the spacing doubles. A run of any length thus keeps between
``max_points / 2`` and ``max_points`` evenly spread points, at O(1) amortised cost per offer. A step
that goes down (a restarted trainer resumed from an older checkpoint) is always kept, with the
point before it, so the timeline shows each fall back.
"""

from __future__ import annotations

from typing import Optional

MAX_POINTS = 1000
START_SPACING = 0.25  # seconds between kept points until the first halving


class StepSeries:
    """A bounded, downsampled series of ``(wall time, step)`` points."""

    def __init__(self, max_points: int = MAX_POINTS, spacing: float = START_SPACING) -> None:
        self.max_points = max_points
        self.spacing = spacing
        self._kept: list[tuple[float, int]] = []
        self._tail: Optional[tuple[float, int]] = None  # the newest point offered and not kept yet

    def add(self, t: float, step: int) -> None:
        """Offer the point ``(t, step)``."""
        last = self._kept[-1] if self._kept else None
        if last is not None and step < (self._tail or last)[1]:  # a fall back: keep the point before it
            if self._tail is not None:
                self._kept.append(self._tail)
            self._tail = None
            self._append((t, step))
        elif last is None or t - last[0] >= self.spacing:
            self._tail = None
            self._append((t, step))
        else:
            self._tail = (t, step)

    def _append(self, point: tuple[float, int]) -> None:
        self._kept.append(point)
        if len(self._kept) > self.max_points:
            halved = halve(self._kept)
            if len(halved) > self.max_points * 3 // 4:  # mostly falls back (a restart every few points)
                halved = self._kept[::2] + ([self._kept[-1]] if len(self._kept) % 2 == 0 else [])
            self._kept = halved
            self.spacing *= 2

    def points(self) -> list[tuple[float, int]]:
        """The kept points and the newest one, oldest first."""
        return self._kept + ([self._tail] if self._tail is not None else [])


def halve(points: list[tuple[float, int]]) -> list[tuple[float, int]]:
    """Every other point, always keeping the first and the last, and each point right before a
    step that goes down and the one after it (so no fall back disappears)."""
    keep = set(range(0, len(points), 2)) | {len(points) - 1}
    for i in range(1, len(points)):
        if points[i][1] < points[i - 1][1]:
            keep |= {i - 1, i}
    return [points[i] for i in sorted(keep)]


def rate(points: list[tuple[float, int]], window: float) -> Optional[float]:
    """Steps per second over the last ``window`` seconds of ``points`` (since the last fall back,
    if that is more recent); None with fewer than two points in it or no time between them."""
    if len(points) < 2:
        return None
    end_t, end_step = points[-1]
    start = len(points) - 1
    while start > 0 and points[start - 1][0] >= end_t - window and points[start - 1][1] <= points[start][1]:
        start -= 1
    t0, s0 = points[start]
    return None if end_t <= t0 else (end_step - s0) / (end_t - t0)
