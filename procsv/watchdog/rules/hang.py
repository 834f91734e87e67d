"""The watchdog's hang decision, a pure function of timestamps (no clock of its own).

Runs in the watchdog. The trainer reports progress after every step (throttled to 100 ms); a
trainer that has been silent for longer than its timeout is hung. Before its first step the
longer ``startup_timeout`` applies (import, restore and tf.function tracing happen then); while
the trainer says it is busy on purpose (a snapshot, its final checkpoint) the longer
``busy_timeout`` applies instead, so a trainer stuck in a snapshot copy is still caught. A trainer
that reports, before its first step, that it is reading its input again (``Busy.INPUT``: a resumed
Keras ``fit`` drawing earlier epochs, which may take longer than any fixed start-up allowance) gets
``startup_timeout`` from each such report instead of from its start. A report before the first step
that is not busy (the end of a TF1 Supervisor's start-up checkpoint, taken as its session becomes
ready: ``Progress.stepped`` False) leaves ``startup_timeout`` on, from the start.

:func:`hang_actions` is rule 4 of the decision function (:func:`procsv.watchdog.rules.decide.decide`
composes it): a hung trainer gets SIGTERM, then SIGKILL once its grace (``hang_kill_at``) passed.
"""

from __future__ import annotations

import signal

from dataclasses import dataclass
from typing import Optional

from procsv.ipc.message_base import Busy
from procsv.watchdog.rules.actions import Action, Cause, Kill, Signal
from procsv.watchdog.rules.state import ChildView, RunView


@dataclass(frozen=True)
class HangLimits:
    """How long a trainer may go without a step: running, starting up, and busy on purpose."""

    hang_timeout: Optional[float]  # None or <= 0: hang detection off
    startup_timeout: Optional[float]
    busy_timeout: Optional[float] = None  # while busy on purpose (None or <= 0: no limit)


def hang_reason(now: float, *, started: float, last_progress: Optional[float], busy: str, stepped: bool,
                limits: HangLimits) -> Optional[str]:
    """A one-line reason if the trainer is hung at ``now``, else None. ``busy`` names what the
    trainer said it is busy with since ``last_progress`` ("" if it is not); ``stepped``: its first
    step was seen (a report before it, the start-up checkpoint's snapshot, leaves the start-up limit on)."""
    if last_progress is None or (not busy and not stepped):
        limit, secs, why = limits.startup_timeout, now - started, "no first step within --startup-timeout {limit:g} s of its start"
    elif busy == Busy.INPUT:  # still before the first step: its limit, per report
        limit, secs, why = limits.startup_timeout, now - last_progress, \
            "no progress putting back fit's input for {secs:.1f} s (--startup-timeout {limit:g} s)"
    elif busy:
        limit, secs, why = limits.busy_timeout, now - last_progress, "busy with {busy} for {secs:.1f} s (limit {limit:g} s)"
    else:
        limit, secs, why = limits.hang_timeout, now - last_progress, \
            "no step completed for {secs:.1f} s (--hang-timeout {limit:g} s)"
    return why.format(busy=busy, secs=secs, limit=limit) if limit and limit > 0 and secs > limit else None


def hang_actions(view: RunView, t: ChildView, now: float, limits: HangLimits) -> list[Action]:
    """Rule 4: a trainer that makes no progress."""
    if not t.live or t.ending_at is not None or view.stop_signal is not None:
        return []  # (an attempt whose end came in is observed as ended within a bound: not hung)
    if t.hang_kill_at is not None:
        return [Kill(t.slot, t.attempt, Cause.HANG)] if now >= t.hang_kill_at else []
    if t.hang_cause:
        return []
    reason = hang_reason(now, started=t.started, last_progress=t.last_progress_at, busy=t.busy,
                         stepped=t.first_step_at is not None, limits=limits)
    return [] if reason is None else [Signal(t.slot, t.attempt, signal.SIGTERM, Cause.HANG, reason)]
