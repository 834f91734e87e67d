"""The run's numbers for monitoring, as one immutable snapshot of the watchdog's view.

Runs in the watchdog. The loop takes a :class:`RunSnapshot` at most every ``PUBLISH_EVERY``
seconds (:func:`take_snapshot`, pure: the view and the times are passed in) and publishes it by
replacing one reference. Readers in other threads -- the Prometheus endpoint
(:mod:`procsv.watchdog.publish.metrics`, in its HTTP server's threads) -- only ever see a whole snapshot
and never touch the view, which the loop changes without a lock. procsv's own TensorBoard scalars
(:mod:`procsv.watchdog.publish.runscalars`) read the same numbers from the loop itself.

Restarts are counted by cause (:func:`restart_cause`): ``hang``, ``chaos``, ``preempted`` (exit
42 with the trainer's exit report: a SIGTERM procsv did not send, its checkpoint committed), the killing signal's name (``SIGKILL``, ``SIGSEGV``, ...)
or ``exit_code`` (any other non-zero exit, a 42 of the program's own too); a trainer group's restart counts
what ended the member that broke the group, not the group rule's SIGTERM to the chief. A restart is counted once its cause is known: at once
for a hang or a chaos kill, else when the dead attempt is reaped (a restart on the death notice
comes a few milliseconds before that). A cause never changes once known, so the counts only grow.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass
from typing import Optional

from procsv.goodput import Breakdown
from procsv.watchdog.publish import badput, recovery
from procsv.watchdog.rules.membership import connected
from procsv.watchdog.rules.failures import signal_name
from procsv.watchdog.rules.state import PS, SERVER, TRAINER, WORKER, ChildView, RunView

PUBLISH_EVERY = 0.5  # seconds between snapshots (and so the freshness of a scrape)
RATE_WINDOW = 10.0  # seconds of progress that steps/s is measured over


@dataclass(frozen=True)
class TrainingFaults:
    """What went wrong with the training itself (issues 41 and 68), as plain immutable values."""

    steps_skipped: int = 0  # steps skipped: non-finite, or a loss spike's (--on-spike rollback)
    rollbacks: int = 0  # restores of a finite state after a non-finite loss or a spike (in place, and a group's restart)
    spikes: tuple[tuple[str, int], ...] = ()  # loss spikes: (--on-spike action, count), sorted by action
    transient: tuple[tuple[str, int], ...] = ()  # transient faults (spikes not again when replayed): (host, count)
    suspects: tuple[str, ...] = ()  # hosts reported suspect (--suspect-after), in the order they became so
    miscomputed: tuple[tuple[str, int], ...] = ()  # --audit: intervals the trainer computed wrongly, (host, count)
    audited: float = 0.0  # --audit: the fraction of the committed steps audited


def training_faults(view: RunView) -> TrainingFaults:
    """The view's :class:`TrainingFaults` now."""
    found = view.findings
    return TrainingFaults(steps_skipped=len(view.skipped_steps), rollbacks=view.rollbacks,
                          spikes=tuple(sorted(found.by_action.items())), transient=tuple(sorted(found.transient.items())),
                          suspects=tuple(found.suspects), miscomputed=tuple(sorted(found.miscomputed.items())),
                          audited=float(found.audit.get("fraction", 0.0)))


@dataclass(frozen=True)
class RunSnapshot:
    """What a scrape reports: plain immutable values (times are wall-clock epoch seconds)."""

    live: bool  # the run is going on (its outcome is not decided yet)
    run: str  # the run's state: running | succeeded | failed | stopped
    step: int
    steps_per_sec: Optional[float]
    attempt: int  # the trainer's current attempt (0 before the first)
    restarts: tuple[tuple[str, int], ...]  # trainer restarts: (cause, count), sorted by cause
    service_restarts: tuple[tuple[str, int], ...]  # (role, restarts) of the checkpoint and summary services
    steps_redone: int
    goodput: Optional[float]
    last_checkpoint_step: Optional[int]  # the last commit of this launch (else the newest on disk, else restored)
    last_checkpoint_at: Optional[float]  # when the last commit happened (this launch's, else the newest on disk)
    last_checkpoint_secs: Optional[float]  # how long it took to persist
    checkpoints: int  # commits during this launch
    checkpoint_failures: int  # failed saves during this launch
    started_at: float
    logdir_errors: int = 0  # looks at the logdir that failed without saying it is gone (EIO, ESTALE)
    training: TrainingFaults = TrainingFaults()  # skipped steps, rollbacks, loss spikes, transient faults, suspects
    task_restarts: tuple[tuple[str, str, int], ...] = ()  # --ps: (task, role, restarts) of every task (task_rows)
    time_by_kind: tuple[tuple[str, float], ...] = ()  # where this launch's time went (procsv.goodput.KINDS)
    group_hosts: Optional[int] = None  # --nnodes: the hosts the trainer group runs on now (rule 15: fewer, elastic)
    live_hosts: Optional[int] = None  # --nnodes: the hosts whose agent is connected now, node 0 too
    membership_changes: int = 0  # groups started on other hosts than the group before them


def restart_cause(prev: ChildView) -> Optional[str]:
    """Why a trainer attempt that was followed by another one ended (None: not known yet). A group's
    chief that the group rule stopped because a member ended is counted by that member's end."""
    if prev.broken_by is not None and prev.broken_by is not prev:
        return restart_cause(prev.broken_by)  # (its own SIGTERM, Cause.GROUP, is not chaos)
    if prev.hang.cause:
        return "hang"
    if prev.chaos_sent:
        return "chaos"  # (a group's member that broke it, the chief too, may have been sent the group's
        # stop, signalled_at: then the signal it died of says how)
    code = prev.exit_code
    if code is None:
        return None
    if prev.failure is not None and prev.failure.preempted:
        return "preempted"  # a 42 without the trainer's exit report is a plain exit code
    return signal_name(code) or "exit_code"


def task_rows(view: RunView) -> tuple[tuple[str, str, int], ...]:
    """With ``--ps``: ``(task, role, restarts)`` of every task, sorted: the chief (task and role
    ``chief``; with ``--coordinator`` the coordinator), ``worker<R>`` (role ``worker``; ``server``
    with ``--coordinator``), ``ps<I>`` (role ``ps``); its restarts are its attempts
    after the first, whatever ended them (a parameter server's death ends every worker: each counts).
    Empty without ``--ps``."""
    if not view.tasks_alone:
        return ()
    rows = [("chief" if c.role == TRAINER else c.slot, "chief" if c.role == TRAINER else c.role, c.attempt - 1)
            for c in view.children.values() if c.role in (TRAINER, WORKER, PS, SERVER)]
    return tuple(sorted(rows))


def task_summary(view: RunView) -> dict[str, dict[str, object]]:
    """``report.json``'s ``tasks`` (``--ps`` only): task -> its role, restarts and whether it was given up on."""
    return {task: {"role": role, "restarts": n, "given_up": task in view.tasks_given_up}
            for task, role, n in task_rows(view)}


def restart_counts(attempts: list[ChildView]) -> tuple[tuple[str, int], ...]:
    """Restarts by cause: every trainer attempt followed by a newer one, once its cause is known (an
    attempt that ended in its group's rollback is a rollback, counted in ``procsv_rollbacks``)."""
    counts = Counter(c for c in (restart_cause(a) for a in attempts[:-1] if a.group_rollback is None and not a.regroup) if c is not None)
    return tuple(sorted(counts.items()))


class StepRate:
    """Steps per second of the current trainer attempt over the last :data:`RATE_WINDOW` seconds.

    Fed a (time, attempt, step) sample each time a snapshot is taken; a new attempt or a step
    that went back starts a new window. None until two samples span some time.
    """

    def __init__(self) -> None:
        self._attempt = -1
        self._samples: deque[tuple[float, int]] = deque()

    def add(self, now: float, attempt: int, step: int) -> Optional[float]:
        if attempt != self._attempt or (self._samples and step < self._samples[-1][1]):
            self._samples.clear()
            self._attempt = attempt
        self._samples.append((now, step))
        while len(self._samples) > 2 and self._samples[1][0] <= now - RATE_WINDOW:
            self._samples.popleft()
        (t0, s0), (t1, s1) = self._samples[0], self._samples[-1]
        return (s1 - s0) / (t1 - t0) if t1 > t0 else None


def take_snapshot(view: RunView, now: float, wall: float, started_at: float, rate: StepRate,
                  on_disk: Optional[tuple[int, float]] = None, spent: Optional[Breakdown] = None) -> RunSnapshot:
    """The snapshot at ``now`` (the watchdog's monotonic clock) / ``wall`` (epoch seconds).
    ``on_disk``: (step, commit time in epoch seconds) of the newest committed checkpoint in the
    logdir, the last checkpoint until this launch commits one (a relaunch that never commits still
    shows how old the run's last checkpoint is, so the stuck-run alert fires). ``spent``: the launch's
    breakdown at ``now`` (the round's, shared), else computed here."""
    spent = badput.of_launch(view, now) if spent is None else spent
    trainer = view.children.get(TRAINER)
    attempt = trainer.attempt if trainer is not None else 0
    services = tuple(sorted((c.role, c.attempt - 1) for c in view.services()))
    commit_at = None if view.last_commit_at is None else wall - (now - view.last_commit_at)
    commit_step = view.last_commit_step if view.last_commit_step is not None else view.restored_step
    if commit_at is None and on_disk is not None:
        commit_step, commit_at = on_disk
    return RunSnapshot(
        live=not view.finishing,
        run=view.run.value,
        step=view.step,
        steps_per_sec=rate.add(now, attempt, view.step),
        attempt=attempt,
        restarts=restart_counts(view.attempts),
        service_restarts=services,
        steps_redone=recovery.summarize(view.attempts, view.findings.audit_rollbacks)["steps_redone"],
        goodput=badput.goodput(view, spent),
        last_checkpoint_step=commit_step,
        last_checkpoint_at=commit_at,
        last_checkpoint_secs=view.last_commit_secs if view.last_commit_at is not None else None,
        checkpoints=view.commits,
        checkpoint_failures=view.failed_commits,
        started_at=started_at,
        logdir_errors=view.logdir_errors,
        training=training_faults(view),
        task_restarts=task_rows(view),
        time_by_kind=tuple(spent.secs.items()),
        group_hosts=len(view.group_nodes) if view.group_nodes else None,
        live_hosts=1 + sum(1 for n in view.nodes if connected(view, n)) if view.group_nodes else None,
        membership_changes=view.membership_changes,
    )
