"""``procsv launch --chaos SPEC``: scheduled kills for unattended crash-and-restart testing.

Runs in the watchdog. SPEC is a comma-separated list of ``key=value``:

* ``every=SECS`` -- kill every SECS seconds, or ``random=MIN:MAX`` -- after a uniformly random
  delay in [MIN, MAX] seconds (``seed=N`` makes it repeatable);
* ``target=trainer|checkpoint|summary`` (default trainer); ``signal=KILL|TERM`` (default KILL).

Delays count from the moment the target completed its first step (the trainer) or started (a
service) after the previous kill, so every attempt gets the same chance to make progress.
Parsing and scheduling are pure; the watchdog performs the kill. :func:`chaos_actions` is rule 5
of the decision function (:func:`procsv.watchdog.rules.decide.decide` composes it): arm the plan once
per attempt of the target, signal it when due, never while it is busy.
"""

from __future__ import annotations

import random
import signal
from dataclasses import dataclass
from typing import Optional

from procsv.common.errors import UsageError
from procsv.watchdog.rules.actions import Action, ArmChaos, Cause, Signal, SkipChaos
from procsv.watchdog.rules.state import TRAINER, RunView

_ROLES = ("trainer", "checkpoint", "summary")


@dataclass(frozen=True)
class ChaosPlan:
    """A parsed ``--chaos`` spec: how often (fixed or a random range), which role, which signal, the seed."""

    every: Optional[float]
    low: float
    high: float
    target: str
    signal: int
    seed: Optional[int]

    def delay(self, rng: random.Random) -> float:
        if self.every is not None:
            return self.every
        return rng.uniform(self.low, self.high)


def parse_chaos(spec: str) -> ChaosPlan:
    fields: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        key, sep, value = part.partition("=")
        if not sep or not value:
            raise UsageError(f"--chaos: {part!r} is not key=value (e.g. every=30,target=trainer)")
        fields[key.strip()] = value.strip()
    unknown = set(fields) - {"every", "random", "target", "signal", "seed"}
    if unknown:
        raise UsageError(f"--chaos: unknown key(s) {', '.join(sorted(unknown))}; use every|random|target|signal|seed")
    if ("every" in fields) == ("random" in fields):
        raise UsageError("--chaos needs exactly one of every=SECS or random=MIN:MAX")
    try:
        every = float(fields["every"]) if "every" in fields else None
        low, high = (float(x) for x in fields["random"].split(":")) if "random" in fields else (0.0, 0.0)
        seed = int(fields["seed"]) if "seed" in fields else None
    except ValueError:
        raise UsageError(f"--chaos {spec!r}: every, random and seed take numbers (random=MIN:MAX)") from None
    if (every is not None and every <= 0) or (every is None and not 0 < low <= high):
        raise UsageError(f"--chaos {spec!r}: delays must be positive and MIN <= MAX")
    target = fields.get("target", "trainer")
    if target not in _ROLES:
        raise UsageError(f"--chaos target must be one of {', '.join(_ROLES)}, not {target!r}")
    sig_name = fields.get("signal", "KILL").upper().removeprefix("SIG")
    if sig_name not in ("KILL", "TERM"):
        raise UsageError(f"--chaos signal must be KILL or TERM, not {fields['signal']!r}")
    return ChaosPlan(every, low, high, target, getattr(signal, "SIG" + sig_name), seed)


def chaos_actions(view: RunView, now: float, plan: Optional[ChaosPlan]) -> list[Action]:
    """Rule 5: scheduled kills, armed once per attempt of the target."""
    if plan is None or view.stop_signal is not None:
        return []
    victim = view.children.get(plan.target)
    current = victim is not None and victim.live and view.chaos_armed_for == (victim.slot, victim.attempt)
    if victim is not None and victim.live and not current:
        since = victim.first_step_at if victim.role == TRAINER else victim.started
        if since is not None:  # a new attempt is ready: its own schedule replaces any earlier one
            return [ArmChaos(victim.slot, victim.attempt, since + view.chaos_next_delay)]
    if view.chaos_at is None or now < view.chaos_at:
        return []
    if victim is None or not current:
        return [SkipChaos(plan.target)]  # its attempt is gone
    if victim.busy:
        return []  # never while it snapshots or writes its final checkpoint: when it is done
    return [Signal(victim.slot, victim.attempt, plan.signal, Cause.CHAOS)]
