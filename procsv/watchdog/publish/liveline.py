"""The live status line that ``procsv launch`` keeps at the bottom of a terminal.

Runs in the watchdog, and only when its stdout is a terminal and ``--quiet`` is not given
(:func:`wanted`). The loop feeds :class:`LiveLine` what it observes (each ``Progress``, each
lifecycle event) and asks it once a round for a line; it answers at most every
:data:`DRAW_EVERY` seconds of the injected clock (:func:`due`), so the loop pays a few string
formats a second. Drawing is not done here: :class:`procsv.watchdog.publish.output.Terminal`'s writer
thread erases the line, prints the output that scrolls above it, and draws the newest line again,
so a terminal that stops reading never blocks the loop (redraws are dropped, not queued).

Decisions are pure functions of plain values: :func:`due` (the throttle), :func:`event_text` (the
short text of a lifecycle event), :func:`format_line` (the line, cut to the terminal's width).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from procsv.watchdog.publish.events import Event
from procsv.watchdog.publish.series import rate

DRAW_EVERY = 0.25  # seconds between redraws at most
RATE_WINDOW = 5.0  # seconds of progress the steps/s figure averages over
_RATE_POINTS = 128  # progress points kept for it (Progress comes at most every 100 ms)


def wanted(quiet: bool, isatty: bool) -> bool:
    """The live line is drawn on a terminal only, and not with ``--quiet``."""
    return isatty and not quiet


def due(now: float, last_draw: Optional[float]) -> bool:
    """True if a redraw may happen at ``now``: never before, or :data:`DRAW_EVERY` seconds after the last."""
    return last_draw is None or now - last_draw >= DRAW_EVERY


def ago(secs: float) -> str:
    """``7 s``, ``3 m 05 s``, ``2 h 14 m``."""
    s = int(max(0.0, secs))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} m {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} m"


# the short texts of the lifecycle events worth showing, filled in from the event's fields
_TEXTS = {
    Event.RESTORED: "restored step {step} in {secs:.2f} s",
    Event.INITIALIZED: "started at step {step}",
    Event.FIRST_STEP: "first step {secs_since_spawn:.2f} s after start",
    Event.CHECKPOINT_COMMITTED: "checkpoint step {step} committed in {secs:.2f} s",
    Event.CHECKPOINT_FAILED: "checkpoint step {step} failed",
    Event.CHECKPOINT_STALLED: "checkpoint service stalled: replaced",
    Event.SUMMARY_STALLED: "summary service stalled: replaced",
    Event.DEATH_NOTICED: "{role}.{attempt} died",
    Event.RESTARTING: "restarting the trainer (attempt {attempt})",
    Event.HANG_DETECTED: "trainer hung at step {step}",
    Event.CHAOS_KILL: "chaos: {signal} to the {role}",
    Event.PREEMPTED: "{signal} received: checkpointing and stopping",
    Event.GAVE_UP: "gave up",
    Event.FINISHED: "finished: {state} at step {step}",
    Event.LOGDIR_LOST: "the logdir was lost: stopping",
    Event.NONFINITE_DETECTED: "non-finite loss at step {step}",
    Event.STEP_SKIPPED: "skipped step {step} (non-finite)",
}


def event_text(event: Event, fields: Mapping[str, Any]) -> Optional[str]:
    """A short text of a lifecycle event for the line, or None for one not worth showing."""
    f = fields
    if event == Event.EXITED:
        if f.get("code") == 0 and f["role"] != "trainer":
            return None  # a service's orderly exit at the end
        how = f"killed by {f['signal']}" if "signal" in f else f"exited with code {f.get('code')}"
        return f"{f['role']}.{f['attempt']} {how}"
    if event == Event.ROLLED_BACK:
        return f"rolled back to step {f['restored_step']} ({'skipping' if f['skip'] else 'retrying'} step {f['step']})"
    text = _TEXTS.get(event)
    return None if text is None else text.format_map(f)


@dataclass(frozen=True)
class Facts:
    """What the line shows."""

    step: int
    steps_per_sec: Optional[float]
    checkpoint_age: Optional[float]  # seconds since the last commit of this launch (None: none yet)
    restarts: int
    goodput: Optional[float]
    last_event: str
    skipped: int = 0  # non-finite steps skipped (issue 41)


def format_line(facts: Facts, width: int) -> str:
    """One line, at most ``width - 1`` characters (the last column would wrap on some terminals)."""
    rate_text = "-" if facts.steps_per_sec is None else f"{facts.steps_per_sec:.1f}"
    ckpt = "none yet" if facts.checkpoint_age is None else f"{ago(facts.checkpoint_age)} ago"
    good = "-" if facts.goodput is None else f"{facts.goodput:.2f}"
    parts = [f"procsv | step {facts.step}", f"{rate_text} steps/s", f"checkpoint {ckpt}",
             f"restarts {facts.restarts}", f"goodput {good}"]
    if facts.skipped:
        parts.append(f"skipped {facts.skipped}")
    if facts.last_event:
        parts.append(facts.last_event)
    text = " | ".join(parts)
    limit = max(1, width - 1)
    return text if len(text) <= limit else text[:max(0, limit - 3)] + "..."


class LiveLine:
    """The watchdog's bookkeeping for the line: recent progress and the last event (the last commit is
    the view's, :attr:`~procsv.watchdog.rules.state.RunView.last_commit_at`, passed to :meth:`facts`)."""

    def __init__(self) -> None:
        self._progress: deque[tuple[float, int]] = deque(maxlen=_RATE_POINTS)
        self.last_event = ""
        self.last_draw: Optional[float] = None
        self.drawn_step: Optional[int] = None  # the step the last drawn line showed

    def progress(self, now: float, step: int) -> None:
        if self._progress and step < self._progress[-1][1]:
            self._progress.clear()  # a restarted trainer: the rate starts again
        self._progress.append((now, step))

    def event(self, event: Event, fields: Mapping[str, Any]) -> None:
        if event in (Event.DEATH_NOTICED, Event.EXITED) and fields.get("role") == "trainer":
            self._progress.clear()  # no steps/s while no trainer steps
        text = event_text(event, fields)
        if text is not None:
            self.last_event = text

    def facts(self, now: float, step: int, restarts: int, goodput: Optional[float], skipped: int = 0,
              committed_at: Optional[float] = None) -> Facts:  # committed_at: RunView.last_commit_at
        points = list(self._progress)
        steps_per_sec = rate(points, RATE_WINDOW) if points and now - points[-1][0] < RATE_WINDOW else None
        return Facts(step, steps_per_sec, None if committed_at is None else now - committed_at,
                     restarts, goodput, self.last_event, skipped)
