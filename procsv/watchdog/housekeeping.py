"""The watchdog's two guards beside the decisions: left-behind processes and the logdir itself.

Runs in the ``procsv launch`` process (the watchdog), called from its loop
(:mod:`procsv.watchdog.launcher`). :class:`Sweeper` kills and reaps processes of the run whose
parent died (:class:`~procsv.common.orphans.Orphans`), every :data:`SWEEP_EVERY` seconds, after
every exit and once more at the end; a node agent (:mod:`procsv.watchdog.multihost.agent`) runs
the same sweep over its host's members. :class:`LogdirGuard` notices a logdir that was deleted,
moved or replaced while the run is live (a look every round, done by the logdir writer thread so
that a hung filesystem never hangs the loop: :mod:`procsv.watchdog.logdirwatch`) and turns it into
an observation for the decision function (rule 9); at the end it writes the final status record
where a moved logdir went.
:func:`clear_group_records` removes earlier launches' trainer-group restore records at launch, and
:func:`clear_stale_temps` the temp files of atomic writes a kill cut short.
"""

from __future__ import annotations

import os
import re
import stat
from typing import Callable, Optional

from procsv.common.layout import Layout, write_json
from procsv.common.manifests import last_checkpoint
from procsv.common.orphans import Orphans
from procsv.watchdog import observe
from procsv.watchdog.config import LaunchConfig
from procsv.watchdog.publish.events import Event, Report
from procsv.watchdog.logdirwatch import Anchor, LogdirHealth
from procsv.watchdog.prewarm import Prewarmed
from procsv.watchdog.rules.state import RunView
from procsv.watchdog.publish.reporting import Reporter
from procsv.watchdog.publish.statusfile import status_record

SWEEP_EVERY = 1.0  # seconds between sweeps for left-behind processes (also after every exit)
FINAL_SWEEP_SECS = 5.0  # at the end, how long a sweep may wait for what it killed to be reaped

Sink = Callable[[list[Report]], None]


class Sweeper:
    """When the next sweep for left-behind processes is due, and the processes being swept."""

    def __init__(self, clock: Callable[[], float], record: Sink) -> None:
        self.clock = clock
        self.record = record
        self.orphans = Orphans()
        self._next = 0.0

    def due(self) -> bool:
        return self.clock() >= self._next

    def sweep(self, children: set[int], pre: Prewarmed, final: bool = False) -> None:
        """Kill and reap processes of the run whose parent died (see :class:`Orphans`): every child
        of this process but ``children`` and ``pre``'s zygotes (a lost zygote's intermediate too, left
        in a fork and re-parented here at its end); ``final``: wait (a bounded while) until
        those killed are reaped. Not while a fork asked of a zygote is unanswered (``pre.forks``), but
        for the final sweep: the trainer it forked is this process's child (re-parented) before the
        answer naming it is read, and would be taken for one left behind. The watchdog's sweep
        (:meth:`~procsv.watchdog.launcher.Watchdog._sweep`) and a node agent's
        (:mod:`procsv.watchdog.multihost.agent`): each is the subreaper of its host's processes of the run."""
        self._next = self.clock() + SWEEP_EVERY
        known = children | {z.pid for z in pre.zygotes()}  # (those given up on and dead are reaped there)
        if pre.forks and not final:
            return
        killed = self.orphans.sweep_and_reap(known, FINAL_SWEEP_SECS if final else 0.0, self.clock)
        if killed:
            self.record([Report(Event.ORPHANS_KILLED, {"pids": killed},
                                say=f"procsv: killed {len(killed)} process(es) the run left behind (pids "
                                    f"{', '.join(map(str, killed))})", err=True)])


class LogdirGuard:
    """The logdir the run started in (its :class:`~procsv.watchdog.logdirwatch.Anchor`, which the logdir
    writer keeps: :attr:`DiskIO.anchor`) and the verdict on the looks at it."""

    def __init__(self, layout: Layout, view: RunView, out: Reporter, timeout: float,
                 clock: Callable[[], float]) -> None:
        self.layout = layout
        self.view = view
        self.out = out
        self.timeout = timeout  # --logdir-timeout: seconds of failed looks in a row that lose the logdir
        self.clock = clock
        self.health: Optional[LogdirHealth] = None
        self.moved = False  # the look that lost the logdir saw it moved (not gone, hung or failing)

    def start(self) -> None:
        try:
            anchor = self.out.io.anchor = Anchor(self.layout.logdir)  # the logdir writer's looks compare with it
        except OSError:
            return  # a logdir that cannot be opened at the start is not watched
        self.health = LogdirHealth(anchor.identity, self.timeout)

    def check(self) -> None:
        """Is the logdir still the directory the run started in? (after a failed checkpoint, and every
        round). The newest look the logdir writer thread took is judged, and a new look is asked for.
        A look that fails without saying the logdir is gone (EIO, ESTALE) is counted in the view and
        loses the logdir only when every look of ``--logdir-timeout`` seconds failed; so does a look
        that has not returned for that long."""
        health = self.health
        if health is None or self.view.logdir_lost is not None:
            return
        io = self.out.io
        looked = io.take_look()
        reason = health.judge(*looked) if looked is not None else None
        since = io.look_since
        if reason is None and since is not None:
            reason = health.judge_pending(since, self.clock())
        io.ask_look()
        if health.errors != self.view.logdir_errors:
            self.view.logdir_errors, self.view.logdir_last_error = health.errors, health.last_error
            self.out.changed()
        if reason is not None:
            self.moved = looked is not None and looked[0].moved_to is not None
            observe.logdir_lost(self.view, reason)
            self.out.changed()

    def final_status_where_it_went(self, cfg: LaunchConfig, now: float, wall: float, started_wall: float) -> None:
        """A logdir moved while live (the directory the run started in is at another path now, or at
        its own path again: moved back) gets its final status record there, so that ``procsv status
        DIR`` tells how the run ended (not the last record before it was lost, that of a live run).
        Its own path is looked at only after a look saw it moved: not after failing or hung looks."""
        anchor = self.out.io.anchor
        dest = anchor.where() if anchor is not None else None
        if dest is None or anchor is None or (dest == anchor.start and not (self.moved and anchor.leads_here(dest))):
            return
        moved = Layout(dest)
        record = status_record(self.view, cfg, moved, now, wall, started_wall, None)  # (ex.close() killed it)
        record["last_checkpoint"] = last_checkpoint(moved)
        try:
            write_json(moved.status, record)
        except OSError:
            pass


def clear_group_records(layout: Layout) -> None:
    """Remove earlier launches' trainer-group restore records (``Layout.group_records``), at launch."""
    try:
        names = os.listdir(layout.group_records)
    except FileNotFoundError:
        return
    for name in names:
        try:
            os.unlink(os.path.join(layout.group_records, name))
        except OSError:
            pass


_TEMP = re.compile(r"^\.tmp-[a-z0-9_]{8}$")  # procsv.common.layout.atomic_write's temp files (tempfile's names)


def clear_stale_temps(layout: Layout) -> list[str]:
    """Remove the temp files of atomic writes a SIGKILL cut short (``.tmp-XXXXXXXX`` beside
    status.json, the manifests, TF's state file, the logs), at launch: this launch holds the
    logdir's lock and its children have not started, so no write of this run is in progress.
    Returns the paths removed (regular files named exactly so, nothing else)."""
    removed = []
    for folder in (layout.logdir, layout.meta, layout.manifests, layout.logs):
        try:
            names = os.listdir(folder)
        except OSError:
            continue
        for name in names:
            path = os.path.join(folder, name)
            try:
                if _TEMP.match(name) and stat.S_ISREG(os.lstat(path).st_mode):
                    os.unlink(path)
                    removed.append(path)
            except OSError:
                pass
    return removed
