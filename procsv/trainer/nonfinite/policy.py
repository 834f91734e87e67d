"""The ``--on-nonfinite`` policy and its bounds, as plain values: no clock, no TensorFlow.

Runs in the trainer (and its parsing in ``procsv launch``). ``rollback`` restores the newest finite
snapshot and skips the poisoned step; ``stop`` stops in order with exit code 4; ``continue`` trains
on (procsv only never commits a poisoned state). :class:`SkipBudget` is the bound on skipped steps:
more than ``max_skips`` within ``skip_window`` steps stops the run with exit code 4.
:class:`RestoreBound` is the other bound: a snapshot that turns non-finite within
:data:`RESTORE_WINDOW` steps of each of :data:`RESTORE_LIMIT` restores, at steps that were not skipped,
stops it too.
:func:`in_place_refusal` says why a member of a trainer group cannot roll back in place;
:func:`member_checks_at_end` whether a member other than the chief checks its kept losses at its end.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Optional, Sequence

DEFAULT_MAX_SKIPS = 3
DEFAULT_SKIP_WINDOW = 1000
RESTORE_WINDOW = 10  # steps after a restore within which a non-finite loss counts against the snapshot restored
RESTORE_LIMIT = 3  # restores of one snapshot, each followed by that, before the run is diverging


class OnNonfinite(str, enum.Enum):
    """What the trainer does when it finds a non-finite loss or state."""

    ROLLBACK = "rollback"
    STOP = "stop"
    CONTINUE = "continue"


def parse(value: Optional[str], default: OnNonfinite) -> OnNonfinite:
    """``value`` (None: ``default``) as a policy; anything else raises ValueError with one clear line."""
    if value is None or value == "":
        return default
    try:
        return OnNonfinite(value)
    except ValueError:
        raise ValueError(f"on_nonfinite must be one of rollback, stop, continue, not {value!r}") from None


def in_place_refusal(members: int, ps: int) -> str:
    """Why ``rollback`` cannot restore in place in a trainer of a group of ``members`` trainers with
    ``ps`` parameter servers ("" if it can: a single trainer; a ``--ps`` task is left as it was, its
    variables are not mirrored). In a MultiWorkerMirroredStrategy group every member holds its own copy of
    the variables and every step is a collective: a chief that restored and replayed alone would
    train out of lock with the others (members on different states, or a hang in a collective).
    A non-empty answer marks a group's member: it asks for the group's rollback instead
    (:meth:`procsv.trainer.nonfinite.group_ask.GroupAsk.ask`)."""
    if members <= 1 or ps > 0:
        return ""
    return (f"rollback in place is not available in a trainer group ({members} members under "
            "MultiWorkerMirroredStrategy: one member restoring and replaying alone would train out of lock with "
            "the others); relaunch with --on-nonfinite continue to train on, or fix the input and relaunch: the "
            "group resumes from the newest committed checkpoint")


def member_checks_at_end(policy: OnNonfinite, on_its_own: bool) -> bool:
    """Whether a trainer group's member other than the chief checks the losses it kept since its last
    check at its session's end (``on_its_own``: the session ended with no signal and no error: the loop
    finished, or the program stopped it). The chief's final checkpoint checks the chief's losses only,
    so a member's own non-finite loss of a step after its last group snapshot step (the last step, say)
    is found there or nowhere. ``rollback``: at any end (a NaN in its batch, whose gradient reached every
    member, makes its own step the one the group skips, though a peer's report of the next came first).
    ``stop``: at an end of its own only; otherwise a member that found one has stopped the group already
    (this member's collective broke, or the watchdog's SIGTERM came), and a second report says nothing
    new. ``continue``: never (it would train on; the member has nothing to commit)."""
    return policy == OnNonfinite.ROLLBACK or (policy == OnNonfinite.STOP and on_its_own)


@dataclass
class SkipBudget:
    """The steps skipped so far, and whether one more is within ``max_skips`` per ``skip_window`` steps."""

    max_skips: int = DEFAULT_MAX_SKIPS
    skip_window: int = DEFAULT_SKIP_WINDOW
    skipped: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.max_skips < 0:
            raise ValueError(f"max_skips must be >= 0, not {self.max_skips}")
        if self.skip_window < 1:
            raise ValueError(f"skip_window must be >= 1, not {self.skip_window}")

    def allows(self, step: int) -> bool:
        """Skipping ``step`` keeps within the bound: at most ``max_skips`` skips in the window of
        ``skip_window`` steps that ends at ``step`` (``step`` counted)."""
        return len(self.recent(step)) + 1 <= self.max_skips

    def recent(self, step: int) -> list[int]:
        """The skipped steps within the window that ends at ``step``."""
        return [s for s in self.skipped if step - s < self.skip_window]

    def skip(self, step: int) -> None:
        self.skipped.append(step)

    def first_refused(self, steps: Sequence[int]) -> Optional[int]:
        """The first of ``steps`` (ascending) whose skip, after those before it, would break the bound
        (None: every one is within it; a step skipped already costs nothing more)."""
        trial = SkipBudget(self.max_skips, self.skip_window, list(self.skipped))
        for step in steps:
            if step in trial.skipped:
                continue
            if not trial.allows(step):
                return step
            trial.skip(step)
        return None

    def refusal(self, step: int) -> str:
        """Why skipping ``step`` breaks the bound (one line; said where :meth:`allows` says no)."""
        return (f"step {step} would be skip {len(self.recent(step)) + 1} within {self.skip_window} steps "
                f"(--max-skips {self.max_skips}; skipped so far: {', '.join(map(str, self.skipped)) or 'none'})")


@dataclass
class RestoreBound:
    """Whether the snapshots rolled back to keep turning non-finite: ``last`` is the step of the
    snapshot restored last (None: none yet), ``found`` the bad steps each snapshot led to within
    ``window`` steps of a restore of it, and not skipped. The retry and the skip of one bad step
    restore the same snapshot twice for one finding: a bad step counts once per snapshot. A step
    skipped (non-finite again when retried: its input's, or its gradient's) leaves this bound for
    :class:`SkipBudget` (:meth:`skipped`): the two never judge one finding, so three bad inputs within
    the window are three skips, which ``--max-skips 3`` allows; what this bound stops is a snapshot
    whose restores keep turning non-finite at steps that are finite when retried."""

    window: int = RESTORE_WINDOW
    limit: int = RESTORE_LIMIT
    last: Optional[int] = None
    found: dict[int, list[int]] = field(default_factory=dict)

    def restored(self, step: int) -> None:
        """The snapshot of ``step`` was just restored."""
        self.last = step

    def turned(self, bad: int) -> list[int]:
        """A non-finite loss at step ``bad`` was found since the last restore: the bad steps the
        restored snapshot led to within the window (this one counted; empty: outside the window,
        or nothing restored yet)."""
        if self.last is None or not 0 < bad - self.last <= self.window:
            return []
        steps = self.found.setdefault(self.last, [])
        if bad not in steps:
            steps.append(bad)
        return list(steps)

    def shown_by(self, shown: int, poisoned: int) -> None:
        """The bad step ``shown`` only showed what step ``poisoned`` did (a non-finite gradient with a
        finite loss, found by the bisect): one finding, counted as ``poisoned`` alone."""
        for steps in self.found.values():
            if shown in steps:
                steps.remove(shown)

    def skipped(self, step: int) -> None:
        """Step ``step`` was skipped: :class:`SkipBudget` counts it; no snapshot's finding any more."""
        for steps in self.found.values():
            if step in steps:
                steps.remove(step)

    def exceeded(self, bad: int) -> Optional[str]:
        """:meth:`turned`, and why the run is diverging if the snapshot reached the limit (None: not)."""
        steps = self.turned(bad)
        if len(steps) < self.limit:
            return None
        return (f"the snapshot of step {self.last} turned non-finite within {self.window} steps of each of "
                f"{len(steps)} restores (at steps {', '.join(map(str, steps))})")
