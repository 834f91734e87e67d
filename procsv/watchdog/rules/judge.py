"""Rule 1 of the decision function: judging a child that ended (or whose death was noticed).

Runs in the watchdog. Pure: :func:`judge` reads the observed view, the time ``now`` passed in
and the backoff jitter ``draw``, and returns actions; it changes nothing. It owns the restart
judgement of a run's children: a trainer attempt goes to the restart policy
(:func:`procsv.watchdog.rules.policy.decide`), overruled by the errors a restart cannot cure
(:func:`hopeless`); a service is respawned unless it died too often within the window; a
standby that ends is counted (:mod:`procsv.watchdog.rules.standby`); anything ending after the run's
outcome is decided is only settled. :func:`procsv.watchdog.rules.decide.decide` composes it.
"""

from __future__ import annotations

import signal
from dataclasses import replace

from procsv.common.exitcodes import (DIVERGING_ERROR, EXIT_DIVERGING, EXIT_GROUP_ROLLBACK, EXIT_PREEMPTED,
                                    GROUP_ROLLBACK_ERROR, SPIKE_DIVERGED)
from procsv.watchdog.rules.actions import Action, Finish, GiveUp, GiveUpService, RespawnService, Restart, Settle
from procsv.watchdog.rules.failures import killed_from_outside
from procsv.watchdog.rules.lifecycle import RunState
from procsv.watchdog.rules.limits import Limits
from procsv.watchdog.rules.policy import Action as Verdict
from procsv.watchdog.rules.policy import TrainerExit
from procsv.watchdog.rules.policy import decide as restart_verdict
from procsv.watchdog.rules import group, standby, tasks
from procsv.watchdog.rules.state import AUDITOR, PS, SERVER, STANDBY, TRAINER, WORKER, ChildView, RunView

# The launch's exit code for a stop (a signal) after which the trainer's last step is not saved: not
# 128+N, which says "stopped in order, nothing lost" (a Kubernetes podFailurePolicy ignores it)
EXIT_STOP_UNSAVED = 1


def judge(view: RunView, child: ChildView, now: float, limits: Limits, draw: float) -> list[Action]:
    """Rule 1: an attempt ended (or its death was noticed)."""
    if not child.reaped and (view.finishing or child.role != TRAINER):
        return []  # a death notice: only a trainer's is acted on before its exit status, and only while the run goes on
    if view.finishing:
        return [Settle(child.slot, child.attempt)]
    if view.tasks_alone and child.role in (WORKER, PS, SERVER):  # rule 14: --ps, each task restarts alone
        return tasks.judge_task(view, child, now, limits, draw)
    if child.role == WORKER:  # rule 11 stops the rest of its group; the chief's attempt is what is judged
        return [Settle(child.slot, child.attempt)]
    if child.role == STANDBY:  # rule 10: not a trainer attempt yet; the run goes on
        return [standby.gone(view, child)]
    if child.role == AUDITOR:  # its answer (or its silence) is the audit's (procsv.watchdog.audit); the run goes on
        return [Settle(child.slot, child.attempt)]
    if child.role != TRAINER:
        return _service(view, child, now, limits)
    return _trainer(view, child, now, limits, draw)


def stop_saved(child: ChildView) -> bool:
    """Whether a trainer that ended during a stop left its last step saved: it exited 0 (its final
    checkpoint committed, else it exits 1), or 42 with its exit report (a preemption: its emergency
    checkpoint committed), or it completed no step (nothing to save), or the watchdog heard its
    stop's (preempted) checkpoint commit, whatever its end (a program SIGKILLed at the grace in a
    slow teardown after the Supervisor's block lost nothing). Not so for an exit with 1 (the
    emergency checkpoint did not commit) nor a SIGKILL at the stop's grace before that commit."""
    if child.first_step_at is None or child.exit_code == 0 or child.stop_committed:
        return True
    return child.failure is not None and child.failure.preempted


def hopeless(child: ChildView, error_type: str, limits: Limits) -> bool:
    """A trainer that failed with an error a restart cannot cure: before its first step with a
    ``permanent_errors`` one, or at any step with a ``program_errors`` one."""
    return error_type in limits.program_errors or (child.first_step_at is None
                                                   and error_type in limits.permanent_errors)


def _service(view: RunView, child: ChildView, now: float, limits: Limits) -> list[Action]:
    """A reaped service: respawned at once, unless that service (each counts alone) died more than
    ``service_restart_limit`` times within ``service_restart_window`` seconds. A death procsv caused
    (a stall kill, chaos: ``killed`` or ``signalled_at``) is respawned and not counted: the budget is
    for a service that keeps failing on its own."""
    earlier = tuple(t for t in view.service_crashes.get(child.slot, ()) if now - t < limits.service_restart_window)
    if child.killed or child.signalled_at is not None:
        return [RespawnService(child.slot, child.attempt, earlier)]
    window = earlier + (now,)
    if len(window) > limits.service_restart_limit:
        return [GiveUpService(child.slot, child.attempt, window)]
    return [RespawnService(child.slot, child.attempt, window)]


def _trainer(view: RunView, child: ChildView, now: float, limits: Limits, draw: float) -> list[Action]:
    """A trainer attempt that was reaped, or whose death notice arrived (that only ever restarts)."""
    if view.stop_signal is None and any(m.regroup for m in group.members(view, child)):
        # rule 15: the watchdog ended the group to take a host back, right after a commit: not a failure; and
        # that commit is progress (--max-restarts counts failures in a row without a new checkpoint)
        history = replace(view.history, failures_without_progress=0, startup_failures_in_a_row=0) \
            if child.made_progress else view.history
        return [Restart(child.slot, child.attempt, 0.0, history, early=not child.reaped, regroup=True)]
    if group.awaits_own_ends(view, child, now, limits.stop_grace_secs):
        return []  # a chief's 0: its workers' own ends first (a worker's own last step is checked at its end)
    who = group.blame(view, child)  # in a group, the member whose end broke it
    if not child.reaped and not who.reaped and child.first_step_at is None and not who.noticed_error \
            and not who.hang.cause:
        # a death notice before the first step, with no error file: whether the program failed on
        # its own (the start-up failure rule) or was killed from outside (not counted by that rule)
        # is known only from the exit status
        return []
    if group.reporter_unreaped(view, child):
        return []  # whether it asks for the group's rollback (exit 5, its step skipped) only its exit status says
    code = who.exit_code if who.exit_code is not None else 1  # a death notice: some unclean death
    if code == EXIT_PREEMPTED and who.hang.cause:
        code = 1  # it saved when terminated for a hang, but a hang is a failure: backoff applies
    preempted = who.failure is not None and who.failure.preempted and not who.hang.cause
    outside = killed_from_outside(who.exit_code) and not who.hang.cause  # a hang kill: its own
    error = who.failure.error if who.failure is not None and who.failure.error is not None else who.noticed
    ex = TrainerExit(code, child.first_step_at is not None, child.made_progress, view.stop_signal is not None,
                     preempted=preempted, killed_from_outside=outside, rollback_step=group.rollback_step(view, child),
                     skipped=tuple(view.skipped_steps), fingerprint=error.fingerprint if error is not None else None,
                     spiked=error is not None and error.type == DIVERGING_ERROR and SPIKE_DIVERGED in error.message)
    verdict = restart_verdict(limits.restart, view.history, ex, draw)
    if not child.reaped:
        if verdict.action != Verdict.RESTART or hopeless(child, who.noticed_error, limits) \
                or who.noticed_error in (DIVERGING_ERROR, GROUP_ROLLBACK_ERROR):
            return []  # stopping or giving up: wait for the exit status to tell the whole story
        return [Restart(child.slot, child.attempt, verdict.delay, verdict.history, early=True, skip=verdict.skip)]
    if verdict.action == Verdict.FINISH and view.findings.audit.get("end_waits"):
        return []  # --audit every: its last intervals' verdicts first (procsv.watchdog.audit bounds the wait)
    if verdict.action == Verdict.FINISH:
        return [Finish(child.slot, child.attempt, RunState.SUCCEEDED, 0, verdict.history)]
    if verdict.action == Verdict.STOPPED:
        sig = view.stop_signal or signal.SIGTERM
        if stop_saved(child):
            return [Finish(child.slot, child.attempt, RunState.STOPPED, 128 + sig, verdict.history)]
        return [Finish(child.slot, child.attempt, RunState.STOPPED, EXIT_STOP_UNSAVED, verdict.history, unsaved=True)]
    if verdict.action == Verdict.GIVE_UP:
        diverged = code == EXIT_DIVERGING or (code == EXIT_GROUP_ROLLBACK and ex.rollback_step is not None)
        return [GiveUp(child.slot, child.attempt, verdict.reason, verdict.history,  # a 5 with no step: a failure
                       EXIT_DIVERGING if diverged else 1)]
    error = who.failure.error if who.failure is not None else None
    if error is not None and error.type in limits.program_errors:
        return [GiveUp(child.slot, child.attempt, f"the {_name(who)} failed with {error.type}: a failure of the program, "
                       "not of the process (a restart would resume from the last checkpoint and meet it again)",
                       view.history)]  # no restart happened: the history before the verdict's
    if error is not None and hopeless(child, error.type, limits):
        return [GiveUp(child.slot, child.attempt, f"the {_name(who)} cannot start: {error.type} (a restart would fail "
                       "the same way)", view.history)]
    return [Restart(child.slot, child.attempt, verdict.delay, verdict.history, preempted=preempted, skip=verdict.skip)]


def _name(child: ChildView) -> str:
    return "trainer" if child.role == TRAINER else f"trainer group's {child.slot}"
