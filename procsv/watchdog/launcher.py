"""The watchdog's event loop: observe, decide, act, record. ``procsv launch`` runs it.

Runs in the ``procsv launch`` process. Everything it waits for is a file descriptor in one
ZeroMQ poller: the PULL socket its children report to, a pidfd per child (readable the moment
the child dies), the pre-warmed trainer's pipe, a pipe the death-notice threads write to, and a
wakeup fd for SIGTERM/SIGINT. Each round turns what arrived into observations
(:mod:`procsv.watchdog.observe`), asks the one decision function
(:func:`procsv.watchdog.rules.decide.decide`) what to do at the current time, and lets the executor
(:mod:`procsv.watchdog.executor`) do it; then the status file is refreshed (by the logdir writer
thread, :mod:`procsv.watchdog.publish.diskio`, as are the lifecycle log, the echo of the trainer's
log and the look at the logdir: the loop never waits on the logdir's filesystem), procsv's own
TensorBoard scalars that are due go to the summary service (:mod:`procsv.watchdog.publish.runscalars`,
non-blocking) and, with ``--metrics-port``, a new metrics snapshot is published for the HTTP
threads (:mod:`procsv.watchdog.publish.metrics`). The loop ends when the run's outcome is decided and no
child is left. Its collaborators own the rest: the sockets, poller and signal wakeup
(:mod:`procsv.watchdog.bringup`), children's deaths and exits (:mod:`procsv.watchdog.exits`),
left-behind processes and the logdir's identity (:mod:`procsv.watchdog.housekeeping`), and
every output (:mod:`procsv.watchdog.publish.reporting`).

The PULL socket takes only what children send the watchdog (:data:`ACCEPT`: ``Hello``,
``TrainerReady``, ``Progress``, ``SaveResult``, ``GroupCopyHeld``, the overdue notices, ``StandbyReady``
and the non-finite reports; ``docs/architecture.md`` lists them with their senders); anything else, malformed or of another schema version, is refused
by the codec, counted by reason (``rejected`` in ``status.json``) and said once per reason
(:class:`~procsv.ipc.rejections.Rejections`). At most :data:`DRAIN_MAX` messages are read per
wakeup, so a flood of them cannot keep the loop from deciding.

One concern: the watchdog's loop and its life, from its first services' seeds to its last words.
"""

from __future__ import annotations

import os
import random
import signal
import time
import traceback
from typing import Callable, Optional

import psutil
import zmq

from procsv.common import env, faults
from procsv.common.bootstrap import write_error_record
from procsv.common.layout import Layout, LogdirLock
from procsv.ipc.codec import ProtocolError
from procsv.ipc.messages import (AuditResult, GroupCopyHeld, GroupCopyRefused, Hello, MemberEnded, MemberLooked, MemberStarted, NodeHello, NonfiniteDetected, Progress, Relayed,
                                 ServiceLoading,
                                 RolledBack, SaveOverdue, SaveResult, SpikeDetected, SpikeReplayed, StacksTaken, StandbyReady,
                                 StepSkipped,
                                 SummaryOverdue,
                                 TrainerReady)
from procsv.ipc.transport import drain
from procsv.watchdog import observe
from procsv.watchdog.bringup import Plumbing, standby_choice
from procsv.watchdog.config import LaunchConfig, check_target, platform_fingerprint, program_fingerprint
from procsv.watchdog.rules.decide import decide
from procsv.watchdog.publish import badput
from procsv.watchdog.publish.events import Event, skipped_steps
from procsv.watchdog.executor import Executor
from procsv.watchdog.prewarm import ZygoteSeed
from procsv.watchdog.seeds import ServiceSeeds
from procsv.watchdog.exits import ChildEnds
from procsv.watchdog.housekeeping import LogdirGuard, Sweeper, clear_group_records, clear_stale_temps
from procsv.watchdog.logrotate import archive_launch
from procsv.watchdog.rules.lifecycle import RunState
from procsv.watchdog.rules import group
from procsv.watchdog.publish.metrics import MetricsServer, RunCollector
from procsv.watchdog.publish.probes import LoopPulse
from procsv.common.clock.watched import WatchedClock
from procsv.watchdog.multihost.nodes import NodeLink
from procsv.watchdog.multihost.remote import RemoteMembers
from procsv.watchdog.publish.events import Report
from procsv.watchdog.onfailure import run_on_failure
from procsv.watchdog.publish.reporting import Reporter
from procsv.watchdog.rules.findings import Findings
from procsv.watchdog.audit.auditors import Auditors
from procsv.watchdog.rules.state import SERVICE_ROLES, TRAINER, RunView, ZygoteState
from procsv.watchdog.rules.hosts import stale_members

TICK_MS = 100
EXIT_INTERNAL = 70  # the watchdog itself failed (EX_SOFTWARE); the run was stopped in order
MAX_INTERNAL_ERRORS = 3  # beyond this many, stop trying to stop in order
DRAIN_MAX = 1000  # messages read from the PULL socket per wakeup (the poller fires again for the rest)
ACCEPT = frozenset({Hello, TrainerReady, Progress, SaveResult, SaveOverdue, SummaryOverdue, StandbyReady,
                    NonfiniteDetected, RolledBack, StepSkipped, SpikeDetected, SpikeReplayed, ServiceLoading,
                    GroupCopyHeld,
                    GroupCopyRefused, AuditResult})  # what children send

__all__ = ["LaunchConfig", "Watchdog", "check_target"]


class Watchdog:
    """One launch: its run's processes, from start to the last reaped child.

    The loop and its observations of messages and signals live here; its collaborators own the
    rest: :class:`~procsv.watchdog.publish.reporting.Reporter` (every output),
    :class:`~procsv.watchdog.bringup.Plumbing` (sockets, poller, signal wakeup),
    :class:`~procsv.watchdog.exits.ChildEnds` (deaths and exits),
    :class:`~procsv.watchdog.housekeeping.Sweeper` and :class:`~procsv.watchdog.housekeeping.LogdirGuard`,
    and the :class:`~procsv.watchdog.executor.Executor` (every effect on a process).
    """

    # built by _run_locked, for the loop
    pipes: Plumbing
    ends: ChildEnds
    ex: Executor
    sweeper: Sweeper

    def __init__(self, cfg: LaunchConfig, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time, rng: Optional[random.Random] = None,
                 born: Optional[float] = None, seed: Optional[ZygoteSeed] = None) -> None:
        """``born``: when the ``procsv launch`` process started (wall time): the launch's start, so
        that its interpreter's start and imports count in the launch's wall time (start-up).
        ``seed``: a zygote seed forked at the launch's start (:meth:`ZygoteSeed.fork`), its first zygote."""
        self.cfg = cfg
        self.seed = seed
        # every timer's clock: ``clock`` without the time this process was stopped (SIGSTOP, then SIGCONT)
        self.clock = WatchedClock(clock)
        self.wall = wall
        self.rng = rng or random.Random()
        self.limits = cfg.limits()
        self.layout = Layout(os.path.abspath(cfg.logdir))
        self.lock = LogdirLock(self.layout)
        since = 0.0 if born is None else max(0.0, wall() - born)
        # the steps the logdir's earlier launches skipped stay skipped: this launch's trainers skip them
        # again (Executor.resume), and its status and report name them (read before this launch's records)
        self.view = RunView(launch_start=self.clock(), tasks_alone=cfg.ps > 0,
                            skipped_steps=list(skipped_steps(self.layout.lifecycle)),
                            findings=Findings(suspect_after=cfg.trainer.suspect_after))
        self.view.process_start = self.view.launch_start - since
        # its first services' seeds, forked before its first thread (the Reporter's); run() uses or discards them
        self.services = ServiceSeeds.plant(cfg.preempt_signal)  # (procsv.watchdog.seeds)
        self.out = Reporter(cfg, self.layout, self.clock, wall)
        self.out.started_wall -= since
        self.internal_errors = 0
        self.logdir = LogdirGuard(self.layout, self.view, self.out, cfg.logdir_timeout, self.clock)
        self.metrics: Optional[MetricsServer] = None
        self.pulse: Optional[LoopPulse] = None  # what /healthz and /readyz answer from (with --metrics-port)
        self.link: Optional[NodeLink] = None  # the other hosts' agents (--nnodes > 1)

    # ------------------------------------------------------------------ main
    def run(self) -> int:
        try:
            return self._run()
        finally:
            if self.seed is not None:  # a launch that ended before its executor took it
                self.seed.discard()
                self.seed = None
            self.services.discard()  # (the same: those its first services did not grow from)

    def _run(self) -> int:
        check_target(self.cfg.target, self.cfg.cwd)
        if self.cfg.metrics_port is not None:  # bound before anything else: a port in use starts nothing
            self.pulse = LoopPulse(self.clock)
            self.metrics = MetricsServer(self.cfg.metrics_host, self.cfg.metrics_port,
                                         RunCollector(lambda: self.out.snapshot, self.layout.summary_stats,
                                                      {"target": self.cfg.target, "logdir": self.layout.logdir,
                                                       **({"job": self.cfg.job_id} if self.cfg.job_id else {})}),
                                         self.pulse)
        try:
            self.layout.create()
            stale = self.lock.acquire()
            if stale is not None:
                self.out.say(f"procsv: took over the lock of {self.layout.logdir}: the launch that held it (pid "
                             f"{stale}) died without releasing it (SIGKILL?); taking it over", err=True)
            try:
                if self.metrics is not None:
                    self.out.say(f"procsv: serving metrics at {self.metrics.url}")
                return self._run_locked()
            finally:
                self.lock.release()
        finally:
            if self.metrics is not None:
                self.metrics.close()

    def _run_locked(self) -> int:
        self.out.open_events()
        self.sweeper = Sweeper(self.clock, self.out.record)
        self.logdir.start()
        pipes = self.pipes = Plumbing(self.cfg.preempt_signal)
        ends = self.ends = ChildEnds(pipes.poller, self.view, self.layout, self.out, self.clock, self.wall,
                                     lambda: self._drain_messages(limit=None), self._sweep,
                                     self.out.io.reads)
        pipes.poller.register(self.out.io.reads.fd, zmq.POLLIN)  # a read of the logdir is done
        ex = self.ex = Executor(self.cfg, self.layout, pipes.runtime_dir, self.view, self.limits, self.out.record,
                                self.clock, pipes.poller, ends.post_notice)
        ex.disk, ex.reading = self.out.io.call, ends.reading  # log rotation: by the logdir writer thread
        pipes.audits = Auditors(self.cfg.trainer.audit, ex, self.view, self.limits.world, self.out.record,
                                pipes.audit_link(), self.limits.nnodes, bool(self.limits.ps), self.limits.elastic,
                                program_fingerprint(self.cfg.target, self.cfg.args, self.cfg.cwd),
                                platform_fingerprint())  # (without --audit
        # too: an earlier launch's unjudged intervals' checkpoints are held from retention for the next with it)
        clear_group_records(self.layout)  # an earlier launch's: nothing reads them any more
        clear_stale_temps(self.layout)  # an earlier launch's writes a kill cut short
        launch = archive_launch(self.layout.logs, self.cfg.keep_logs)  # an earlier launch's logs: logs/launch-<n>/
        if self.cfg.nnodes > 1 and self.cfg.master_addr:  # the other hosts' agents connect here
            self.link = NodeLink(pipes.zctx, self.layout, self.cfg.master_addr, self.clock, self.view, self.limits)
            ex.remote = RemoteMembers(self.link, self.view, self.layout, self.cfg.nproc,
                                      self.out.record, self.clock, self.out.io.reads)
            pipes.poller.register(self.link.sock, zmq.POLLIN)
            self.out.serve_stacks(pipes.serve_stacks(ex.remote.stacks, self.view))  # procsv stacks asks here
            self.out.say(f"procsv: node 0 of {self.cfg.nnodes}: waiting for the other hosts at "
                         f"{self.cfg.master_addr} (job {self.link.job})")
        self.out.record([Report(Event.LAUNCH, {"target": self.cfg.target, "args": self.cfg.args,
                                               "pid": os.getpid(), "launch": launch}, at=self.out.started_wall,
                                say=f"procsv: launching {self.cfg.target} {' '.join(self.cfg.args)} in "
                                    f"{self.layout.logdir}")])
        try:
            for role in SERVICE_ROLES:
                ex.spawn(role, role, seed=self.services.get(role))
            if self.cfg.prewarm:
                seed, self.seed = self.seed, None  # (the zygote's now: grown, or discarded if unsuitable)
                ex.start_zygote(seed=seed)
            self.clock.watch()  # (from the loop's first reading: a suspension of the job is no silence of its children)
            self.view.restart_at = self.clock()  # the first trainer (it waits for the zygote, if any)
            remote = ex.remote
            while not (self.view.finishing and not ex.handles and not ends.pending
                       and not (remote is not None and remote.live())):
                try:
                    for sock, _ in pipes.poller.poll(TICK_MS if self.link is None else self.link.poll_ms(TICK_MS)):
                        self._dispatch(sock)
                    self.round()
                except Exception as exc:  # a bug in procsv itself: stop the run in order
                    self._internal_error(exc)
        finally:
            self.clock.unwatch()
            self._close()
        return self.view.exit_code

    def _dispatch(self, sock: object) -> None:
        """One ready file descriptor (or socket) of the poller."""
        if sock is self.pipes.pull:
            self._drain_messages()
        elif sock == self.pipes.wake_r.fileno():
            for signum in self.pipes.stop_signals():
                self.out.record(observe.stop_requested(self.view, signum, self.clock(), self.cfg.stop_grace_secs))
                self.out.changed()
        elif self.ex.zygote is not None and sock == self.ex.zygote.fd:
            self._on_zygote()
        elif self.link is not None and sock is self.link.sock:
            self._on_nodes()
        elif self.pipes.desk is not None and sock is self.pipes.desk.sock:
            self.pipes.desk.receive()
        elif sock == self.ends.notice_fd:
            self.ends.drain_notices(self.ex)
        elif sock == self.out.io.reads.fd:
            self.out.io.reads.woken()
            self._settle()
        elif isinstance(sock, int) and (handle := self.ex.handle_for(sock)) is not None:
            self.ends.on_exit(handle, self.ex)
        else:
            self.pipes.poller.unregister(sock)

    def _probe_stopped(self) -> None:
        """Observe which silent members of this host are stopped (SIGSTOP): rule 4 signals a stopped
        member first, not the peers blocked waiting for it in a collective."""
        stopped: set[str] = set()
        for c in group.silent_members(self.view, self.clock()):
            try:
                if psutil.Process(c.pid).status() == psutil.STATUS_STOPPED:
                    stopped.add(c.slot)
            except psutil.Error:
                pass
        observe.members_stopped(self.view, stopped)

    def _on_nodes(self) -> None:
        """What the other hosts' agents sent (``--nnodes``)."""
        assert self.link is not None
        for node, msg, payload in self.link.receive():
            if isinstance(msg, NodeHello):
                self.out.record(observe.node_hello(self.view, msg, self.clock()))
                if self.ex.remote is not None:  # (a host found lost whose agent still runs the old group's members)
                    self.ex.remote.stale(node, stale_members(self.view.nodes[node]))
                if msg.stop in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP) and self.view.stop_signal is None:  # left to us
                    self.out.record(observe.stop_requested(self.view, msg.stop, self.clock(), self.cfg.stop_grace_secs))
            elif isinstance(msg, MemberStarted) and self.ex.remote is not None:
                self.ex.remote.started(node, msg.slot, msg.attempt, msg.pid)
            elif isinstance(msg, MemberEnded) and self.ex.remote is not None:
                self.ex.remote.ended(msg.slot, msg.attempt, msg.pid, msg.code, self.wall(), msg.signalled)
            elif isinstance(msg, Relayed) and payload:
                self.out.record(observe.heard(self.view, payload[0], self.clock(), slot=msg.slot,
                                                              stops=self.clock.stops))
            elif isinstance(msg, StacksTaken) and self.ex.remote is not None:
                self.ex.remote.stacks.answered(node, msg)
            elif isinstance(msg, MemberLooked):
                observe.member_looked(self.view, msg, self.clock(), self.limits.hang)
            self.out.changed()
        if self.ex.remote is not None:
            self.ex.remote.resend(self.link.take_rerouted())  # a start that went down a replaced connection
        self.out.record(self.link.take_refusals())

    def _close(self) -> None:
        """The end of the launch: stop what is left, take the plumbing down, write the last words
        (status, report, lifecycle log) and run ``--on-failure``."""
        if self.link is not None:
            self.link.stop_all(self.view.exit_code)
            self.link.close()
        self.ex.close()
        self._sweep(final=True)
        self.pipes.close()
        self.out.publish(self.view, force=True)  # the last word of the metrics endpoint: up 0, the outcome
        # the last status names no pre-warmed trainer: ex.close() killed it
        if self.view.logdir_lost is None:  # never write into a logdir that is gone or moved
            self.out.write_status(self.view, None, force=True)
        else:
            self.logdir.final_status_where_it_went(self.cfg, self.clock(), self.wall(), self.out.started_wall)
        self.out.final_report(self.view, self.limits)
        self.out.close_io()
        if self.cfg.on_failure and self.view.run == RunState.FAILED:
            run_on_failure(self.cfg.on_failure, self.layout.logdir, self.view.exit_code, self.view.run.value,
                           self.view.last_error, self.out.complain)
        self.out.term.close()

    def _internal_error(self, exc: Exception) -> None:
        """Record the watchdog's own failure and stop the run in order (the trainer saves first).

        A further error while stopping re-raises: the ``finally`` then kills everything.
        """
        self.internal_errors += 1
        layout = self.layout
        self.out.io.call(lambda: write_error_record(layout, "watchdog", 1, exc, "run"))  # never in the loop
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)).rstrip()
        self.out.say(f"procsv: internal error in the watchdog: {type(exc).__name__}: {exc}; stopping the run in "
                     f"order (traceback in {self.layout.error_file('watchdog', 1)})\n{text}", err=True)
        if self.internal_errors > MAX_INTERNAL_ERRORS:
            raise exc
        self.view.last_error = f"internal error in the watchdog: {type(exc).__name__}: {exc}"
        self.view.failed = True
        self.view.exit_code = self.view.exit_code or EXIT_INTERNAL
        self.out.record(observe.stop_requested(self.view, signal.SIGTERM, self.clock(), self.cfg.stop_grace_secs))

    def round(self) -> None:
        """Decide at the current time and perform the actions; then hand the echo of the trainer's log,
        a look at the logdir and the status file to the logdir writer thread (none of it waits)."""
        fault_point("round", self.view.step)
        self.out.record(observe.suspended(self.clock.new_stops(), self.clock.subtracted))
        self.ends.check_unkillable(self.ex)
        self._settle()  # ends whose reads are done, or past their bound
        self.ex.poll_fork()
        self.ex.poll_stacks()
        if self.limits.hang.stuck_secs > 0:
            self.ex.look_at_trainers(self.clock())
        if self.link is not None:
            self.link.beat()
            self.link.probe()  # (rule 12: the answers observed before the decision)
        if self.pipes.desk is not None:
            self.pipes.desk.reply(self.clock())
        if self.limits.world > 1:
            self._probe_stopped()
        if self.view.standby_ok is None:
            self._decide_standby()
        if self.pipes.audits is not None:
            self.pipes.audits.round()
        for _ in range(3):  # an action may make another due at once (a restart with delay 0: promote now)
            actions = decide(self.view, self.clock(), self.limits, self.rng.random())
            for action in actions:
                self.ex.perform(action)
                self.out.changed()
            if not actions:
                break
        trainer = self.ex.handles.get((TRAINER, self.view.children[TRAINER].attempt)) \
            if TRAINER in self.view.children else None
        if trainer is not None:
            self.out.echo(trainer)
        if self.sweeper.due():
            self._sweep()
        self.logdir.check()  # one look a round (by the logdir writer): before a write of status.json
        # the round's outputs, each throttled on its own, share one breakdown of the launch's time (computed
        # by the first that is due, if any: one pass over the attempts, at most once a round)
        shared = badput.Shared(self.view, self.clock())
        self.out.write_status(self.view, self.ex.zygote, shared=shared)
        self.pipes.scalars.tick(self.view, shared.now, self.wall(), shared)
        self.out.publish(self.view, shared=shared)
        self.out.draw_live(self.view, shared=shared)
        if self.pulse is not None:
            self.pulse.turned(self.view)  # /healthz: the loop turns; /readyz: training started
            if self.view.step > 0:
                faults.stall("watchdog", "loop_stall")  # tests only: a loop stuck after a round (/healthz 503)

    def _settle(self) -> None:
        """Observe the ends (here and on other hosts) whose reads of the logdir are done or overdue."""
        self.ends.settle(self.ex)
        if self.ex.remote is not None and self.ex.remote.settle():
            self.out.changed()

    def _sweep(self, final: bool = False) -> None:
        """Kill and reap what the run left behind (:meth:`Sweeper.sweep`): this process's own children
        are the executor's handles, its zygotes and the children it gave up on."""
        self.sweeper.sweep({h.pid for h in self.ex.handles.values()} | self.ex.unreaped.pids | (set() if final else self.ex.captures.pids()),
                           self.ex, final)

    def _decide_standby(self) -> None:
        """Whether a hot standby may run (once: ``--standby``, and for ``auto`` the memory rule at
        the first trainer's first step)."""
        choice = standby_choice(self.cfg, self.view)
        if choice is None:
            return
        ok, mode, why = choice
        self.view.standby_ok = ok
        self.out.record([Report(Event.STANDBY_DECIDED, {"mode": mode, "reason": why})])

    # ------------------------------------------------------------------ observations
    def _drain_messages(self, limit: Optional[int] = DRAIN_MAX) -> None:
        for got in drain(self.pipes.pull, limit=limit, accept=ACCEPT):
            if isinstance(got, ProtocolError):
                self.out.rejections.count(got)
                self.out.changed()
                continue
            if isinstance(got.msg, Progress) and not got.msg.busy:
                self.out.progress(got.msg.step)
            known = {c.pid for c in self.view.children.values() if c.pid}
            if self.ex.forks and self.ex.zygote is not None and getattr(got.msg, "pid", 0) not in known:
                self._on_zygote()  # a forked sender runs only once the zygote's answer naming it is written
            self.out.record(observe.heard(self.view, got.msg, self.clock(), stops=self.clock.stops))
            if self.pipes.audits is not None:
                self.pipes.audits.heard(got.msg)  # (after the view took it: a commit's rollback bound first)
            self.out.changed()
            if isinstance(got.msg, SaveResult) and not got.msg.ok:
                self.logdir.check()  # a save that fails may be the first sign of a lost logdir

    def _on_zygote(self) -> None:
        z = self.ex.zygote
        assert z is not None
        z.pump()
        if not z.alive():
            try:
                self.pipes.poller.unregister(z.fd)
            except KeyError:
                pass
            self.ex.drop_zygote("procsv: the pre-warmed trainer (zygote) died; restarts start fresh trainers until "
                                "a new one is ready")
        elif z.ready:
            self.out.record(observe.zygote_changed(self.view, ZygoteState.READY, z.pid, z.import_secs,
                                                   now=self.clock()))
        self.ex.poll_fork()  # a trainer it was asked for: answered, or to be started fresh now


def fault_point(name: str, step: int) -> None:
    """Raise here once if ``PROCSV_FAULT`` is ``watchdog:<name>`` and a step was completed (tests only)."""
    if step > 0 and faults.fires("watchdog", name):
        raise RuntimeError(f"injected fault ({env.FAULT}=watchdog:{name})")
