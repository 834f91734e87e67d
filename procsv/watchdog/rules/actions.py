"""What the watchdog's decision function asks for: one frozen dataclass per kind of action.

Runs in the watchdog. :func:`procsv.watchdog.rules.decide.decide` returns a list of these;
:class:`procsv.watchdog.executor.Executor` performs them (spawn, signal, kill) and
:func:`procsv.watchdog.rules.bookkeeping.note` records in the :class:`~procsv.watchdog.rules.state.RunView` what
each one changed, so that deciding again without a new observation asks for nothing new.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Optional, Union

from procsv.watchdog.rules.lifecycle import RunState
from procsv.watchdog.rules.policy import History


class Cause(str, enum.Enum):
    """Why the watchdog signals or kills a child."""

    STOP = "stop"  # the run was asked to stop (SIGTERM/SIGINT, procsv stop)
    STOP_GRACE = "stop_grace"  # the trainer outlived --stop-grace-secs after the stop request
    HANG = "hang"  # no progress within --hang-timeout / --startup-timeout
    CHAOS = "chaos"  # --chaos
    SHUTDOWN = "shutdown"  # the run is over: the services flush and exit
    STALL = "stall"  # steps complete but no checkpoint commits, or summaries are not confirmed: a service is stuck
    GROUP = "group"  # another member of the trainer group ended: the group restarts together
    STANDBY_UNREADY = "standby_unready"  # a restart is due and the standby is not ready: a fork replaces it
    STANDBY_LOST = "standby_lost"  # a member of the standby group ended: the rest of it goes with it
    GROUP_NOW = "group_now"  # a member of the trainer group ended and the standby group is ready: no grace
    PS_LOST = "ps_lost"  # --ps: a parameter server died; every worker's session lost its variables (rule 14)
    REGROUP = "regroup"  # --min-nodes: a host is back; the group restarts with it from the checkpoint just committed
    AUDIT = "audit"  # --audit: two replays say the trainer computed an interval wrongly: it restores the interval's start


@dataclass(frozen=True)
class Spawn:
    """Start the next attempt of ``slot``; a trainer group's on the hosts ``nodes`` (node 0 first; empty:
    not a group over hosts)."""

    slot: str
    role: str
    nodes: tuple[int, ...] = ()


@dataclass(frozen=True)
class Signal:
    """Send ``sig`` to the child (the process itself, so a trainer can save first)."""

    slot: str
    attempt: int
    sig: int
    cause: Cause
    reason: str = ""  # the hang's one-line reason
    stuck_for: float = 0.0  # a stuck verdict's limit (rules.hang.stuck_limit; 0: any other verdict)


@dataclass(frozen=True)
class TakeStacks:
    """Record the stacks of every trainer process of the run before ``slot``'s attempt is signalled as
    hung (rule 4): its SIGTERM waits for them, within ``HangLimits.stacks_secs``."""

    slot: str
    attempt: int
    reason: str  # the hang's one-line reason, as judged
    stuck_for: float = 0.0  # a stuck verdict's limit (rules.hang.stuck_limit; 0: any other verdict)


@dataclass(frozen=True)
class Kill:
    """SIGKILL the child's whole process group."""

    slot: str
    attempt: int
    cause: Cause
    reason: str = ""  # a stall's one-line reason


@dataclass(frozen=True)
class Restart:
    """A trainer attempt ended (or died, ``early``: noticed before its exit status): start another."""

    slot: str
    attempt: int
    delay: float
    history: History
    preempted: bool = False  # a SIGTERM/SIGINT stopped it and its checkpoint committed (exit 42 and its exit report)
    early: bool = False
    skip: Optional[int] = None  # a group's rollback (exit 5): the step every member of the next group skips
    regroup: bool = False  # the group was ended to take a host back (rule 15): not a failure, not counted


@dataclass(frozen=True)
class RestartTask:
    """A parameter server or a non-chief worker of ``--ps`` ended: start it again, alone, after ``delay``
    (:mod:`procsv.watchdog.rules.tasks`); ``history`` is that task's own."""

    slot: str
    attempt: int
    delay: float
    history: History


@dataclass(frozen=True)
class GiveUpTask:
    """The restart policy gave up on a non-chief worker of ``--ps`` and ``--on-worker-give-up continue``
    says the run trains on without it (:mod:`procsv.watchdog.rules.tasks`); ``history`` is its own."""

    slot: str
    attempt: int
    reason: str
    history: History


@dataclass(frozen=True)
class RespawnService:
    """A service died while the run goes on: start it again at once."""

    slot: str
    attempt: int
    crashes: tuple[float, ...]  # the crash times inside the restart window, this one included


@dataclass(frozen=True)
class GiveUpService:
    """A service keeps dying: stop the run in order, and exit 1."""

    slot: str
    attempt: int
    crashes: tuple[float, ...]


@dataclass(frozen=True)
class StopFailing:
    """The run cannot go on: stop it in order, and fail with ``exit_code``. ``cause``: ``checkpoints``
    (rule 8: they keep failing to commit), ``logdir`` (rule 9: deleted, moved or replaced while the
    run is live) or ``nodes`` (rule 12: a host did not join, or come back, within ``rejoin_timeout``);
    ``reason``: what happened; ``error``: the run's last error from now on."""

    cause: str
    reason: str
    error: str
    exit_code: int = 1


@dataclass(frozen=True)
class NodeLost:
    """A host's agent went silent (``--nnodes``): its members count as dead; the group waits for it.
    ``unanswered``: how long its host's kernel answered no probe (found by rule 12's fast path), or None:
    found by ``--node-timeout``, or by ``reset``: its host answered a probe with a reset (no agent listens on
    its probe port: the agent is gone, its host up); or by ``unstarted``: the members of a start its agent answered
    for none of ``start_secs`` while it beat on (:func:`~procsv.watchdog.rules.hosts.start_unanswered`)."""

    node: int
    silent_secs: float
    unanswered: Optional[float] = None
    reset: bool = False
    unstarted: tuple[str, ...] = ()
    start_secs: float = 0.0
    deaf: float = 0.0  # with ``unanswered``: how long its agent said it had heard nothing from node 0 (a one-way cut)


@dataclass(frozen=True)
class StartsDropped:
    """A stop came while a start asked of host ``node``'s agent (``members``, ``slot.attempt``) had no answer for
    ``waited`` seconds (the oldest of its starts waiting): the stop waits for none of them. Each member asked counts as never started (dead: a group waiting
    for it in its first collective is broken and stopped, rule 11); the launch's ``NodeStop`` has the agent stop
    whatever it started."""

    node: int
    members: tuple[str, ...]
    waited: float


@dataclass(frozen=True)
class Finish:
    """A trainer attempt's end decides the run: it ``succeeded`` or was ``stopped`` (``unsaved``: a stop
    after which the last step's checkpoint did not commit)."""

    slot: str
    attempt: int
    run: RunState
    exit_code: int
    history: History
    unsaved: bool = False


@dataclass(frozen=True)
class GiveUp:
    """The restart policy gives up on the trainer: the run failed (the launch exits ``exit_code``)."""

    slot: str
    attempt: int
    reason: str
    history: History
    exit_code: int = 1  # 4 (EXIT_DIVERGING) when the trainer stopped on diverging training


@dataclass(frozen=True)
class Settle:
    """An ended child needs nothing more (a service exiting at the end of the run)."""

    slot: str
    attempt: int


@dataclass(frozen=True)
class Promote:
    """Make the ready hot standby (``slot`` ``standby``, ``attempt``) the trainer's next attempt (a
    standby group's ``standby<R>``: the next attempt's worker R; the group is promoted together)."""

    slot: str
    attempt: int


@dataclass(frozen=True)
class StandbyGone:
    """The standby ended (killed by the watchdog, or on its own: ``failed``); prepare another later.
    ``no_shadow``: a standby group's member whose run of the step on shadows did not complete: the
    next standby groups skip that run (not a failure: the next is prepared at once). ``unsuitable``: the
    program can have no standby (``EXIT_NO_STANDBY``): none for the rest of the run."""

    slot: str
    attempt: int
    failed: bool
    no_shadow: bool = False
    unsuitable: bool = False


@dataclass(frozen=True)
class ArmChaos:
    """Schedule the next chaos kill of ``slot``'s current attempt at ``at``."""

    slot: str
    attempt: int
    at: float


@dataclass(frozen=True)
class SkipChaos:
    """The chaos kill is due but its victim is not killable now (gone, or writing its final checkpoint)."""

    slot: str


@dataclass(frozen=True)
class StartZygote:
    """The pre-warmed trainer was lost: start a new one (its ``attempt``-th), which restarts fork
    from, and the hot standby with it, once it is ready."""

    attempt: int


Action = Union[Spawn, Signal, TakeStacks, Kill, Restart, RestartTask, GiveUpTask, RespawnService, GiveUpService, StopFailing, Finish,
               GiveUp, Settle, ArmChaos, SkipChaos, Promote, StandbyGone, NodeLost, StartsDropped, StartZygote]


@dataclass(frozen=True)
class AuditRollback:
    """A trainer verdict acted on (:func:`procsv.watchdog.audit.verdict.rollback`): trainer ``attempt`` restores the newest state before step
    ``before``, a bound that holds until a later attempt commits past ``stale`` (the newest step committed by
    the timeline rolled back); ``finished``: that trainer had finished (restarted, not killed); ``ended``: it had
    died and is not restarted yet (nothing to kill: its restart, told the bound, restores before ``before``);
    ``why``: the restart's reason, as the lifecycle and ``procsv report`` say it."""

    attempt: int
    before: int
    stale: int
    finished: bool
    why: str
    ended: bool = False
