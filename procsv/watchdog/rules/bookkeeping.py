"""The bookkeeping of the decision function: what each action changed in the observed view.

Runs in the watchdog. Pure of effects like the rules: no clock (``now`` is passed in), no
process, no file. The executor (:mod:`procsv.watchdog.executor`) performs an action and then
calls :func:`note`, which records the action's consequences in the
:class:`~procsv.watchdog.rules.state.RunView`, so that deciding again
(:func:`procsv.watchdog.rules.decide.decide`) with nothing new observed returns nothing new. Also here:
:func:`request_stop` (a stop request, also from :mod:`procsv.watchdog.observe`) and :func:`find`
(an attempt of a slot), and the exit codes the run-level stops set.
"""

from __future__ import annotations

import signal
from typing import Optional

from procsv.watchdog.rules import group
from procsv.watchdog.rules import standby
from procsv.watchdog.rules.actions import (Action, ArmChaos, AuditRollback, Cause, Finish, GiveUp, GiveUpService, Kill,
                                     NodeLost, StartsDropped, Promote, RespawnService, Restart, RestartTask, GiveUpTask, Settle, Signal, SkipChaos, Spawn,
                                     StandbyGone, StartZygote, StopFailing, TakeStacks)
from procsv.watchdog.rules.failures import ChildError, Failure
from procsv.watchdog.rules.hang import inherit, judged_together
from procsv.watchdog.rules.lifecycle import ProcState, RunState, transition
from procsv.watchdog.rules.limits import Limits
from procsv.watchdog.rules.membership import FLAP_WINDOW
from procsv.watchdog.rules.state import SUMMARY, TRAINER, WORKER, ChildView, HangView, RunView, ZygoteState

EXIT_CHECKPOINTS_FAILING = 3  # the launch's exit code when checkpoints kept failing (rule 8)
EXIT_LOGDIR_LOST = 1  # the launch's exit code when the logdir was deleted or moved (rule 9)


def note(view: RunView, action: Action, now: float, limits: Limits) -> None:
    """Record in ``view`` what ``action`` changed (the executor performs its effects)."""
    if isinstance(action, Spawn):
        if action.role == TRAINER:
            view.restart_at = None
            if action.nodes:  # a group over hosts (rule 15): the hosts it is made of
                if view.group_nodes and action.nodes != view.group_nodes:
                    view.membership_changes += 1
                view.group_nodes = action.nodes
        view.task_due.pop(action.slot, None)  # a --ps task restarted alone (rule 14)
        return
    if isinstance(action, ArmChaos):
        view.chaos_at, view.chaos_armed_for = action.at, (action.slot, action.attempt)
        return
    if isinstance(action, SkipChaos):
        view.chaos_at = None
        return
    if isinstance(action, StartZygote):
        view.zygote, view.zygote_attempt, view.zygote_lost_at = ZygoteState.WARMING, action.attempt, None
        return
    if isinstance(action, Promote):
        promoted = view.children.pop(action.slot)
        rank = group.rank_of(action.slot)  # a standby group's member R becomes the next attempt's worker R
        promoted.slot, promoted.role = (TRAINER, TRAINER) if rank == 0 else (group.worker_slot(rank), WORKER)
        promoted.started = now  # the attempt starts now: its start-up limit and its recovery breakdown count from here
        promoted.set_state(ProcState.STARTING)
        promoted.commit_base = view.commit_step
        inherit(promoted, view.children.get(promoted.slot))  # (before: a promotion forgot what the slot had learned)
        view.children[promoted.slot] = promoted
        if rank == 0:
            view.attempts.append(promoted)
            view.restart_at = None
            view.standby_failures = 0
        return
    if isinstance(action, NodeLost):
        node = view.nodes[action.node]
        node.lost_at = now
        node.lost_times = [t for t in node.lost_times if now - t <= FLAP_WINDOW] + [now]
        node.waits.asked_at, node.waits.asked = None, []  # (what was asked of it counts dead: RemoteMembers.lost)
        how = f"answered no start for {action.start_secs:.1f} s" if action.unstarted else \
            f"went silent for {action.silent_secs:.1f} s"
        for c in list(view.children.values()):
            if c.node == action.node and not c.reaped:  # its members: dead with their host, as far as the job knows
                c.noticed_dead_at = c.noticed_dead_at if c.noticed_dead_at is not None else now
                c.ended_at = c.ended_at if c.ended_at is not None else now
                c.failure = Failure(c.slot, c.attempt, c.pid, -signal.SIGKILL, 0.0, "",
                                    ChildError(group.HOST_LOST, f"node {action.node} ({node.host}) {how}", "", "run"))
        return
    if isinstance(action, StartsDropped):  # (each member added by the executor: RemoteMembers.dropped)
        node = view.nodes[action.node]
        node.waits.asked_at, node.waits.asked = None, []
        for c in list(view.children.values()):
            if c.node == action.node and c.pid == 0 and not c.reaped:  # (pid 0: asked, never started)
                c.noticed_dead_at = c.noticed_dead_at if c.noticed_dead_at is not None else now
                c.ended_at = c.ended_at if c.ended_at is not None else now
                c.failure = Failure(c.slot, c.attempt, c.pid, -signal.SIGKILL, 0.0, "",
                                    ChildError(group.NOT_STARTED, f"node {action.node} ({node.host}) had not answered "
                                                                  f"its start when the stop came", "", "run"))
        return
    if isinstance(action, StopFailing):
        view.failed = True
        view.exit_code = view.exit_code or action.exit_code
        view.last_error = action.error
        request_stop(view, signal.SIGTERM, now, limits.stop_grace_secs)
        return
    child = find(view, action.slot, action.attempt)
    if isinstance(action, (Finish, GiveUp, Restart)) and child is not None and child.role == TRAINER:
        child.broken_by = group.blame(view, child)  # kept: the next group's workers replace this one's
    if isinstance(action, (Finish, GiveUp)):
        if child is not None:
            _settle(child)
        view.history = action.history
        if isinstance(action, GiveUp) and child is not None:
            view.last_error = group.blame(view, child).headline()
        # (view.failed: a service kept failing, and the orderly stop that followed is a failure)
        run = action.run if isinstance(action, Finish) and not view.failed else RunState.FAILED
        view.run = transition(view.run, run)  # type: ignore[assignment]
        view.exit_code = view.exit_code or action.exit_code
        view.restart_at = None
        view.services_deadline = now + min(limits.stop_grace_secs, limits.services_grace_secs)
        return
    if child is None:
        raise KeyError(f"{type(action).__name__}: no attempt {action.attempt} of {action.slot}")
    if isinstance(action, (Restart, RestartTask, GiveUpTask, RespawnService, GiveUpService, Settle, StandbyGone)):
        _settle(child, early=isinstance(action, Restart) and action.early)  # its end is judged
    if isinstance(action, (Restart, RestartTask, RespawnService)):
        child.set_state(ProcState.RESTARTING)
    if isinstance(action, TakeStacks):
        child.hang = HangView(stacks_asked_at=now, reason=action.reason, samples=child.hang.samples,
                              quiet_max=child.hang.quiet_max, judged_max=child.hang.judged_max,
                              stuck_for=action.stuck_for)  # (a stall that passed leaves nothing)
    elif isinstance(action, Signal):
        if action.cause == Cause.CHAOS:
            view.chaos_at = None
            child.signalled_at, child.chaos_sent = now, True
        elif action.cause == Cause.HANG:
            child.hang.cause, child.hang.kill_at, child.signalled_at = f"hang: {action.reason}", \
                now + limits.hang_grace_secs, now
            child.set_state(ProcState.STOPPING)
            for m in judged_together(view, child) if action.stuck_for > 0 else []:
                # judged stuck: the slot's next limit is twice this wait (a wait that ends, quiet, is killed
                # two or three times, each time later, not at every attempt until the run gives up)
                m.hang.judged_max = max(m.hang.judged_max, action.stuck_for)
        else:
            if action.cause == Cause.GROUP:
                child.signalled_at = now  # SIGKILL after group_grace_secs (rule 11)
            elif action.cause in (Cause.STOP, Cause.SHUTDOWN):
                child.stop_sent_at = now  # (sent again after stop_resend_secs: ChildView.stopping)
            if child.state != ProcState.STOPPING:  # (a resent SIGTERM: stopping already)
                child.set_state(ProcState.STOPPING)
    elif isinstance(action, Kill):
        child.killed = True
        if action.cause in (Cause.REGROUP, Cause.AUDIT):  # ended on purpose, not a failure: restarted at once
            child.regroup = True
        elif action.cause == Cause.HANG:
            child.hang.kill_at = None
        elif action.cause == Cause.STOP_GRACE and child.role == TRAINER:
            view.stop_deadline = None  # (a --ps worker killed at half the grace leaves the chief's deadline)
        elif action.cause == Cause.STALL and child.role == SUMMARY:
            view.summary_overdue = ""
            view.last_error = f"summary service stalled: {action.reason}"
        elif action.cause == Cause.STALL:
            for t in view.trainers():
                t.save_overdue = ""
            view.last_error = f"checkpoint service stalled: {action.reason}"
    elif isinstance(action, Restart):
        view.history = action.history
        view.restart_at = now + action.delay
        if action.skip is not None:  # a group's rollback: counted as one, not as a restart
            child.group_rollback = action.skip
            view.rollbacks += 1
            stale = view.commit_step if view.rollback_before is None else max(view.commit_step, view.rollback_before[1])
            chief = view.children.get(TRAINER)  # (the one that saves: commits name its attempt)
            rolled = chief.attempt if chief is not None else child.attempt
            view.rollback_before = next_rollback_bound(view.rollback_before, action.skip, stale, rolled)
            if action.skip not in view.skipped_steps:  # handed to the next group
                view.skipped_steps = sorted([*view.skipped_steps, action.skip])
        if not action.preempted:
            view.last_error = group.blame(view, child).headline()
    elif isinstance(action, RestartTask):
        view.task_history[child.slot] = action.history
        view.task_due[child.slot] = now + action.delay
        view.last_error = child.headline()
    elif isinstance(action, GiveUpTask):
        view.task_history[child.slot] = action.history
        view.tasks_given_up.append(child.slot)
        view.last_error = child.headline()
    elif isinstance(action, RespawnService):
        view.service_crashes[child.slot] = action.crashes
    elif isinstance(action, GiveUpService):
        view.service_crashes[child.slot] = action.crashes
        view.failed = True
        view.last_error = f"{child.role} service keeps failing: {child.headline()}"
        view.exit_code = 1
        request_stop(view, signal.SIGTERM, now, limits.stop_grace_secs)
    elif isinstance(action, StandbyGone):
        if action.no_shadow:
            view.shadow_runs = False
        if action.unsuitable:
            view.standby_ok = False
        if action.failed:
            view.standby_failures += 1
            view.standby_after = now + standby.backoff(view.standby_failures)


def note_audit_rollback(view: RunView, rb: AuditRollback) -> None:
    """What an audit's rollback (:func:`procsv.watchdog.audit.verdict.rollback`) changes in the view: the
    rollback's bound, as a group's rollback sets it (every trainer started until a later attempt commits past
    ``rb.stale`` restores a checkpoint before ``rb.before``: :func:`procsv.watchdog.observe.rollback_bound`
    lifts it), the restart's reason, and a trainer that had finished marked to restart at once, not as a
    failure (a running one is killed with :attr:`Cause.AUDIT`, which :func:`note` marks so)."""
    view.rollback_before = (rb.before, rb.stale, rb.attempt)
    view.findings.audit_rollbacks[rb.attempt] = rb.why
    trainer = find(view, TRAINER, rb.attempt)
    if rb.finished and trainer is not None:
        trainer.regroup = True


def next_rollback_bound(bound: Optional[tuple[int, int, int]], skip: int, stale: int,
                        rolled: int) -> tuple[int, int, int]:
    """The group rollback's bound (:attr:`RunView.rollback_before`) after a rollback of step ``skip`` by the
    chief's attempt ``rolled``, ``stale`` the newest step committed by then: ``skip`` itself, unless an
    earlier rollback's bound still holds (no later attempt committed past its stale steps) and keeps a
    checkpoint out, one its rolled-back timeline committed at or after its B (it holds B's update, not
    rewritten yet): then the lower of the two. A bound that keeps nothing out (that timeline committed
    nothing at or after its B: a group of in-memory snapshots) is replaced: before, it held, and the
    second rollback's group passed over its own snapshots after the first B and started from step 0."""
    if bound is None:
        return skip, stale, rolled
    before, was_stale, was = bound
    if was_stale < before:
        return skip, stale, max(rolled, was)
    return min(before, skip), stale, max(rolled, was)


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
    """The attempt's end was judged (``early``: on its death notice, before its exit status)."""
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
