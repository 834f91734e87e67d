"""The watchdog's one decision function, and the bookkeeping of what each action changed.

Runs in the watchdog, but reads no clock, touches no process and no file:
:func:`decide` ``(view, now, limits, draw) -> list[Action]`` looks at the observed state
(:class:`~procsv.watchdog.state.RunView`), the time ``now`` (the watchdog's monotonic clock,
passed in) and a uniform random ``draw`` in [0, 1) for the backoff jitter, and returns what to
do. :func:`note` applies an action's consequences to the view. The executor performs an action
and notes it; deciding again with nothing new observed then returns nothing new. Tests drive
both with a fake clock and scripted observations (``tests/test_watchdog_decide.py``).

Rules, in the order they are considered:

1. **Ended children.** A trainer attempt that was reaped, or whose death notice arrived, is
   judged by the restart policy (:func:`procsv.watchdog.policy.decide`): finish, stopped,
   restart (at once after progress or a preemption, else with backoff), or give up -- at once if
   it failed before its first step with an error a restart cannot cure (``permanent_errors``:
   a usage error, no restorable checkpoint, a checkpoint of another model, a syntax error), and
   at any step if it failed as a program (``program_errors``: a NaN loss). A death
   notice alone only ever restarts (any other verdict waits for the exit status, so that it is
   reported exactly). A service that dies is restarted at once, unless it died more than
   ``service_restart_limit`` times within ``service_restart_window`` seconds: then the run stops
   in order and fails. Anything ending after the run's outcome is decided is only settled.
2. **Stop.** A stop request (SIGTERM/SIGINT) sends SIGTERM to a running trainer; past
   ``stop_grace_secs`` it is SIGKILLed; once no trainer is left (and none is being forked by the
   zygote: it is stopped in turn once it exists) the run is ``stopped``.
3. **Restart timer.** A pending trainer start happens when due -- but the first one waits up to
   ``zygote_wait`` seconds for the pre-warmed trainer to be ready.
4. **Hangs.** A trainer silent beyond its limit (:func:`procsv.watchdog.hang.hang_reason`; busy
   on purpose has a longer limit, never none) gets SIGTERM, then SIGKILL after ``hang_grace_secs``.
   If it then exits with "saved, restart me" (42), that still counts as a failure.
5. **Chaos.** The target is armed once per attempt (after the trainer's first step, or when a
   service starts) with the next delay of the plan, and signalled when due -- never while it is
   busy with a snapshot or its final checkpoint: then as soon as it is not.
6. **Shutdown.** Once the outcome is decided, every live child gets SIGTERM, and SIGKILL after
   ``min(stop_grace_secs, services_grace_secs)``.
7. **Checkpoint stalls.** The trainer says a snapshot passed its deadline (``SaveOverdue``), or
   steps complete but nothing commits for ``stall_factor`` times the trainer's save interval (at
   least ``stall_floor_secs``): the checkpoint service is SIGKILLed, which rule 1 then restarts;
   the restarted service tells the trainer its snapshot was lost. An overdue snapshot also counts
   as a failed checkpoint for rule 8.
8. **Failing checkpoints.** ``checkpoint_failure_limit`` commits in a row fail (a full disk, a
   permission): training would go on burning compute that cannot be kept, so the run is stopped
   in order (the trainer still tries its emergency checkpoint) and fails with exit code 3.
   ``--on-checkpoint-failure continue`` (a limit of 0) trains on.
9. **Lost logdir.** The logdir was deleted, moved away or replaced while the run is live
   (``view.logdir_lost``, from filesystem events and a check every round): nothing the run
   writes from now on would land where the user looks, so the run is stopped in order and fails
   (exit 1). Considered first, like rule 8; not while a stop is already under way.
10. **Hot standby** (:mod:`procsv.watchdog.standby`): one is prepared (forked from the zygote)
   once the trainer has completed a step; a due restart (rule 3) promotes it if it is ready for
   that attempt, else kills it and forks. A standby that ends is settled by rule 1
   (``StandbyGone``: counted, with backoff, unless the watchdog ended it).
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from typing import Optional

from procsv.common.bootstrap import EXIT_PREEMPTED
from procsv.watchdog import standby
from procsv.watchdog.actions import (Action, ArmChaos, Cause, Finish, GiveUp, GiveUpCheckpoints, GiveUpService, Kill,
                                     Promote, RespawnService, Restart, Settle, Signal, SkipChaos, Spawn, StandbyGone,
                                     StopLogdirLost)
from procsv.watchdog.chaos import ChaosPlan
from procsv.watchdog.hang import HangLimits, hang_reason
from procsv.watchdog.lifecycle import ProcState, RunState, transition
from procsv.watchdog.policy import Action as Verdict
from procsv.watchdog.policy import RestartPolicy, TrainerExit
from procsv.watchdog.policy import decide as restart_verdict
from procsv.watchdog.state import CHECKPOINT, STANDBY, TRAINER, ChildView, RunView, ZygoteState


EXIT_CHECKPOINTS_FAILING = 3  # the launch's exit code when checkpoints kept failing (rule 8)
EXIT_LOGDIR_LOST = 1  # the launch's exit code when the logdir was deleted or moved (rule 9)


@dataclass(frozen=True)
class Limits:
    """Everything configurable that the decisions depend on."""

    restart: RestartPolicy = RestartPolicy()
    hang: HangLimits = HangLimits(600.0, 1800.0)
    stop_grace_secs: float = 120.0
    hang_grace_secs: float = 10.0
    service_restart_limit: int = 5  # service deaths within the window before the run gives up
    service_restart_window: float = 60.0
    zygote_wait: float = 120.0  # how long the first trainer waits for the pre-warmed trainer
    services_grace_secs: float = 30.0  # at the end, how long services may take to flush and exit
    stall_factor: float = 3.0  # no commit for this many save intervals while steps complete: a stall
    stall_floor_secs: float = 10.0  # ... but never sooner than this (a commit takes time)
    checkpoint_failure_limit: int = 3  # consecutive failed commits that stop the run (0: never)
    # a trainer that fails before its first step with one of these (the type named in its error
    # file) cannot start this way however often it is restarted: give up at once
    permanent_errors: frozenset[str] = frozenset({"UsageError", "NoRestorableCheckpoint", "MismatchedCheckpoint",
                                                  "SyntaxError", "IndentationError", "TabError"})
    # a trainer that fails with one of these at any step failed as a program, not as a process: a
    # restart would resume from the last checkpoint and meet the same failure again
    program_errors: frozenset[str] = frozenset({"NanLossDuringTrainingError"})
    chaos: Optional[ChaosPlan] = None


def decide(view: RunView, now: float, limits: Limits, draw: float) -> list[Action]:
    """What to do now, given what has been observed. Pure: the view is not changed."""
    if view.logdir_lost is not None and view.stop_signal is None and not view.finishing:
        return [StopLogdirLost(view.logdir_lost)]  # rule 9 comes first: an exit it causes is a stop
    if 0 < limits.checkpoint_failure_limit <= view.failed_saves and view.stop_signal is None \
            and not view.finishing:
        return [GiveUpCheckpoints(view.failed_saves)]  # rule 8 comes first: an exit it causes is a stop
    actions: list[Action] = []
    ended = view.unsettled()
    for child in ended:
        actions += _judge(view, child, now, limits, draw)
    if any(isinstance(a, (Finish, GiveUp)) for a in actions):
        return actions  # the run's outcome is decided; the next round shuts down
    if view.finishing:
        return actions + _shutdown(view, now, limits)
    actions += _stop(view, now)
    actions += _restart_due(view, now, limits)
    for trainer in view.trainers():
        actions += _hang(view, trainer, now, limits)
    actions += _chaos(view, now, limits)
    actions += _checkpoint_stall(view, now, limits)
    if standby.may_prepare(view, now) and not any(isinstance(a, (Spawn, Promote)) for a in actions):
        actions.append(Spawn(STANDBY, STANDBY))
    return actions


# ------------------------------------------------------------------------------------------ rules
def _judge(view: RunView, child: ChildView, now: float, limits: Limits, draw: float) -> list[Action]:
    """Rule 1: an attempt ended (or its death was noticed)."""
    if view.finishing:
        return [Settle(child.slot, child.attempt)] if child.reaped else []
    if child.role == STANDBY:  # rule 10: not a trainer attempt yet; the run goes on
        failed = not child.killed and view.stop_signal is None
        return [StandbyGone(child.slot, child.attempt, failed)] if child.reaped else []
    if child.role != TRAINER:
        if not child.reaped:
            return []
        window = tuple(t for t in view.service_crashes if now - t < limits.service_restart_window) + (now,)
        if len(window) > limits.service_restart_limit:
            return [GiveUpService(child.slot, child.attempt, window)]
        return [RespawnService(child.slot, child.attempt, window)]
    code = child.exit_code if child.reaped else 1  # a death notice: some unclean death
    assert code is not None
    if code == EXIT_PREEMPTED and child.hang_cause:
        code = 1  # it saved when terminated for a hang, but a hang is a failure: backoff applies
    ex = TrainerExit(code, child.first_step_at is not None, child.made_progress, view.stop_signal is not None)
    verdict = restart_verdict(limits.restart, view.history, ex, draw)
    if not child.reaped:
        if verdict.action != Verdict.RESTART or _hopeless(child, child.noticed_error, limits):
            return []  # stopping or giving up: wait for the exit status to tell the whole story
        return [Restart(child.slot, child.attempt, verdict.delay, verdict.history, early=True)]
    if verdict.action == Verdict.FINISH:
        return [Finish(child.slot, child.attempt, RunState.SUCCEEDED, 0, verdict.history)]
    if verdict.action == Verdict.STOPPED:
        sig = view.stop_signal or signal.SIGTERM
        return [Finish(child.slot, child.attempt, RunState.STOPPED, 128 + sig, verdict.history)]
    if verdict.action == Verdict.GIVE_UP:
        return [GiveUp(child.slot, child.attempt, verdict.reason, verdict.history)]
    error = child.failure.error if child.failure is not None else None
    if error is not None and error.type in limits.program_errors:
        return [GiveUp(child.slot, child.attempt, f"the trainer failed with {error.type}: a failure of the program, "
                       "not of the process (a restart would resume from the last checkpoint and meet it again)",
                       view.history)]  # no restart happened: the history before the verdict's
    if error is not None and _hopeless(child, error.type, limits):
        return [GiveUp(child.slot, child.attempt, f"the trainer cannot start: {error.type} (a restart would fail "
                       "the same way)", view.history)]
    return [Restart(child.slot, child.attempt, verdict.delay, verdict.history, preempted=code == EXIT_PREEMPTED)]


def _hopeless(child: ChildView, error_type: str, limits: Limits) -> bool:
    """A trainer that failed with an error a restart cannot cure: before its first step with a
    ``permanent_errors`` one, or at any step with a ``program_errors`` one."""
    return error_type in limits.program_errors or (child.first_step_at is None
                                                   and error_type in limits.permanent_errors)


def _stop(view: RunView, now: float) -> list[Action]:
    """Rule 2: a stop was requested."""
    if view.stop_signal is None:
        return []
    out: list[Action] = []
    live = [t for t in view.trainers() if t.live]
    for t in live:
        if t.state in (ProcState.STARTING, ProcState.RUNNING):
            out.append(Signal(t.slot, t.attempt, signal.SIGTERM, Cause.STOP))
        elif view.stop_deadline is not None and now >= view.stop_deadline:
            out.append(Kill(t.slot, t.attempt, Cause.STOP_GRACE))
    if not live and view.forking_since is None:  # stopped before a trainer started, or while a restart was pending
        out.append(Finish(TRAINER, 0, RunState.STOPPED, 128 + view.stop_signal, view.history))
    return out


def _restart_due(view: RunView, now: float, limits: Limits) -> list[Action]:
    """Rule 3: a pending trainer start."""
    if view.restart_at is None or now < view.restart_at or view.stop_signal is not None:
        return []
    if view.zygote == ZygoteState.WARMING and now - view.launch_start < limits.zygote_wait:
        return []
    if view.forking_since is not None:
        return []  # a standby asked of the zygote: wait for its answer (milliseconds), then decide
    if standby.promotable(view):
        sb = view.standby()
        assert sb is not None
        return [Promote(sb.slot, sb.attempt)]
    sb = view.standby()
    if sb is not None and sb.live and not sb.killed:  # not ready yet (kills in a row): fork instead
        return [Kill(sb.slot, sb.attempt, Cause.STANDBY_UNREADY), Spawn(TRAINER, TRAINER)]
    return [Spawn(TRAINER, TRAINER)]


def _hang(view: RunView, t: ChildView, now: float, limits: Limits) -> list[Action]:
    """Rule 4: a trainer that makes no progress."""
    if not t.live or view.stop_signal is not None:
        return []
    if t.hang_kill_at is not None:
        return [Kill(t.slot, t.attempt, Cause.HANG)] if now >= t.hang_kill_at else []
    if t.hang_cause:
        return []
    reason = hang_reason(now, started=t.started, last_progress=t.last_progress_at, busy=t.busy, limits=limits.hang)
    return [] if reason is None else [Signal(t.slot, t.attempt, signal.SIGTERM, Cause.HANG, reason)]


def _chaos(view: RunView, now: float, limits: Limits) -> list[Action]:
    """Rule 5: scheduled kills, armed once per attempt of the target."""
    plan = limits.chaos
    if plan is None or view.stop_signal is not None:
        return []
    victim = view.children.get(plan.target)
    current = victim is not None and victim.live and view.chaos_armed_for == (victim.slot, victim.attempt)
    if victim is not None and victim.live and not current:
        since = victim.first_step_at if victim.role == TRAINER else victim.started
        if since is not None:  # a new attempt is ready: its own schedule replaces any earlier one
            return [ArmChaos(victim.slot, victim.attempt, since + view.chaos_next_delay)]
    if view.chaos_at is None or now < view.chaos_at:
        return []
    if victim is None or not current:
        return [SkipChaos(plan.target)]  # its attempt is gone
    if victim.busy:
        return []  # never while it snapshots or writes its final checkpoint: when it is done
    return [Signal(victim.slot, victim.attempt, plan.signal, Cause.CHAOS)]


def checkpoint_stall(view: RunView, now: float, limits: Limits) -> Optional[str]:
    """A one-line reason if checkpoints stopped while training goes on, else None.

    Judged on the current trainer's own schedule (``save_model_secs`` / ``save_checkpoint_steps``):
    its steps complete (it is not busy) but nothing committed for ``stall_factor`` intervals
    (at least ``stall_floor_secs``), counted from its first step, the last commit or the checkpoint
    service's start, whichever is latest. A hung service (a dead NFS server, SIGSTOP) or a lost result looks like this.
    """
    overdue = [t.save_overdue for t in view.trainers() if t.live and t.save_overdue]
    if overdue:
        return overdue[0]
    trainers = [t for t in view.trainers() if t.live and t.first_step_at is not None and not t.busy]
    if not trainers:
        return None
    t = trainers[0]
    first = t.first_step_at if t.first_step_at is not None else now
    since = first if view.commit_clock is None else max(first, view.commit_clock)
    service = view.children.get(CHECKPOINT)
    if service is not None:
        if service.state == ProcState.STARTING:
            return None  # a (re)started service still importing TensorFlow is not stuck (SaveOverdue still applies)
        # a replacement service gets a whole window of its own, from the moment it can commit
        since = max(since, service.running_at if service.running_at is not None else service.started)
    silent = now - since
    if silent < limits.stall_floor_secs:
        return None
    if t.save_secs and t.save_secs > 0 and silent > limits.stall_factor * t.save_secs:
        return f"no checkpoint committed for {silent:.1f} s (save_model_secs={t.save_secs:g})"
    steps = view.step - max(view.commit_step, t.restored_step)
    if t.save_steps and t.save_steps > 0 and steps > limits.stall_factor * t.save_steps:
        return f"no checkpoint committed for {steps} steps (save_checkpoint_steps={t.save_steps})"
    return None


def _checkpoint_stall(view: RunView, now: float, limits: Limits) -> list[Action]:
    """Rule 7: checkpoints stopped while training goes on: replace the checkpoint service."""
    service = view.children.get(CHECKPOINT)
    if service is None or not service.live or service.killed or view.stop_signal is not None:
        return []
    reason = checkpoint_stall(view, now, limits)
    return [] if reason is None else [Kill(service.slot, service.attempt, Cause.STALL, reason)]


def _shutdown(view: RunView, now: float, limits: Limits) -> list[Action]:
    """Rule 6: the outcome is decided; stop whatever still runs."""
    out: list[Action] = []
    for c in view.live_children():
        if not c.live:
            continue  # noticed dead already: only its reap is missing
        if c.state in (ProcState.STARTING, ProcState.RUNNING, ProcState.STANDBY):
            out.append(Signal(c.slot, c.attempt, signal.SIGTERM, Cause.SHUTDOWN))
        elif view.services_deadline is not None and now >= view.services_deadline and not c.killed:
            out.append(Kill(c.slot, c.attempt, Cause.SHUTDOWN))
    return out


# ------------------------------------------------------------------------------------ bookkeeping
def note(view: RunView, action: Action, now: float, limits: Limits) -> None:
    """Record in ``view`` what ``action`` changed (the executor performs its effects)."""
    if isinstance(action, Spawn):
        if action.role == TRAINER:
            view.restart_at = None
        return
    if isinstance(action, ArmChaos):
        view.chaos_at, view.chaos_armed_for = action.at, (action.slot, action.attempt)
        return
    if isinstance(action, SkipChaos):
        view.chaos_at = None
        return
    if isinstance(action, Promote):
        promoted = view.children.pop(STANDBY)
        promoted.slot = promoted.role = TRAINER
        promoted.started = now  # the attempt starts now: its start-up limit and its recovery breakdown count from here
        promoted.set_state(ProcState.STARTING)
        view.children[TRAINER] = promoted
        view.attempts.append(promoted)
        view.restart_at = None
        view.standby_failures = 0
        return
    if isinstance(action, StopLogdirLost):
        view.failed = True
        view.exit_code = view.exit_code or EXIT_LOGDIR_LOST
        view.last_error = f"the logdir was lost while the run was live: {action.reason}"
        request_stop(view, signal.SIGTERM, now, limits.stop_grace_secs)
        return
    if isinstance(action, GiveUpCheckpoints):
        view.failed = True
        view.exit_code = view.exit_code or EXIT_CHECKPOINTS_FAILING
        view.last_error = (f"{action.failures} checkpoints in a row failed to commit; the last: "
                           f"{(view.last_error or '').removeprefix('checkpoint ')}")
        request_stop(view, signal.SIGTERM, now, limits.stop_grace_secs)
        return
    child = find(view, action.slot, action.attempt)
    if isinstance(action, (Finish, GiveUp)):
        if child is not None:
            _settle(child)
        view.history = action.history
        if isinstance(action, GiveUp) and child is not None:
            view.last_error = child.headline()
        run, code = (action.run, action.exit_code) if isinstance(action, Finish) else (RunState.FAILED, 1)
        if view.failed:  # a service kept failing: the orderly stop that followed is a failure
            run = RunState.FAILED
        view.run = transition(view.run, run)  # type: ignore[assignment]
        view.exit_code = view.exit_code or code
        view.finishing = True
        view.restart_at = None
        view.services_deadline = now + min(limits.stop_grace_secs, limits.services_grace_secs)
        return
    if child is None:
        raise KeyError(f"{type(action).__name__}: no attempt {action.attempt} of {action.slot}")
    if isinstance(action, Signal):
        if action.cause == Cause.CHAOS:
            view.chaos_at = None
            child.signalled_at = now
        elif action.cause == Cause.HANG:
            child.hang_cause, child.hang_kill_at, child.signalled_at = f"hang: {action.reason}", \
                now + limits.hang_grace_secs, now
            child.set_state(ProcState.STOPPING)
        else:
            child.set_state(ProcState.STOPPING)
    elif isinstance(action, Kill):
        child.killed = True
        if action.cause == Cause.HANG:
            child.hang_kill_at = None
        elif action.cause == Cause.STOP_GRACE:
            view.stop_deadline = None
        elif action.cause == Cause.STALL:
            view.commit_clock = now  # the next stall counts from the replacement
            for t in view.trainers():
                t.save_overdue = ""
            view.last_error = f"checkpoint service stalled: {action.reason}"
    elif isinstance(action, Restart):
        _settle(child, early=action.early)
        child.set_state(ProcState.RESTARTING)
        view.history = action.history
        view.restart_at = now + action.delay
        if not action.preempted:
            view.last_error = child.headline()
    elif isinstance(action, RespawnService):
        _settle(child)
        child.set_state(ProcState.RESTARTING)
        view.service_crashes = action.crashes
    elif isinstance(action, GiveUpService):
        _settle(child)
        view.service_crashes = action.crashes
        view.failed = True
        view.last_error = f"{child.role} service keeps failing: {child.headline()}"
        view.exit_code = 1
        request_stop(view, signal.SIGTERM, now, limits.stop_grace_secs)
    elif isinstance(action, Settle):
        _settle(child)
    elif isinstance(action, StandbyGone):
        _settle(child)
        if action.failed:
            view.standby_failures += 1
            view.standby_after = now + standby.backoff(view.standby_failures)


def request_stop(view: RunView, signum: int, now: float, grace: float) -> None:
    """A stop request (SIGTERM/SIGINT to the watchdog). A second SIGINT ends the grace period at once."""
    if view.stop_signal is not None:
        if signum == signal.SIGINT:
            view.stop_deadline = now
        return
    view.stop_signal = signum
    view.stop_deadline = now + grace
    view.restart_at = None


def _settle(child: ChildView, early: bool = False) -> None:
    child.settled = True
    child.settled_early = early
    if child.state in (ProcState.STARTING, ProcState.RUNNING, ProcState.STOPPING, ProcState.STANDBY):
        child.set_state(ProcState.EXITED if child.exit_code == 0 else ProcState.FAILED)


def find(view: RunView, slot: str, attempt: int) -> Optional[ChildView]:
    """Attempt ``attempt`` of ``slot`` (``None`` for attempt 0: the run ended before any)."""
    current = view.children.get(slot)
    if current is not None and current.attempt == attempt:
        return current
    return next((c for c in view.attempts if c.slot == slot and c.attempt == attempt), None)
