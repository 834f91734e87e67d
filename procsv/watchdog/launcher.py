"""The watchdog's event loop: observe, decide, act, record. ``procsv launch`` runs it.

Runs in the ``procsv launch`` process. Everything it waits for is a file descriptor in one
ZeroMQ poller: the PULL socket its children report to, a pidfd per child (readable the moment
the child dies), the pre-warmed trainer's pipe, a pipe the death-notice threads write to, and a
wakeup fd for SIGTERM/SIGINT. Each round turns what arrived into observations
(:mod:`procsv.watchdog.observe`), asks the one decision function
(:func:`procsv.watchdog.decide.decide`) what to do at the current time, and lets the executor
(:mod:`procsv.watchdog.executor`) do it; then the status file is refreshed, procsv's own
TensorBoard scalars that are due go to the summary service (:mod:`procsv.watchdog.runscalars`,
non-blocking) and, with ``--metrics-port``, a new metrics snapshot is published for the HTTP
threads (:mod:`procsv.watchdog.metrics`). The loop ends when the run's outcome is decided and no
child is left.

The PULL socket takes only what children send the watchdog (``Hello``, ``TrainerReady``,
``Progress``, ``SaveResult``); anything else, malformed or of another schema version, is refused
by the codec, counted by reason (``rejected`` in ``status.json``) and said once per reason
(:class:`~procsv.ipc.rejections.Rejections`). At most :data:`DRAIN_MAX` messages are read per
wakeup, so a flood of them cannot keep the loop from deciding.
"""

from __future__ import annotations

import os
import queue
import random
import shutil
import signal
import socket
import sys
import time
import traceback
from typing import Any, Callable, Optional

import psutil
import zmq

from procsv.common import env, faults
from procsv.common.bootstrap import write_error_record
from procsv.common.layout import Layout, LogdirLock, RuntimeDir, spilled_error_file, write_json
from procsv.ipc.codec import ProtocolError
from procsv.ipc.messages import Hello, Progress, SaveOverdue, SaveResult, StandbyReady, TrainerReady
from procsv.ipc.rejections import Rejections
from procsv.ipc.transport import Endpoints, bind_private, drain, make_socket
from procsv.watchdog import liveline, observe, report, standby
from procsv.common.orphans import Orphans
from procsv.watchdog.children import ChildProcess
from procsv.watchdog.output import Terminal
from procsv.watchdog.config import LaunchConfig, check_target
from procsv.watchdog.decide import decide
from procsv.watchdog.events import Event, EventLog
from procsv.watchdog.executor import Executor
from procsv.watchdog.failures import ChildError, Failure, read_child_error
from procsv.watchdog.lifecycle import RunState
from procsv.watchdog.onfailure import run_on_failure
from procsv.watchdog.logdirwatch import LogdirWatch, identity, lost_reason
from procsv.watchdog.metrics import MetricsServer, RunCollector
from procsv.watchdog.observe import Report
from procsv.watchdog.prewarm import ForkedProcess, zygote_env
from procsv.watchdog.runmetrics import PUBLISH_EVERY, RunSnapshot, StepRate, take_snapshot
from procsv.watchdog.runscalars import ScalarSender
from procsv.watchdog.series import StepSeries
from procsv.watchdog.state import SERVICE_ROLES, TRAINER, RunView, ZygoteState
from procsv.watchdog.statusfile import StatusWriter, status_record

TICK_MS = 100
EXIT_INTERNAL = 70  # the watchdog itself failed (EX_SOFTWARE); the run was stopped in order
MAX_INTERNAL_ERRORS = 3  # beyond this many, stop trying to stop in order
STATUS_WAIT = 2.0  # seconds a forked trainer's exit status may take to come from the zygote
SWEEP_EVERY = 1.0  # seconds between sweeps for left-behind processes (also after every exit)
DRAIN_MAX = 1000  # messages read from the PULL socket per wakeup (the poller fires again for the rest)
ACCEPT = frozenset({Hello, TrainerReady, Progress, SaveResult, SaveOverdue, StandbyReady})  # what children send

__all__ = ["LaunchConfig", "Watchdog", "check_target"]


class Watchdog:
    """One launch: its run's processes, from start to the last reaped child."""

    def __init__(self, cfg: LaunchConfig, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time, rng: Optional[random.Random] = None) -> None:
        self.cfg = cfg
        self.clock = clock
        self.wall = wall
        self.rng = rng or random.Random()
        self.limits = cfg.limits()
        self.layout = Layout(os.path.abspath(cfg.logdir))
        self.lock = LogdirLock(self.layout)
        self.view = RunView(launch_start=clock())
        self.started_wall = wall()
        self.term = Terminal(live=liveline.wanted(cfg.quiet, sys.stdout.isatty()))
        self.live = liveline.LiveLine() if self.term.live else None
        self.series = StepSeries()  # the step over wall time, for the report's timeline
        self.status = StatusWriter(self.layout, clock, wall, complain=lambda text: self.say(text, err=True))
        self.internal_errors = 0
        self.rejections = Rejections("procsv", "status.json, `procsv status`", lambda text: self.say(text, err=True))
        self._notices: "queue.SimpleQueue[tuple[ChildProcess, bool, float, float]]" = queue.SimpleQueue()
        self._notice_r, self._notice_w = os.pipe()
        os.set_blocking(self._notice_w, False)
        self.events: Optional[EventLog] = None
        self.ex: Optional[Executor] = None
        self._by_fd: dict[int, ChildProcess] = {}
        self._awaiting_status: dict[tuple[str, int], tuple[ChildProcess, float]] = {}  # forked, exited, no status yet
        self.orphans: Optional[Orphans] = None
        self._next_sweep = 0.0
        self.logdir_watch = LogdirWatch(self.layout.logdir)
        self._logdir_id: Optional[tuple[int, int]] = None
        self.metrics: Optional[MetricsServer] = None
        self.snapshot: Optional[RunSnapshot] = None  # replaced whole by the loop; read by the metrics threads
        self._rate = StepRate()
        self._next_publish = 0.0
        self.scalars: Optional[ScalarSender] = None

    # ------------------------------------------------------------------ main
    def run(self) -> int:
        check_target(self.cfg.target, self.cfg.cwd)
        if self.cfg.metrics_port is not None:  # bound before anything else: a port in use starts nothing
            self.metrics = MetricsServer(self.cfg.metrics_host, self.cfg.metrics_port,
                                         RunCollector(lambda: self.snapshot, self.layout.summary_stats,
                                                      {"target": self.cfg.target, "logdir": self.layout.logdir}))
        try:
            self.layout.create()
            stale = self.lock.acquire()
            if stale is not None:
                self.say(f"procsv: took over the lock of {self.layout.logdir}: the launch that held it (pid {stale}) "
                         "died without releasing it (SIGKILL?); taking it over", err=True)
            try:
                if self.metrics is not None:
                    self.say(f"procsv: serving metrics at {self.metrics.url}")
                return self._run_locked()
            finally:
                self.lock.release()
        finally:
            if self.metrics is not None:
                self.metrics.close()

    def _run_locked(self) -> int:
        self.events = EventLog(self.layout.lifecycle, self.wall, complain=lambda text: self.say(text, err=True))
        self.orphans = Orphans()
        self._logdir_id = identity(self.layout.logdir)
        self.logdir_watch.start()
        runtime_dir = RuntimeDir.create().path  # mode 0700: sockets only we can reach
        zctx = zmq.Context()
        self.pull = make_socket(zctx, zmq.PULL)
        bind_private(self.pull, Endpoints(runtime_dir).watchdog)
        self.poller = zmq.Poller()
        self.poller.register(self.pull, zmq.POLLIN)
        self.scalars = ScalarSender(zctx, Endpoints(runtime_dir).summary)
        wake_r, wake_w = socket.socketpair()
        wake_r.setblocking(False)
        wake_w.setblocking(False)
        old_wakeup = signal.set_wakeup_fd(wake_w.fileno(), warn_on_full_buffer=False)
        old = {s: signal.signal(s, lambda signum, frame: None) for s in (signal.SIGTERM, signal.SIGINT)}
        self.poller.register(wake_r.fileno(), zmq.POLLIN)
        self.poller.register(self._notice_r, zmq.POLLIN)
        self.poller.register(self.logdir_watch.fd, zmq.POLLIN)
        ex = self.ex = Executor(self.cfg, self.layout, runtime_dir, self.view, self.limits, self.record, self.clock,
                                self._register, self._post_notice)
        self.record([Report(Event.LAUNCH, {"target": self.cfg.target, "args": self.cfg.args, "pid": os.getpid()},
                            say=f"procsv: launching {self.cfg.target} {' '.join(self.cfg.args)} in "
                                f"{self.layout.logdir}")])
        try:
            for role in SERVICE_ROLES:
                ex.spawn(role, role)
            if self.cfg.prewarm:
                z = ex.start_zygote(zygote_env(self.layout.logdir, runtime_dir))
                self.poller.register(z.fd, zmq.POLLIN)
            self.view.restart_at = self.clock()  # the first trainer (it waits for the zygote, if any)
            while not (self.view.finishing and not ex.handles):
                try:
                    for sock, _ in self.poller.poll(TICK_MS):
                        if sock is self.pull:
                            self._drain_messages()
                        elif sock == wake_r.fileno():
                            self._drain_wakeups(wake_r)
                        elif ex.zygote is not None and sock == ex.zygote.fd:
                            self._on_zygote()
                        elif sock == self._notice_r:
                            self._drain_notices()
                        elif sock == self.logdir_watch.fd:
                            self.logdir_watch.drain()
                            self._check_logdir()
                        elif sock in self._by_fd:
                            self._on_exit(self._by_fd[sock])
                        else:
                            self.poller.unregister(sock)
                    self.round()
                except Exception as exc:  # a bug in procsv itself: stop the run in order
                    self._internal_error(exc)
        finally:
            ex.close()
            self.logdir_watch.close()
            self._sweep(final=True)
            signal.set_wakeup_fd(old_wakeup)
            for s, h in old.items():
                signal.signal(s, h)
            wake_r.close()
            wake_w.close()
            self.pull.close(0)
            self.scalars.close()
            self.scalars = None
            self._publish(force=True)  # the last word of the metrics endpoint: up 0, the outcome
            zctx.term()
            shutil.rmtree(runtime_dir, ignore_errors=True)
            if self.view.logdir_lost is None:  # never write into a logdir that is gone or moved
                self.status.maybe_write(self._status, force=True)
            else:
                self._final_status_where_it_went()
            self._final_report()
            self.events.close()
            if self.cfg.on_failure and self.view.run == RunState.FAILED:
                run_on_failure(self.cfg.on_failure, self.layout.logdir, self.view.exit_code, self.view.run.value,
                               self.view.last_error, lambda text: self.say(text, err=True))
            self.term.close()
        return self.view.exit_code

    def _internal_error(self, exc: Exception) -> None:
        """Record the watchdog's own failure and stop the run in order (the trainer saves first).

        A further error while stopping re-raises: the ``finally`` then kills everything.
        """
        self.internal_errors += 1
        write_error_record(self.layout, "watchdog", 1, exc, "run")
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)).rstrip()
        self.say(f"procsv: internal error in the watchdog: {type(exc).__name__}: {exc}; stopping the run in "
                 f"order (traceback in {self.layout.error_file('watchdog', 1)})\n{text}", err=True)
        if self.internal_errors > MAX_INTERNAL_ERRORS:
            raise exc
        self.view.last_error = f"internal error in the watchdog: {type(exc).__name__}: {exc}"
        self.view.failed = True
        self.view.exit_code = self.view.exit_code or EXIT_INTERNAL
        self.record(observe.stop_requested(self.view, signal.SIGTERM, self.clock(), self.cfg.stop_grace_secs))

    def round(self) -> None:
        """Decide at the current time and perform the actions; echo logs; refresh the status file."""
        assert self.ex is not None
        fault_point("round", self.view.step)
        self._check_awaiting()
        self.ex.poll_fork()
        if self.view.standby_ok is None:
            self._decide_standby()
        for _ in range(3):  # an action may make another due at once (a restart with delay 0: promote now)
            actions = decide(self.view, self.clock(), self.limits, self.rng.random())
            for action in actions:
                self.ex.perform(action)
                self.status.dirty = True
            if not actions:
                break
        trainer = self.ex.handles.get((TRAINER, self.view.children[TRAINER].attempt)) \
            if TRAINER in self.view.children else None
        if trainer is not None:
            self._echo(trainer)
        if self.clock() >= self._next_sweep:
            self._sweep()
        self._check_logdir()  # one stat a round: before any write of status.json into a lost logdir
        if self.view.logdir_lost is None:
            self.status.maybe_write(self._status)
        if self.scalars is not None:
            self.scalars.tick(self.view, self.clock(), self.wall())
        self._publish()
        self._draw_live()

    def _publish(self, force: bool = False) -> None:
        """Replace the snapshot the metrics endpoint serves, at most every ``PUBLISH_EVERY`` seconds."""
        now = self.clock()
        if self.metrics is None or (now < self._next_publish and not force):
            return
        self._next_publish = now + PUBLISH_EVERY
        self.snapshot = take_snapshot(self.view, now, self.wall(), self.started_wall, self._rate)

    def _decide_standby(self) -> None:
        """Whether a hot standby may run (once: ``--standby``, and for ``auto`` the memory rule at
        the first trainer's first step)."""
        mode = self.cfg.standby if self.cfg.prewarm else "off"
        if mode in ("fork", "off"):
            ok, why = False, f"--standby {mode}" if self.cfg.prewarm else "no pre-warmed trainer (--no-prewarm)"
        elif mode == "hot":
            ok, why = True, "--standby hot"
        else:
            trainer = self.view.children.get(TRAINER)
            if trainer is None or trainer.first_step_at is None or not trainer.live:
                return
            try:
                rss = psutil.Process(trainer.pid).memory_info().rss
            except psutil.Error:
                return  # it just died: decide with the next one
            ok, why = standby.memory_allows(rss, psutil.virtual_memory().available)
        self.view.standby_ok = ok
        self.record([Report(Event.STANDBY_DECIDED, {"mode": "hot" if ok else "fork" if self.cfg.prewarm else "off",
                                                    "reason": why})])

    def _draw_live(self) -> None:
        """Hand the live line to the terminal, at most every ``liveline.DRAW_EVERY`` seconds."""
        now = self.clock()
        if self.live is None or not liveline.due(now, self.live.last_draw):
            return
        self.live.last_draw = now
        gp = report.goodput([a.record() for a in self.view.attempts], self.view.launch_start, now)
        facts = self.live.facts(now, self.view.step, self.view.history.restarts, gp)
        self.term.status(liveline.format_line(facts, self.term.width()))

    # ------------------------------------------------------------------ observations
    def _register(self, handle: ChildProcess) -> None:
        self._by_fd[handle.pidfd] = handle
        self.poller.register(handle.pidfd, zmq.POLLIN)

    def _drain_messages(self, limit: Optional[int] = DRAIN_MAX) -> None:
        for got in drain(self.pull, limit=limit, accept=ACCEPT):
            if isinstance(got, ProtocolError):
                self.rejections.count(got)
                self.status.dirty = True
                continue
            if isinstance(got.msg, Progress) and not got.msg.busy:
                self.series.add(self.wall(), got.msg.step)
                if self.live is not None:
                    self.live.progress(self.clock(), got.msg.step)
            self.record(observe.heard(self.view, got.msg, self.clock()))
            self.status.dirty = True
            if isinstance(got.msg, SaveResult) and not got.msg.ok:
                self._check_logdir()  # a save that fails may be the first sign of a lost logdir

    def _drain_wakeups(self, wake_r: socket.socket) -> None:
        try:
            data = wake_r.recv(64)
        except BlockingIOError:
            return
        for signum in data:
            if signum in (signal.SIGTERM, signal.SIGINT):
                self.record(observe.stop_requested(self.view, signum, self.clock(), self.cfg.stop_grace_secs))
                self.status.dirty = True

    def _post_notice(self, handle: ChildProcess, died: bool, at: float) -> None:
        """Runs in a death-watch thread: hand the notice to the main loop."""
        self._notices.put((handle, died, at, self.wall()))
        try:
            os.write(self._notice_w, b"!")
        except BlockingIOError:
            pass

    def _drain_notices(self) -> None:
        try:
            os.read(self._notice_r, 4096)
        except BlockingIOError:
            pass
        while not self._notices.empty():
            handle, died, at, wall = self._notices.get()
            if died and handle.pidfd >= 0:
                err = self._child_error(handle)
                self.record(observe.death_noticed(self.view, handle.slot, handle.attempt, at, wall,
                                                  err.type if err is not None else ""))
                self.status.dirty = True

    def _on_exit(self, handle: ChildProcess) -> None:
        """A pidfd became readable: reap the child and record how it ended. A trainer forked by the
        zygote gets its exit status from the zygote: until that arrives it waits in
        ``_awaiting_status`` (see :meth:`_check_awaiting`), never in a blocking wait."""
        assert self.ex is not None
        self.poller.unregister(handle.pidfd)
        del self._by_fd[handle.pidfd]
        if isinstance(handle.proc, ForkedProcess) and handle.proc.poll() is None:
            self._awaiting_status[(handle.slot, handle.attempt)] = (handle, self.clock() + STATUS_WAIT)
            return
        self._reaped(handle)

    def _check_awaiting(self) -> None:
        """Forked trainers whose exit status is due from the zygote: reap those that have it; a
        zygote that does not report one within ``STATUS_WAIT`` is killed (the watchdog, a child
        subreaper, then inherits the trainer's zombie and reaps it itself)."""
        assert self.ex is not None
        for key, (handle, due) in list(self._awaiting_status.items()):
            if handle.proc.poll() is not None:
                del self._awaiting_status[key]
                self._reaped(handle)
            elif self.clock() >= due and self.ex.zygote is not None and isinstance(handle.proc, ForkedProcess) \
                    and handle.proc.zygote is self.ex.zygote:
                self.ex.zygote.kill()
                self.ex.drop_zygote(f"procsv: the pre-warmed trainer (zygote) did not report the exit of trainer "
                                    f"pid {handle.pid} within {STATUS_WAIT:g} s; restarts will start fresh trainers")

    def _child_error(self, handle: ChildProcess) -> Optional[ChildError]:
        assert self.ex is not None
        return read_child_error((self.layout.error_file(handle.role, handle.attempt),
                                 spilled_error_file(self.ex.runtime.path, handle.role, handle.attempt)), handle.pid)

    def _reaped(self, handle: ChildProcess) -> None:
        assert self.ex is not None
        code = handle.reap()
        self.ex.handles.pop((handle.slot, handle.attempt), None)
        self._drain_messages(limit=None)  # all it said before dying (a last checkpoint result), before its exit
        self._echo(handle)
        err = self._child_error(handle)
        failure = Failure(handle.role, handle.attempt, handle.pid, code, self.wall(), handle.log_path, err)
        self.record(observe.reaped(self.view, handle.slot, handle.attempt, failure, self.clock()))
        self.status.dirty = True
        self._sweep()  # what it left behind

    def _on_zygote(self) -> None:
        assert self.ex is not None and self.ex.zygote is not None
        z = self.ex.zygote
        z.pump()
        if not z.alive():
            try:
                self.poller.unregister(z.fd)
            except KeyError:
                pass
            self.ex.drop_zygote("procsv: the pre-warmed trainer (zygote) died; restarts will start fresh trainers")
        elif z.ready:
            self.record(observe.zygote_changed(self.view, ZygoteState.READY, z.pid, z.import_secs or 0.0))
        self.ex.poll_fork()  # a trainer it was asked for: answered, or to be started fresh now

    def _final_status_where_it_went(self) -> None:
        """A logdir moved while live (an event named where, and it is still the same directory) gets
        its final status record there, so that ``procsv status NEWDIR`` tells how the run ended."""
        dest = self.logdir_watch.moved_to
        if dest is None or self._logdir_id is None or identity(dest) != self._logdir_id or self.ex is None:
            return
        moved = Layout(dest)
        z = self.ex.zygote
        record = status_record(self.view, self.cfg, moved, self.clock(), self.wall(), self.started_wall,
                               None if z is None else {"pid": z.pid, "ready": z.ready})
        try:
            write_json(moved.status, record)
        except OSError:
            pass

    def _check_logdir(self) -> None:
        """Is the logdir still the directory the run started in? (after a filesystem event about it,
        a failed checkpoint, and every round). What an event said (where it was moved) comes first."""
        if self._logdir_id is None or self.view.logdir_lost is not None:
            return
        reason = self.logdir_watch.seen or lost_reason(self.layout.logdir, self._logdir_id)
        if reason is not None:
            self.record(observe.logdir_lost(self.view, reason))
            self.status.dirty = True

    def _sweep(self, final: bool = False) -> None:
        """Kill and reap processes of the run whose parent died (see :class:`Orphans`)."""
        if self.orphans is None or self.ex is None:
            return
        self._next_sweep = self.clock() + SWEEP_EVERY
        known = {h.pid for h in self.ex.handles.values()} | self.ex.zygote_pids()
        killed = self.orphans.sweep(known)
        deadline = self.clock() + 5.0
        while final and self.orphans.pending and self.clock() < deadline:
            time.sleep(0.01)
            killed += self.orphans.sweep(known)
        if killed:
            self.record([Report(Event.ORPHANS_KILLED, {"pids": killed},
                                say=f"procsv: killed {len(killed)} process(es) the run left behind (pids "
                                    f"{', '.join(map(str, killed))})", err=True)])

    # ------------------------------------------------------------------ output
    def record(self, reports: list[Report]) -> None:
        for r in reports:
            if r.event is not None and self.events is not None:
                self.events.write(r.event, **r.fields)
            if r.event is not None and self.live is not None:
                self.live.event(r.event, r.fields, self.clock())
            if r.say:
                self.say(r.say, err=r.err)

    def say(self, text: str, err: bool = False) -> None:
        self.term.line(text, err)

    def _echo(self, handle: ChildProcess) -> None:
        if not self.cfg.quiet:
            for line in handle.new_log_lines():
                self.term.line(f"[{handle.role}.{handle.attempt}] {line}")

    def _status(self, now: float, wall: float) -> dict[str, Any]:
        assert self.ex is not None
        z = self.ex.zygote
        return status_record(self.view, self.cfg, self.layout, now, wall, self.started_wall,
                             None if z is None else {"pid": z.pid, "ready": z.ready}, self.rejections.record())

    def _final_report(self) -> None:
        summary = report.summarize([a.record() for a in self.view.attempts], self.view.launch_start, self.clock())
        points = self.series.points()
        if points and self.view.step > points[-1][1]:  # Progress is throttled: the last steps may be unsaid
            self.series.add(self.wall(), self.view.step)
        summary.update(started_at=self.started_wall, ended_at=self.wall(),
                       series=[[round(t, 3), s] for t, s in self.series.points()])
        try:
            if self.view.logdir_lost is None:
                write_json(self.layout.report, summary)
        except OSError:
            pass
        if summary["restarts"] or self.limits.chaos is not None:
            self.say(report.render(summary))


def fault_point(name: str, step: int) -> None:
    """Raise here once if ``PROCSV_FAULT`` is ``watchdog:<name>`` and a step was completed (tests only)."""
    if step > 0 and faults.fires("watchdog", name):
        raise RuntimeError(f"injected fault ({env.FAULT}=watchdog:{name})")
