"""Rule 7 of the decision function: checkpoint and summary stalls, and the stalled service's replacement.

Runs in the watchdog. Pure: reads the observed view and the time ``now`` passed in, changes
nothing. It owns the judgement "checkpoints stopped while training goes on":
:func:`checkpoint_stall` says why (a ``SaveOverdue`` from the trainer, or no commit for
``stall_factor`` save intervals), and :func:`stall_actions` turns that into a SIGKILL of the
checkpoint service, which rule 1 (:mod:`procsv.watchdog.rules.judge`) then respawns. A summary service
the trainer says confirmed nothing within its deadline (``view.summary_overdue``, from a
``SummaryOverdue``) is SIGKILLed the same way.
:func:`procsv.watchdog.rules.decide.decide` composes it.
"""

from __future__ import annotations

from typing import Optional

from procsv.watchdog.rules.actions import Action, Cause, Kill
from procsv.watchdog.rules.lifecycle import ProcState
from procsv.watchdog.rules.limits import Limits
from procsv.watchdog.rules.state import CHECKPOINT, SUMMARY, TRAINER, RunView


def checkpoint_stall(view: RunView, now: float, limits: Limits) -> Optional[str]:
    """A one-line reason if checkpoints stopped while training goes on, else None.

    Judged on the current trainer's own schedule (``save_model_secs`` / ``save_checkpoint_steps``):
    its steps complete (it is not busy) but nothing committed for ``stall_factor`` intervals
    (at least ``stall_floor_secs``) of training, up to its last completed step (not to now), counted from its first step
    (or its first after :data:`~procsv.watchdog.rules.state.RESUME_GAP_SECS` without one), the last commit, the checkpoint
    service's readiness (its Hello, or the end of a load it announced: ``ServiceLoading``, during
    which, up to ``loading_limit_secs``, the window does not apply) or the trainer's last refusal of a snapshot of a non-finite state, whichever
    is latest. A snapshot the trainer found overdue (``SaveOverdue``) is a stall at once, during a
    load too: a load that makes progress tells the trainer so (CommitLoading), so it sends none then. A hung service (a dead NFS server, SIGSTOP) or a lost result looks like this; a
    trainer that refuses every snapshot (``--on-nonfinite continue`` once its state is non-finite:
    procsv never commits a poisoned state) does not: nothing was sent to the service to commit.
    """
    t = view.children.get(TRAINER)  # (the trainer: the one child of its role)
    if t is not None and t.live and t.save_overdue:  # (also during a load: the trainer saw it make no progress)
        return t.save_overdue
    service = view.children.get(CHECKPOINT)
    if service is not None and service.loading_since is not None:
        if now - service.loading_since < limits.loading_limit_secs:
            return None  # loading what its commits need (ServiceLoading): not judged by the window meanwhile
        return f"loading what its checkpoints need for {now - service.loading_since:.1f} s"
    if t is None or not t.live or t.first_step_at is None or t.busy or t.hang.cause:
        return None  # (found hung: it steps no more and asks for no save, whatever the service does)
    since = t.first_step_at if view.last_commit_at is None else max(t.first_step_at, view.last_commit_at)
    if t.refused_at is not None:
        since = max(since, t.refused_at)  # the trainer's own choice, not the service's stall
    if service is not None:
        if service.state == ProcState.STARTING:
            return None  # a (re)started service still importing TensorFlow is not stuck (SaveOverdue still applies)
        # a replacement service gets a whole window of its own, from the moment it can commit
        since = max(since, service.running_at if service.running_at is not None else service.started)
    # the trainer's training since then, to its last completed step: a save is due only at a step boundary,
    # so a trainer that stopped stepping (hung in a collective, its filesystem frozen, a step of minutes)
    # leaves the service nothing to commit, and its silence is not the service's
    trained_to = now if t.last_work_at is None else min(now, t.last_work_at)
    # on a time schedule the window starts again where it steps again: its first snapshot then has the time
    # any other has to commit (on a step schedule the steps count: they were taken whatever the pause between)
    resumed = since if t.hang.resumed_at is None else max(since, t.hang.resumed_at)
    silent = trained_to - resumed
    if t.save_secs and t.save_secs > 0 and silent >= limits.stall_floor_secs \
            and silent > limits.stall_factor * t.save_secs:
        return f"no checkpoint committed for {silent:.1f} s (save_model_secs={t.save_secs:g})"
    steps = view.step - max(view.commit_step, t.restored_step)
    if t.save_steps and t.save_steps > 0 and trained_to - since >= limits.stall_floor_secs \
            and steps > limits.stall_factor * t.save_steps:
        return f"no checkpoint committed for {steps} steps (save_checkpoint_steps={t.save_steps})"
    return None


def stall_actions(view: RunView, now: float, limits: Limits) -> list[Action]:
    """Rule 7: checkpoints stopped while training goes on: replace the checkpoint service; the
    summary service confirms no summaries (``SummaryOverdue``): replace it."""
    out: list[Action] = []
    if view.stop_signal is not None:
        return out
    service = view.children.get(CHECKPOINT)
    if service is not None and service.live and not service.killed:
        reason = checkpoint_stall(view, now, limits)
        if reason is not None:
            out.append(Kill(service.slot, service.attempt, Cause.STALL, reason))
    summary = view.children.get(SUMMARY)
    if view.summary_overdue and summary is not None and summary.attempt == view.summary_overdue_for \
            and summary.live and not summary.killed:
        out.append(Kill(summary.slot, summary.attempt, Cause.STALL, view.summary_overdue))
    return out
