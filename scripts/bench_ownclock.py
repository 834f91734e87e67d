"""The goodput of a chaos run by bench_recovery's own clock, and the report's to compare it with.

Runs in the benchmark script (scripts/bench_recovery.py), beside the launch it measures: it reads
the lines the example program prints in each attempt's log as they are written, and the
launch's ``report.json`` and lifecycle records afterwards. Nothing here runs in procsv.
"""

from __future__ import annotations

import os
from typing import Any, Optional

from bench_group import events  # scripts/ is this script's folder, first on sys.path

from procsv import goodput as gp


def blocked_share(report: dict[str, Any]) -> float:
    """The share of the launch's wall time its training loop was blocked by snapshots while it
    stepped, shared out as its stepping is (``blocked_kept_s``; the report leaves it out of
    ``productive``, this script's clock cannot see it), or all the blocks of ``report.json``."""
    spent = report.get("breakdown") or {}
    blocked = report.get("blocked_kept_s", spent.get("checkpoint_s"))
    return float(blocked or 0.0) / float(spent.get("wall_s") or 1.0)


def blocked_kept(logdir: str) -> float:
    """Seconds the last launch's attempts were blocked by snapshots between their first and last
    steps (``busy_secs`` of their ``trained`` records; not a final checkpoint's block after the
    last step), each times the share of its steps that were kept, as ``productive`` is shared."""
    launches = gp.launches_from_events(events(logdir))
    attempts = [a for a in launches[-1].attempts if a.first_step is not None] if launches else []
    out = 0.0
    for i, a in enumerate(attempts):
        ran = a.last_step - a.first_step_no
        below = attempts[i + 1].restored_step if i + 1 < len(attempts) else a.last_step
        if ran > 0 and a.last_at is not None and a.first_step is not None:
            out += min(a.busy_secs, a.last_at - a.first_step) * max(0, min(a.last_step, below) - a.first_step_no) / ran
    return out


PRINT_EVERY = 1  # the chaos runs' --print-every-steps: the example's own line each step (a 2 ms sleep's step)


class StepLines:
    """The steps the example prints (``digits: step N ...``, each step) in its attempts' logs
    (``logs/*.log``, one per process: each trainer attempt's, or a promoted standby's), read as
    they are written, on this script's clock: a new line seen at a 20 ms poll is stamped with the
    poll's time. (``status.json`` is rewritten every 0.5 s at most: stamped by its polls, an
    attempt's last steps before a kill and the step its successor restored were up to 0.5 s off,
    five times in a 75 s run; and a successor that restored the killed attempt's last step, as an
    in-memory snapshot can, did not show as a new attempt at all.)"""

    def __init__(self, logs: str) -> None:
        self.logs = logs
        self.offsets: dict[str, int] = {}
        self.partial: dict[str, bytes] = {}
        self.attempts: dict[str, list[tuple[float, int]]] = {}  # log -> its (time, step) samples
        self.restored: dict[str, int] = {}  # log -> the step it restored (``procsv: restored step N ...``)
        self.seen: dict[str, float] = {}  # log -> when its first such line was read

    def read(self, now: float) -> None:
        try:
            names = sorted(n for n in os.listdir(self.logs) if n.endswith(".log"))
        except OSError:
            return
        for name in names:
            path = os.path.join(self.logs, name)
            try:
                with open(path, "rb") as fh:
                    fh.seek(self.offsets.get(path, 0))
                    data = fh.read()
            except OSError:
                continue
            self.offsets[path] = self.offsets.get(path, 0) + len(data)
            *whole, rest = (self.partial.get(path, b"") + data).split(b"\n")
            self.partial[path] = rest
            for line in whole:
                words = line.split()
                if words[:2] == [b"digits:", b"step"] and len(words) > 2 and words[2].isdigit():
                    self.attempts.setdefault(path, []).append((now, int(words[2])))
                    self.seen.setdefault(path, now)
                elif words[:3] == [b"procsv:", b"restored", b"step"] and len(words) > 3 and words[3].isdigit():
                    self.restored.setdefault(path, int(words[3]))
                    self.seen.setdefault(path, now)

    def by_start(self) -> list[tuple[Optional[int], list[tuple[float, int]]]]:
        """Each attempt that restored or stepped: the step it restored (None: it started afresh)
        and its samples, the attempts in the order they began."""
        return [(self.restored.get(p), self.attempts.get(p, [])) for p in sorted(self.seen, key=self.seen.__getitem__)]


def own_goodput(attempts: list[tuple[Optional[int], list[tuple[float, int]]]], t0: float, t1: float) -> float:
    """The share of ``t0``..``t1`` (this script's clock: the launch's start to its exit) spent on
    steps that were kept, as the report defines it (``docs/observability.md``, ``productive``):
    each attempt's time from its first completed step to its last, shared out by step count
    between the steps that were kept (at or below the step the next attempt restored, even if it
    never stepped; one that started afresh: below its first step) and the rest. ``attempts``:
    each attempt's restored step and (time, step) samples (:class:`StepLines`), oldest first. A snapshot's block
    (tens of ms) is inside an attempt's stepping: this clock cannot tell it from a step."""
    productive = 0.0
    starts = [r if r is not None else (samples[0][1] - 1 if samples else 0) for r, samples in attempts]
    for i, (_, samples) in enumerate(attempts):
        if len(samples) < 2 or samples[-1][1] <= samples[0][1]:
            continue
        (first_t, first), (last_t, last) = samples[0], samples[-1]
        below = starts[i + 1] if i + 1 < len(attempts) else last
        productive += (last_t - first_t) * max(0, min(last, below) - first) / (last - first)
    return productive / (t1 - t0)
