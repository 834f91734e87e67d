"""The recovery report: restarts, each recovery's breakdown, steps re-done.

Runs in the watchdog (live for ``procsv status``, and once at the end of a launch). Pure: it
reads only the trainer attempts the watchdog keeps (``RunView.attempts``, monotonic timestamps).

For a trainer restart, recovery is split as: *detect* (the fatal signal, when the watchdog or
chaos sent it, to the moment the watchdog noticed the death), *respawn* (noticed to new process
started, including any backoff), *restored* (process start to state restored), *first step*
(restored to the first completed step). *Steps re-done* are the steps the dead attempt had
completed after the checkpoint the next one restored. A trainer group's rollback (an attempt that ended
asking for it: ``rollback_step``, the step skipped) is a recovery too, but a rollback, not a restart:
``restarts`` counts the others, ``group_rollbacks`` those; so is an elastic group's regroup (``regroup``:
ended at a checkpoint boundary to take a host back, rule 15), counted in ``regroups``. The report's goodput and wall time are the
launch's breakdown's (:mod:`procsv.watchdog.publish.badput`), added by the caller.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

from procsv.watchdog.rules.group import HOST_LOST
from procsv.watchdog.rules.state import ChildView


def _d(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return None if a is None or b is None else max(0.0, b - a)


def cause(prev: ChildView, audited: Mapping[int, str] = {}) -> str:
    """How ``prev`` ended, as the recovery report's cause column says it: a trainer group's attempt by
    the member that broke it (``worker1 was killed by SIGKILL``, ``worker1 host lost``: its
    :attr:`~procsv.watchdog.rules.state.ChildView.broken_by`, also when it was found after the
    judgement), not by the chief's own end (its collective failure, or the group's stop); one an audit rolled back
    (``audited``: the audit's words by attempt, ``Findings.audit_rollbacks``) by the audit's verdict."""
    if prev.attempt in audited and prev.regroup:
        return audited[prev.attempt]
    if prev.regroup:
        return "regroup: a host taken back"
    who = prev.broken_by if prev.broken_by is not None else prev
    if who is prev:
        return prev.cause
    error = who.failure.error if who.failure is not None else None
    how = "host lost" if error is not None and error.type == HOST_LOST and not who.hang.cause else who.cause
    return f"{who.slot} {how}".strip()


def recoveries(attempts: Sequence[ChildView], audited: Mapping[int, str] = {}) -> list[dict[str, Any]]:
    out = []
    for prev, cur in zip(attempts, attempts[1:]):
        start = prev.signalled_at if prev.signalled_at is not None else prev.ended_at
        out.append({
            "attempt": cur.attempt,
            "cause": cause(prev, audited),
            "rollback_step": prev.group_rollback,
            # the chief asked for that rollback past a loss spike's onset (not a non-finite loss)
            "spike": prev.group_rollback is not None and prev.last_report == ("spike", prev.group_rollback),
            "regroup": prev.regroup and prev.attempt not in audited,
            "audit": prev.regroup and prev.attempt in audited,
            "detect_s": _d(prev.signalled_at, prev.ended_at),
            "respawn_s": _d(prev.ended_at, cur.started),
            "restore_s": _d(cur.started, cur.ready_at),
            "first_step_s": _d(cur.ready_at, cur.first_step_at),
            "total_s": _d(start, cur.first_step_at),
            "steps_redone": max(0, prev.work_step - cur.restored_step) if cur.ready_at is not None else None,
        })
    return out


def summarize(attempts: Sequence[ChildView], audited: Mapping[int, str] = {}) -> dict[str, Any]:
    """The restarts, the group's rollbacks and their recoveries (what :func:`render` shows beside the
    goodput and wall time)."""
    recs = recoveries(attempts, audited)
    rolled = sum(1 for r in recs if r["rollback_step"] is not None)
    regroups = sum(1 for r in recs if r["regroup"])
    audits = sum(1 for r in recs if r["audit"])
    return {"restarts": len(recs) - rolled - regroups - audits, "group_rollbacks": rolled, "regroups": regroups,
            "audit_rollbacks": audits, "recoveries": recs,
            "steps_redone": sum(r["steps_redone"] or 0 for r in recs)}


def render(summary: dict[str, Any]) -> str:
    def f(x: Optional[float]) -> str:
        return "-" if x is None else f"{x:.3f}"

    rolled = summary.get("group_rollbacks") or 0  # (a report of an older procsv has none)
    lines = [f"procsv report: {summary['restarts']} restart(s), "
             + (f"{rolled} rollback(s) of the trainer group, " if rolled else "")
             + (f"{summary['regroups']} regroup(s) taking a host back, " if summary.get("regroups") else "")
             + (f"{summary['audit_rollbacks']} rollback(s) by an audit, " if summary.get("audit_rollbacks") else "")
             + f"{summary['steps_redone']} step(s) re-done, goodput {f(summary['goodput'])} over {summary['wall_s']:.1f} s"]
    if summary["recoveries"]:
        lines.append(f"  {'attempt':>7} {'detect_s':>9} {'respawn_s':>9} {'restore_s':>9} {'1st_step_s':>10} "
                     f"{'total_s':>8} {'redone':>6}  cause")
        for r in summary["recoveries"]:
            lines.append(f"  {r['attempt']:>7} {f(r['detect_s']):>9} {f(r['respawn_s']):>9} {f(r['restore_s']):>9} "
                         f"{f(r['first_step_s']):>10} {f(r['total_s']):>8} {r['steps_redone'] if r['steps_redone'] is not None else '-':>6}  "
                         f"{_cause(r)[:60]}")
    tasks = summary.get("tasks")
    if isinstance(tasks, dict) and tasks:
        lines.append("  tasks: " + ", ".join(f"{t} {v['restarts']} restart(s)" + (" (given up on)" if v.get("given_up")
                                                                                  else "")
                                             for t, v in tasks.items()))
    return "\n".join(lines)


def _cause(rec: dict[str, Any]) -> str:
    """A recovery's cause column: a group's rollback says so (its exit 5 is no failure), and why."""
    step = rec.get("rollback_step")
    if step is None:
        return str(rec["cause"])
    return f"group rollback: step {step} skipped ({'a loss spike, its onset' if rec.get('spike') else 'non-finite loss'})"
