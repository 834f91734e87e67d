"""What the watchdog tells the world while a launch runs, and once more at its end.

Runs in the ``procsv launch`` process (the watchdog), called from its loop
(:mod:`procsv.watchdog.launcher`). :class:`Reporter` owns every output of the loop: terminal
lines and the live line (:mod:`procsv.watchdog.publish.output`, :mod:`procsv.watchdog.publish.liveline`), the
lifecycle log (:mod:`procsv.watchdog.publish.events`), ``status.json`` (:mod:`procsv.watchdog.publish.statusfile`),
the step series and the final ``logs/report.json`` (:mod:`procsv.watchdog.publish.recovery`), and the
snapshot the metrics threads serve (:mod:`procsv.watchdog.publish.runmetrics`). None of it blocks the
loop: lines go through the terminal's writer thread, and everything that touches the logdir (the
lifecycle log, ``status.json``, the echo of a child's log, ``logs/report.json``) through the logdir
writer thread (:mod:`procsv.watchdog.publish.diskio`); failing writes are reported once.
"""

from __future__ import annotations

import sys
from typing import Any, Callable, Optional

from procsv import goodput as gp
from procsv.common.layout import Layout, write_json
from procsv.ipc.rejections import Rejections
from procsv.watchdog.publish import badput, liveline, recovery
from procsv.watchdog.children import ChildProcess
from procsv.watchdog.config import LaunchConfig
from procsv.watchdog.publish.diskio import DiskIO
from procsv.watchdog.rules.limits import Limits
from procsv.watchdog.publish.events import EventLog, Report, read_events
from procsv.watchdog.publish.output import Terminal
from procsv.watchdog.prewarm import Zygote
from procsv.watchdog.publish.runmetrics import PUBLISH_EVERY, RunSnapshot, StepRate, take_snapshot, task_summary
from procsv.watchdog.publish.series import StepSeries
from procsv.watchdog.rules.state import RunView
from procsv.watchdog.publish.statusfile import status_record


class Reporter:
    """The launch's outputs: the terminal, the lifecycle log, the status file, the step series,
    the metrics snapshot (replaced whole; read by the metrics threads) and the final report.

    The lifecycle log (``io.events``) is opened once the logdir is locked (:meth:`open_events`); until
    then :meth:`record` only prints.
    """

    def __init__(self, cfg: LaunchConfig, layout: Layout, clock: Callable[[], float],
                 wall: Callable[[], float]) -> None:
        self.cfg = cfg
        self.layout = layout
        self.clock = clock
        self.wall = wall
        self.started_wall = wall()
        self.term = Terminal()
        self.live = liveline.LiveLine() if liveline.wanted(cfg.quiet, sys.stdout.isatty()) else None
        self.series = StepSeries()  # the step over wall time, for the report's timeline
        self.rejections = Rejections("procsv", "status.json, `procsv status`", self.complain)
        self.io = DiskIO(layout, self.term, clock)  # every write into the logdir, off the loop
        self.snapshot: Optional[RunSnapshot] = None  # replaced whole by the loop; read by the metrics threads
        self._publishing = cfg.metrics_port is not None
        self._rate = StepRate()
        self._next_publish = 0.0
        self._stacks_endpoint = ""  # node 0's of a job over hosts: where procsv stacks asks for the other hosts' stacks

    def serve_stacks(self, endpoint: str) -> None:
        """The status names ``endpoint``: where ``procsv stacks`` asks for the other hosts' members' stacks."""
        self._stacks_endpoint = endpoint

    def open_events(self) -> None:
        self.io.events = EventLog(self.layout.lifecycle, complain=lambda text: self.term.line(text, True))

    # ------------------------------------------------------------------ lines and events
    def record(self, reports: list[Report]) -> None:
        for r in reports:
            if r.event is not None:
                self.io.event(r.event, r.fields, self.wall() if r.at is None else r.at)
                if self.live is not None:
                    self.live.event(r.event, r.fields)
            if r.say:
                self.say(r.say, err=r.err)

    def say(self, text: str, err: bool = False) -> None:
        self.io.line(text, err)

    def complain(self, text: str) -> None:
        self.say(text, err=True)

    def echo(self, handle: ChildProcess, final: bool = False) -> None:
        """A child's new log lines, on the terminal (unless ``--quiet``); ``final``: it was reaped,
        the rest of its log (see :meth:`ChildProcess.new_log_lines`)."""
        if not self.cfg.quiet:
            self.io.echo(handle, final)

    def changed(self) -> None:
        """The view changed: ``status.json`` is due for a rewrite (throttled)."""
        self.io.status.dirty = True

    def progress(self, step: int) -> None:
        """A completed step: for the report's timeline and the live line."""
        self.series.add(self.wall(), step)
        if self.live is not None:
            self.live.progress(self.clock(), step)

    # ------------------------------------------------------------------ every round
    def write_status(self, view: RunView, zygote: Optional[Zygote], force: bool = False,
                     shared: Optional[badput.Shared] = None) -> None:
        """Hand ``status.json`` to the logdir writer if due (``force``: now, durably); never into a
        lost logdir. The record is built here (the view is the loop's); the writer reads its
        ``last_checkpoint``. ``shared``: the round's breakdown (and its time), else one of its own."""
        if view.logdir_lost is not None or not self.io.status.due(force):
            return
        shared = shared or badput.Shared(view, self.clock())
        record = status_record(view, self.cfg, self.layout, shared.now, self.wall(), self.started_wall, zygote,
                               self.rejections.record(), shared())
        if self._stacks_endpoint:
            record["stacks_endpoint"] = self._stacks_endpoint
        self.io.write_status(record, durable=force)

    def publish(self, view: RunView, force: bool = False, shared: Optional[badput.Shared] = None) -> None:
        """Replace the snapshot the metrics endpoint serves, at most every ``PUBLISH_EVERY`` seconds."""
        now = self.clock() if shared is None else shared.now
        if not self._publishing or (now < self._next_publish and not force):
            return
        self._next_publish = now + PUBLISH_EVERY
        newest = self.io.newest  # until this launch commits: the newest on disk (read by the last status write)
        self.snapshot = take_snapshot(view, now, self.wall(), self.started_wall, self._rate,
                                      None if newest is None else (newest.step, newest.committed_at),
                                      None if shared is None else shared())

    def draw_live(self, view: RunView, shared: Optional[badput.Shared] = None) -> None:
        """Hand the live line to the terminal, at most every ``liveline.DRAW_EVERY`` seconds; once
        the run's outcome is decided, its last step is drawn at once (the run may end sooner)."""
        now = self.clock() if shared is None else shared.now
        if self.live is None:
            return
        final = view.finishing and view.step != self.live.drawn_step
        if not final and not liveline.due(now, self.live.last_draw):
            return
        self.live.last_draw, self.live.drawn_step = now, view.step
        gp = badput.goodput(view, badput.of_launch(view, now) if shared is None else shared())
        facts = self.live.facts(now, view.step, view.history.restarts, gp, len(view.skipped_steps), view.last_commit_at)
        self.term.status(liveline.format_line(facts, self.term.width()))

    # ------------------------------------------------------------------ the end
    def final_report(self, view: RunView, limits: Limits) -> None:
        """``logs/report.json`` (not into a lost logdir); the recovery report on the terminal if
        anything was restarted or chaos was on."""
        now = self.clock()
        spent = badput.of_launch(view, now)
        summary = recovery.summarize(view.attempts, view.findings.audit_rollbacks)
        summary["group_rollbacks"] += view.findings.group_in_place  # (in place: no recovery of a restart to count it by)
        summary["group_in_place"] = view.findings.group_in_place
        points = self.series.points()
        if points and view.step > points[-1][1]:  # Progress is throttled: the last steps may be unsaid
            self.series.add(self.wall(), view.step)
        summary.update(started_at=self.started_wall, ended_at=self.wall(), skipped_steps=list(view.skipped_steps),
                       breakdown=spent.to_json(), goodput=badput.goodput(view, spent), wall_s=spent.wall,
                       rollbacks=view.rollbacks, **({"tasks": task_summary(view)} if view.tasks_alone else {}),
                       series=[[round(t, 3), s] for t, s in self.series.points()])
        if view.logdir_lost is None:
            self.io.call(lambda: _write_report(self.layout, summary))
        if summary["restarts"] or summary["group_rollbacks"] or limits.chaos is not None:
            self.say(recovery.render(summary))

    def close_io(self) -> None:
        """The last of the logdir's writes: close the lifecycle log after what is queued, and wait a
        bounded time for the writer thread (:meth:`DiskIO.close`)."""
        events = self.io.events
        if events is not None:
            self.io.call(events.close)
        self.io.close()


def _write_report(layout: Layout, summary: dict[str, Any]) -> None:
    """``logs/report.json`` (in the logdir writer thread, after every lifecycle record of the launch
    queued before it), with ``run``: every launch of the logdir, from ``lifecycle.jsonl``, as ``procsv
    report`` prints it (:func:`procsv.goodput.run_record`; null if the file cannot be read). Written
    atomically (aside, fsync, rename); a failing write is left unsaid."""
    try:
        run: Optional[dict[str, Any]] = gp.run_record(read_events(layout.lifecycle))
    except (OSError, ValueError, KeyError, TypeError):  # unreadable, or a record edited by hand
        run = None
    try:
        write_json(layout.report, {**summary, "run": run})
    except OSError:
        pass
