"""``<logdir>/.procsv/status.json``: the watchdog's record of its run, for ``procsv status``.

Runs in the watchdog, the file's only writer (:mod:`procsv.status` is the reader the CLI uses).
:func:`status_record` builds the record from the view (in the loop); :class:`StatusWriter` says
when a write is due (in the loop) and replaces the file atomically (in the logdir writer thread,
:mod:`procsv.watchdog.publish.diskio`), at most every :data:`STATUS_EVERY` seconds while the run
goes on (not fsync'd: it is rewritten constantly), and once more, durably, at the end.
"""

from __future__ import annotations

import errno
import os
import socket
import time
from typing import Any, Callable, Optional

import psutil

from procsv.common import faults
from procsv.common.layout import Layout, write_json
from procsv.common.pidfd import host_id
from procsv.goodput import Breakdown
from procsv.watchdog.rules import group, membership
from procsv.watchdog.publish import badput
from procsv.watchdog.config import LaunchConfig
from procsv.watchdog.prewarm import Zygote
from procsv.watchdog.rules.state import CHECKPOINT, PS, SERVER, SUMMARY, TRAINER, WORKER, RunView

STATUS_EVERY = 0.5  # seconds
STATUS_VERSION = 1
STALL_SECS = 5.0  # how long the fault point status_stall blocks a write (tests only)


def status_record(view: RunView, cfg: LaunchConfig, layout: Layout, now: float, wall: float, started_wall: float,
                  zygote: Optional[Zygote], rejected: Optional[dict[str, Any]] = None,
                  spent: Optional[Breakdown] = None) -> dict[str, Any]:
    """The status record at ``now`` (monotonic) / ``wall`` (epoch seconds); ``rejected``: the
    messages the watchdog refused (:meth:`procsv.ipc.rejections.Rejections.record`). Its
    ``last_checkpoint`` is left None for the writer to read (the loop reads nothing from the logdir).
    ``spent``: the launch's breakdown at ``now`` (the round's, shared), else computed here."""
    procs: list[dict[str, Any]] = [{"role": "watchdog", "pid": os.getpid(),
                                    "state": "exited" if view.finishing else "running", "restarts": 0,
                                    "create_time": psutil.Process().create_time()}]
    host = socket.gethostname()
    chief = view.children.get(TRAINER)
    members = [TRAINER] + sorted((w.slot for w in group.workers(view) if chief is None or view.tasks_alone or not w.reaped
                                  or w.attempt == chief.attempt), key=group.rank_of)  # (not a bigger group's, rule 15)
    ps = sorted((c.slot for c in view.children.values() if c.role == PS), key=lambda s: int(s[len(PS):]))
    servers = sorted((c.slot for c in view.children.values() if c.role == SERVER), key=group.rank_of)  # --coordinator
    grouped = cfg.nproc * cfg.nnodes > 1 or cfg.ps > 0  # --nproc, --nnodes (one trainer per host too), --ps
    for slot in (*members, *servers, *ps, CHECKPOINT, SUMMARY):
        c = view.children.get(slot)
        if c is not None:
            rolled = view.not_restarts(before=c.attempt) if c.role in (TRAINER, WORKER) else 0  # not restarts
            entry = {"role": c.slot if c.role in (WORKER, PS, SERVER) else c.role, "pid": c.pid, "state": c.state.value,
                     "restarts": c.attempt - 1 - rolled, "attempt": c.attempt, "create_time": c.create_time}
            if grouped and c.role in (TRAINER, WORKER):  # a group's member: its task, its node and host, its step
                node = view.nodes.get(c.node)
                entry.update(rank=group.rank_of(c.slot), node=c.node, host=node.host if node else host, step=c.step)
            procs.append(entry)
    spent = badput.of_launch(view, now) if spent is None else spent
    return {
        "group": {"nproc": cfg.nproc, "nnodes": cfg.nnodes, "state": group.group_state(view), "ps": cfg.ps,
                  # rule 15 (--min-nodes): the hosts the group runs on now, and how often that changed
                  "nodes": list(view.group_nodes or range(cfg.nnodes)), "min_nodes": cfg.min_nodes or cfg.nnodes,
                  "membership_changes": view.membership_changes,
                  "hosts": [{"node": n, "host": v.host, "connected": membership.connected(view, n),
                             "ready": v.ready_at is not None} for n, v in sorted(view.nodes.items())]}
        if grouped else None,
        "version": STATUS_VERSION,
        "state": view.run.value,
        "step": view.step,
        "restarts": view.history.restarts,  # a group's rollback is none: it is counted in rollbacks
        "restored_step": view.restored_step,
        "skipped_steps": list(view.skipped_steps),  # non-finite steps skipped (issue 41): the global step each would have completed
        "rollbacks": view.rollbacks,  # restores of a finite state after a non-finite loss: in place, and a group's
        "group_rollbacks": view.group_rollbacks() + view.findings.group_in_place,  # ... of which a trainer group's (in place,
        # or its restart, to skip the step)
        "group_in_place": view.findings.group_in_place,  # ... of which in place (no member restarted)
        "nonfinite_detected": view.findings.nonfinite,  # non-finite losses or snapshot states found (a group's step: once)
        "spikes": view.findings.spikes_json(),  # loss spikes (issue 68), transient faults by host, suspect hosts
        "audit": view.findings.audit or None,  # --audit (issue 71): mode, steps audited and their fraction, verdicts
        "last_checkpoint": None,  # (read by the writer: DiskIO, or the final status of a moved logdir)
        "last_error": view.last_error,
        "goodput": badput.goodput(view, spent),
        "breakdown": spent.to_json(),
        "prewarm": None if zygote is None else {"pid": zygote.pid, "ready": zygote.ready},  # the pre-warmed trainer
        "exit_code": view.exit_code if view.finishing else None,
        "rejected": rejected or {"total": 0, "by_reason": {}},
        "logdir_errors": {"count": view.logdir_errors, "last": view.logdir_last_error},
        "processes": procs,
        "target": cfg.target,
        "job": cfg.job_id,  # the scheduler's job id (SLURM_JOB_ID), None outside one
        "args": cfg.args,
        "logdir": layout.logdir,
        "host": host,  # the watchdog's; its pids mean something only where host_id is the reader's
        "host_id": host_id(),
        "started_at": started_wall,
        "updated_at": wall,
    }


class StatusWriter:
    """Writes the status record when it changed, throttled."""

    def __init__(self, layout: Layout, clock: Callable[[], float], complain: Callable[[str], None]) -> None:
        self.layout = layout
        self.clock = clock
        self.dirty = True
        self._at = float("-inf")
        self._complain = complain
        self.failing: Optional[str] = None  # the error of the last write, while writes fail
        self._vanished = False  # the last write found the directory gone (ENOENT): not reported yet

    def due(self, force: bool = False) -> bool:
        """Whether a record is to be written now (it changed and :data:`STATUS_EVERY` passed, or
        ``force``); if so, the write is counted as done now."""
        now = self.clock()
        if not force and (not self.dirty or now - self._at < STATUS_EVERY):
            return False
        self.dirty = False
        self._at = now
        return True

    def write(self, record: dict[str, Any], durable: bool = False) -> None:
        """Replace the file with ``record`` (``durable``: fsync'd). A failing write (ENOSPC, EIO) is
        reported once and retried at the next change: the run goes on without a fresh status file
        rather than stopping. A write that finds its directory gone (ENOENT) is reported only if the
        next one does too, or if it is the final (``durable``) one: a logdir being deleted is the
        loop's "lost" line, not this one. The fault point ``watchdog:status_stall`` (tests only) blocks
        a write of a record past step 0 for :data:`STALL_SECS`, as a stalled network filesystem does."""
        if record.get("step", 0) > 0 and faults.fires("watchdog", "status_stall"):
            time.sleep(STALL_SECS)
        try:
            write_json(self.layout.status, record, durable=durable)
        except OSError as exc:
            self.dirty = True
            if exc.errno == errno.ENOENT and not durable and not self._vanished and self.failing is None:
                # the directory is gone: the logdir is being deleted or moved, which the loop's
                # check reports (and then nothing is written there) before the next try; a logdir
                # that is still there at the next failure gets the complaint then
                self._vanished = True
                return
            if self.failing is None:
                self._complain(f"procsv: cannot write {self.layout.status} ({exc.strerror or exc}); "
                               "`procsv status` shows stale data until it can (the run goes on)")
            self.failing = str(exc)
            return
        self._vanished = False
        if self.failing is not None:
            self._complain(f"procsv: {self.layout.status} is written again")
            self.failing = None
