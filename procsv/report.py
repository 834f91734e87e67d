"""``procsv report DIR``: the recovery report of a run's last launch, as text (and the data for a plot).

Runs in the user's shell (the CLI); it only reads. What it reads, each written by the watchdog
unless noted:

- ``logs/report.json``: the recovery report written at the end of a launch (restarts with their
  recovery breakdown, steps re-done, goodput) and ``series``, the global step over wall time
  (:class:`procsv.watchdog.publish.series.StepSeries`);
- ``logs/lifecycle.jsonl``: the events of the last launch (from its ``launch`` record on): when
  each trainer attempt ended and why (a trainer group's ``breaker`` record, when there is one, in place
  of its ``restarting`` record's error: the member found cut off after the judgement), what the next
  one restored, each committed checkpoint;
- ``.procsv/status.json`` (through :func:`procsv.status.read_status`): the run's state, step and
  live goodput;
- ``.procsv/checkpoints/*.json``: the manifests (written by the checkpoint service), for the
  commit times of checkpoints whose lifecycle record is missing.

While the launch is live, or when it died before writing its report (a SIGKILLed watchdog), the
report is built from the lifecycle events and the status record alone: no recovery breakdown, and
a step series made of the events that name a step. :func:`gather` collects a :class:`RunReport`;
:func:`render` is the text; :mod:`procsv.reportplot` draws it (the CLI calls both: this module never imports
the plotting one, which imports it).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Optional

from procsv import goodput as gp
from procsv.common.layout import Layout, LogdirLock, read_json
from procsv.common.manifests import list_committed
from procsv.status import rollback_label, rollback_words
from procsv.watchdog.publish import recovery
from procsv.watchdog.publish.events import read_events


@dataclass(frozen=True)
class Restart:
    """One restart of the trainer."""

    at: float  # wall time its previous attempt died (noticed, or reaped)
    attempt: int  # the attempt started
    cause: str  # one line: how the previous attempt ended
    label: str  # a few words for the plot: "SIGKILL", "exit 1", "hang", "chaos SIGKILL", "preempted"
    restored_step: Optional[int]
    restore_secs: Optional[float]
    from_checkpoint: bool = True  # False: the next attempt found no checkpoint and initialized
    rollback_step: Optional[int] = None  # a trainer group's rollback (a rollback, not a restart): the step skipped


@dataclass
class RunReport:
    """What ``procsv report`` shows of one logdir's last launch, assembled from its files."""

    logdir: str
    state: str
    step: int
    live_pid: Optional[int]  # the launch that is live now, if any
    started_at: Optional[float]
    ended_at: Optional[float]
    goodput: Optional[float]
    summary: Optional[dict[str, Any]]  # logs/report.json, when it belongs to the last launch
    restarts: list[Restart] = field(default_factory=list)  # and the trainer group's rollbacks (``rollback_step``)
    checkpoints: list[tuple[float, int]] = field(default_factory=list)  # (wall time, step) of each commit
    series: list[tuple[float, int]] = field(default_factory=list)  # (wall time, step)
    skipped: list[tuple[float, int]] = field(default_factory=list)  # (wall time, step) of each non-finite step skipped
    rollbacks: int = 0  # restores after a non-finite loss (issue 41): in place, and a trainer group's restarts
    group_rollbacks: int = 0  # ... of which a trainer group's (in place: those not among ``restarts``)
    detected: int = 0  # non-finite losses or snapshot states found (the records' repeats, or status.json's count if more)
    launches: list[tuple[int, gp.Breakdown]] = field(default_factory=list)  # (launch number, where its time went)
    lifetime: Optional[gp.Breakdown] = None  # every launch of the logdir, and the gaps between them
    tasks: list[tuple[str, gp.Breakdown]] = field(default_factory=list)  # a group's: each task's whole run
    memberships: list[dict[str, Any]] = field(default_factory=list)  # an elastic group's ``membership`` records
    spikes: list[dict[str, Any]] = field(default_factory=list)  # its ``spike_detected``, ``spike_replayed``, ``host_suspect`` records


def last_launch(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The events from the last ``launch`` record on."""
    starts = [i for i, e in enumerate(events) if e.get("event") == "launch"]
    return events[starts[-1]:] if starts else events


def restarts(events: list[dict[str, Any]]) -> list[Restart]:
    """The trainer's restarts in one launch's events, each with its cause and what was restored (a
    trainer group's rollback is one too, with its ``rollback_step``: :func:`plain_restarts` leaves it out).

    One pass to index the records (a long run's log holds a record per commit: O(events))."""
    ends: dict[tuple[str, int, str], dict[str, Any]] = {}  # (exited | death_noticed, attempt, role) -> its record
    hung: dict[int, dict[str, Any]] = {}  # attempt -> hang_detected
    chaos: dict[Any, dict[str, Any]] = {}  # pid -> chaos_kill
    broke: dict[int, dict[str, Any]] = {}  # attempt -> its breaker record, the last (the cause found after its judgement)
    for x in events:
        kind = x.get("event")
        if kind == "breaker":
            broke[int(x.get("attempt", 0))] = x
        if kind in ("exited", "death_noticed") and str(x.get("role")).startswith(("trainer", "worker")):
            ends.setdefault((str(kind), int(x.get("attempt", 0)), str(x.get("role"))), x)
        elif kind == "hang_detected":
            hung.setdefault(int(x.get("attempt", 0)), x)
        elif kind == "chaos_kill" and x.get("role") == "trainer":
            chaos.setdefault(x.get("pid"), x)
    next_restore: list[Optional[dict[str, Any]]] = [None] * len(events)
    following: Optional[dict[str, Any]] = None
    for i in range(len(events) - 1, -1, -1):
        if events[i].get("event") in ("restored", "initialized"):
            following = events[i]
        next_restore[i] = following
    out = []
    for i, e in enumerate(events):
        if e.get("event") != "restarting":
            continue
        prev = int(e.get("attempt", 0)) - 1
        if prev in broke and e.get("error") != "preempted":  # the group's true breaker, found after the judgement
            e = {**e, "error": broke[prev].get("error")}
        # a group's restart names the member whose end broke it ("worker1 attempt 3 (pid N) died"): its records
        role = str(e.get("error") or "").split(" ", 1)[0]
        role = role if role.startswith("worker") and ("exited", prev, role) in ends else "trainer"
        exited, noticed = ends.get(("exited", prev, role)), ends.get(("death_noticed", prev, role))
        pid = (exited or noticed or {}).get("pid")
        hang, kill = hung.get(prev), chaos.get(pid) if pid is not None else None
        out.append(_restart(e, prev, pid, exited, noticed, hang, kill, next_restore[i], role))
    return out


def _restart(e: dict[str, Any], prev: int, pid: Any, exited: Optional[dict[str, Any]],
             noticed: Optional[dict[str, Any]], hang: Optional[dict[str, Any]], kill: Optional[dict[str, Any]],
             restored: Optional[dict[str, Any]], role: str = "trainer") -> Restart:
    how = ""
    if exited is not None:
        how = f"killed by {exited['signal']}" if "signal" in exited else f"exit {exited.get('code')}"
    error = str(e.get("error") or "")
    if exited is not None and (not error or error.endswith(" died")):  # restarted on the death notice
        said = f"was {how}" if "signal" in exited else f"exited with code {exited.get('code')}"
        error = f"{role} attempt {prev} (pid {pid}) {said}"
    if error == "preempted":
        label, cause = "preempted", f"trainer attempt {prev} was preempted (saved its state, exit 42)"
    elif error == "regroup":  # rule 15: no failure, a membership change (counted apart)
        label, cause = "regroup", f"attempt {prev} was ended at a checkpoint boundary to take a host back"
    elif error.startswith("audit: "):  # --audit: the trainer's machine computed wrongly; rolled back, not a failure
        label, cause = "audit", f"attempt {prev} {error}"
    else:
        label = "hang" if hang is not None else (f"chaos {kill.get('signal', '')}".strip() if kill is not None
                                                  else how.replace("killed by ", "") or "died")
        cause = error or f"trainer attempt {prev} {how or 'died'}"
        if ": HostLost: " in error:  # a member of a lost host (rule 12): no exit status of its own
            label = "host lost"
    step = e.get("rollback_step")
    if isinstance(step, int):
        label = f"rollback {step}"
        cause = f"the trainer group rolled back to skip step {step}: " + cause
    if hang is not None:
        where = f"; {hang['where']}" if hang.get("where") else ""  # (the stacks taken first: issue 69)
        blamed = f"; the stacks blame {hang['culprit']}" if hang.get("culprit") else ""
        kept = f"; stacks in {hang['stacks']}" if hang.get("stacks") else ""
        cause += f" (hung: {hang.get('reason')}{where}{blamed}{kept})"
    if kill is not None:
        cause += f" (chaos: {kill.get('signal')})"
    times = [float(x["noticed"]) for x in (noticed, exited) if x is not None and x.get("noticed")]
    return Restart(min(times) if times else float(e["time"]), prev + 1, cause, label,
                   None if restored is None else int(restored["step"]),
                   None if restored is None else float(restored["secs"]),
                   restored is None or restored.get("event") == "restored", step if isinstance(step, int) else None)


def plain_restarts(rep: list[Restart]) -> list[Restart]:
    """The restarts that are not a trainer group's rollback (counted as a rollback, not a restart) nor a
    regroup (an elastic group ended to take a host back: a membership change) nor an audit's rollback."""
    return [r for r in rep if r.rollback_step is None and r.label not in ("regroup", "audit")]


def commits(events: list[dict[str, Any]], layout: Layout, since: Optional[float]) -> list[tuple[float, int]]:
    """(wall time, step) of each checkpoint committed in the launch: its lifecycle records, plus
    the manifests committed since the launch began (retention deletes old manifests, never
    lifecycle records; a record may be missing if lifecycle.jsonl could not be written)."""
    found = {int(e["step"]): float(e["time"]) for e in events if e.get("event") == "checkpoint_committed"}
    for m in list_committed(layout):
        if (since is None or m.committed_at >= since) and m.step not in found:
            found[m.step] = m.committed_at
    return sorted((t, s) for s, t in found.items())


def event_series(events: list[dict[str, Any]]) -> list[tuple[float, int]]:
    """A coarse step series from events that name a step (when ``report.json`` has none)."""
    named = ("initialized", "restored", "first_step", "checkpoint_committed", "hang_detected", "finished")
    return [(float(e["time"]), int(e["step"])) for e in events if e.get("event") in named and "step" in e]


def nonfinite(events: list[dict[str, Any]], summary: Optional[dict[str, Any]],
              every: Optional[list[dict[str, Any]]] = None) -> tuple[list[tuple[float, int]], int]:
    """(wall time, step) of each step the run skipped as non-finite (once each: a step met again after a
    restart, or in a later launch of the logdir, is skipped again), and the launch's rollbacks (in place,
    and a trainer group's: :func:`group_rollbacks`): from ``report.json`` when it has them, the times
    (and a live launch's steps) from the ``step_skipped`` events of ``every`` launch of the logdir (the
    launch's ``events`` without it); an earlier launch's skip keeps the time it was first skipped at."""
    when: dict[int, float] = {}
    for e in events if every is None else every:
        if e.get("event") == "step_skipped" and isinstance(e.get("step"), int):
            when.setdefault(int(e["step"]), float(e["time"]))
    rollbacks = sum(1 for e in events if e.get("event") == "rolled_back") + group_restarts(events)
    if summary is not None and isinstance(summary.get("skipped_steps"), list):
        steps = [int(s) for s in summary["skipped_steps"]]
        rollbacks = int(summary.get("rollbacks") or 0)
    else:
        steps = sorted(when)
    last = float(events[-1]["time"]) if events else 0.0
    return [(when.get(s, last), s) for s in steps], rollbacks


def group_rollbacks(events: list[dict[str, Any]], summary: Optional[dict[str, Any]]) -> int:
    """A trainer group's rollbacks (a restart of the group, counted as a rollback, or one in place): from
    ``report.json`` when it has its skipped steps, else the ``restarting`` records naming a ``rollback_step``
    and the ``rolled_back`` records of a group (``group``)."""
    if summary is not None and isinstance(summary.get("skipped_steps"), list):
        return int(summary.get("group_rollbacks") or 0)
    return group_restarts(events) + group_in_place(events, None)


def group_restarts(events: list[dict[str, Any]]) -> int:
    """A trainer group's rollbacks by its restart: the ``restarting`` records naming a ``rollback_step``."""
    return sum(1 for e in events if e.get("event") == "restarting" and isinstance(e.get("rollback_step"), int))


def group_in_place(events: list[dict[str, Any]], summary: Optional[dict[str, Any]]) -> int:
    """A trainer group's rollbacks in place (no member restarted): from ``report.json`` when it has its skipped
    steps, else the ``rolled_back`` records of a group."""
    if summary is not None and isinstance(summary.get("skipped_steps"), list):
        return int(summary.get("group_in_place") or 0)
    return sum(1 for e in events if e.get("event") == "rolled_back" and e.get("group"))


def gather(layout: Layout) -> Optional[RunReport]:
    """The report of the last launch in ``layout``, or None if procsv never ran there."""
    from procsv.status import read_status

    status = read_status(layout)
    every = read_events(layout.lifecycle)
    events = last_launch(every)
    if status is None and not events:
        return None
    status = status or {}
    started = float(events[0]["time"]) if events and events[0].get("event") == "launch" else None
    live = LogdirLock.holder(layout)
    summary = read_json(layout.report)
    if not isinstance(summary, dict) or live is not None or not _same_launch(summary, started):
        summary = None
    finished = next((e for e in reversed(events) if e.get("event") == "finished"), None)
    rep = RunReport(
        logdir=layout.logdir, state=str(status.get("state", "unknown")),
        step=int(status.get("step") or (finished or {}).get("step") or 0), live_pid=live, started_at=started,
        ended_at=float(summary["ended_at"]) if summary and summary.get("ended_at") else
        (None if live is not None else (float(events[-1]["time"]) if events else None)),
        goodput=(summary or {}).get("goodput", status.get("goodput")), summary=summary,
        restarts=restarts(events), checkpoints=commits(events, layout, started))
    series = (summary or {}).get("series")
    rep.series = [(float(t), int(s)) for t, s in series] if isinstance(series, list) and series else event_series(events)
    rep.skipped, rep.rollbacks = nonfinite(events, summary, every)
    rep.group_rollbacks = group_rollbacks(events, summary)
    rep.memberships = [e for e in events if e.get("event") == "membership"]
    rep.spikes = [e for e in events if e.get("event") in ("spike_detected", "spike_replayed", "host_suspect")]
    launches = gp.launches_from_events(every, now=time.time() if live is not None else None)
    per, rep.lifetime = gp.run_breakdown(launches)
    rep.launches = [(la.number, b) for la, b in zip(launches, per)]
    # the records' repeats added up (0: a group member's report of the step a peer reported first, the same
    # finding); status.json's count when more: a watchdog killed (SIGKILL) before it wrote its last
    # coalesced record (at most a minute's detections), or a live run's unwritten tail
    rep.detected = max(sum(_repeats(e) for e in events if e.get("event") == "nonfinite_detected"),
                       int(status.get("nonfinite_detected") or 0))
    names = gp.tasks(every)
    if len(names) > 1:  # a group (--nproc, or --ps workers that step): each task's own breakdown
        now = time.time() if live is not None else None
        rep.tasks = [(n, gp.run_breakdown(gp.launches_from_events(every, now=now, task=n))[1]) for n in names]
    return rep


def _repeats(record: dict[str, Any]) -> int:
    """The detections a ``nonfinite_detected`` record stands for (1 when it does not say)."""
    n = record.get("repeats")
    return n if isinstance(n, int) and n >= 0 else 1


def _same_launch(summary: dict[str, Any], started: Optional[float]) -> bool:
    """``report.json`` was written by the launch whose lifecycle starts at ``started`` (the
    watchdog takes its start time before it writes the launch record: within a few seconds)."""
    at = summary.get("started_at")
    if started is None or not isinstance(at, (int, float)):
        return started is None  # a report of an older procsv, or no launch record: take it as is
    return abs(started - at) < 30.0


def _clock(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def render(rep: RunReport) -> str:
    """The report as text."""
    span = ""
    if rep.started_at is not None:
        end = rep.ended_at if rep.ended_at is not None else time.time()
        span = f", launched {_clock(rep.started_at)}, {end - rep.started_at:.1f} s"
    lines = [f"procsv run in {rep.logdir}: {rep.state} at step {rep.step}{span}"]
    if rep.live_pid is not None:
        lines.append(f"  live (watchdog pid {rep.live_pid}): the recovery breakdown is written when the launch ends")
    if rep.summary is not None:
        lines.append(recovery.render(rep.summary))
    else:
        good = "-" if rep.goodput is None else f"{rep.goodput:.3f}"
        rolled = sum(1 for r in rep.restarts if r.rollback_step is not None)
        lines.append(f"procsv report: {len(plain_restarts(rep.restarts))} restart(s), "
                     + (f"{rolled} rollback(s) of the trainer group, " if rolled else "") + f"goodput {good}")
    for r in rep.restarts:
        if r.restored_step is None:
            back = ""
        elif not r.from_checkpoint:
            back = f"; attempt {r.attempt} started again from step {r.restored_step} (no checkpoint yet)"
        else:
            back = f"; attempt {r.attempt} restored step {r.restored_step}" + \
                ("" if r.restore_secs is None else f" in {r.restore_secs:.2f} s")
        what = "restart" if r.rollback_step is None else "group rollback"
        what = r.label if r.label in ("regroup", "audit") else what
        lines.append(f"  {what} at {_clock(r.at)} [{r.label}]: {r.cause}{back}")
    for m in rep.memberships:  # --min-nodes: each group started on other hosts than the one before
        nodes = m.get("nodes") or []
        lines.append(f"  membership at {_clock(float(m['time']))}: attempt {m.get('attempt')} on {len(nodes)} host(s) "
                     f"(nodes {', '.join(map(str, nodes))}; {m.get('world')} trainers): {m.get('reason')}")
    found = [e for e in rep.spikes if e.get("event") == "spike_detected"]
    verdicts = {e.get("step"): e for e in rep.spikes if e.get("event") == "spike_replayed"}
    rolled_spikes = sum(1 for e in found if e.get("action") == "rollback")
    if rep.skipped or rep.rollbacks or rep.detected:
        restarted = sum(1 for r in rep.restarts if r.rollback_step is not None)  # (the others: in place)
        counts = nonfinite_counts(rep.rollbacks, rep.group_rollbacks, len(rep.skipped), rolled_spikes, rep.detected,
                                  max(0, rep.group_rollbacks - restarted))
        lines.append(f"  {rollback_label(rep.detected, rolled_spikes)}: {counts}: "
                     f"{', '.join(str(s) for _, s in rep.skipped) or 'none'}"
                     + (f"; {rep.detected} time(s) found non-finite" if rep.detected or not rolled_spikes else ""))
    if found:
        words = "; ".join(spike_words(e, verdicts.get(e.get("step"))) for e in found)
        lines.append(f"  loss spikes: {len(found)}: {words}")
    for e in (e for e in rep.spikes if e.get("event") == "host_suspect"):
        lines.append(f"  suspect host {e.get('host')}: {e.get('faults')} transient fault(s) (loss spikes not again "
                     f"when replayed, the last at step {e.get('step')}; --suspect-after {e.get('limit')}): reported "
                     "only, nothing excluded or stopped")
    if rep.lifetime is not None and rep.launches:
        lines.append(gp.render(rep.launches, rep.lifetime))
    if rep.tasks:
        lines.append(gp.render_tasks(rep.tasks))
    if rep.checkpoints:
        steps = [s for _, s in rep.checkpoints]
        lines.append(f"  checkpoints: {len(steps)} committed in this launch (steps {steps[0]}..{steps[-1]}), "
                     f"the last at {_clock(rep.checkpoints[-1][0])}")
    else:
        lines.append("  checkpoints: none committed in this launch")
    return "\n".join(lines)



def nonfinite_counts(rollbacks: int, group_rollbacks: int, skipped: int, spikes: int = 0, found: int = 1,
                     in_place: int = 0) -> str:
    """``N rollback(s)..., M step(s) skipped (why)``: a single trainer skips a step whose loss was
    non-finite twice (found, rolled back in place, retried); a trainer group skips it once found (its
    rollback restarts the group, every member skipping it); ``spikes``: loss spikes rolled back
    (``--on-spike rollback``), whose restores and steps are counted here too; ``found``: the non-finite
    findings (none, with spikes: the why names the spikes alone); ``in_place``: the group's rollbacks in place."""
    why = "NaN or infinite loss" if group_rollbacks else "NaN or infinite loss twice"
    if spikes:
        why = f"{why}, or a loss spike's steps" if found else "a loss spike's steps"
    return f"{rollback_words(rollbacks, group_rollbacks, in_place)}, {skipped} step(s) skipped ({why})"


def spike_words(record: dict[str, Any], replayed: Optional[dict[str, Any]] = None) -> str:
    """A ``spike_detected`` record in words: ``step 65 (loss 14.9 against a threshold of 2.6, median 0.29):
    rollback`` (``steps 63-65`` when its onset is earlier), and what its replay (its ``spike_replayed``
    record, if any) said: ``, the data's (again when replayed): skipped``, ``, a transient fault of
    host H (not again when replayed): kept`` or ``, no verdict (the replay's input differed from step N):
    kept``."""
    step, onset = record.get("step"), record.get("onset")
    steps = f"steps {onset}-{step}" if onset is not None and onset != step else f"step {step}"

    def num(key: str) -> str:
        value = record.get(key)
        return f"{value:.3g}" if isinstance(value, (int, float)) else "?"

    verdict = ""
    if replayed is not None:
        verdict = (", the data's (again when replayed): skipped" if replayed.get("reproduced") else
                   f", no verdict (the replay's input differed from step {replayed['differs_at']}): kept"
                   if replayed.get("differs_at") is not None else
                   f", a transient fault of host {replayed.get('host')} (not again when replayed): kept")
    return (f"{steps} (loss {num('loss')} against a threshold of {num('threshold')}, median {num('median')}): "
            f"{record.get('action')}{verdict}")
