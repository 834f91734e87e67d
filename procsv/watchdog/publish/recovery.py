"""The recovery report: restarts, each recovery's breakdown, steps re-done, goodput.

Runs in the watchdog (live for ``procsv status``, and once at the end of a launch). Pure: it
reads only the attempt records the watchdog kept (monotonic timestamps) and a ``now``.

For a trainer restart, recovery is split as: *detect* (the fatal signal, when the watchdog or
chaos sent it, to the moment the watchdog noticed the death), *respawn* (noticed to new process
started, including any backoff), *restored* (process start to state restored), *first step*
(restored to the first completed step). *Steps re-done* are the steps the dead attempt had
completed after the checkpoint the next one restored. *Goodput* is the time spent on steps that
were kept, divided by the wall time of the launch.
"""

from __future__ import annotations

from typing import Any, Optional

from procsv.watchdog.rules.state import AttemptRecord


def _d(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return None if a is None or b is None else max(0.0, b - a)


def recoveries(attempts: list[AttemptRecord]) -> list[dict[str, Any]]:
    out = []
    for prev, cur in zip(attempts, attempts[1:]):
        start = prev.killed_at if prev.killed_at is not None else prev.ended
        out.append({
            "attempt": cur.attempt,
            "cause": prev.cause,
            "detect_s": _d(prev.killed_at, prev.ended),
            "respawn_s": _d(prev.ended, cur.spawned),
            "restore_s": _d(cur.spawned, cur.ready),
            "first_step_s": _d(cur.ready, cur.first_step),
            "total_s": _d(start, cur.first_step),
            "steps_redone": max(0, prev.last_step - cur.restored_step) if cur.ready is not None else None,
        })
    return out


def goodput(attempts: list[AttemptRecord], launch_start: float, now: float) -> Optional[float]:
    """Share of the launch's wall time spent on steps that were kept (None before any step)."""
    wall = now - launch_start
    if wall <= 0 or not any(a.first_step is not None for a in attempts):
        return None
    productive = 0.0
    for i, a in enumerate(attempts):
        if a.first_step is None or a.last_progress is None:
            continue
        run = a.last_step - a.restored_step
        if run <= 0:
            continue
        # first_step marks the end of the first step: count one more step's worth of time
        per_step = (a.last_progress - a.first_step) / max(1, run - 1)
        stepping = a.last_progress - a.first_step + per_step
        nxt = next((b for b in attempts[i + 1:] if b.ready is not None), None)
        kept = (min(a.last_step, nxt.restored_step) if nxt is not None else a.last_step) - a.restored_step
        productive += stepping * max(0, kept) / run
    return min(1.0, productive / wall)


def summarize(attempts: list[AttemptRecord], launch_start: float, now: float) -> dict[str, Any]:
    recs = recoveries(attempts)
    return {
        "restarts": len(recs),
        "recoveries": recs,
        "steps_redone": sum(r["steps_redone"] or 0 for r in recs),
        "goodput": goodput(attempts, launch_start, now),
        "wall_s": now - launch_start,
    }


def render(summary: dict[str, Any]) -> str:
    def f(x: Optional[float]) -> str:
        return "-" if x is None else f"{x:.3f}"

    lines = [f"procsv report: {summary['restarts']} restart(s), {summary['steps_redone']} step(s) re-done, "
             f"goodput {f(summary['goodput'])} over {summary['wall_s']:.1f} s"]
    if summary["recoveries"]:
        lines.append(f"  {'attempt':>7} {'detect_s':>9} {'respawn_s':>9} {'restore_s':>9} {'1st_step_s':>10} "
                     f"{'total_s':>8} {'redone':>6}  cause")
        for r in summary["recoveries"]:
            lines.append(f"  {r['attempt']:>7} {f(r['detect_s']):>9} {f(r['respawn_s']):>9} {f(r['restore_s']):>9} "
                         f"{f(r['first_step_s']):>10} {f(r['total_s']):>8} {r['steps_redone'] if r['steps_redone'] is not None else '-':>6}  "
                         f"{r['cause'][:60]}")
    tasks = summary.get("tasks")
    if isinstance(tasks, dict) and tasks:
        lines.append("  tasks: " + ", ".join(f"{t} {v['restarts']} restart(s)" + (" (given up on)" if v.get("given_up")
                                                                                  else "")
                                             for t, v in tasks.items()))
    return "\n".join(lines)
