"""The node agent: ``procsv launch --nnodes M --node-rank R`` (R > 0) on each other host of a job.

Runs in the ``procsv launch`` process of hosts 1..M-1. It decides nothing: node 0's watchdog (the master) holds
the job's one decision function. The agent connects to the master over ZeroMQ TCP over CURVE
(:mod:`procsv.common.curve`) with a key pair of its own, made when it starts (the secret stays in
its memory; it files the public key for the launch in the shared logdir and pins the master's public key from
there), says which node it is and where its next members will listen (:class:`NodeHello`, also its heartbeat,
every 0.1 s; it names the agent's probe port, :class:`~.probes.ProbePort`, whose handshakes its host's kernel
answers for it while it is stopped or starved: rule 12 tells a slow agent from a silent host by them),
starts the members it is asked for (:class:`StartMembers`: trainer processes with their ``TF_CONFIG``, forked
from this host's own pre-warmed trainer when it is ready; with ``standby``, its share of a standby group, which it
promotes when told, :class:`PromoteMember`, :mod:`.standbys`), signals them when told (:class:`SignalMember`;
through each member's pidfd, never by pid: once reaped, its pid may name another process; every member, one
forked by the pre-warmed trainer too, is the agent's own child, reaped by the agent; what a member leaves
behind is re-parented to the agent, a child subreaper, and killed and reaped by the watchdog's own sweep,
:class:`~procsv.watchdog.housekeeping.Sweeper`), relays their reports (:class:`Relayed`: progress, restore and
non-finite training, :data:`~procsv.ipc.node_messages.RELAYABLE`), tells of their ends
(:class:`MemberEnded`) and reads their stacks when asked (:class:`StacksAsked`: before the kill of a hung
group, or for a ``procsv stacks`` on node 0's host; the watchdog's own capture, off its loop, answered with a
:class:`StacksTaken` per member). It runs no checkpoint or summary service: only the chief (task 0, on node 0) saves and
writes summaries; node 1's agent holds a replica of node 0's group copies in a thread (:mod:`.holder`). Its loop never waits on the shared logdir: the reads and writes of a reconnect (the job file,
this agent's key file) and the rotation of its members' logs are jobs of a thread of its own
(:class:`~procsv.watchdog.diskjobs.DiskJobs`), and a member opens its own log
(:func:`procsv.common.spawn.logged_argv`); it beats to node 0 meanwhile.

If the master is found lost (rule 12 the other way, :func:`~procsv.watchdog.rules.hosts.master_lost`: its
beats, every 0.1 s, late past the adaptive bound and its address answering none of this agent's probes, within
0.5 s of a silent host or a launch gone; or silent for ``node_timeout`` seconds, node 0's ``--node-timeout``, which
every :class:`MasterBeat` and :class:`NodeRefused` carries; until the first of them, this agent's own
``--node-timeout``), the agent SIGKILLs its members (they are part of a group that cannot go on) and says why
and keeps reconnecting (every second once found lost), reloading the launch's public key and filing its own key
again for a relaunched master's new launch. It probes node 0's address on, and once node 0 is heard again after
a silence (its address answers a probe, or a beat comes: a partition healed,
:func:`~procsv.watchdog.rules.hosts.master_redial`) it replaces its connection at once (the one it had waits out
TCP's retransmission backoff, up to about the partition's length, before its hello passes). Node 1's agent says its
first hello to a relaunched master once its
holder handed its copies back there (``HOLDER_WAIT_SECS`` at most); after ``rejoin_timeout`` seconds it exits 1
(an elastic job's outlives a partition: :mod:`.masterseen`).
A SIGTERM/SIGINT is left to node 0 while connected (:mod:`.agentstop`), else it stops the members and exits
143/130; :class:`NodeStop` exits with the job's exit code. A master that refuses its claim of its node rank (:class:`NodeRefused`: another agent holds it) is asked
again for twice ``node_timeout`` seconds (a holder that died is found lost by then), then the agent exits 2 with
the master's reason. It removes its key file when it exits. Its loop stamps ``pulse``, from which
``--metrics-port`` (served by :mod:`procsv.cli`) answers only the probes ``/healthz`` (the loop turns) and
``/readyz`` (a member of this host completed a step).

One concern: a host's agent for node 0, from joining the job to its exit.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

import zmq

from procsv.cluster import make_tf_config
from procsv.common import spawn
from procsv.common.env import PREDECESSORS, RANK
from procsv.common.layout import Layout, RuntimeDir, release_runtime_dir
from procsv.common.spawn import free_ports
from procsv.ipc.codec import ProtocolError, encode
from procsv.ipc.messages import (RELAYABLE, MasterBeat, MemberEnded, MemberLooked, MemberStarted, NodeHello, NodeRefused,
                                 NodeStop, ProcessStacks, Progress, PromoteMember, Relayed, SignalMember, StacksAsked,
                                 StacksTaken, StartMembers)
from procsv.ipc.transport import Endpoints, bind_private, drain, make_socket, send
from procsv.common import curve, faults
from procsv.watchdog.multihost import agentstop
from procsv.watchdog.children import ChildProcess, Process, Unreaped, end_all
from procsv.watchdog.config import LaunchConfig
from procsv.watchdog.diskjobs import DiskJobs, Job
from procsv.watchdog.housekeeping import Sweeper
from procsv.watchdog.publish.events import Report
from procsv.watchdog.publish.output import Terminal
from procsv.watchdog.publish.probes import LoopPulse
from procsv.watchdog.rules.group import worker_slot
from procsv.watchdog.rules.standby import slot as standby_slot
from procsv.watchdog.rules.state import STANDBY, WORKER
from procsv.watchdog.multihost.standbys import promote
from procsv.ipc.stack_messages import fitted
from procsv.watchdog.stacks.capture import LOOK_EVERY, Readings, activity
from procsv.watchdog.logrotate import rotate
from procsv.watchdog.multihost.holder import Holder, start_holder
from procsv.watchdog.multihost.masterseen import MasterSeen
from procsv.watchdog.multihost.nodes import host_ip
from procsv.watchdog.multihost.probes import ProbePort
from procsv.watchdog.multihost.zygoteagain import ZygoteLosses
from procsv.watchdog.rules.hosts import AGENT_BEAT_SECS
from procsv.watchdog.rules.limits import Limits
from procsv.watchdog.prewarm import PendingFork, Prewarmed, Zygote, ZygoteSeed, zygote_env
from procsv.common.clock.watched import WatchedClock

TICK = 0.05  # the loop turns at least this often (sooner when node 0 or its pre-warmed trainer says something)
BEAT_EARLY = 0.005  # a hello goes this much before it is due at most (a turn woken a little early: the wait's rounding)
HOLDER_WAIT_SECS = 5.0  # a relaunched master: node 1 joins once its holder handed its copies back, or this long after
REJOIN_LOOK_SECS = 1.0  # a master found lost: the agent reads the launch's job file this often (a relaunch's new keys)
CLAIM_PATIENCE = 2  # refused for this many node timeouts: another agent live holds the node rank (exit 2)
MASTER_ACCEPT = frozenset({MasterBeat, StartMembers, PromoteMember, SignalMember, StacksAsked, NodeStop, NodeRefused})
MEMBER_ACCEPT = RELAYABLE  # what its members report (as to a watchdog), all relayed to node 0


@dataclass(frozen=True)
class _Rejoin:
    """What a reconnect read in the logdir: the launch's job (None: not written yet), this agent's
    key file newly filed for it, or why it could not be filed."""

    job: Optional[curve.Job] = None
    key_file: Optional[str] = None
    problem: str = ""


def started_again(live: list[tuple[str, int, int]], link: int, told: int) -> list[MemberStarted]:
    """What the agent says after the first hello that passed on connection ``link``: each live member
    (``(slot, attempt, pid)``) started, again, unless said on that link already (``told``). A MemberStarted sent on a
    connection the agent then replaced is lost with it: a StartMembers node 0 sent just before a partition, delivered
    once it healed and read on the old connection before the redial, started a member of an attempt node 0 had
    given up meanwhile, and node 0, which kills a stale start at once (``RemoteMembers.started``), never heard of it;
    its hellos listed it live, so node 0 did not take the host back while it ran (measured, a group over two hosts
    whose link flapped 1 s down, 1 s up, beside two CPU burners). Node 0 takes a repeat of a start it knows as known."""
    return [] if link == told else [MemberStarted(slot, attempt, pid) for slot, attempt, pid in live]


def beat_wait(then: float, beat_at: float, now: float) -> float:
    """How long the agent's loop may wait for a word (from node 0 or its pre-warmed trainer) before its next turn,
    at ``now``, its turn having started at ``then`` and its last hello sent at ``beat_at``: up to :data:`TICK` after
    the turn's start, and no later than its next hello is due (every :data:`AGENT_BEAT_SECS`: a word woke it in
    between). A hello overdue (its connection not up yet) is tried again a turn later, as before."""
    due = beat_at + AGENT_BEAT_SECS
    until = then + TICK if now >= due else min(then + TICK, due)
    return max(0.0, until - now)


def lost_line(why: str, live: bool) -> str:
    """What the agent says once it finds node 0 lost (rule 12 the other way, ``why``): it stops this host's ``live``
    trainers, or says none was running (their ends are in their logs). Before, it said nothing without a live
    trainer: under a one-way cut of node 1's packets to node 0, node 0 found node 1 lost and SIGKILLed its own
    chief, whose closed connection (node 0's packets still passing) made TensorFlow end worker1 with "Socket
    closed" before the agent found node 0 lost, and node 1's output never said that node 0 was lost."""
    if live:
        return f"node 0 is lost ({why}): stopping this host's trainers (a stale group)"
    return f"node 0 is lost ({why}): no trainer of this host is running (a trainer's end is in its log)"


class NodeAgent(Prewarmed):
    """One host's agent; :meth:`run` returns the exit code. It holds this host's pre-warmed trainer as
    the watchdog's executor does (:class:`~procsv.watchdog.prewarm.Prewarmed`)."""

    def __init__(self, cfg: LaunchConfig, clock: Callable[[], float] = time.monotonic,
                 pulse: Optional[LoopPulse] = None, host: str = "") -> None:
        assert cfg.master_addr is not None
        super().__init__()  # (its zygote: unless --no-prewarm)
        self.cfg = cfg
        self.layout = Layout(os.path.abspath(cfg.logdir))
        # every timer's clock: ``clock`` without the time this process was stopped (SIGSTOP, then SIGCONT)
        self.clock = clock if isinstance(clock, WatchedClock) else WatchedClock(clock)
        self.host = host or host_ip(cfg.master_addr, cfg.node_rank)  # (the launch's, resolved before anything started)
        self.members: dict[str, ChildProcess] = {}  # by "slot.attempt"; the pidfd of each signals it
        self.stop_code: Optional[int] = None
        self.keys = curve.AgentKeys.new()  # this agent's own key pair; the secret never leaves this process
        self.key_file: Optional[str] = None  # where its public key is filed for the current launch
        self.job_keys: Optional[curve.Job] = None  # the launch its socket is connected to (a redial's): its job, keys
        # the members node 0 asked for in this launch ("slot.attempt"; each starts once), and whether a
        # SignalMember reached it alive (its MemberEnded says so)
        self.asked: dict[str, bool] = {}
        self.refused_at: Optional[float] = None  # the master refuses this agent's claim of its node since
        self.addresses = [f"{self.host}:{p}" for p in free_ports(self.cfg.nproc, self.host)]  # its members' next
        self.disk = DiskJobs("procsv-agent-logdir")  # its work on the shared logdir, off the loop
        self._rejoin: Optional[Job[_Rejoin]] = None  # a reconnect's reads and writes in the logdir, in flight
        # (and node 0 as this agent sees it: rules.hosts.master_lost, its beats' gaps and the probes of its address)
        # (its last word, heard_at, the start counting as one; and node_timeout: the master silent this long, its
        # members are stopped: this agent's own --node-timeout until node 0 tells its)
        self.seen = MasterSeen(self.layout, self.disk, cfg.rejoin_timeout, 0 < cfg.min_nodes < cfg.nnodes,
                               cfg.master_addr or "", self.clock, cfg.node_timeout)
        self.pulse = pulse or LoopPulse(self.clock)  # what --metrics-port's probes answer from (it latches a step)
        self.stop = agentstop.StopRequest(cfg.stop_grace_secs + 2 * cfg.node_timeout)  # a stop signal, left to node 0
        self.stacks: Readings[int, list[ProcessStacks]] = Readings("procsv-agent-stacks")  # for the master's asks
        self.zygote_losses = ZygoteLosses()  # its pre-warmed trainer's, and when a new one is due (node 0's rule 13)
        # what it says, written by a thread: never by the loop, which beats (its stderr may be a file on a stalled
        # filesystem: a Slurm output file on NFS; before, a line said there blocked the beats, and node 0 found the
        # host lost by --node-timeout: an agent SIGSTOPped 10 s whose "was stopped" line met a 10 s freeze)
        self.terminal = Terminal(err=sys.stderr)

    def say(self, text: str) -> None:
        self.terminal.line(f"procsv node {self.cfg.node_rank}: {text}", err=True)

    # ------------------------------------------------------------------ the loop
    def run(self, seed: Optional[ZygoteSeed] = None) -> int:
        """The agent's life; ``seed``: a zygote seed forked at the launch's start
        (``procsv.zygote.seed.plant``), grown into its zygote (or discarded)."""
        runtime = RuntimeDir.create()
        self.runtime = runtime.path
        zctx: zmq.Context[Any] = zmq.Context()
        pull = make_socket(zctx, zmq.PULL)  # the members report here, as to a watchdog
        bind_private(pull, Endpoints(runtime.path).watchdog)
        stops: list[int] = []
        old = {s: signal.signal(s, lambda signum, frame: stops.append(signum)) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
        # the subreaper of what its pre-warmed trainer forks and of what its members leave behind (swept)
        self.sweeper = Sweeper(self.clock, self._said)
        dealer: Optional[zmq.Socket[Any]] = None
        holder: Optional[Holder] = None
        self.say(f"joining the job at {self.cfg.master_addr} as {self.host} ({self.cfg.nproc} trainer(s))")
        try:
            if self._wait_for_job(stops):  # node 0 creates the logdir and the job's keys first
                holder = start_holder(self.layout, self.cfg.node_rank)  # node 1: node 0's group copies, replicated
                if self.cfg.prewarm:
                    grown, seed = seed, None  # (the zygote's now: grown, or discarded if unsuitable)
                    self._start_zygote(1, grown)
                dealer = self._loop(zctx, pull, stops, holder)
        finally:  # SIGKILL and reap what is left, bounded: the watchdog's own end_all
            if seed is not None:  # an agent that ended before its zygote
                seed.discard()
            for line in end_all(list(self.members.values()), self.zygotes(), Unreaped(), self.clock):
                self.terminal.line(line, err=True)
            self._sweep(final=True)
            if holder is not None:
                holder.stop()
            for s, h in old.items():
                signal.signal(s, h)
            if dealer is not None:
                dealer.close(0)
            pull.close(0)
            zctx.term()
            self.disk.close()
            self.stacks.close()
            curve.unfile_agent_key(self.key_file)
            release_runtime_dir(runtime.path)
            self.terminal.close()  # (what it said written, 2 s at most)
        return self.stop_code if self.stop_code is not None else 1

    def _loop(self, zctx: "zmq.Context[Any]", pull: "zmq.Socket[Any]", stops: list[int], holder: Optional[Holder]
              ) -> "Optional[zmq.Socket[Any]]":
        """Until the job ends, a stop signal, or the master stays away: returns the socket to close."""
        self.clock.watch()  # (a suspension of the job is no silence of node 0's)
        self.seen.heard_at = self.clock()
        port = ProbePort(self.host)  # node 0's probes: this host's kernel answers them, this loop turning or not
        try:
            return self._turn(zctx, pull, stops, port, "" if faults.fires("agent", "no_probe_port") else port.address,
                              holder, not faults.fires("agent", "no_redial"))
        finally:
            self.clock.unwatch()
            port.close()
            self.seen.close()

    def _turn(self, zctx: "zmq.Context[Any]", pull: "zmq.Socket[Any]", stops: list[int], port: ProbePort,
              probe: str, holder: Optional[Holder], redial: bool = True) -> "Optional[zmq.Socket[Any]]":
        """The loop of :meth:`_loop`, with its probe port (``probe``: its address as said in each hello; "" for
        none, a bench's agent as before the probes: ``PROCSV_FAULT=agent:no_probe_port``; ``redial``: False, a bench's
        agent as before its redial of a healed partition, ``PROCSV_FAULT=agent:no_redial``). Node 1's agent holds
        back its hellos to a relaunched master (a new launch, after one it knew) until its ``holder`` handed its
        copies back to the new launch's checkpoint service, ``HOLDER_WAIT_SECS`` at most: the relaunched group
        starts once every host joined, and its chief's first restore asks that service for them."""
        dealer: Optional[zmq.Socket[Any]] = None
        link = 0  # its connections to the master so far: each hello names the one it is sent on (NodeHello.link)
        connected_at = beat_at = float("-inf")
        dialed_at = float("-inf")  # when it made the socket it has (a healed partition's redial: after it only)
        told = 0  # the link its live members were said started on (started_again)
        only_new = False  # the reconnect in flight connects only to a new launch
        relaunch_at: Optional[float] = None  # a relaunched master's launch read then, its hellos held back for the holder
        while self.stop_code is None:
            now = self.clock()
            for stop in self.clock.new_stops():
                self.say(f"this agent was stopped for {stop.secs:.1f} s (SIGSTOP, then SIGCONT: a suspended job?); its "
                         "timers leave that time out")
            timeout = self.seen.node_timeout
            self.stop_code = self.stop.take(stops, now, dealer is not None and now - self.seen.heard_at <= timeout, self.say)
            if self.stop_code is not None:  # (None until now: the loop's condition)
                break
            # found lost: a relaunched master is looked for every second (only_new: its socket is kept for the same
            # launch, which ZeroMQ reconnects by itself; a new one each second could outrun a master slow to beat)
            anew = dealer is None or (now - self.seen.heard_at > 2 * timeout and now - connected_at > timeout)
            if self._rejoin is None and (anew or (self.seen.is_lost and now - connected_at > REJOIN_LOOK_SECS)):
                self._rejoin = self.disk.submit(self._read_job)  # (again: a relaunched master has new keys)
                connected_at, only_new = now, not anew
            if self._rejoin is not None and self._rejoin.done:
                known = self.job
                fresh = self._reconnect(zctx, dealer, self._rejoin, only_new)
                if known is not None and self.job != known and holder is not None:
                    relaunch_at = now
                if fresh is not dealer:
                    link, dialed_at, beat_at = link + 1, self.clock(), float("-inf")
                dealer = fresh
                self._rejoin = None
            if self.zygote is not None:
                self.zygote.pump()
            port.take()
            if dealer is not None:
                self._from_master(dealer)
                self.seen.probe(now)  # (rule 12 the other way: the answers observed before master_lost decides)
                if redial and self.job_keys is not None and (silent := self.seen.redial(dialed_at)) is not None:
                    dealer = self._dial(zctx, dealer, self.job_keys)  # (its old one waits out TCP's backoff)
                    link, dialed_at, beat_at = link + 1, self.clock(), float("-inf")  # (after what it observed)
                    self.say(f"node 0 is heard again after {silent:.1f} s of silence: a new connection to it (link "
                             f"{link}; the one it had waits out TCP's retransmission backoff)")
                self._forked(dealer)
                self.relay(pull, dealer)
                self._look(dealer, now)
                for ask, got, _ in self.stacks.done():  # (one that raised: none read)
                    for p in list[Optional[ProcessStacks]](got or []) or [None]:
                        send(dealer, StacksTaken(ask, len(got or []), p))
                if self._reap(dealer):
                    self._sweep()
                if relaunch_at is not None and (holder is None or holder.handed == self.job
                                                or now - relaunch_at >= HOLDER_WAIT_SECS):
                    relaunch_at = None
                if relaunch_at is None and now - beat_at >= AGENT_BEAT_SECS - BEAT_EARLY:  # (a beat each 0.1 s)
                    warm = self.zygote is None or self.zygote.ready or not self.zygote.alive()  # (its NodeHello.ready)
                    # (one not sent, its connection not up yet, goes at the next turn: a new link's first hello
                    # within a turn of its handshake, not a beat later)
                    if send(dealer, NodeHello(self.cfg.node_rank, self.cfg.nproc, self.host, os.getpid(),
                                              self.addresses, sorted(self.members), self.stop.signum or 0, warm, link,
                                              probe, round(max(0.0, self.clock() - self.seen.heard_at), 3))):
                        beat_at = now
                        for news in started_again([(m.slot, m.attempt, m.pid) for m in self.members.values()
                                                   if m.proc.poll() is None], link, told):
                            send(dealer, news)
                        told = link
            if self.zygote is not None and not self.forks and not self.zygote.alive():
                # found dead (its answers to pending starts read first, by _forked): given up, reaped by a sweep
                self.drop_zygote("the pre-warmed trainer died")
            elif self.zygote is not None and self.zygote.ready:
                self.zygote_losses.ready(now)
            elif self.zygote is None and self.cfg.prewarm and not self.forks and self.zygote_losses.due(now, Limits()):
                self._start_zygote(self.zygote_losses.started())
            if self.sweeper.due():
                self._sweep()
            silent = now - self.seen.heard_at
            why = self.seen.lost(now, timeout) if dealer is not None else None  # (once per loss: a beat clears it)
            live = any(m.killed_at is None for m in self.members.values())
            if why is not None and (not live or silent <= timeout):  # (the fast way; past the bound, said as before)
                self.say(lost_line(why, live))
            elif live and (silent > timeout or self.seen.is_lost):
                self.say(f"the master is silent for {silent:.1f} s (no heartbeat from node 0 for longer than its "
                         f"--node-timeout {timeout:g}): stopping this host's trainers")
            if live and (why is not None or silent > timeout or self.seen.is_lost):
                for m in self.members.values():
                    m.kill(now)  # (reaped by _reap, reported once reaped)
            if self.seen.gone(now, self.seen.heard_at, timeout):
                self.say(f"the master did not come back within --rejoin-timeout {self.cfg.rejoin_timeout:g} s; "
                         "giving up")
                self.stop_code = 1
                break
            self.pulse.beat(False)
            # (a hello due and not sent, its connection not up: the connection's completion ends the wait too)
            self._idle(dealer, beat_wait(now, beat_at, self.clock()),
                       relaunch_at is None and self.clock() - beat_at >= AGENT_BEAT_SECS - BEAT_EARLY)
        return dealer

    def _idle(self, dealer: "Optional[zmq.Socket[Any]]", secs: float, unsent: bool = False) -> None:
        """Wait up to ``secs`` for node 0's next word or the pre-warmed trainer's (its readiness, a fork's answer):
        the next turn reads it at once. Before, a blind sleep of :data:`TICK`: a :class:`StartMembers` waited up to
        50 ms for the next turn (25 ms on average), then a fork's answer as long for its :class:`MemberStarted`. The
        members' reports do not wake it (a group's steps would turn it at their rate): relayed within a turn.
        ``unsent``: a hello is due that its connection did not take (not up yet: a redial's, after a partition
        healed): the connection coming up ends the wait too, and the hello goes at once (node 0 sends the
        group's start it holds for this host once it hears it on the new connection)."""
        poller = zmq.Poller()
        if dealer is not None:
            poller.register(dealer, zmq.POLLIN | (zmq.POLLOUT if unsent else 0))
        if self.zygote is not None and not self.zygote.closed:
            poller.register(self.zygote.fd, zmq.POLLIN)
        poller.poll(max(1, round(secs * 1000)))

    def _wait_for_job(self, stops: list[int]) -> bool:
        """Wait until node 0 wrote the job's keys (the logdir exists); False on a stop, or past ``rejoin_timeout``."""
        deadline = self.clock() + self.cfg.rejoin_timeout
        while curve.load_job(self.layout) is None:
            if stops:
                self.stop_code = 128 + stops[0]
                return False
            if self.clock() > deadline:
                self.say(f"no job appeared in {self.layout.logdir} within --rejoin-timeout "
                         f"{self.cfg.rejoin_timeout:g} s (is node 0's `procsv launch` running with this --logdir?)")
                self.stop_code = 1
                return False
            self.pulse.beat(False)
            time.sleep(0.1)
        return True

    @property
    def job(self) -> Optional[str]:
        """The launch this agent's socket is connected to (its job id; None before the first)."""
        return self.job_keys.job if self.job_keys is not None else None

    # ------------------------------------------------------------------ the master's channel
    def _read_job(self) -> "_Rejoin":
        """In the logdir thread: the launch's job file and, for a new launch, this agent's key filed for it."""
        job = curve.load_job(self.layout)
        if job is None or job.job == self.job:
            return _Rejoin(job)
        try:
            return _Rejoin(job, curve.file_agent_key(self.layout, job.job, self.keys, self.cfg.node_rank, self.host))
        except OSError as exc:
            return _Rejoin(job, problem=f"cannot file this agent's key in {self.layout.logdir} "
                                        f"({exc.strerror or exc}); trying again")

    def _reconnect(self, zctx: "zmq.Context[Any]", old: "Optional[zmq.Socket[Any]]", read: "Job[_Rejoin]",
                   only_new: bool = False) -> "Optional[zmq.Socket[Any]]":
        """Connect to the master with what the logdir thread read (:meth:`_read_job`); ``only_new``: only if it
        names a new launch (else ``old`` is kept)."""
        got = read.result
        if got is None or got.job is None:
            return old  # the master has not written this launch's job file yet (or the read failed)
        if only_new and old is not None and got.key_file is None and not got.problem:
            return old
        if got.problem:
            self.say(got.problem)
            return old
        if got.key_file is not None:  # a new launch of the master: this agent's key is filed for it
            stale = self.key_file
            self.disk.submit(lambda: curve.unfile_agent_key(stale))
            self.key_file = got.key_file
            self.asked.clear()  # (a new launch counts its attempts anew)
            self.seen.new_master()
        self.job_keys = got.job
        return self._dial(zctx, old, got.job)

    def _dial(self, zctx: "zmq.Context[Any]", old: "Optional[zmq.Socket[Any]]", job: curve.Job) -> "zmq.Socket[Any]":
        """A new socket connected to the master of launch ``job`` (``old`` closed)."""
        if old is not None:
            old.close(0)  # (its kernel may still deliver what it queued, late: the hellos say which link)
        sock = make_socket(zctx, zmq.DEALER)  # no identity: the master knows this agent by its key
        sock.setsockopt(zmq.IMMEDIATE, 1)  # nothing is queued for a master that is not connected
        curve.connect_as_agent(sock, self.keys, job)
        sock.connect(f"tcp://{self.cfg.master_addr}")
        return sock

    def _start_zygote(self, attempt: int, seed: Optional[ZygoteSeed] = None) -> None:
        """Start this host's pre-warmed trainer (its ``attempt``-th: at the start, from the launch's ``seed`` if any,
        and again after a loss, :class:`~.zygoteagain.ZygoteLosses`)."""
        self.zygote = Zygote(zygote_env(self.layout.logdir, self.runtime),
                             self.layout.attempt_log(f"zygote-node{self.cfg.node_rank}", attempt),
                             self.cfg.cwd, self.cfg.preload, self.clock, seed)
        if attempt > 1:
            self.say(f"a new pre-warmed trainer (pid {self.zygote.pid}, its log zygote-node{self.cfg.node_rank}."
                     f"{attempt}.log): this host's members are forked again once it is ready")

    def drop_zygote(self, why: str) -> Optional[Zygote]:
        """Give up on the pre-warmed trainer (:meth:`Prewarmed.drop_zygote`), saying ``why`` and when a new one comes
        (before, neither: the agent said nothing, and its members started fresh for the rest of the run)."""
        lost = super().drop_zygote(why)
        if lost is not None:
            again = self.zygote_losses.lost(self.clock(), Limits())
            self.say(f"{why.removeprefix('procsv: ')}: this host's members start fresh until a new one is ready; "
                     + (f"a new one in {again:g} s" if again is not None else
                        f"none again ({self.zygote_losses.losses} lost in a row)"))
        return lost

    def _from_master(self, dealer: "zmq.Socket[Any]") -> None:
        for got in drain(dealer, accept=MASTER_ACCEPT, limit=100):
            if isinstance(got, ProtocolError):
                continue
            msg = got.msg
            if isinstance(msg, (MasterBeat, NodeRefused)):
                self.seen.node_timeout = msg.node_timeout  # node 0's: the job has one
            if isinstance(msg, MasterBeat):
                self.seen.beat(self.clock())
            else:  # (node 0 is there: a StartMembers before its first beat on a new connection ends its loss too)
                self.seen.heard(self.clock())
            self.seen.heard_at = self.clock()  # (a refusal too: the master is there; _refused bounds the asking)
            if isinstance(msg, NodeRefused):
                self._refused(msg)
                continue
            self.refused_at = None
            if isinstance(msg, StartMembers):
                if faults.fires("agent", "start_unanswered"):  # tests: a start never answered while the agent beats
                    continue  # on (lost with a connection node 0 did not see replaced, or its loop wedged)
                self._start(dealer, msg)
            elif isinstance(msg, PromoteMember):
                promote(self.members, self.runtime, msg)
            elif isinstance(msg, SignalMember):
                m = self.members.get(f"{msg.slot}.{msg.attempt}")
                if m is not None and m.proc.poll() is None:
                    self.asked[f"{msg.slot}.{msg.attempt}"] = True  # reached alive
                    if msg.kill:
                        m.kill_group()
                    else:
                        m.send_signal(msg.sig)
            elif isinstance(msg, StacksAsked):
                self._read_stacks(msg)
            elif isinstance(msg, NodeStop):
                self.say(f"the job ended (exit code {msg.exit_code})")
                self.stop_code = msg.exit_code

    def _look(self, dealer: "zmq.Socket[Any]", now: float) -> None:
        """A look at each live member from ``/proc``, at most every :data:`LOOK_EVERY` seconds, sent to node 0
        (:class:`MemberLooked`): the stuck rule's samples of this host's members, as node 0's watchdog takes
        of its own (before, none: a group over hosts was left to ``--hang-timeout``, its local members too)."""
        for m in self.members.values():  # (not a standby group's member waiting: node 0 looks at none of its own)
            if m.proc.poll() is not None or m.slot.startswith(STANDBY) or \
                    (m.look is not None and now - m.look.at < LOOK_EVERY):
                continue
            if (a := activity(m.pid, now, m.look)) is not None:
                m.look = a
                send(dealer, MemberLooked(m.slot, m.attempt, a.cpu, a.io, a.woke, a.state, a.syscall, a.kids_cpu,
                                          a.kids_io))

    def _read_stacks(self, msg: StacksAsked) -> None:
        """Read the stacks of the members the master asked for (the watchdog's own capture, off this loop:
        py-spy started here, waited for by a thread; the loop sends a :class:`StacksTaken` per member when done)."""
        live = {m.slot: m for m in sorted(self.members.values(), key=lambda m: m.attempt) if m.proc.poll() is None}
        host = self.host
        self.stacks.start(msg.ask, [(slot, m.pid) for slot, m in live.items() if not msg.slots or slot in msg.slots],
                          msg.native, msg.timeout, lambda got: [fitted(dataclasses.replace(s, host=host)) for s in got])

    def _refused(self, msg: NodeRefused) -> None:
        """The master refuses this agent's claim of its node rank: ask again (the holder may be a dead
        agent the master has not found lost yet); after twice node 0's ``--node-timeout``, exit 2."""
        now = self.clock()
        patience = CLAIM_PATIENCE * self.seen.node_timeout
        if self.refused_at is None:
            self.refused_at = now
            self.say(f"the master refuses this agent as node {msg.node}: {msg.reason}; asking again for "
                     f"{patience:g} s (twice node 0's --node-timeout)")
        elif now - self.refused_at > patience:
            self.say(f"error: the master still refuses this agent as node {msg.node} after {patience:g} s: "
                     f"{msg.reason}; giving up")
            self.stop_code = 2

    def _start(self, dealer: "zmq.Socket[Any]", msg: StartMembers) -> None:
        """Start the members asked for: forked from the pre-warmed trainer when it is ready, else fresh. A
        member asked for again is not started again (node 0 asks again down a new connection while it has
        not heard of the start: the first request may have reached this agent all the same); one running is
        said started again, since its first MemberStarted may be what went down a dead connection. A standby
        group's members (``msg.standby``) are slots ``standby<R>`` writing the next attempt's ``worker<R>`` log; one
        that ended unpromoted is forgotten at its reap (:meth:`_reap`), so the standby group node 0 prepares for the
        same attempt after that one broke is started here too (before, asked of a slot already asked, it started
        nothing and said nothing: node 0 waited for it for good, its view forking, and no restart came)."""
        slot_of = standby_slot if msg.standby else worker_slot
        ranks = [r for r in msg.ranks if f"{slot_of(r)}.{msg.attempt}" not in self.asked]
        for rank in [r for r in msg.ranks if r not in ranks]:  # asked again: its MemberStarted may be lost
            m = self.members.get(f"{slot_of(rank)}.{msg.attempt}")
            if m is not None:
                send(dealer, MemberStarted(m.slot, m.attempt, m.pid))  # (node 0 takes a repeat as known)
        if not ranks:
            return
        for rank in ranks:
            slot, name = slot_of(rank), worker_slot(rank)
            self.asked[f"{slot}.{msg.attempt}"] = False
            env = spawn.child_env(role=name, attempt=msg.attempt, logdir=self.layout.logdir,
                                  runtime_dir=self.runtime, supervised=True)
            env.update(msg.env)  # a --ps worker's carries its whole TF_CONFIG; a group member's is built here
            env.update({"TF_CONFIG": msg.env.get("TF_CONFIG") or make_tf_config(msg.cluster, rank), RANK: str(rank)})
            if not msg.standby:  # its program starts once this host's earlier members are gone (trainer/ends/predecessors)
                env[PREDECESSORS] = ",".join(str(m.pid) for m in self.members.values()
                                             if m.attempt < msg.attempt and not m.slot.startswith(STANDBY))
            pending = PendingFork(slot, msg.attempt, env, self.layout.attempt_log(name, msg.attempt), None,
                                  STANDBY if msg.standby else WORKER, rank)
            if not self.ask_zygote(pending, self.cfg.target, self.cfg.args, self.cfg.cwd):
                self._started(dealer, pending, None)
        self.addresses = [f"{self.host}:{p}" for p in free_ports(self.cfg.nproc, self.host)]  # the next group's

    def _forked(self, dealer: "zmq.Socket[Any]") -> None:
        """Complete the forks asked of the pre-warmed trainer (a fresh start if it fails or is late)."""
        for pending, proc in self.answered():
            self._started(dealer, pending, proc)

    def _started(self, dealer: "zmq.Socket[Any]", pending: PendingFork, proc: Optional[Process]) -> None:
        """A member started: forked by the pre-warmed trainer (``proc``), or None: fresh, now."""
        slot, attempt = pending.slot, pending.attempt
        proc = proc or spawn.spawn(spawn.trainer_argv(self.cfg.target, self.cfg.args), pending.env, pending.log_path,
                                   cwd=self.cfg.cwd)
        # its own unreaped child (a zombie if it died at once): its pidfd opens
        self.members[f"{slot}.{attempt}"] = ChildProcess(slot, worker_slot(pending.rank), attempt, proc,
                                                         pending.log_path)
        send(dealer, MemberStarted(slot, attempt, proc.pid))
        # this host's members are the only writers of their per-attempt logs: rotate them here (off the loop)
        name = worker_slot(pending.rank)  # (a standby group's member writes the next attempt's worker log)
        logs, keep, live = self.layout.logs, self.cfg.keep_logs, {m.attempt for m in self.members.values()
                                                                    if m.role == name}
        self.disk.submit(lambda: rotate(logs, name, attempt, keep, live=live))

    def relay(self, pull: "zmq.Socket[Any]", dealer: "zmq.Socket[Any]") -> None:
        """Relay to node 0 what this host's members reported (:data:`MEMBER_ACCEPT`), each as they sent
        it. One from a pid not known yet while forks are pending reads the zygote's answers first: a
        forked member runs only once the answer naming it is written (:mod:`procsv.zygote`)."""
        for got in drain(pull, accept=MEMBER_ACCEPT, limit=1000):
            if isinstance(got, ProtocolError):
                continue
            pid = getattr(got.msg, "pid", 0)
            if self.forks and self.zygote is not None and all(m.pid != pid for m in self.members.values()):
                self.zygote.pump()
                self._forked(dealer)
            member = next((m for m in self.members.values() if m.pid == pid), None)
            if member is not None:
                if isinstance(got.msg, Progress) and not got.msg.busy:
                    self.pulse.beat(True)  # (/readyz: a member of this host completed a step)
                frames = encode(got.msg)
                send(dealer, Relayed(member.slot, len(frames)), frames)

    def _reap(self, dealer: Optional["zmq.Socket[Any]"]) -> bool:
        """Reap the members that ended and tell node 0; True if any did."""
        ended = False
        for key, m in list(self.members.items()):
            code = m.proc.poll()
            if code is None:
                continue
            del self.members[key]
            m.reap()  # (reaped already: closes its pidfd)
            ended = True
            signalled = self.asked.get(key, False)
            if m.slot.startswith(STANDBY):  # a standby group's member gone unpromoted: the next group prepared for
                self.asked.pop(key, None)  # the same attempt (after this one broke) asks for its slot again, anew
            if dealer is not None and not faults.fires("agent", "member_ended_unsent"):  # tests: a report its host took along
                send(dealer, MemberEnded(m.slot, m.attempt, m.pid, code, signalled))
        return ended

    def _sweep(self, final: bool = False) -> None:
        """Kill and reap what this host's members left behind: the watchdog's own sweep
        (:meth:`Sweeper.sweep`), over the agent's own children (its members and zygotes). A zygote given
        up on is reaped there once dead, as the watchdog's are (before, at the agent's end only)."""
        self.sweeper.sweep({m.pid for m in self.members.values()} | (set() if final else self.stacks.pids()), self, final)

    def _said(self, reports: list[Report]) -> None:
        for r in reports:  # (no lifecycle log of its own: node 0's holds the job's events)
            if r.say:
                self.say(r.say.removeprefix("procsv: "))


__all__ = ["NodeAgent", "beat_wait", "lost_line", "started_again"]
