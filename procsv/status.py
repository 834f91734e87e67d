"""The run's status record: written by the watchdog, read by ``procsv status``.

The watchdog owns ``<logdir>/.procsv/status.json`` (atomic replace on every change, throttled).
:func:`read_status` is what the CLI shows: the file, corrected by what is true *now* -- the last
checkpoint comes from the committed manifests, and a run whose watchdog is gone is not reported
as running -- plus the summary service's counters from ``<logdir>/.procsv/summary_stats.json``
(that service writes it) and the messages each process refused (``rejected``: the watchdog's from
``status.json``, the services' from their stats files). :func:`watch` redraws the view on every change (``procsv status --watch``).

Pids are checked only where they mean something: on the watchdog's host (the record's ``host_id``:
the same kernel boot and PID namespace, :func:`procsv.common.pidfd.host_id`). Read from another
host of a ``--nnodes`` job (or another container sharing the logdir), the watchdog is alive while
it holds the logdir lock (a ``flock``, which a shared filesystem's hosts see: NFSv4, or one
kernel's), and the other processes' liveness is not known there (``alive`` is None); a member on
another node is never checked by its pid on node 0 either.
"""

from __future__ import annotations

import os
from typing import Any, Optional, TextIO

import psutil

from procsv.goodput import KINDS
from procsv.common.layout import Layout, LogdirLock, read_json
from procsv.common.manifests import last_checkpoint
from procsv.common.pidfd import host_id


def summary_counts(layout: Layout) -> Optional[dict[str, int]]:
    """``{"written": n, "dropped": n, "nonfinite": n}`` from the summary service's stats file, or None.

    ``nonfinite``: scalars written whose value is NaN or infinite (kept as logged, and counted).
    """
    stats = read_json(layout.summary_stats)
    if not isinstance(stats, dict):
        return None
    try:
        return {"written": int(stats.get("written", 0)), "dropped": int(stats.get("dropped", 0)),
                "nonfinite": int(stats.get("nonfinite", 0))}
    except (TypeError, ValueError):
        return None


def rejected_counts(layout: Layout, watchdog: Any) -> dict[str, Optional[dict[str, Any]]]:
    """The messages each receiving process refused: ``{role: {"total": n, "by_reason": {...}}}``;
    None for a service that has written no stats file yet."""
    out: dict[str, Optional[dict[str, Any]]] = {"watchdog": _rejected(watchdog)}
    for role, path in (("checkpoint", layout.checkpoint_stats), ("summary", layout.summary_stats)):
        stats = read_json(path)
        out[role] = _rejected(stats.get("rejected") if isinstance(stats, dict) else None)
    return out


def _rejected(record: Any) -> Optional[dict[str, Any]]:
    if not isinstance(record, dict) or not isinstance(record.get("total"), int):
        return None
    by_reason = record.get("by_reason")
    return {"total": record["total"], "by_reason": dict(by_reason) if isinstance(by_reason, dict) else {}}


def pid_alive(pid: Optional[int], create_time: Optional[float] = None) -> bool:
    """True if ``pid`` runs and, when given, was started at ``create_time`` (not a reused pid)."""
    if not pid:
        return False
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        return create_time is None or abs(proc.create_time() - create_time) < 1.0
    except psutil.Error:
        return False


def read_status(layout: Layout) -> Optional[dict[str, Any]]:
    """The status of the run in ``layout``, or None if procsv never ran there."""
    status = read_json(layout.status)
    if not isinstance(status, dict) or not isinstance(status.get("processes", []), list) \
            or not all(isinstance(p, dict) for p in status.get("processes", [])):
        return None  # not a status record (damaged, or written by something else)
    status["last_checkpoint"] = last_checkpoint(layout)
    status["summaries"] = summary_counts(layout)
    status["rejected"] = rejected_counts(layout, status.get("rejected"))
    here = status.get("host_id") in (None, host_id())  # (None: written by an older procsv)
    status["here"] = here
    for proc in status.get("processes", []):
        remote = proc.get("node") not in (None, 0)  # a member on another host of the job
        proc["alive"] = pid_alive(proc.get("pid"), proc.get("create_time")) if here and not remote else None
    watchdog = next((p for p in status.get("processes", []) if p.get("role") == "watchdog"), None)
    if watchdog is not None and not here:
        watchdog["alive"] = LogdirLock.held_by(layout) is not None
    if status.get("state") == "running" and watchdog is not None and not watchdog["alive"]:
        status["state"] = "failed"
        status["last_error"] = status.get("last_error") or "the watchdog process died (killed?) without finishing"
    if status.get("state") != "running":
        status["prewarm"] = None  # it ends with its watchdog (a record of an older procsv still names it)
    return status


def rollback_words(rollbacks: int, grouped: int, in_place: int = 0) -> str:
    """``N rollback(s)``, and how many were a trainer group's (its restart, or ``in_place`` of them in place,
    every member skipping the step: a rollback, not a restart), as ``procsv status`` and ``procsv report`` say it."""
    if not grouped:
        return f"{rollbacks} rollback(s)"
    how = "restarted" if not in_place else "in place" if in_place == grouped else \
        f"{in_place} in place, {grouped - in_place} restarted"
    if grouped == rollbacks:
        return f"{rollbacks} rollback(s) of the trainer group ({how}, every member skipping the step)"
    return f"{rollbacks} rollback(s) ({grouped} of the trainer group ({how}), {rollbacks - grouped} in place)"


def rollback_label(found: int, spikes: int) -> str:
    """What the rollbacks and skips of a run were for, as the line that counts them begins: ``non-finite``
    (``found`` non-finite findings, no loss spike rolled back), ``loss-spike rollbacks`` (``spikes`` rolled
    back, nothing found non-finite), or both."""
    if not spikes:
        return "non-finite"
    return "loss-spike rollbacks" if not found else "non-finite and loss-spike rollbacks"


def spike_lines(spikes: Any) -> list[str]:
    """``status.json``'s ``spikes`` in words (none if no spike was seen): how many, by action, the last
    one's step, loss, threshold and action; each host's transient faults (loss spikes not again when
    replayed) and which hosts are suspect (``--suspect-after``)."""
    if not isinstance(spikes, dict) or not spikes.get("seen"):
        return []
    actions = ", ".join(f"{a} {n}" for a, n in (spikes.get("by_action") or {}).items())
    line = f"  loss spikes: {spikes['seen']} seen ({actions})"
    last = spikes.get("last")
    if isinstance(last, dict):
        steps = f"steps {last.get('onset')}-{last.get('step')}" if last.get("onset") != last.get("step") \
            else f"step {last.get('step')}"
        line += (f"; the last at {steps}: loss {float(last.get('loss', 0)):.3g} against a threshold of "
                 f"{float(last.get('threshold', 0)):.3g}, {last.get('action')}")
    out = [line]
    faults = spikes.get("transient_faults") or {}
    if faults:
        suspects = set(spikes.get("suspect_hosts") or [])
        hosts = ", ".join(f"{h} {n}" + (" (suspect)" if h in suspects else "") for h, n in faults.items())
        out.append(f"  transient faults (spikes not again when replayed), by host: {hosts}; suspect from "
                   f"{spikes.get('suspect_after')} (reported only: nothing is excluded or stopped)")
    return out


def audit_lines(audit: Any) -> list[str]:
    """``status.json``'s ``audit`` (``--audit``, issue 71) in words: the fraction of the committed steps audited,
    the verdicts, the hosts whose trainer an audit found computing wrongly, the steps not audited (dropped, or no
    replay could be made) and the auditors dead before their answer, whether a finished trainer's end waits for the
    audit, the auditor's duty cycle and what it costs the trainer (once measured), why the audit switched off."""
    if not isinstance(audit, dict) or not audit.get("mode"):
        return []
    verdicts = ", ".join(f"{v} {n}" for v, n in sorted((audit.get("verdicts") or {}).items())) or "none yet"
    line = (f"  audit ({audit['mode']}): {audit.get('audited_steps')} of {audit.get('committed_steps')} committed "
            f"steps replayed bit-equal ({float(audit.get('fraction') or 0):.1%}); verdicts: {verdicts}")
    wrong = audit.get("miscomputed") or {}
    if wrong:
        line += "; computed wrongly (rolled back), by host: " + ", ".join(f"{h} {n}" for h, n in wrong.items())
    lines = [line]
    if audit.get("dropped_steps"):
        lines.append(f"  {audit['dropped_steps']} committed steps not audited: the auditor fell behind and their "
                     "intervals were dropped (a fault in them goes unseen)")
    if audit.get("unaudited_steps"):
        lines.append(f"  {audit['unaudited_steps']} committed steps got no verdict (their replay could not be made: "
                     "the audit records say why)")
    if audit.get("auditor_deaths"):
        lines.append(f"  {audit['auditor_deaths']} auditor(s) died before their answer (their interval replayed again "
                     "by a fresh auditor, a bounded number of times)")
    if audit.get("end_waits"):
        lines.append("  the trainer finished; the run's end waits for the audit's last verdicts")
    if audit.get("slowdown") is not None and not audit.get("off"):
        bound = f" (at most {float(audit['bound']):.1%})" if audit.get("bound") is not None else ""
        lines.append(f"  auditor runs {float(audit.get('duty') or 0):.0%} of the time: a running auditor slows the "
                     f"trainer {float(audit['slowdown']):.1%}{bound}, so the audit costs it {'at most ' if bound else ''}"
                     f"{float(audit.get('cost') or 0):.2%} (budget 0.5%)"
                     + (f"; {float(audit['spent']):.2%} of its time so far" if audit.get("spent") is not None else ""))
    return lines + ([f"  audit off: {audit['off']}"] if audit.get("off") else [])


def render(status: dict[str, Any], logdir: str) -> str:
    """A short human view of a status record."""
    lines = [f"procsv run in {logdir}: {status.get('state')}"]
    if not status.get("here", True):
        lines.append(f"  watchdog on host {status.get('host', '?')} (not this one: its pids are not checked from here; "
                     "it is alive while it holds the logdir lock)")
    if status.get("job"):
        lines.append(f"  scheduler job {status['job']}")
    ck = status.get("last_checkpoint")
    ck_text = f"step {ck['step']} ({os.path.basename(ck['path'])})" if ck else "none"
    lines.append(f"  step {status.get('step')}, restarts {status.get('restarts')}, last checkpoint {ck_text}")
    if status.get("restored_step") is not None:
        lines.append(f"  trainer restored from step {status['restored_step']}")
    skipped, rollbacks = status.get("skipped_steps") or [], status.get("rollbacks") or 0
    found, grouped = status.get("nonfinite_detected") or 0, status.get("group_rollbacks") or 0
    if skipped or rollbacks or found:
        steps = ", ".join(map(str, skipped)) if skipped else "none"
        spiked = status.get("spikes")
        rolled = int(((spiked.get("by_action") if isinstance(spiked, dict) else None) or {}).get("rollback") or 0)
        lines.append(f"  {rollback_label(found, rolled)}: {rollback_words(rollbacks, grouped, status.get('group_in_place') or 0)}, {len(skipped)} step(s) "
                     f"skipped: {steps}" + (f"; {found} time(s) found non-finite" if found or not rolled else ""))
    lines += spike_lines(status.get("spikes"))
    lines += audit_lines(status.get("audit"))
    if status.get("goodput") is not None:
        lines.append(f"  goodput {status['goodput']:.3f} (time on kept steps / wall time)")
    spent = status.get("breakdown")
    if isinstance(spent, dict) and spent.get("wall_s"):
        shares = [f"{k} {float(spent.get(k + '_s') or 0) / float(spent['wall_s']):.0%}" for k in KINDS
                  if spent.get(k + "_s")]
        lines.append(f"  this launch's {float(spent['wall_s']):.0f} s: " + ", ".join(shares))
    prewarm = status.get("prewarm")
    if prewarm:
        lines.append(f"  pre-warmed trainer pid {prewarm['pid']} ({'ready' if prewarm['ready'] else 'warming up'})")
    grp = status.get("group")
    if grp:
        if grp.get("ps"):  # --ps N --workers M: each task restarts alone
            lines.append(f"  {grp.get('nproc')} worker(s) and {grp['ps']} parameter server(s), each restarted alone")
        elif (grp.get("nnodes") or 1) > 1:  # --nnodes: nproc is each host's share
            nodes = grp.get("nodes") or list(range(grp["nnodes"]))
            elastic = (grp.get("min_nodes") or grp["nnodes"]) < grp["nnodes"]
            hosts = f"{len(nodes)} of {grp['nnodes']} hosts (nodes {', '.join(map(str, nodes))}; --min-nodes " \
                    f"{grp['min_nodes']}; {grp.get('membership_changes') or 0} membership change(s))" if elastic \
                else f"{grp['nnodes']} hosts"
            lines.append(f"  trainer group of {len(nodes) * grp.get('nproc', 1)} ({grp.get('nproc')} on each of "
                         f"{hosts}): {grp.get('state')}")
        else:
            lines.append(f"  trainer group of {grp.get('nproc')}: {grp.get('state')}")
    for p in status.get("processes", []):
        alive = {True: "alive", False: "gone"}.get(p.get("alive"), f"on {p.get('host') or status.get('host', '?')}")
        member = f"  rank {p['rank']} on node {p.get('node')} ({p.get('host')}), step {p.get('step')}" \
            if "rank" in p else ""
        lines.append(f"  {p.get('role', '?'):<11} pid {p.get('pid')!s:<8} {p.get('state', '?'):<10} "
                     f"restarts {p.get('restarts', 0)}  ({alive}){member}")
    summ = status.get("summaries")
    if summ:
        line = f"  summaries: {summ['written']} written, {summ['dropped']} dropped"
        if summ.get("nonfinite"):
            line += f", {summ['nonfinite']} NaN or infinite scalars (kept as logged: check the loss)"
        lines.append(line)
    refused = {role: r["total"] for role, r in (status.get("rejected") or {}).items() if r and r.get("total")}
    if refused:
        lines.append("  messages refused (malformed or foreign): "
                     + ", ".join(f"{role} {n}" for role, n in refused.items()))
    blips = status.get("logdir_errors") or {}
    if blips.get("count"):
        lines.append(f"  logdir: {blips['count']} look(s) at it failed ({blips.get('last')}, a filesystem's blip; "
                     "the run stops only after --logdir-timeout of failures in a row)")
    if status.get("last_error"):
        lines.append(f"  last error: {status['last_error']}")
    return "\n".join(lines)


def watch(layout: Layout, out: TextIO, liveness_secs: float = 2.0) -> dict[str, Any]:
    """Redraw the human view whenever ``status.json`` changes, until the run is no longer running.

    Changes arrive as filesystem events (the ``watchdog`` package's observer on ``.procsv/``), not
    by polling the file; every ``liveness_secs`` without an event the record is read again anyway,
    because a watchdog killed with SIGKILL changes nothing on disk. Returns the last record.
    """
    from procsv.common.fswake import wakeups

    clear = "\x1b[H\x1b[J" if out.isatty() else ""
    shown = ""
    with wakeups(layout.meta, only=layout.status) as changed:
        while True:
            changed.clear()
            status = read_status(layout)
            if status is None:
                raise FileNotFoundError(layout.status)
            text = render(status, layout.logdir)
            if text != shown:
                out.write(clear + text + "\n" + ("" if clear else "\n"))
                out.flush()
                shown = text
            if status.get("state") != "running":
                return status
            changed.wait(liveness_secs)
