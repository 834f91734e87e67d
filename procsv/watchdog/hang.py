"""The watchdog's hang decision, a pure function of timestamps (no clock of its own).

Runs in the watchdog. The trainer reports progress after every step (throttled to 100 ms); a
trainer that has been silent for longer than its timeout is hung. Before its first step the
longer ``startup_timeout`` applies (import, restore and tf.function tracing happen then); while
the trainer says it is busy on purpose (its final checkpoint) the clock does not run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class HangLimits:
    hang_timeout: Optional[float]  # None or <= 0: hang detection off
    startup_timeout: Optional[float]


def hang_reason(now: float, *, started: float, last_progress: Optional[float], busy: bool,
                limits: HangLimits) -> Optional[str]:
    """A one-line reason if the trainer is hung at ``now``, else None."""
    if busy:
        return None
    if last_progress is None:
        limit = limits.startup_timeout
        if limit and limit > 0 and now - started > limit:
            return f"no first step within --startup-timeout {limit:g} s of its start"
        return None
    limit = limits.hang_timeout
    if limit and limit > 0 and now - last_progress > limit:
        return f"no step completed for {now - last_progress:.1f} s (--hang-timeout {limit:g} s)"
    return None
