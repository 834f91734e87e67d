"""What the watchdog knows about its run: plain data, changed only by observations and actions.

Runs in the watchdog. :class:`RunView` is the whole picture the decision function
(:func:`procsv.watchdog.rules.decide.decide`) looks at: one :class:`ChildView` per attempt of every
role, the restart history, the stop request, the timers and the pre-warmed trainer's state.
Nothing here touches a process, a file or a clock: every time is a number passed in (the
watchdog's monotonic clock), so tests build and drive a view with plain values.

Slots name the places a process occupies: ``checkpoint``, ``summary`` and one per trainer
(``trainer``, the chief: task 0; with ``--nproc N`` also ``worker1`` ... ``worker<N-1>``). Each slot holds its current
attempt; attempts of trainers are also kept in order in :attr:`RunView.attempts` for the
recovery report.

One concern: the watchdog's picture of its run, as plain data.
"""

from __future__ import annotations

import enum
import signal
from dataclasses import dataclass, field
from typing import Any, Optional

from procsv.ipc.message_base import Busy
from procsv.watchdog.rules.actions import Action, Cause, Kill, Signal
from procsv.watchdog.rules.failures import ChildError, Failure, describe
from procsv.watchdog.rules.findings import Findings
from procsv.watchdog.rules.lifecycle import ProcState, RunState, transition
from procsv.watchdog.rules.nonfinitelog import NonfiniteLog
from procsv.watchdog.rules.policy import History

TRAINER = "trainer"
WORKER = "worker"  # the role of a group's task 1, 2, ... (slots ``worker1``, ...; procsv.watchdog.rules.group)
PS = "ps"  # a parameter-server task of procsv launch --ps N (slots ``ps0``, ...; procsv.watchdog.rules.tasks)
SERVER = "server"  # a worker task of --ps N --workers M --coordinator: a plain server (slots ``worker0``, ...)
STANDBY = "standby"  # the slot (and role) of the hot-standby trainer until it is promoted
AUDITOR = "auditor"  # the slot (and role) of a trainer process replaying a committed interval (issue 71)

CHECKPOINT = "checkpoint"
SUMMARY = "summary"
SERVICE_ROLES = (SUMMARY, CHECKPOINT)
# the roles that leave a stop signal from anyone but the watchdog to the watchdog (procsv.common.stopfrom):
# a job-wide SIGTERM (scancel, systemd, kill -TERM -<pgid>) still pending in one swallows the watchdog's
# own, sent at nearly the same moment (a standard signal is not queued twice, and the one read names the
# job's sender), so theirs is sent again every ``stop_resend_secs`` while they live (rules 2 and 6). A lone
# trainer's is sent once; a group's chief's again too (rule 2: ``resend``): TensorFlow's
# MultiWorkerMirroredStrategy puts its own SIGTERM handler in place under Python's (its coordination
# service's preemption notifier), and a SIGTERM before the Supervisor's handlers replace it is swallowed.
LEAVES_STOPS = (WORKER, PS, SERVER, SUMMARY, CHECKPOINT, STANDBY)


def auditor_slot(rank: int) -> str:
    """The slot of member ``rank`` of a group's auditors (issue 71): :data:`AUDITOR` for its chief, ``auditor<R>``."""
    return AUDITOR if rank == 0 else f"{AUDITOR}{rank}"


class ZygoteState(str, enum.Enum):
    """The pre-warmed trainer: ``off`` (--no-prewarm) or ``warming`` -> ``ready``, either -> ``lost``."""

    OFF = "off"
    WARMING = "warming"
    READY = "ready"
    LOST = "lost"


@dataclass(frozen=True)
class Activity:
    """One look at a trainer process from outside (``/proc``): its CPU seconds (every thread), the
    bytes it read and wrote (files, pipes, sockets), how often its main thread was switched in and
    out (it ran), its main thread's state letter (``R``, ``S``, ``D``: in uninterruptible I/O, ``T``/``t``:
    stopped or traced) and the system call it is in; and its live descendants' CPU seconds and bytes in
    all (a data loader's worker processes, a subprocess it waits for), read only when its own counters
    barely moved since the look before (``rules.hang.IDLE_CPU``, ``IDLE_IO``; -1: not read)."""

    at: float
    cpu: float
    io: int
    woke: int
    state: str
    syscall: str = ""
    kids_cpu: float = -1.0
    kids_io: int = -1

RESUME_GAP_SECS = 5.0  # a trainer that completed no step for longer than this was not training (blocked in a
# collective, its filesystem frozen, a step of minutes): the checkpoint stall window starts again at its next step


@dataclass
class HangView:
    """A trainer attempt's hang: the looks at its process (whether it is stuck), and once judged, its
    stacks asked for and back, then its SIGTERM and SIGKILL."""

    cause: str = ""  # "hang: <reason>", once signalled for it
    kill_at: Optional[float] = None  # its SIGKILL is due (the SIGTERM's grace)
    stacks_asked_at: Optional[float] = None  # the stacks of the run's trainers were asked for (TakeStacks) ...
    reason: str = ""  # ... when it was judged hung for this (its signal says the same, however long they take)
    stacks_in: bool = False  # ... and are back (taken, or failed: the artifact says which)
    where: str = ""  # the innermost frame of its main thread, as taken (stacks.innermost)
    culprit: str = ""  # the group's member the stacks blame (stacks.culprit; "" for a single trainer, or none)
    stacks: str = ""  # the file they were written to
    samples: list[Activity] = field(default_factory=list)  # the looks at its process from outside, newest last (stuck_reason)
    quiet_max: float = 0.0  # its slot's longest quiet wait that ended in a step (this launch; rules.hang.quiet_span)
    judged_max: float = 0.0  # the longest stuck limit its slot was judged at (this launch): the next is twice it (capped)
    stuck_for: float = 0.0  # the stuck limit it was judged at, at this stall, its stacks asked for (0: another verdict)
    resumed_at: Optional[float] = None  # its first completed step, or the first after RESUME_GAP_SECS without one


@dataclass
class ChildView:
    """One attempt of one slot, as the watchdog has observed it."""

    slot: str
    role: str
    attempt: int
    pid: int
    started: float
    create_time: Optional[float] = None  # the kernel's start time of the pid (tells a reused pid apart)
    state: ProcState = ProcState.STARTING
    # the trainer's own reports
    ready_at: Optional[float] = None  # state restored (TrainerReady)
    standby_ready_at: Optional[float] = None  # a standby that waits to be promoted (StandbyReady)
    running_at: Optional[float] = None  # a service's Hello (the checkpoint service's: ready to commit)
    restored_step: int = 0
    save_secs: Optional[float] = None  # its checkpoint schedule, from TrainerReady
    save_steps: Optional[int] = None
    first_step_at: Optional[float] = None
    last_progress_at: Optional[float] = None  # any Progress, busy or not: the hang clock
    last_work_at: Optional[float] = None  # the last Progress of a completed step (not busy)
    work_step: int = 0  # the step of that Progress (or the restored step before it)
    step: int = 0
    busy: str = ""  # what the trainer said it is busy with since its last Progress ("" if nothing)
    busy_since: Optional[float] = None  # when that began (goodput: the loop blocked by a snapshot)
    busy_secs: float = 0.0  # its busy spans that ended before now, in total
    restore_secs: float = 0.0  # its TrainerReady's
    first_step_no: int = 0  # the step of its first completed step
    rolled_steps: int = 0  # steps its in-place rollbacks undid (RolledBack: step - restored_step), in total
    rollback_secs: float = 0.0  # those rollbacks' restores
    save_overdue: str = ""  # its snapshot in flight passed its deadline (SaveOverdue): why, until acted on
    refused_at: Optional[float] = None  # it last refused a snapshot of a non-finite state (NonfiniteDetected)
    # the first step it reported non-finite (NonfiniteDetected), or the onset of a loss spike a group's chief
    # asks its group's rollback for (SpikeDetected, action rollback): the step a group's rollback skips
    nonfinite_step: Optional[int] = None
    # its latest such report, (what, step): ("nonfinite", its NonfiniteDetected's step: a peer's same step is one
    # finding) or ("spike", the onset of a rollback's SpikeDetected)
    last_report: Optional[tuple[str, int]] = None
    group_rollback: Optional[int] = None  # a chief's attempt that ended in its group's rollback: the step skipped
    loading_since: Optional[float] = None  # a service loading what it needs (ServiceLoading), until loaded
    # its progress (for the restart policy): the newest committed step the watchdog knew of when it
    # became the trainer, and the newest it has seen committed since (a SaveResult heard while it was
    # the trainer, or a manifest on disk read at its death)
    commit_base: int = -1
    commit_seen: int = -1
    # a group's chief: the newest step of its attempt each member's in-memory copy is held of (GroupCopyHeld,
    # by rank), and the newest held for every member (-1: none): progress too, the next group restores it
    held_by_rank: dict[int, int] = field(default_factory=dict)
    held_whole: int = -1
    stop_committed: bool = False  # a stop's (preempted) checkpoint of its last step committed (SaveResult)
    # what the watchdog did to it
    signalled_at: Optional[float] = None  # a signal meant to end it was sent (hang, chaos)
    chaos_sent: bool = False  # ... and it was chaos's (a group's member may be signalled by the group's stop too)
    stop_sent_at: Optional[float] = None  # the watchdog's stopping SIGTERM (rule 2 or 6) was last sent to it
    hang: HangView = field(default_factory=HangView)  # its hang: the stacks taken, the signal, the kill
    killed: bool = False  # SIGKILL was sent to its process group
    # its end
    noticed_dead_at: Optional[float] = None  # its death notice (robust mutex "owner died")
    noticed_wall: Optional[float] = None  # the same moment on the wall clock, for the lifecycle log
    noticed: Optional[ChildError] = None  # what its error file said when its death was noticed
    ended_at: Optional[float] = None
    ending_at: Optional[float] = None  # its exit or death notice came in; observed once what is read at its end is back
    failure: Optional[Failure] = None  # set when reaped (its exit status: exit_code)
    settled: bool = False  # the decision about its end has been taken
    settled_early: bool = False  # ... on the death notice, before the exit status was known
    node: int = 0  # the host (--node-rank) it runs on: 0 is the master's own
    stopped: bool = False  # a group member seen stopped (SIGSTOP: state T) while the group made no step
    regroup: bool = False  # SIGKILLed to take a host back into the group (rule 15): not a failure
    broken_by: Optional["ChildView"] = None  # a group's chief: the member whose end broke its attempt, once judged

    def note_busy(self, busy: str, now: float) -> None:
        """A Progress said ``busy`` (or "" for a completed step): add up the time it was busy (the
        program's own marked wait, ``Supervisor.waiting``, is its time, not procsv's: not counted)."""
        blocked = busy if busy != Busy.WAITING else ""
        if blocked and self.busy_since is None:
            self.busy_since = now
        elif not blocked and self.busy_since is not None:
            self.busy_secs += now - self.busy_since
            self.busy_since = None
        self.busy = busy

    def rolled_back(self, steps: int, secs: float) -> None:
        """A rollback (RolledBack) undid ``steps`` of its steps in place, its restore took ``secs``."""
        self.rolled_steps += max(0, steps)
        self.rollback_secs += secs

    def trained(self, now: float, wall: float) -> dict[str, Any]:
        """A trainer's (or a group's worker's) ``trained`` lifecycle record, at its end ``now``
        (``wall`` on the wall clock): a worker has no ``restored``/``first_step`` records of its
        own (its restore has a ``worker_ready`` record), so its restore and first step are here too."""
        def at(t: Optional[float]) -> Optional[float]:
            return None if t is None else round(wall - (now - t), 3)
        stepped = self.first_step_at is not None
        return {"role": self.slot if self.role == WORKER else self.role, "attempt": self.attempt, "pid": self.pid,
                "step": self.work_step, "step_at": at(self.last_work_at if stepped else None),
                "busy_secs": round(self.busy_secs, 3), "busy_from": at(self.busy_since),
                "ready_at": at(self.ready_at), "restored_step": self.restored_step if self.ready_at is not None else None,
                "restore_secs": round(self.restore_secs, 4), "first_at": at(self.first_step_at),
                "first_step": self.first_step_no if stepped else None}

    def set_state(self, new: ProcState) -> None:
        self.state = transition(self.state, new)  # type: ignore[assignment]

    def headline(self) -> str:
        """One line on how this attempt ended (its hang, if that was why), for ``last_error``."""
        if self.failure is None:  # not reaped (yet)
            name = self.slot if self.role == WORKER else self.role
            if self.hang.cause:
                return f"{name} attempt {self.attempt} (pid {self.pid}) was found hung ({self.hang.cause})"
            died = f"{name} attempt {self.attempt} (pid {self.pid}) died"
            return f"{died}: {self.noticed_error} (its error file)" if self.noticed_error else died
        head = self.failure.headline(before_first_step=self.role == TRAINER and self.first_step_at is None)
        return f"{head} ({self.hang.cause})" if self.hang.cause else head

    def root_cause(self) -> str:
        """The headline, the child's own traceback and where its log is."""
        if self.failure is None:
            return self.headline()
        return self.failure.root_cause(before_first_step=self.role == TRAINER and self.first_step_at is None,
                                       note=self.hang.cause)

    @property
    def noticed_error(self) -> str:
        """The exception type its error file named when its death was noticed ("" if none)."""
        return self.noticed.type if self.noticed is not None else ""

    @property
    def made_progress(self) -> bool:
        """A checkpoint newer than what this attempt started from was committed while it ran (a group's
        chief: or every member's in-memory copy of a step of its attempt is held, which the next group restores)."""
        return self.commit_seen > self.commit_base or self.held_whole >= 0

    @property
    def exit_code(self) -> Optional[int]:
        """Its exit status once reaped (None before): >= 0 the exit code, < 0 killed by signal -code."""
        return None if self.failure is None else self.failure.code

    @property
    def reaped(self) -> bool:
        return self.failure is not None

    @property
    def live(self) -> bool:
        """Neither reaped nor given up on after its death notice."""
        return not self.reaped and not self.settled_early

    def stopping(self, now: float, kill_after: Optional[float], resend_secs: float, cause: Cause,
                 kill_cause: Cause, resend: bool = False) -> list[Action]:
        """Its stop (rules 2, 6 and 14; pure): SIGTERM while it starts or runs, SIGKILL once ``kill_after``
        passed, else its SIGTERM again ``resend_secs`` after the last if it leaves foreign stops to the
        watchdog (:data:`LEAVES_STOPS`): the first may have merged into a job-wide one; or if ``resend``
        (a group's chief: the first may have been swallowed by TensorFlow's own SIGTERM handler)."""
        if self.state in (ProcState.STARTING, ProcState.RUNNING, ProcState.STANDBY):
            return [Signal(self.slot, self.attempt, signal.SIGTERM, cause)]
        if kill_after is not None and now >= kill_after and not self.killed:
            return [Kill(self.slot, self.attempt, kill_cause)]
        if ((resend or self.role in LEAVES_STOPS) and self.state == ProcState.STOPPING and self.live and not self.killed
                and self.stop_sent_at is not None and now >= self.stop_sent_at + resend_secs):
            return [Signal(self.slot, self.attempt, signal.SIGTERM, cause)]
        return []

    @property
    def cause(self) -> str:
        """Why this attempt ended, as the recovery report names it ("" while it runs)."""
        return self.hang.cause or (describe(self.failure.code) if self.failure else "")


@dataclass(frozen=True)
class Healed:
    """(An agent's view of its master only) node 0's address answered a handshake again after answering none for
    ``PROBE_WINDOW`` at least: when the agent's look saw it (``at``) and how long it had answered none (``after``)
    (:func:`~procsv.watchdog.rules.hosts.master_redial`)."""

    at: float
    after: float


@dataclass
class Waits:
    """(Node 0's view of a host; of node 0 in an agent's, ``reached`` only) what node 0 waits for from a host besides its beats (rule 12,
    :mod:`procsv.watchdog.rules.hosts`): the answer to the oldest start it asked of its agent (``StartMembers``: first
    sent at ``asked_at`` on the watched clock, None: none waiting; ``asked``, its members ``slot.attempt``), lost once
    that waits past ``start_bound``; and its own frames to reach the host: ``deaf``, how long the agent said in its
    last hello it had heard nothing from node 0 (``NodeHello.deaf``), ``deaf_from``, when node 0 first read a hello
    saying so for ``DEAF_SECS`` or more in a row (None: the last said less, or a probe sent since was answered; a
    one-way cut, ``one_way_cut``); ``reached``, when node 0 sent the last probe the host's kernel answered with a
    handshake (its frames reached the host then: an agent's word that it heard nothing since before is no cut, and a
    host silent is so from then, if later than its last beat, ``kernel_silent``)."""

    asked_at: Optional[float] = None
    asked: list[str] = field(default_factory=list)
    deaf: float = 0.0
    deaf_from: Optional[float] = None
    reached: Optional[float] = None


@dataclass
class NodeView:
    """Another host of a job that spans hosts (``--nnodes M``), as its agent's heartbeats tell it."""

    node: int
    host: str = ""
    pid: int = 0
    addresses: list[str] = field(default_factory=list)  # where its next members will listen
    live: list[str] = field(default_factory=list)  # the members it says it runs (``slot.attempt``)
    last_beat: Optional[float] = None  # its last NodeHello (None: never joined)
    lost_at: Optional[float] = None  # when it was found lost (None: connected, or never joined)
    joined_at: Optional[float] = None  # when it last joined or came back (rule 15 takes it back after a commit)
    lost_times: list[float] = field(default_factory=list)  # when it was found lost, the last FLAP_WINDOW's (rule 15's hold-down)
    ready_at: Optional[float] = None  # since then, when it first said a member would start at once (NodeHello.ready)
    # what rule 12 tells a slow agent from a silent host by (procsv.watchdog.rules.hosts):
    gaps: list[float] = field(default_factory=list)  # the last GAPS_KEPT gaps between its beats, as node 0 read them
    probe: str = ""  # HOST:PORT of its agent's probe port ("": none)
    probe_ok: bool = False  # its probe port answered once: a probe unanswered means something
    probed_at: Optional[float] = None  # node 0's last probe of it (their pace)
    # when node 0 sent each probe of it since its last beat that no answer covers yet (an answer to the probe
    # sent at s covers every probe sent up to s: the host was up after s)
    unanswered: list[float] = field(default_factory=list)
    looked_at: Optional[float] = None  # when node 0 last looked for the answers (its clock before it looked)
    reset_at: Optional[float] = None  # the send of a probe sent since its last beat that its host answered with a reset
    # (an agent's view of its master only) when its address answered a handshake again after answering none for
    # PROBE_WINDOW at least (the agent's look; rules.hosts.master_redial), and how long it had answered none
    healed: Optional[Healed] = None
    # (node 0's view only) node 0 watched its beats from then: the end of a stall of node 0's own loop (blocked or
    # descheduled OWN_STALL_SECS or more, not stopped: the beats queued meanwhile are read a moment after): rule 12's
    # bound counts from it (a stop, SIGSTOP then SIGCONT, is left out of the watched clock itself)
    watched_from: float = float("-inf")
    waits: Waits = field(default_factory=lambda: Waits())  # (node 0's view only) what it waits for besides beats


@dataclass
class RunView:
    """Everything the decision function looks at."""

    launch_start: float
    process_start: Optional[float] = None  # the watchdog process's start (before its imports), if known
    zygote: ZygoteState = ZygoteState.OFF
    zygote_attempt: int = 0  # the pre-warmed trainers started so far
    zygote_lost_at: Optional[float] = None  # when the current one was lost (None: not lost, or replaced)
    zygote_losses: int = 0  # lost in a row, without one staying ready for ZYGOTE_STEADY_SECS in between
    zygote_ready_at: Optional[float] = None  # when the current one became ready
    children: dict[str, ChildView] = field(default_factory=dict)  # slot -> its current attempt
    attempts: list[ChildView] = field(default_factory=list)  # every trainer attempt, in order
    history: History = field(default_factory=History)
    run: RunState = RunState.RUNNING
    exit_code: int = 0
    failed: bool = False  # a service kept failing: the run ends as failed, after an orderly stop
    step: int = 0
    restored_step: Optional[int] = None
    last_error: Optional[str] = None
    stop_signal: Optional[int] = None
    stop_deadline: Optional[float] = None  # SIGKILL the trainer after this (stop grace)
    services_deadline: Optional[float] = None  # once the outcome is decided: SIGKILL what still runs after this
    restart_at: Optional[float] = None  # start the trainer (again) at this time
    forking: bool = False  # a trainer start asked of the zygote or another host, not answered yet (Executor.poll_fork)
    service_crashes: dict[str, tuple[float, ...]] = field(default_factory=dict)  # slot -> its deaths counted
    tasks_alone: bool = False  # --ps N --workers M: each task restarts alone (procsv.watchdog.rules.tasks)
    task_history: dict[str, History] = field(default_factory=dict)  # slot -> its restarts (a --ps task's own)
    task_due: dict[str, float] = field(default_factory=dict)  # slot -> when the task is started again
    tasks_given_up: list[str] = field(default_factory=list)  # --ps workers given up on, the run training on
    commit_step: int = -1  # the step of the last commit seen
    failed_saves: int = 0  # consecutive checkpoints that failed to commit (lost snapshots not counted)
    summary_overdue: str = ""  # the summary service confirmed no batch within the deadline (SummaryOverdue): why, until acted on
    summary_overdue_for: int = 0  # ... the attempt of the summary service it is about (a later one is not killed for it)
    commits: int = 0  # checkpoints committed during this launch
    failed_commits: int = 0  # saves that failed during this launch (lost snapshots not counted)
    last_commit_at: Optional[float] = None  # when the last checkpoint of this launch committed (stalls count from here)
    last_commit_step: Optional[int] = None  # ... its step
    last_commit_final: bool = False  # ... the trainer's last (reason ``final``): it trained to its end (rule 15)
    last_commit_secs: float = 0.0  # ... and how long the checkpoint service took to persist it
    logdir_lost: Optional[str] = None  # why the logdir is no longer there (deleted, moved, replaced)
    logdir_errors: int = 0  # looks at the logdir that failed without saying it is gone (EIO, ESTALE: blips)
    logdir_last_error: Optional[str] = None  # the errno name of the last of them
    chaos_at: Optional[float] = None  # the next chaos kill
    chaos_armed_for: Optional[tuple[str, int]] = None  # (slot, attempt) the current schedule targets
    chaos_next_delay: float = 0.0  # drawn from the plan's seeded generator by the executor
    # the hot standby (procsv.watchdog.rules.standby): whether one may run (None: not decided yet; the
    # memory rule needs the first trainer's size), when the next may be prepared, its failures in a row,
    # and whether a standby group's members run the step on shadows (False for the rest of the run once a
    # member's did not: standby.gone)
    standby_ok: Optional[bool] = None
    standby_after: float = 0.0
    standby_failures: int = 0
    shadow_runs: bool = True
    # non-finite training (issue 41) and loss spikes (issue 68), as the trainer told it: losses or states
    # found non-finite (a group's members reporting the same step: once), spikes, transient faults by host
    # and the hosts suspect (findings), rollbacks (in place, and a group's: its restart to skip a step),
    # and the global steps skipped (each would have completed that step), sorted: the run's, the logdir's
    # earlier launches' first (read at the launch's start: they stay skipped)
    findings: Findings = field(default_factory=Findings)
    nonfinite_log: NonfiniteLog = field(default_factory=NonfiniteLog)  # the records not written yet (coalesced)
    rollbacks: int = 0
    skipped_steps: list[int] = field(default_factory=list)
    # a group's rollback of step B: (B, the newest step committed then, the rolled-back chief's attempt);
    # every group started until a commit of a later attempt past that step restores a state before B
    # (PROCSV_ROLLBACK_BEFORE): the checkpoints committed after B, before a worker found it, hold B's
    # update, and so do those of the rolled-back attempt that commit late (observe.rollback_bound)
    rollback_before: Optional[tuple[int, int, int]] = None
    # the other hosts of a job that spans hosts (--nnodes): node rank -> what its agent said
    nodes: dict[int, NodeView] = field(default_factory=dict)
    group_nodes: tuple[int, ...] = ()  # the hosts the current (or last) group was started on, node 0 first (rule 15)
    membership_changes: int = 0  # groups started on other hosts than the group before them

    @property
    def finishing(self) -> bool:
        """The run's outcome is decided (its state is no longer ``running``); what is left is stopping the services."""
        return self.run != RunState.RUNNING

    def trainers(self) -> list[ChildView]:
        return [c for c in self.children.values() if c.role == TRAINER]

    def services(self) -> list[ChildView]:
        return [c for c in self.children.values() if c.role not in (TRAINER, STANDBY, AUDITOR, WORKER, PS, SERVER)]

    def known(self) -> list[ChildView]:
        """Every trainer attempt (oldest first), then the services' and the standby's current attempts."""
        return self.attempts + [c for c in self.children.values() if c.role != TRAINER]

    def unsettled(self) -> list[ChildView]:
        """Attempts that ended (or were noticed dead) and await a decision, oldest first."""
        return [c for c in self.known() if not c.settled and (c.reaped or c.noticed_dead_at is not None)]

    def group_rollbacks(self, before: Optional[int] = None) -> int:
        """The trainer group's rollbacks by its restart (an attempt that ended in one: a restart of the group that
        is a rollback, not counted as a restart), of every attempt or of those before attempt ``before``; its
        rollbacks in place are ``findings.group_in_place``."""
        return sum(1 for a in self.attempts if a.group_rollback is not None and (before is None or a.attempt < before))

    def not_restarts(self, before: Optional[int] = None) -> int:
        """Trainer attempts followed by another that were no restart: a group's rollback (counted as one)
        or a regroup (rule 15, ended to take a host back: a membership change), of every attempt or of
        those before attempt ``before``."""
        return sum(1 for a in self.attempts if (a.group_rollback is not None or a.regroup)
                   and (before is None or a.attempt < before))

    def live_children(self) -> list[ChildView]:
        """Attempts not reaped yet."""
        return [c for c in self.known() if not c.reaped]
