"""The executor: performs the decision function's actions on real processes.

Runs in the watchdog. For each :mod:`~procsv.watchdog.rules.actions` value it does the effect (start a process,
from the pre-warmed trainer when it is ready; send a signal; kill a process group), records the action's
consequences in the view (:func:`procsv.watchdog.rules.bookkeeping.note`), and reports it (lifecycle event,
terminal line). A start never waits on the logdir: a child opens its own log (:func:`procsv.common.spawn.logged_argv`);
rotating per-attempt logs (:mod:`~procsv.watchdog.logrotate`) is the writer thread's (:attr:`Executor.disk`).
It owns the live handles, the pre-warmed trainer, the chaos rng, the captures of a hang's stacks
(:class:`~procsv.watchdog.stacks.artifact.Captures`: with ``--nnodes``, the other hosts' too, asked of their agents); ``--ps`` tasks start through :mod:`.pstasks`.

One concern: performing the decision function's actions on the run's real processes.
"""

from __future__ import annotations

import os
import random
import signal
import uuid
from typing import Callable, Optional, Sequence

import psutil
import zmq

from procsv.common import spawn
from procsv.cluster import make_tf_config
from procsv.common.env import (ALLOW_REINIT, PREDECESSORS, CHECKPOINT_FAILURE_LIMIT, GROUP_HOSTS, GROUP_PEER_BIND, GROUP_PIN, GROUP_REMOTE,
                               GROUP_SNAPSHOT_STEPS, NPROC, RANK, SHADOW_MEMORY, SHADOW_RUN, STANDBY as STANDBY_ENV)
from procsv.common.bootstrap import Resume
from procsv.common.layout import Layout, RuntimeDir, atomic_write, promotion_file, read_json, write_json
from procsv.common.manifests import list_committed
from procsv.ipc.codec import encode
from procsv.ipc.messages import Promotion
from procsv.common.mutex import RobustMutex
from procsv.watchdog import observe
from procsv.watchdog.lateblame import breaker_found
from procsv.watchdog.actionlines import (kill_reports, membership_reports, node_lost_reports, restart_reports, signal_reports, standby_gone_reports,
                                         starts_dropped_reports, stop_failing_reports, task_gave_up_reports)
from procsv.watchdog.rules.actions import (Action, ArmChaos, Finish, GiveUp, GiveUpService, GiveUpTask,
                                     Kill, NodeLost, Promote, StartsDropped, RespawnService, Restart, Signal, SkipChaos, Spawn, StandbyGone,
                                     StartZygote, StopFailing, TakeStacks)
from procsv.watchdog.config import LaunchConfig
from procsv.watchdog.rules.bookkeeping import find, note
from procsv.watchdog.rules.limits import Limits
from procsv.watchdog.publish.events import Event, Report
from procsv.watchdog.children import ChildProcess, Process, Unreaped, death_mutex, end_all
from procsv.watchdog.deathwatch import DeathWatch
from procsv.watchdog.logrotate import rotate
from procsv.watchdog.rules.failures import describe
from procsv.watchdog.multihost.remote import RemoteMembers
from procsv.watchdog.rules.lifecycle import ProcState, RunState
from procsv.watchdog.pstasks import PsCluster
from procsv.watchdog.prewarm import PendingFork, Prewarmed, Zygote, ZygoteSeed, zygote_env
from procsv.watchdog.rules import standby
from procsv.watchdog.rules.group import blame, rank_of, worker_slot, workers as group_workers
from procsv.watchdog.rules.state import (AUDITOR, CHECKPOINT, auditor_slot, PS, SERVER, SERVICE_ROLES, STANDBY, TRAINER, WORKER, RunView,
                                         ZygoteState)
from procsv.watchdog.seeds import ServiceSeed
from procsv.watchdog.multihost.stackasks import remote_members
from procsv.watchdog.stacks.artifact import Captures
from procsv.watchdog.stacks.capture import LOOK_EVERY, activity

Sink = Callable[[list[Report]], None]


AUDIT_FORK_RANK = 2000  # an auditor's fork is answered under this rank (the workers' under their task, PS_FORK_RANK + i)


class Executor(Prewarmed):
    """Carries out actions; the only place the watchdog starts or signals a process. It holds the
    pre-warmed trainer (:class:`~procsv.watchdog.prewarm.Prewarmed`)."""

    def __init__(self, cfg: LaunchConfig, layout: Layout, runtime_dir: str, view: RunView, limits: Limits,
                 report: Sink, clock: Callable[[], float], poller: zmq.Poller,
                 on_death_notice: Callable[[ChildProcess, bool, float], None],
                 chaos_rng: Optional[random.Random] = None) -> None:
        super().__init__()
        self.cfg, self.layout, self.runtime, self.view = cfg, layout, RuntimeDir(runtime_dir), view
        self.limits, self.report, self.clock = limits, report, clock
        self.poller = poller  # the loop's: each child's pidfd and the zygote's pipe are registered there
        self._on_death_notice = on_death_notice
        self.handles: dict[tuple[str, int], ChildProcess] = {}
        self.unreaped = Unreaped()  # children SIGKILL did not end, given up on (see give_up)
        self.remote: Optional[RemoteMembers] = None  # the other hosts' members (--nnodes), set by the launcher
        self.disk: Callable[[Callable[[], object]], None] = lambda work: None if work() else None  # the launcher's: the writer thread
        self.reading: Callable[[str], set[int]] = lambda role: set()  # attempts whose end is being read (kept)
        self.job = uuid.uuid4().hex[:12]  # names the group's restore records (the link's job id when there is one)
        ps_host = cfg.master_addr.rpartition(":")[0] if limits.nnodes > 1 and cfg.master_addr else "127.0.0.1"
        self.ps_cluster = PsCluster(limits.ps, limits.nproc, limits.coordinator, limits.nnodes, ps_host) \
            if limits.ps else None  # --ps N --workers M
        self.captures = Captures()  # the stacks taken before a hang's SIGTERM (rule 4), by a thread of their own
        self.chaos_rng = chaos_rng or random.Random(limits.chaos.seed if limits.chaos else None)
        if limits.chaos is not None:
            view.chaos_next_delay = limits.chaos.delay(self.chaos_rng)

    # ------------------------------------------------------------------ the one entry point
    def perform(self, action: Action) -> None:
        self._perform(action)
        if self.forks or (self.remote is not None and self.remote.pending):
            self.view.forking = True  # a start asked of the zygote or of another host: until poll_fork

    def _perform(self, action: Action) -> None:
        now = self.clock()
        if isinstance(action, StartZygote):
            self.report([Report(say=f"procsv: starting a new pre-warmed trainer (zygote attempt {action.attempt})")])
            try:
                self.start_zygote(action.attempt)
            except OSError as exc:  # no memory or pids left (after an OOM kill, say): another loss, not a stop
                self.report(observe.zygote_changed(self.view, ZygoteState.LOST, 0, now=self.clock(),
                                                   why=f"procsv: could not start a pre-warmed trainer ({exc})"))
            return
        if isinstance(action, Spawn):
            if action.role == STANDBY:  # the trainer's next attempt, prepared: from the zygote only
                self._spawn_standby()
                return
            before = self.view.group_nodes
            note(self.view, action, self.clock(), self.limits)  # a trainer, a service, a --ps task (rule 14)
            prev = self.view.children.get(action.slot)
            if action.role == TRAINER and prev is not None:
                self.report([Report(Event.RESTARTED, {"attempt": prev.attempt + 1})])
            if action.role == TRAINER:  # (an elastic group's hosts changed: rule 15)
                self.report(membership_reports(self.view, before, action.nodes, self.clock(), self.limits))
            self.spawn(action.slot, action.role, action.nodes)
            return
        if isinstance(action, Promote):
            self._promote(action)
            return
        if isinstance(action, ArmChaos):
            note(self.view, action, now, self.limits)
            assert self.limits.chaos is not None
            self.view.chaos_next_delay = self.limits.chaos.delay(self.chaos_rng)
            return
        if isinstance(action, SkipChaos):
            note(self.view, action, now, self.limits)
            return
        if isinstance(action, NodeLost):
            self.remote.lost(action.node) if self.remote is not None else None  # (its members not started: lost too)
            note(self.view, action, now, self.limits)
            self.report(node_lost_reports(action, self.view.nodes[action.node].host, self.limits) + breaker_found(self.view))
            return
        if isinstance(action, StartsDropped):
            self.remote.dropped(action.node) if self.remote is not None else None  # (each added, never started)
            note(self.view, action, now, self.limits)
            self.report(starts_dropped_reports(action, self.view.nodes[action.node].host))
            return
        if isinstance(action, StopFailing):
            note(self.view, action, now, self.limits)
            self.report(stop_failing_reports(action, self.layout.logdir))
            return
        if isinstance(action, TakeStacks):
            note(self.view, action, now, self.limits)
            self._take_stacks(action)
            return
        child = find(self.view, action.slot, action.attempt)
        handle = self.handles.get((action.slot, action.attempt))
        reports: list[Report] = []
        remote = child.node if child is not None and handle is None and self.remote is not None else 0
        if isinstance(action, Signal):
            reports += signal_reports(self.view, action, self.limits, now)
            if handle is not None:
                handle.send_signal(action.sig)
            elif remote:
                self.remote.link.signal(remote, action.slot, action.attempt, action.sig)  # type: ignore[union-attr]
        elif isinstance(action, Kill):
            reports += kill_reports(self.view, action, self.limits)
            if handle is not None:
                handle.kill(now)
            elif remote:
                self.remote.link.signal(remote, action.slot, action.attempt, signal.SIGKILL,  # type: ignore[union-attr]
                                        kill=True)
        note(self.view, action, now, self.limits)
        if isinstance(action, Restart):
            reports += restart_reports(self.view, action)
        elif isinstance(action, GiveUpTask):
            reports += task_gave_up_reports(self.view, action)
        elif isinstance(action, RespawnService):
            assert child is not None
            reports.append(Report(say=f"procsv: {child.headline()}; restarting the {child.role} service", err=True))
            self.report(reports)
            reports = []
            self.spawn(action.slot, child.role)
        elif isinstance(action, StandbyGone):
            reports += standby_gone_reports(self.view, action, now)
        elif isinstance(action, GiveUpService):
            assert child is not None
            reports.append(Report(say=f"procsv: giving up: the {child.role} service failed {len(action.crashes)} "
                                      f"times in {self.limits.service_restart_window:g} s.\n{child.root_cause()}",
                                  err=True))
        elif isinstance(action, GiveUp):
            assert child is not None
            reports.append(Report(Event.GAVE_UP, {"reason": action.reason, "error": self.view.last_error},
                                  say=f"procsv: giving up: {action.reason}.\n{blame(self.view, child).root_cause()}",
                                  err=True))
        if isinstance(action, (Finish, GiveUp)):
            if isinstance(action, Finish) and child is not None:
                code = child.exit_code
                line = (f"procsv: trainer finished at step {self.view.step}" if action.run == RunState.SUCCEEDED
                        else f"procsv: trainer stopped at step {self.view.step} ({describe(code)})")
                if action.unsaved and child.state == ProcState.RESTARTING:  # rule 2: stopped between two groups
                    line = (f"procsv: the trainer group stopped while its restart was pending: its in-memory snapshot "
                            f"of step {child.held_whole}, which the restart would have restored, is not on disk")
                if action.unsaved:
                    newest = f"step {self.view.commit_step}" if self.view.commit_step >= 0 else "none"
                    line += (f": its checkpoint of the last step did not commit (the newest committed checkpoint: "
                             f"{newest}); exit code {action.exit_code}, not 128+signal (which says nothing was lost)")
                reports.append(Report(say=line, err=action.unsaved))
                if action.run == RunState.SUCCEEDED and not any(a.ready_at is not None for a in self.view.attempts):
                    reports.append(Report(say=f"procsv: warning: {self.cfg.target} exited with code 0 without ever "
                                              "entering a procsv.Supervisor's managed_session(): nothing was "
                                              "supervised (no checkpoint, no summaries); train inside "
                                              "`with sv.managed_session() as sess:`", err=True))
            reports.append(Report(Event.FINISHED, {"state": self.view.run.value, "exit_code": self.view.exit_code,
                                                   "step": self.view.step}))
        self.report(reports)

    # ------------------------------------------------------------------ starting processes
    def _spawn_standby(self) -> None:
        """Ask the zygote for a hot standby, prepared to become the trainer's next attempt; with
        ``--nproc N`` a standby group of N, on the next group's ``TF_CONFIG`` (ports of its own); with
        ``--nnodes M`` over the current group's hosts, each other host's share asked of its agent."""
        attempt, free = self.view.children[TRAINER].attempt + 1, psutil.virtual_memory().available
        hosts = (self.view.group_nodes or tuple(range(self.limits.nnodes))) if self.remote is not None else (0,)
        cluster, common, extras = self._group(attempt, hosts) if self.limits.world > 1 else ([], {}, [{}])
        alike = {STANDBY_ENV: "1", SHADOW_MEMORY: str(free), **({} if self.view.shadow_runs else {SHADOW_RUN: "0"})}
        for rank, extra in enumerate(extras):  # (alike: the members' shadow runs decided alike, warmup.py)
            if self.zygote is None or not self.zygote.ready:
                return  # (members asked already: their answers fail with it, poll_fork)
            self._spawn_member(standby.slot(rank), STANDBY, attempt, rank, {**extra, **alike})
        if self.remote is not None:  # (every host's members alike: one memory figure, node 0's)
            self.remote.start(attempt, cluster, {**common, GROUP_REMOTE: "1", **alike}, hosts, standby=True)

    def _promote(self, action: Promote) -> None:
        """Wake the standby (SIGUSR1): it becomes the trainer's next attempt and restores (a standby
        group's member R: the next attempt's worker R; the decision promotes every member in turn; one on
        another host is woken by its agent, :mod:`procsv.watchdog.multihost.standbys`)."""
        rank = rank_of(action.slot)
        slot = TRAINER if rank == 0 else worker_slot(rank)
        # what it would find in its environment if spawned now, decided after its fork: read at its wake-up
        told = self.resume()
        handle = self.handles.pop((action.slot, action.attempt), None)
        if handle is None:  # another host's member (Promote only names members alive: rule 10)
            child = self.view.children[action.slot]
            assert self.remote is not None and child.node != 0
            pid, node = child.pid, child.node
            self.remote.promote(child.node, action.slot, action.attempt, told)
        else:
            handle.slot = slot
            self.handles[(slot, action.attempt)] = handle
            handle.unidle()  # woken at normal CPU priority
            promotion = Promotion(action.attempt, list(told.skip_steps), told.rollback_before, told.launch_start_step)
            # (not durable: read by a live process; the rename makes it whole, tmpfs or not)
            atomic_write(promotion_file(self.runtime.path, action.attempt, rank), encode(promotion)[0], durable=False)
            handle.send_signal(signal.SIGUSR1)
            pid, node = handle.pid, 0
        note(self.view, action, self.clock(), self.limits)
        name = "trainer" if rank == 0 else f"trainer group's {slot}"
        say = f"procsv: promoted the standby {name} (pid {pid}{f' on node {node}' if node else ''}) to attempt {action.attempt}"
        self.report(([Report(Event.RESTARTED, {"attempt": action.attempt})] if rank == 0 else [])
                    + [Report(Event.SPAWNED, {"role": slot, "attempt": action.attempt, "pid": pid,
                                              "via": "standby"},
                              say=say)])

    def _env(self, role: str, attempt: int) -> dict[str, str]:
        """The environment of ``role``'s attempt ``attempt`` (its coordinates and the launch's settings)."""
        env = spawn.child_env(role=role, attempt=attempt, logdir=self.layout.logdir, runtime_dir=self.runtime.path,
                              supervised=True)
        env[CHECKPOINT_FAILURE_LIMIT] = str(self.limits.checkpoint_failure_limit)
        env[ALLOW_REINIT] = "1" if self.cfg.allow_reinit else "0"
        env.update(self.cfg.trainer.nonfinite_env())
        if role not in SERVICE_ROLES:
            env.update(self.resume().environ())
        if role == CHECKPOINT and self.remote is not None and self.cfg.master_addr:  # other hosts' members' copies
            env[GROUP_PEER_BIND] = self.cfg.master_addr.rpartition(":")[0]
        return env

    def resume(self) -> Resume:
        """What a trainer started now is told (``ChildConfig.resume``): every step the run skipped (this
        launch's and the earlier launches'), the step B of the group's rollback while one is in force
        (a checkpoint the chief committed after B, before a worker found it, holds B's update; so do those
        of the rolled-back attempt that commit late: :func:`procsv.watchdog.observe.rollback_bound`), and
        the step this launch's first trainer began at."""
        first = next((c for c in self.view.attempts if c.role == TRAINER and c.ready_at is not None), None)
        bound = self.view.rollback_before
        return Resume(tuple(self.view.skipped_steps),
                      bound[0] if bound is not None else None, first.restored_step if first is not None else None)

    def spawn(self, slot: str, role: str, nodes: tuple[int, ...] = (), seed: Optional[ServiceSeed] = None) -> None:
        """Start the next attempt of ``slot`` and add it to the view (a trainer forked by the zygote: :meth:`poll_fork`
        adds it; a service grown from the launch's ``seed`` where it suits: :mod:`procsv.watchdog.seeds`). With ``--nproc
        N`` a trainer start is the whole group's, each with its own ``TF_CONFIG`` on ports chosen now, over ``nodes``."""
        if self.ps_cluster is not None and role in (TRAINER, WORKER, PS, SERVER):  # --ps: each task alone (pstasks)
            return self.ps_cluster.start(self, slot, role)
        prev = self.view.children.get(slot)
        attempt = prev.attempt + 1 if prev else 1
        if role != TRAINER:
            env, log_path = self._env(role, attempt), self.layout.attempt_log(role, attempt)
            if seed is not None and (grown := seed.start(env, log_path, self.cfg.cwd)) is not None:
                return self._started(slot, role, attempt, grown, log_path, None, "fork")
            return self._fresh(slot, role, attempt, env, log_path, None)
        if self.limits.world == 1:
            return self._spawn_member(TRAINER, TRAINER, attempt, 0, {})
        hosts = nodes or tuple(range(self.limits.nnodes))
        cluster, common, extras = self._group(attempt, hosts)
        for rank in range(self.limits.nproc):
            self._spawn_member(TRAINER if rank == 0 else worker_slot(rank), TRAINER if rank == 0 else WORKER,
                               attempt, rank, extras[rank])
        if self.remote is not None:  # (their copies: node 0's peer link)
            self.remote.start(attempt, cluster, {**common, GROUP_REMOTE: "1"}, hosts)

    def _group(self, attempt: int, nodes: tuple[int, ...] = (0,)) -> tuple[list[str], dict[str, str], list[dict[str, str]]]:
        """Group attempt ``attempt``'s addresses over the hosts ``nodes`` (this host's on ports free now, then
        each other host's, in order), the environment every member shares, and each of this host's members'."""
        n = self.limits.nproc
        host = self.cfg.master_addr.rpartition(":")[0] if self.remote is not None and self.cfg.master_addr \
            else "127.0.0.1"
        cluster = [f"{host}:{port}" for port in spawn.free_ports(n, host)]
        for node in nodes[1:]:  # each agent reported its next members' addresses
            cluster += self.view.nodes[node].addresses[:n]
        job = self.remote.link.job if self.remote is not None else self.job
        common = {NPROC: str(len(cluster)), GROUP_HOSTS: str(len(nodes)), GROUP_PIN: self.layout.group_pin(job, attempt),
                  GROUP_SNAPSHOT_STEPS: str(self.cfg.trainer.group_snapshot_steps),  # K: every member's
                  **self.resume().environ()}  # (other hosts' members too: skipped again, the rollback's bound)
        return cluster, common, [{**common, "TF_CONFIG": make_tf_config(cluster, r), RANK: str(r)} for r in range(n)]

    def _spawn_member(self, slot: str, role: str, attempt: int, rank: int, extra: dict[str, str]) -> None:
        """Start one trainer process (the chief, a group's worker ``rank``, or a hot standby: the
        trainer's next attempt, from the zygote only), from the zygote if ready."""
        # a worker's files carry its task (a standby group's member R: the next attempt's worker R)
        name = slot if role == WORKER else (worker_slot(rank) if rank else TRAINER) if role == STANDBY else role
        env = self._env(name, attempt)
        env.update(extra)
        if role != STANDBY:  # (a standby runs beside the trainer it may replace)
            env[PREDECESSORS] = ",".join(map(str, self._predecessors(attempt)))
        log_path = self.layout.attempt_log(name, attempt)
        mutex = death_mutex(self.runtime.standby_mutex(attempt, rank) if role == STANDBY
                            else self.runtime.trainer_mutex(attempt, rank), env)
        if self.fork(PendingFork(slot, attempt, env, log_path, mutex, role, rank), self.cfg.target, self.cfg.args):
            return
        if role != STANDBY:
            return self._fresh(slot, role, attempt, env, log_path, mutex)
        if mutex is not None:  # no standby this time: no process will hold its mutex
            mutex.remove()

    def _predecessors(self, attempt: int) -> list[int]:
        """This host's trainer processes of attempts before ``attempt`` not reaped yet (dead, their teardown still
        releasing what they held, being killed, or given up on while stuck in the kernel and holding it still): the new
        attempt's program starts once they are gone
        (:mod:`procsv.trainer.ends.predecessors`). A standby or an auditor is not one: it runs beside the trainer."""
        given_up = [((h.slot, h.attempt), h) for h in self.unreaped.handles]  # (still stuck: still holding)
        return sorted(h.pid for (slot, older), h in [*self.handles.items(), *given_up]
                      if older < attempt and slot in self.view.children
                      and self.view.children[slot].role in (TRAINER, WORKER))

    def fork_auditor(self, attempt: int, extra: dict[str, str], members: int = 1) -> bool:
        """Ask the zygote for auditor ``attempt`` (issue 71: a trainer process of its own role, told its interval in
        ``extra``), from the zygote only, holding no death-notice mutex; False: not asked (no zygote ready). A group's
        (``members`` > 1, on this host: node 0's, for a group over hosts too): that many, a group of their own (``TF_CONFIG`` on ports free now, as a
        trainer group's; member R in slot :func:`~procsv.watchdog.rules.state.auditor_slot`), which replays the
        interval as the group would after a restart."""
        cluster = [f"127.0.0.1:{port}" for port in spawn.free_ports(members)] if members > 1 else []
        for rank in range(members):
            slot = auditor_slot(rank)
            env = {**self._env(AUDITOR, attempt), **extra}
            if cluster:
                env.update({NPROC: str(members), RANK: str(rank), GROUP_HOSTS: "1",
                            "TF_CONFIG": make_tf_config(cluster, rank)})
            pending = PendingFork(slot, attempt, env, self.layout.attempt_log(slot, attempt), None, AUDITOR,
                                  AUDIT_FORK_RANK + rank)
            if not self.fork(pending, self.cfg.target, self.cfg.args):
                return rank > 0  # (members asked already: their answers come, the rest is the replay's death)
        return True

    def pause(self, slot: str, attempt: int, stopped: bool) -> None:
        """Stop (SIGSTOP) or continue (SIGCONT) this host's child ``attempt`` of ``slot``: the audit's duty cycle
        (:mod:`procsv.watchdog.audit.duty`). Nothing is recorded; nothing is sent once it is reaped."""
        handle = self.handles.get((slot, attempt))
        if handle is not None:
            handle.send_signal(signal.SIGSTOP if stopped else signal.SIGCONT)

    def cpu_secs(self, slot: str, attempt: int) -> Optional[float]:
        """The CPU seconds (user and system, every thread) this host's child ``attempt`` of ``slot`` has used; None: no
        such child here, or it is gone (the audit's :mod:`~procsv.watchdog.audit.stillness` reads its auditor's)."""
        handle = self.handles.get((slot, attempt))
        if handle is None:
            return None
        try:
            used = psutil.Process(handle.pid).cpu_times()
        except psutil.Error:
            return None
        return float(used.user + used.system)

    def carry_audit(self, carried: dict[str, object]) -> None:
        """Persist what ``--audit`` leaves the next launch (:func:`~procsv.watchdog.audit.carry.carried`), on the
        logdir writer thread (a stalled filesystem never holds the loop), atomically (write, fsync, rename)."""
        path = self.layout.audit_carry
        self.disk(lambda: write_json(path, carried))

    def audit_left(self) -> tuple[object, dict[int, str]]:
        """What an earlier launch's audit left (the JSON of ``.procsv/audit.json``: None, no such file; ``...``, a
        file that cannot be read) and the committed checkpoints now, step -> path; read once, at the launch's start."""
        path = self.layout.audit_carry
        left = read_json(path)
        if left is None and os.path.exists(path):
            left = ...
        return left, {m.step: m.path(self.layout.logdir) for m in list_committed(self.layout)}

    def fork(self, pending: PendingFork, target: str, args: Sequence[str]) -> bool:
        """Ask the zygote, when it is ready, for ``pending``'s process (:meth:`poll_fork` completes it);
        False: start it fresh (a zygote the request failed on is given up)."""
        return self.ask_zygote(pending, target, args, self.cfg.cwd)

    def _take_stacks(self, action: TakeStacks) -> None:
        """Hand the capture of every trainer process of this host to the capture thread (rule 4, issue 69)."""
        hung = find(self.view, action.slot, action.attempt)
        assert hung is not None
        targets = [(c.slot, c.pid) for c in self.view.trainers() + group_workers(self.view)
                   if c.live and (c.slot, c.attempt) in self.handles]
        headline = (f"procsv: the stacks of the run's trainers, taken when {action.slot} attempt {action.attempt} "
                    f"(pid {hung.pid}) was judged hung at step {hung.step}: {action.reason}")
        timeout = max(1.0, self.limits.hang.stacks_secs - 0.5)
        others = remote_members(self.view) if self.remote is not None else {}  # (their agents read them)
        ask = self.remote.stacks.ask(others, False, timeout).wait if self.remote is not None and others else None
        host = (self.cfg.master_addr or "").rpartition(":")[0] if self.remote is not None else ""  # node 0's
        self.captures.take(action.slot, action.attempt, targets, self.layout.stacks_file(action.slot, action.attempt),
                           headline, timeout, ask, host)

    def look_at_trainers(self, now: float) -> None:
        """A look at each live trainer process of this host from ``/proc`` (the stuck rule's samples; with
        ``--ps`` the parameter servers and the workers' servers too), at most every :data:`LOOK_EVERY` seconds."""
        for c in [c for c in self.view.children.values() if c.role in (TRAINER, WORKER, PS, SERVER)]:
            if not c.live or (c.slot, c.attempt) not in self.handles or \
                    (c.hang.samples and now - c.hang.samples[-1].at < LOOK_EVERY):
                continue
            if (sample := activity(c.pid, now, c.hang.samples[-1] if c.hang.samples else None)) is not None:
                observe.looked_at(self.view, c.slot, c.attempt, sample, self.limits.hang)

    def poll_stacks(self) -> None:
        """Take the captures that are done (the next decision signals their hung attempt). Call every round."""
        for taken in self.captures.done():
            observe.stacks_back(self.view, taken.slot, taken.attempt, taken.where, taken.culprit, taken.path)

    def poll_fork(self) -> None:
        """Complete the trainer starts asked of the zygote: an answer arrived, or it is overdue or
        failed (then the zygote is given up and the trainer starts fresh). Call after every pump
        of the zygote and every round."""
        for pending, proc in self.answered():
            if proc is not None:
                self._started(pending.slot, pending.role, pending.attempt, proc, pending.log_path, pending.mutex,
                              "zygote")
                continue
            # its mutex goes (no standby this time; a fork given up on may have started late, the zygote stalled
            # after its intermediate forked it: sharing it, the sweep's kill of that one would read as the fresh
            # one's death)
            if pending.mutex is not None:
                pending.mutex.remove()
            if pending.role not in (STANDBY, AUDITOR):  # (an auditor comes from the zygote or not at all)
                mutex = death_mutex(pending.mutex.path.removesuffix(".mutex") + ".fresh.mutex", pending.env) \
                    if pending.mutex is not None else None
                self._fresh(pending.slot, pending.role, pending.attempt, pending.env, pending.log_path, mutex)
        # a group's members are answered one by one: the view is forking until the last answer
        self.view.forking = bool(self.forks or (self.remote is not None and self.remote.pending))

    def _fresh(self, slot: str, role: str, attempt: int, env: dict[str, str], log_path: str,
               mutex: Optional[RobustMutex]) -> None:
        trainer = role in (TRAINER, WORKER)
        argv = spawn.trainer_argv(self.cfg.target, self.cfg.args) if trainer else spawn.service_argv(role)
        self._started(slot, role, attempt, spawn.spawn(argv, env, log_path, cwd=self.cfg.cwd), log_path, mutex, "fresh")

    def _started(self, slot: str, role: str, attempt: int, proc: Process, log_path: str,
                 mutex: Optional[RobustMutex], via: str) -> None:
        # a standby is a trainer process (a standby group's member R: worker R's); a group's worker is known
        # by its task (worker1.3.log)
        rank = rank_of(slot) if role == STANDBY else 0
        name = (TRAINER if rank == 0 else worker_slot(rank)) if role == STANDBY else \
            slot if role in (WORKER, PS, SERVER, AUDITOR) else role
        handle = ChildProcess(slot, name, attempt, proc, log_path)
        handle.take_over_log(self.handles.values())
        self.handles[(slot, attempt)] = handle
        self.poller.register(handle.pidfd, zmq.POLLIN)
        # a standby writes the trainer's next attempt log (its promotion starts no process: rotate now)
        logs, name, keep = self.layout.logs, handle.role, self.cfg.keep_logs
        live = {h.attempt for h in self.handles.values() if h.role == name} | self.reading(name)
        self.disk(lambda: rotate(logs, name, attempt, keep, live=live))
        try:  # the view's (status.json's): it tells a reused pid apart
            create_time: Optional[float] = psutil.Process(handle.pid).create_time()
        except psutil.Error:
            create_time = None
        self.report(observe.spawned(self.view, slot, role, attempt, handle.pid, self.clock(), via, create_time))
        if mutex is not None:  # the death-notice watch on the mutex it was told to hold
            handle.watch = DeathWatch(mutex, lambda died, at: self._on_death_notice(handle, died, at), self.clock)

    def start_zygote(self, attempt: int = 1, seed: Optional[ZygoteSeed] = None) -> None:
        """Start the pre-warmed trainer (at launch, from the launch's ``seed`` if any, and again after a
        loss: rule 13). It is noted as warming first, so a start that raises is one more loss (:meth:`perform`)."""
        note(self.view, StartZygote(attempt), self.clock(), self.limits)
        self.zygote = Zygote(zygote_env(self.layout.logdir, self.runtime.path), self.layout.attempt_log(
            "zygote", attempt), self.cfg.cwd, self.cfg.preload, self.clock, seed)
        self.report([Report(Event.SPAWNED, {"role": "zygote", "attempt": attempt, "pid": self.zygote.pid,
                                            "via": self.zygote.via})])
        if seed is not None and self.zygote.via == "fresh":
            self.report([Report(say="procsv: --fork-prewarm: the zygote's TF_CPP_MIN_LOG_LEVEL or PYTHONUNBUFFERED "
                                    "would differ from this process's (read at TensorFlow's import): started fresh")])
        self.poller.register(self.zygote.fd, zmq.POLLIN)

    def handle_for(self, fd: int) -> Optional[ChildProcess]:
        """The child whose pidfd ``fd`` is, if it is one (every handle's is in the poller until its end)."""
        return next((h for h in self.handles.values() if h.pidfd == fd), None)

    def drop_zygote(self, why: str) -> Optional[Zygote]:
        """Give up on the pre-warmed trainer (:meth:`Prewarmed.drop_zygote`), a loss reported (rule 13)."""
        lost = super().drop_zygote(why)
        if lost is not None:
            self.report(observe.zygote_changed(self.view, ZygoteState.LOST, lost.pid, why=why, now=self.clock()))
        return lost

    def close(self) -> None:
        """SIGKILL and reap whatever still runs (the end of the launch, however it ends)."""
        lines = end_all(list(self.handles.values()), self.zygotes(), self.unreaped, self.clock)
        self.handles.clear()
        self.captures.close()
        self.report([Report(say=line, err=True) for line in lines])

    def give_up(self, handle: ChildProcess) -> None:
        """Stop waiting for a child that SIGKILL did not end (:class:`~procsv.watchdog.children.Unreaped`)."""
        self.handles.pop((handle.slot, handle.attempt), None)
        self.report([Report(say=self.unreaped.add(handle), err=True)])

