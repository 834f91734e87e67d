"""Where a run's wall time went: goodput and the badput kinds, per launch and across relaunches.

Pure: functions of plain data, no clock read, no file read. Two readers build the data: the
``procsv report`` CLI from ``logs/lifecycle.jsonl`` (:func:`launches_from_events`, every launch of
the logdir), as the watchdog does once more at the end of a launch for ``logs/report.json``'s
``run`` (:func:`run_record`), and the watchdog from its own view of the live launch
(:mod:`procsv.watchdog.publish.badput`, for ``status.json``, Prometheus, TensorBoard, the live
line and ``logs/report.json``'s ``breakdown``).
Nothing here runs in the trainer, and nothing is measured per step: the watchdog already hears
each attempt's first step, its last completed step and when a snapshot blocks it.

The kinds (:data:`KINDS`) split each launch's wall time, from its ``launch`` record to its
last record (its services' ends, after ``finished``), and sum to it exactly (each second is
given one kind). For each trainer attempt, on the watchdog's clock (``docs/observability.md`` names the lifecycle records):

- ``startup``: the launch to the first trainer's spawn (the watchdog, its services, the
  pre-warmed zygote); then each attempt's spawn (a standby's promotion: the previous attempt's
  death) to the start of its restore, and the restore's end to its first completed step (TF
  import, model build and first trace, the first step);
- ``restoring``: the restore itself (``secs`` of its ``restored``/``initialized`` record), and
  the in-place restores of its rollbacks after a non-finite loss (``secs`` of ``rolled_back``);
- ``checkpoint``: the training loop blocked while a snapshot is taken (from the trainer's busy
  ``snapshot``/``final_checkpoint`` Progress to its next Progress);
- ``productive``: the rest of the time from the first step to the last completed step, for the
  steps that were kept, shared out by steps;
- ``redone``: the same for the steps the next attempt (or the next launch) trained again because
  it restored an older step, plus the step in progress when an attempt was killed, plus the
  steps a rollback undid (``rolled_back``: its ``step`` down to its ``restored_step``);
- ``restart``: detecting a failure and starting the next attempt, backoff included: a hung
  attempt's last step to its kill, then the death (or the kill procsv sent) to the next spawn;
- ``stopped``: after a preemption (the launch received SIGTERM/SIGINT): the last attempt's
  end to the launch's end, and between one launch's end and the next launch of the logdir;
- ``unaccounted``: what none of the above bounds (a normal end's shutdown; an attempt whose end
  is not recorded, e.g. a SIGKILLed watchdog, and no launch followed). Such an attempt has no
  ``trained`` record: it stepped until its launch's last ``checkpoint_committed`` record.

A group (``--nproc``; ``--ps`` workers that step) is also broken down per task (:func:`tasks`):
the same kinds from each task's own records (a worker's restore and first step are in its
``trained`` record), and :func:`costliest` names the task with the most seconds not kept.

Waiting on input is not a kind: no record separates a step's input wait from its compute, and
measuring it would cost the trainer per-step work. It is inside ``productive`` and ``redone``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

KINDS = ("productive", "startup", "restoring", "checkpoint", "redone", "restart", "stopped", "unaccounted")


@dataclass(frozen=True)
class Attempt:
    """One trainer attempt, on one clock (seconds); None: not reached or not recorded."""

    spawned: float
    ready: Optional[float] = None  # its state restored (or initialized)
    restore_secs: float = 0.0
    restored_step: int = 0
    first_step: Optional[float] = None
    first_step_no: int = 0  # the step its first completed step reported
    last_at: Optional[float] = None  # its last completed step
    last_step: int = 0
    ended: Optional[float] = None  # its death noticed, or reaped; or the kill procsv sent (hang, chaos)
    hung: bool = False
    busy_secs: float = 0.0  # blocked by snapshots, closed intervals
    busy_from: Optional[float] = None  # blocked by a snapshot from then until its end
    rolled_steps: int = 0  # steps trained, then undone by its in-place rollbacks (a non-finite loss)
    rollback_secs: float = 0.0  # those rollbacks' restores


@dataclass(frozen=True)
class Launch:
    """One launch of a logdir: its bounds, whether it was stopped (preempted), its trainer attempts."""

    start: float
    end: float
    stopped: bool = False
    attempts: tuple[Attempt, ...] = ()
    number: int = 1
    closed: bool = True  # it recorded its end (``finished``); False: its watchdog died (SIGKILL) first


@dataclass
class Breakdown:
    """Seconds per kind (:data:`KINDS`), and the wall time they split."""

    secs: dict[str, float] = field(default_factory=lambda: dict.fromkeys(KINDS, 0.0))
    wall: float = 0.0

    def add(self, other: "Breakdown") -> None:
        for k in KINDS:
            self.secs[k] += other.secs[k]
        self.wall += other.wall

    @property
    def goodput(self) -> Optional[float]:
        return self.secs["productive"] / self.wall if self.wall > 0 else None

    def to_json(self) -> dict[str, Any]:
        return {"wall_s": round(self.wall, 3), "goodput": None if self.goodput is None else round(self.goodput, 4),
                **{f"{k}_s": round(v, 3) for k, v in self.secs.items()}}


def _span(a: float, b: Optional[float]) -> float:
    return 0.0 if b is None else max(0.0, b - a)


def kept_below(attempts: tuple[Attempt, ...], restored_after: Optional[int] = None) -> list[Optional[int]]:
    """For each attempt, the step the next one that restored (its ``ready`` recorded) restored,
    else ``restored_after``: its steps past that were re-done. One pass, from the last attempt back."""
    out: list[Optional[int]] = [None] * len(attempts)
    below = restored_after
    for i in range(len(attempts) - 1, -1, -1):
        out[i] = below
        if attempts[i].ready is not None:
            below = attempts[i].restored_step
    return out


def breakdown(launch: Launch, restored_after: Optional[int] = None) -> Breakdown:
    """Split ``launch``'s wall time into :data:`KINDS`. ``restored_after``: the step the next
    launch of the logdir restored (its re-done steps count against this launch).

    One pass over the attempts (linear: the watchdog computes it for its live launch once a round)."""
    out = Breakdown(wall=max(0.0, launch.end - launch.start))
    s = out.secs
    cursor = launch.start  # every second before it has its kind
    atts = launch.attempts
    keep = kept_below(atts, restored_after)
    for i, a in enumerate(atts):
        keep_below = keep[i]
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


def run_breakdown(launches: list[Launch]) -> tuple[list[Breakdown], Breakdown]:
    """Each launch's breakdown, and the whole run's: their sum plus the gaps between launches
    (``stopped``: from one launch's end to the next one's start; ``unaccounted`` after a launch
    whose watchdog died without a ``finished`` or ``preempted`` record: its trainer may have gone
    on stepping after its last record, and nothing says when the relaunch was decided)."""
    per = []
    total = Breakdown()
    for i, la in enumerate(launches):
        after = next((a.restored_step for a in launches[i + 1].attempts if a.ready is not None), None) \
            if i + 1 < len(launches) else None
        b = breakdown(la, after)
        per.append(b)
        total.add(b)
        if i + 1 < len(launches):
            gap = max(0.0, launches[i + 1].start - la.end)
            total.secs["stopped" if la.stopped or la.closed else "unaccounted"] += gap
            total.wall += gap
    return per, total


def run_record(events: list[dict[str, Any]]) -> dict[str, Any]:
    """Every launch of the logdir as ``logs/report.json`` holds it (``run``), from the lifecycle
    records ``events``: what ``procsv report`` prints after the launch, as data. ``launches``: each
    launch's breakdown (:meth:`Breakdown.to_json`) with its number; ``total``: the whole run's, the
    gaps between launches included, with ``launches``, how many; ``tasks`` (a group whose workers
    step, :func:`tasks`): each task's whole run, by task name."""
    launches = launches_from_events(events)
    per, total = run_breakdown(launches)
    out: dict[str, Any] = {"launches": [{"launch": la.number, **b.to_json()} for la, b in zip(launches, per)],
                           "total": {"launches": len(launches), **total.to_json()}}
    names = tasks(events)
    if len(names) > 1:
        out["tasks"] = {n: run_breakdown(launches_from_events(events, task=n))[1].to_json() for n in names}
    return out


def launches_from_events(events: list[dict[str, Any]], now: Optional[float] = None,
                         task: str = "trainer") -> list[Launch]:
    """Every launch in ``lifecycle.jsonl``'s records (oldest first), as ``task`` lived it (the
    trainer: the chief; or a group's ``worker1`` ...). A launch ends at its last record (the
    services' exits, after ``finished``), the live one at ``now`` if given."""
    groups: list[list[dict[str, Any]]] = []
    for e in events:
        if e.get("event") == "launch" or not groups:
            groups.append([])
        groups[-1].append(e)
    out = []
    for n, g in enumerate(groups):
        last = n + 1 == len(groups)
        live = now if last and now is not None else None
        end = live if live is not None else max(float(e["time"]) for e in g)
        number = int(g[0].get("launch") or n + 1) if g[0].get("event") == "launch" else n + 1
        out.append(Launch(float(g[0]["time"]), end, any(e.get("event") == "preempted" for e in g),
                          tuple(_attempts(g, live, task)), number, any(e.get("event") == "finished" for e in g)))
    return out


def _attempts(g: list[dict[str, Any]], live: Optional[float] = None, task: str = "trainer") -> list[Attempt]:
    """``task``'s attempts in one launch's records; ``live``: the launch is going on at that time
    (an attempt that stepped and has not ended is stepping until then). A group's worker has no
    ``restored``/``first_step`` records: its ``trained`` record holds them."""
    by_pid: dict[Any, dict[str, dict[str, Any]]] = {}
    order = []
    undone: dict[Any, tuple[int, float]] = {}  # pid -> (steps undone, restore secs) of its rollbacks
    for e in g:
        if e.get("event") == "rolled_back":
            n, secs = undone.get(e.get("pid"), (0, 0.0))
            undone[e.get("pid")] = (n + max(0, int(e["step"]) - int(e["restored_step"])), secs + float(e.get("secs") or 0))
    commits = [(float(e["time"]), int(e["step"])) for e in g
               if e.get("event") == "checkpoint_committed" and isinstance(e.get("step"), int)]
    for e in g:
        kind = e.get("event")
        if kind == "spawned" and e.get("role") == task:
            by_pid[e["pid"]] = {"spawned": e}
            order.append(e["pid"])
        elif kind == "chaos_kill" and e.get("role") != task:
            continue
        elif e.get("pid") in by_pid and kind in ("restored", "initialized", "first_step", "trained", "hang_detected",
                                                  "chaos_kill", "death_noticed", "exited"):
            if kind in ("death_noticed", "exited", "trained") and e.get("role") != task:
                continue
            by_pid[e["pid"]].setdefault(str(kind), e)
    out = []
    for pid in order:
        r = by_pid[pid]
        ready = r.get("restored") or r.get("initialized")
        first, trained = r.get("first_step"), r.get("trained")
        if trained is not None and ready is None and trained.get("ready_at") is not None:
            ready = {"time": trained["ready_at"], "secs": trained.get("restore_secs"), "step": trained["restored_step"]}
        if trained is not None and first is None and trained.get("first_at") is not None:
            first = {"time": trained["first_at"], "step": trained["first_step"]}
        ends = [float(x["noticed"]) for x in (r.get("death_noticed"), r.get("exited")) if x and x.get("noticed")]
        kills = [float(x["time"]) for x in (r.get("hang_detected"), r.get("chaos_kill")) if x]
        ended = min(kills + ends) if kills + ends else None
        last_step = int(trained["step"]) if trained else (int(first["step"]) if first else 0)
        running = live is not None and first is not None and trained is None and ended is None
        last_at = None if not trained or trained.get("step_at") is None else float(trained["step_at"])
        if trained is None and not running and first is not None and task == "trainer":
            # no `trained` record (a SIGKILLed watchdog): its last commit is the last step the records show
            seen = [c for c in commits if float(first["time"]) <= c[0] <= (ended or c[0]) and c[1] > last_step]
            if seen:
                last_at, last_step = max(seen)
        out.append(Attempt(
            spawned=float(r["spawned"]["time"]),
            ready=None if ready is None else float(ready["time"]),
            restore_secs=0.0 if ready is None else float(ready.get("secs") or 0.0),
            restored_step=0 if ready is None else int(ready["step"]),
            first_step=None if first is None else float(first["time"]),
            first_step_no=0 if first is None else int(first["step"]),
            last_at=live if running else last_at,
            last_step=last_step, ended=ended, hung="hang_detected" in r,
            busy_secs=float(trained.get("busy_secs") or 0.0) if trained else 0.0,
            busy_from=None if not trained or trained.get("busy_from") is None else float(trained["busy_from"]),
            rolled_steps=undone.get(pid, (0, 0.0))[0], rollback_secs=undone.get(pid, (0, 0.0))[1]))
    return out


def tasks(events: list[dict[str, Any]]) -> list[str]:
    """The tasks that step, each with a breakdown of its own: the trainer (a group's chief) and
    the workers that recorded a ``trained`` record (``worker1`` ...); a --ps run's parameter
    servers take no steps and are not among them."""
    workers = sorted({str(e["role"]) for e in events if e.get("event") == "trained" and e.get("role") != "trainer"})
    return ["trainer"] + workers


def costliest(rows: list[tuple[str, Breakdown]]) -> Optional[tuple[str, Breakdown]]:
    """The task whose time went least to kept steps (the most badput seconds); None if none."""
    return max(rows, key=lambda r: r[1].wall - r[1].secs["productive"], default=None)


def render_tasks(rows: list[tuple[str, Breakdown]]) -> str:
    """Per task, the whole run's seconds per kind, and the line naming the task that cost the most."""
    lines = _table("per task (s)", rows)
    worst = costliest(rows)
    if worst is not None:
        name, b = worst
        bad = sorted(((b.secs[k], k) for k in KINDS if k != "productive" and b.secs[k] > 0), reverse=True)
        lines.append(f"  costliest task: {name}, {b.wall - b.secs['productive']:.1f} s of {b.wall:.1f} s not kept steps"
                     + ("" if not bad else " (" + ", ".join(f"{k} {v:.1f} s" for v, k in bad[:3]) + ")"))
    return "\n".join(lines)


SHORT = {"productive": "product", "startup": "startup", "restoring": "restore", "checkpoint": "ckpt",
         "redone": "redone", "restart": "restart", "stopped": "stopped", "unaccounted": "unacct"}


def render(per: list[tuple[int, Breakdown]], total: Breakdown) -> str:
    """The table ``procsv report`` prints: seconds per kind for each launch, then the whole run's
    (cumulative) with each kind's share of its wall time."""
    rows = [(f"launch {number}", b) for number, b in per]
    lines = _table("where the time went (s)", rows + ([(f"all {len(per)} launches", total)] if len(per) != 1 else []))
    if total.wall > 0:
        lines.append("  cumulative: " + ", ".join(f"{k} {total.secs[k] / total.wall:.1%}" for k in KINDS
                                                  if total.secs[k] > 0) + f" of {total.wall:.1f} s")
    return "\n".join(lines)


def _table(title: str, rows: list[tuple[str, Breakdown]]) -> list[str]:
    """A head line and a row per breakdown: seconds per kind, the wall time, the goodput; the
    columns as wide as the widest figure (a month is 2,592,000.0 s)."""
    w = max([8] + [len(f"{x:.1f}") for _, b in rows for x in (*b.secs.values(), b.wall)])
    lines = [f"  {title:<23} " + " ".join(f"{SHORT[k]:>{w}}" for k in KINDS) + f" {'wall':>{w}} {'goodput':>7}"]
    for name, b in rows:
        lines.append(f"  {name:<23} " + " ".join(f"{b.secs[k]:>{w}.1f}" for k in KINDS)
                     + f" {b.wall:>{w}.1f} {_pct(b.goodput):>7}")
    return lines


def _pct(x: Optional[float]) -> str:
    return "-" if x is None else f"{x:.1%}"
