"""The goodput breakdown as it was before issue 66 made it linear: a frozen copy of
``procsv.goodput.breakdown`` at fcdd1d3, which for each attempt searched the attempts after it (a
slice, copied) for the next one that restored: quadratic in attempts. Kept as the oracle the
linear one is compared with (``tests/test_goodput_linear_pure.py``) and timed against
(``scripts/bench_goodput.py``), and :func:`random_launch`, the seeded generator of launches both use.
Imported by tests and the benchmark only; nothing in procsv imports it.
"""

from __future__ import annotations

import random
from typing import Optional

from procsv.goodput import Attempt, Breakdown, Launch


def _span(a: float, b: Optional[float]) -> float:
    return 0.0 if b is None else max(0.0, b - a)


def breakdown_quadratic(launch: Launch, restored_after: Optional[int] = None) -> Breakdown:
    """Split ``launch``'s wall time into :data:`KINDS`. ``restored_after``: the step the next
    launch of the logdir restored (its re-done steps count against this launch)."""
    out = Breakdown(wall=max(0.0, launch.end - launch.start))
    s = out.secs
    cursor = launch.start  # every second before it has its kind
    atts = launch.attempts
    for i, a in enumerate(atts):
        nxt = next((b for b in atts[i + 1:] if b.ready is not None), None)
        keep_below = nxt.restored_step if nxt is not None else restored_after
        born = min(max(a.spawned, cursor), launch.end)
        s["startup" if i == 0 else "restart"] += born - cursor
        end = min(max(a.ended if a.ended is not None else launch.end, born), launch.end)

        def clip(t: Optional[float]) -> Optional[float]:
            return None if t is None else min(max(t, born), end)

        ready, first, last = clip(a.ready), clip(a.first_step), clip(a.last_at)
        if ready is None:  # not recorded: start-up to its first step (if any), as after a restore
            s["startup"] += (first if first is not None else end) - born
        else:
            restore = min(a.restore_secs, ready - born)
            s["startup"] += ready - born - restore
            s["restoring"] += restore
            s["startup"] += _span(ready, first if first is not None else end)
        if first is not None:
            last = first if last is None else max(last, first)
            blocked_end = 0.0 if a.busy_from is None else _span(max(clip(a.busy_from) or end, last), end)
            blocked = min(a.busy_secs, last - first)
            rollback = min(a.rollback_secs, last - first - blocked)
            stepping = last - first - blocked - rollback
            ran = a.last_step - a.first_step_no + a.rolled_steps
            kept = max(0, (a.last_step if keep_below is None else min(a.last_step, keep_below)) - a.first_step_no)
            share = min(1.0, kept / ran) if ran > 0 else 1.0
            s["checkpoint"] += blocked + blocked_end
            s["restoring"] += rollback
            s["productive"] += stepping * share
            s["redone"] += stepping * (1.0 - share)
            tail = max(0.0, end - last - blocked_end)
            if a.hung:
                s["restart"] += tail
            elif i + 1 < len(atts) or restored_after is not None:
                s["redone"] += tail
            else:
                s["stopped" if launch.stopped else "unaccounted"] += tail
        cursor = end
    if atts:
        s["stopped" if launch.stopped else "unaccounted"] += max(0.0, launch.end - cursor)
    else:
        s["startup"] += max(0.0, launch.end - cursor)
    return out


def _maybe(rng: random.Random, value: float, p_none: float = 0.2) -> Optional[float]:
    return None if rng.random() < p_none else value


def random_attempt(rng: random.Random, t: float) -> tuple[Attempt, float]:
    """One attempt spawned near ``t`` (now and then before it, or with its times out of order, to
    exercise the clipping), and the time the next one may start after."""
    spawned = t + rng.uniform(-0.5, 2.0)
    ready = spawned + rng.uniform(0.0, 3.0)
    first = ready + rng.uniform(0.0, 2.0)
    last = first + rng.uniform(-0.5, 30.0)
    ended = last + rng.uniform(-0.2, 2.0)
    restored = rng.randrange(0, 500)
    first_no = restored + rng.choice((0, 1, 1, 2))
    a = Attempt(spawned=spawned, ready=_maybe(rng, ready), restore_secs=rng.uniform(0.0, 2.0),
                restored_step=restored, first_step=_maybe(rng, first), first_step_no=first_no,
                last_at=_maybe(rng, last), last_step=first_no + rng.randrange(-2, 400), ended=_maybe(rng, ended),
                hung=rng.random() < 0.15, busy_secs=rng.uniform(0.0, 3.0) if rng.random() < 0.5 else 0.0,
                busy_from=_maybe(rng, last + rng.uniform(-1.0, 1.0), 0.7),
                rolled_steps=rng.randrange(0, 20) if rng.random() < 0.2 else 0,
                rollback_secs=rng.uniform(0.0, 1.0) if rng.random() < 0.2 else 0.0)
    return a, max(t, ended)


def random_launch(rng: random.Random, n: int) -> tuple[Launch, Optional[int]]:
    """A launch of ``n`` attempts (ready now and then unrecorded: the next restore is searched past
    such attempts), its end before, at or after its last attempt's, and ``restored_after`` (the next
    launch's restored step, or None)."""
    start = rng.uniform(0.0, 10.0)
    t = start + rng.uniform(0.0, 3.0)
    atts = []
    for _ in range(n):
        a, t = random_attempt(rng, t)
        atts.append(a)
    end = t + rng.uniform(-5.0, 5.0) if atts else start + rng.uniform(0.0, 5.0)
    after = rng.randrange(0, 600) if rng.random() < 0.5 else None
    return Launch(start, end, stopped=rng.random() < 0.4, attempts=tuple(atts)), after
