"""The messages between the job's watchdogs when a group spans hosts (``procsv launch --nnodes M``).

Over ZeroMQ TCP, authenticated and encrypted with CURVE (:mod:`procsv.watchdog.multihost.curve`): node 0's
watchdog (the master, which decides for the whole job) binds a ROUTER on ``--master-addr``; the
node agent of every other host (:mod:`procsv.watchdog.multihost.agent`) connects a DEALER to it. Agents
send :class:`NodeHello` (also their heartbeat), :class:`MemberStarted`, :class:`MemberEnded` and
:class:`Relayed` (a trainer's own report, as it sent it: one of :data:`RELAYABLE`); the master sends
:class:`MasterBeat`, :class:`StartMembers`, :class:`PromoteMember`, :class:`SignalMember` and :class:`NodeStop`, and :class:`NodeRefused` to an
agent whose claim of a node rank it refused; both carry node 0's ``--node-timeout``, which every
agent uses for node 0 (how long it may be silent). No message carries a key: the master knows each
agent's public key from the CURVE handshake (ZeroMQ's ``User-Id`` of every frame).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Optional

from procsv.ipc.message_base import Message
from procsv.ipc.watchdog_messages import NonfiniteDetected, Progress, RolledBack, StandbyReady, StepSkipped, TrainerReady

# what a member on another host tells its watchdog, which its agent relays to node 0 in a Relayed (the
# agent's PULL takes only these, node 0 decodes only these from a Relayed's frames): a trainer's progress
# and restore, non-finite training (issue 41), and a standby group's member ready to be promoted (issue 70).
# Not the chief's (on node 0): Save/SummaryOverdue.
RELAYABLE: frozenset[type[Message]] = frozenset({Progress, TrainerReady, NonfiniteDetected, RolledBack, StepSkipped,
                                                 StandbyReady})


@dataclass(frozen=True)
class NodeHello(Message):
    """Agent -> master, every heartbeat: who it is, the addresses its next members will listen on
    (free ports on its host, chosen by it), which members it still runs (``slot.attempt``), and whether
    a member it starts now starts at once (``ready``: its pre-warmed trainer is ready, or it has none
    left to wait for; an elastic group takes a host back only then, rule 15). ``link`` names the
    agent's connection that sent it: the master routes to the agent's newest and drops a hello of an
    older one (a connection the agent replaced during a partition delivers its queued hellos late, once
    the link is back). ``probe``: ``HOST:PORT`` of the agent's probe port, a listening socket whose
    handshake its host's kernel answers even while the agent is stopped or starved (node 0 connects to it
    when the agent's beats are late, to tell a slow agent from a silent host: rule 12); "" if none. ``deaf``: how
    long the agent has heard nothing from node 0 when it sends this (seconds of its watched clock): a hello that
    reaches node 0 saying so tells node 0 that its frames to this host are lost while this host's pass (a one-way
    cut), which node 0's probes then confirm (rule 12, :func:`~procsv.watchdog.rules.hosts.one_way_cut`).
    Sent every 0.1 s (``AGENT_BEAT_SECS``)."""

    KIND: ClassVar[str] = "node_hello"
    node: int
    nproc: int
    host: str
    pid: int
    addresses: list[str]
    live: list[str] = field(default_factory=list)
    stop: int = 0  # a stop signal the agent got (0: none): node 0 stops the whole job in order
    ready: bool = True
    link: int = 0  # which of the agent's connections to the master sent it, counted from 1 (a new one each reconnect)
    probe: str = ""  # HOST:PORT of its probe port ("" : none; node 0 then finds it lost by --node-timeout alone)
    deaf: float = 0.0  # seconds since the agent last heard node 0 (at the send)


@dataclass(frozen=True)
class MasterBeat(Message):
    """Master -> agent, every heartbeat: the job is alive (an agent that stops hearing it for
    ``node_timeout`` seconds, node 0's ``--node-timeout``, stops its members)."""

    KIND: ClassVar[str] = "master_beat"
    job: str
    node_timeout: float


@dataclass(frozen=True)
class StartMembers(Message):
    """Master -> agent: start these tasks of the group's attempt ``attempt``; ``env`` is what every
    member's environment gets besides its own task (``TF_CONFIG`` is built from ``cluster``, unless
    ``env`` carries it: a ``--ps`` worker's, one rank, ``cluster`` empty). ``standby``: they are this host's
    share of a standby group prepared to become attempt ``attempt`` (slots ``standby<R>``, the next attempt's
    ``worker<R>`` once promoted by :class:`PromoteMember`; ``env`` says ``PROCSV_STANDBY=1``)."""

    KIND: ClassVar[str] = "start_members"
    attempt: int
    ranks: list[int]
    cluster: list[str]
    env: dict[str, str]
    standby: bool = False


@dataclass(frozen=True)
class PromoteMember(Message):
    """Master -> agent: promote this host's standby group member ``slot`` (``standby<R>``), prepared for attempt
    ``attempt``, to the attempt's ``worker<R>``, as node 0's watchdog promotes its own: the agent writes the
    member's :class:`~procsv.ipc.watchdog_messages.Promotion` (these fields) to its runtime directory and sends
    it SIGUSR1 (the agent is its parent: the one sender a standby obeys). Node 0 sends one to each member of
    the group, every host's, in the same round."""

    KIND: ClassVar[str] = "promote_member"
    slot: str
    attempt: int
    skip_steps: list[int]
    rollback_before: Optional[int] = None
    launch_start_step: Optional[int] = None


@dataclass(frozen=True)
class SignalMember(Message):
    """Master -> agent: send ``sig`` to one member (``kill``: SIGKILL its whole process group)."""

    KIND: ClassVar[str] = "signal_member"
    slot: str
    attempt: int
    sig: int
    kill: bool = False


@dataclass(frozen=True)
class NodeStop(Message):
    """Master -> agent: the job is over; stop every member and exit with ``exit_code``."""

    KIND: ClassVar[str] = "node_stop"
    exit_code: int


@dataclass(frozen=True)
class NodeRefused(Message):
    """Master -> agent: its claim to be ``node`` is refused; ``reason`` says why (another agent
    holds that rank in this launch, or the job has no such rank). The agent asks again for twice
    ``node_timeout`` (node 0's ``--node-timeout``: a holder that died is found lost by then)."""

    KIND: ClassVar[str] = "node_refused"
    node: int
    reason: str
    node_timeout: float


@dataclass(frozen=True)
class MemberLooked(Message):
    """Agent -> master: a look at a member from its host's ``/proc`` (once a second: the stuck rule's samples,
    as node 0's watchdog takes of its own trainers; the master stamps it with its own clock when it arrives).
    The fields are :class:`procsv.watchdog.rules.state.Activity`'s but its time: CPU seconds, bytes read and
    written, the main thread's switches, its state letter and system call, its descendants' CPU and bytes
    (-1: not read)."""

    KIND: ClassVar[str] = "member_looked"
    slot: str
    attempt: int
    cpu: float
    io: int
    woke: int
    state: str
    syscall: str = ""
    kids_cpu: float = -1.0
    kids_io: int = -1


@dataclass(frozen=True)
class MemberStarted(Message):
    """Agent -> master: a member runs (pid on the agent's host)."""

    KIND: ClassVar[str] = "member_started"
    slot: str
    attempt: int
    pid: int


@dataclass(frozen=True)
class MemberEnded(Message):
    """Agent -> master: a member was reaped; ``code`` < 0 means killed by signal -code. Its error
    file, if it wrote one, is in the shared logdir. ``signalled``: a :class:`SignalMember` reached it
    alive before its end (False: whatever killed it, it was not the master: the group's breaker, maybe)."""

    KIND: ClassVar[str] = "member_ended"
    slot: str
    attempt: int
    pid: int
    code: int
    signalled: bool = True


@dataclass(frozen=True)
class Relayed(Message):
    """Agent -> master: one report a member sent its agent (one of :data:`RELAYABLE`: ``Progress``,
    ``TrainerReady``, ``NonfiniteDetected``, ``RolledBack``, ``StepSkipped``), whose ``frames`` frames
    follow as the payload exactly as the member encoded them."""

    KIND: ClassVar[str] = "relayed"
    slot: str
    frames: int


__all__ = ["NodeHello", "MasterBeat", "StartMembers", "SignalMember", "NodeStop", "NodeRefused", "MemberStarted",
           "MemberEnded", "Relayed", "RELAYABLE"]
