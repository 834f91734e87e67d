"""Observations: what the watchdog hears and sees, turned into state.

Runs in the watchdog. Each function applies one observation (a child started, a message arrived, a
death notice, a reaped exit status, a stop signal, the pre-warmed trainer's state) to the
:class:`~procsv.watchdog.rules.state.RunView`, and returns what is worth recording about it as
:class:`~procsv.watchdog.publish.events.Report` values (a lifecycle event, a line), which the watchdog's
loop writes. No I/O and no clock here: times are passed in.

One concern: applying each observation the watchdog makes to the RunView (one function per kind).
"""

from __future__ import annotations

import os
import signal
from typing import Any, Optional, Sequence

from procsv.ipc.messages import (Busy, GroupCopyHeld, GroupCopyRefused, Hello, MemberLooked, Message, NodeHello, NonfiniteDetected, Progress,
                                 RolledBack, SaveOverdue, SaveResult, ServiceLoading, SpikeDetected, SpikeReplayed,
                                 StandbyReady, StepSkipped, SummaryOverdue, TrainerReady)
from procsv.watchdog.rules.bookkeeping import find, request_stop
from procsv.watchdog.publish.events import Event, Report
from procsv.watchdog.rules.failures import ChildError, Failure
from procsv.watchdog.rules.findings import SpikeSeen
from procsv.watchdog.rules.lifecycle import ProcState
from procsv.watchdog.rules.group import blame, copy_held, members, peer_found, workers
from procsv.watchdog.rules.hang import HangLimits, inherit, looks_kept, quiet_span, stuck_peers
from procsv.watchdog.rules.hosts import DEAF_SECS, GAPS_KEPT
from procsv.watchdog.rules.nonfinitelog import detected, ended
from procsv.common.clock.unwatched import Stop, stopped_within
from procsv.watchdog.rules.state import (AUDITOR, PS, RESUME_GAP_SECS, SERVER, STANDBY, SUMMARY, TRAINER, WORKER, Activity, ChildView, HangView, NodeView, RunView,
                                         ZygoteState)


def spawned(view: RunView, slot: str, role: str, attempt: int, pid: int, now: float, via: str,
            create_time: Optional[float] = None) -> list[Report]:
    child = ChildView(slot, role, attempt, pid, now, create_time=create_time)
    inherit(child, view.children.get(slot))  # what the stuck rule learned of its slot's quiet waits (issue 69)
    view.children[slot] = child
    if role == TRAINER:
        view.attempts.append(child)
    child.commit_base = view.commit_step
    if role == STANDBY:
        child.state = ProcState.STANDBY
    name = slot if role in (WORKER, PS, SERVER, STANDBY, AUDITOR) else role  # by their task: worker1, ps0, standby1, auditor1
    return [Report(Event.SPAWNED, {"role": name, "attempt": attempt, "pid": pid, "via": via})]


def heard(view: RunView, msg: Message, now: float, slot: Optional[str] = None,
          stops: Sequence[Stop] = ()) -> list[Report]:
    """A message from a child (stale ones, from an attempt that is not current, change nothing).
    ``slot``: relayed by another host's agent for that member (pids of hosts may coincide). ``stops``: the watchdog's
    clock's (its process stopped with the job): a wait a child timed on its raw clock leaves them out here."""
    if isinstance(msg, Hello):
        child = view.children.get(msg.slot or msg.role)
        if child is not None and child.pid == msg.pid and child.state == ProcState.STARTING:
            child.set_state(ProcState.RUNNING)
            child.running_at, child.loading_since = now, None
        return []
    if isinstance(msg, ServiceLoading):
        return _loading(view, msg, now)
    if isinstance(msg, TrainerReady):
        return _ready(view, msg, now, slot)
    if isinstance(msg, Progress):
        return _progress(view, msg, now, slot)
    if isinstance(msg, SaveResult):
        return _saved(view, msg, now)
    if isinstance(msg, (GroupCopyHeld, GroupCopyRefused)):  # a group's progress (rules/group.py), or a peer copy refused
        return copy_held(view, msg.rank, msg.attempt, msg.step) if isinstance(msg, GroupCopyHeld) else [Report(Event.GROUP_COPY_REFUSED, dict(vars(msg)))]
    if isinstance(msg, SaveOverdue):
        return _overdue(view, msg, now, stops)
    if isinstance(msg, SummaryOverdue):
        return _summary_overdue(view, msg, now, stops)
    if isinstance(msg, (NonfiniteDetected, RolledBack, StepSkipped)):
        return _nonfinite(view, msg, slot, now)
    if isinstance(msg, (SpikeDetected, SpikeReplayed)):
        return _spike(view, msg, slot)
    if isinstance(msg, StandbyReady):
        sb = next((c for c in view.children.values() if c.role == STANDBY and c.pid == msg.pid
                   and (slot is None or c.slot == slot)), None)  # (another host's: relayed by its agent)
        if sb is None or sb.standby_ready_at is not None:
            return []
        sb.standby_ready_at = now
        return [Report(Event.STANDBY_READY, {"pid": msg.pid, "attempt": msg.attempt, "secs": round(now - sb.started, 3)})]
    return []


def _plain(value: Any) -> Any:
    """An enum field's wire value (lifecycle records hold plain strings)."""
    return getattr(value, "value", value)


def _trainer(view: RunView, pid: int, slot: Optional[str] = None) -> Optional[ChildView]:
    """The trainer (or a group's worker) with this pid (on this host, or in ``slot`` on another)."""
    if slot is not None:
        c = view.children.get(slot)
        return c if c is not None and c.node != 0 and c.pid == pid else None
    return next((t for t in view.trainers() + workers(view) if t.pid == pid and t.node == 0), None)


def _ready(view: RunView, msg: TrainerReady, now: float, slot: Optional[str] = None) -> list[Report]:
    child = _trainer(view, msg.pid, slot)
    if child is None:
        return []
    child.step = child.work_step = msg.step
    if child.ready_at is None:  # the recovery's own restore; a later one is the program's retry loop
        child.ready_at, child.restored_step, child.restore_secs = now, msg.step, msg.restore_secs
        if child.role != WORKER:  # (a group's worker restored what the chief restored: procsv.trainer.replica.GroupPin)
            # it started from what it restored: below the newest commit known (that one was skipped as
            # corrupt, or nothing was restored), a commit above its restore is its progress
            child.commit_base = min(child.commit_base, msg.step)
    if child.role == WORKER:  # (when it restored: where a group's start after the chief's restore goes)
        return [Report(Event.WORKER_READY, {"role": child.slot, "attempt": msg.attempt, "pid": msg.pid, "step": msg.step,
                                            "path": msg.restored_from, "secs": round(msg.restore_secs, 4),
                                            "prepared_at": msg.prepared_at, "warm_secs": round(msg.warm_secs, 4),
                                            "source": msg.source.value if msg.source is not None else None})]
    view.step = msg.step
    child.save_secs, child.save_steps = msg.save_secs, msg.save_steps
    view.commit_step = max(view.commit_step, msg.step)
    out = [Report(Event.RESTORED if msg.restored_from else Event.INITIALIZED,
                  {"pid": msg.pid, "step": msg.step, "path": msg.restored_from, "secs": round(msg.restore_secs, 4),
                   "skipped": list(msg.skipped), "prepared_at": msg.prepared_at, "warm_secs": round(msg.warm_secs, 4),
                  "source": msg.source.value if msg.source is not None else None})]
    if msg.restored_from:
        view.restored_step = msg.step
        out.append(Report(say=f"procsv: trainer attempt {msg.attempt} restored step {msg.step} from "
                              f"{os.path.basename(msg.restored_from)} in {msg.restore_secs:.2f} s"))
    out += [Report(say=f"procsv: skipped corrupt checkpoint {prefix}") for prefix in msg.skipped]
    return out


def _progress(view: RunView, msg: Progress, now: float, slot: Optional[str] = None) -> list[Report]:
    child = _trainer(view, msg.pid, slot)
    if child is None:
        return []
    busy = str(_plain(msg.busy))
    out = []
    stepped_before = child.first_step_at is not None
    if child.first_step_at is None and not busy and msg.stepped:  # (not the start-up snapshot's end: no step yet)
        child.first_step_at = now
        child.first_step_no = msg.step
        if child.role == TRAINER:
            out.append(Report(Event.FIRST_STEP, {"pid": msg.pid, "step": msg.step,
                                                 "secs_since_spawn": round(now - child.started, 3)}))
    if child.state == ProcState.STARTING:
        child.set_state(ProcState.RUNNING)
    child.step = msg.step
    if child.role == TRAINER:  # the run's step is the chief's (a group's workers take the same steps)
        view.step = msg.step
    marked = child.busy == Busy.WAITING  # (the step after the program's own marked wait: that wait teaches nothing)
    child.note_busy(busy, now)
    if not busy and msg.stepped and stepped_before and child.hang.samples and not marked:  # (not a start's wait: a standby's)
        # a quiet wait that ended in this step was slow work, not a hang: the stuck rule learns its length
        waited = quiet_span(now, child.hang.samples, stuck_peers(view, child))
        if child.last_progress_at is not None:  # (since its step before: a step's own work may not show)
            waited = min(waited, now - child.last_progress_at)
        child.hang.quiet_max = max(child.hang.quiet_max, waited)
    if not (marked and busy == Busy.WAITING):  # (a marked wait again, no step since: the same wait, its clock
        child.last_progress_at = now        # from the first one's start; else a loop of them was never bounded)
    if not busy and child.first_step_at is not None:
        if child.last_work_at is None or now - child.last_work_at > RESUME_GAP_SECS:
            child.hang.resumed_at = now  # (training again: the checkpoint stall window starts here)
        child.last_work_at, child.work_step = now, msg.step
    return out


def rollback_bound(bound: tuple[int, int, int], step: int, attempt: int,
                   chief: Optional[ChildView]) -> Optional[tuple[int, int, int]]:
    """The group rollback's bound (:attr:`RunView.rollback_before`: B, the newest step committed by the
    rolled-back timeline, the rolled-back chief's attempt) after a commit of ``step`` by a trainer of
    ``attempt`` (0: not said). A commit of the rolled-back attempt or an earlier one is late and holds
    B's update: the bound stays, past that step too. One of a later attempt at or past every such step
    (at: that step's checkpoint rewritten in place) means the group after the rollback committed a
    state of its own timeline newer than all of them: None, no bound any more. Without an attempt (a
    sender that does not say it), a commit before the running chief's first step counts as late, and
    only one past every such step ends the bound."""
    before, stale, rolled = bound
    if attempt:
        late, passed = attempt <= rolled, step >= stale
    else:
        late = chief is None or chief.group_rollback is not None or chief.first_step_at is None
        passed = step > stale
    if late:
        return before, max(stale, step), rolled
    return None if passed else bound


def _saved(view: RunView, msg: SaveResult, now: float) -> list[Report]:
    if not msg.ok:
        if _plain(msg.reason) != "lost":  # a snapshot lost with a dead service is retaken, not a failure
            view.failed_saves += 1
            view.failed_commits += 1
        if not view.failed:  # once the run is failing, its root cause stays the last error
            view.last_error = f"checkpoint at step {msg.step} failed: {msg.error}"
        quiet = view.logdir_lost is not None  # of course it failed: the root cause was said already
        return [Report(Event.CHECKPOINT_FAILED, {"step": msg.step, "error": msg.error},
                       say="" if quiet else f"procsv: checkpoint at step {msg.step} failed: {msg.error}")]
    if not msg.again:  # (again: committed before, and recorded then; a stop may still wait for it)
        view.step, view.commit_step = max(view.step, msg.step), max(view.commit_step, msg.step)
        view.failed_saves, view.commits, view.last_commit_final = 0, view.commits + 1, _plain(msg.reason) == "final"
        view.last_commit_at, view.last_commit_step, view.last_commit_secs = now, msg.step, msg.persist_secs
        chief = view.children.get(TRAINER)
        if view.rollback_before is not None:
            view.rollback_before = rollback_bound(view.rollback_before, msg.step, msg.attempt, chief)
    for t in view.children.values():
        if t.role in (TRAINER, WORKER, PS, SERVER):  # a --ps task's progress too: its restarts count per task
            t.commit_seen = max(t.commit_seen, msg.step)
        if t.role == TRAINER and _plain(msg.reason) == "preempted":  # its stop's checkpoint of its last step
            t.stop_committed = True
    fields = {"step": msg.step, "path": msg.path, "reason": _plain(msg.reason), "secs": round(msg.persist_secs, 4)}
    return [] if msg.again else [Report(Event.CHECKPOINT_COMMITTED, fields)]


def _nonfinite(view: RunView, msg: NonfiniteDetected | RolledBack | StepSkipped, slot: Optional[str],
               now: float) -> list[Report]:
    """Non-finite training (issue 41), as the trainer tells it: a lifecycle event each (detections
    coalesced: rules/nonfinitelog); the run's
    rollbacks and skipped steps counted (a step skipped again after a restart is one step). A
    detection is a snapshot the trainer refused: the stall rule counts the silence from it."""
    trainer = _trainer(view, msg.pid, slot)
    if trainer is None:
        return []
    if isinstance(msg, NonfiniteDetected):  # its record coalesced (rules/nonfinitelog: a count in ``repeats``)
        peer = peer_found(view, trainer, msg.step)
        trainer.refused_at = now
        trainer.nonfinite_step = min(msg.step, msg.step if trainer.nonfinite_step is None else trainer.nonfinite_step)
        trainer.last_report = ("nonfinite", msg.step)
        fields = {"pid": msg.pid, "step": msg.step, "epoch": msg.epoch, "batch": msg.batch, "what": msg.what}
        if peer is not None:  # the group's finding, reported by a peer first: its record, counted once (repeats 0)
            return [Report(Event.NONFINITE_DETECTED, {**fields, "repeats": 0, "peer": peer.pid})]
        view.findings.nonfinite += 1
        return [Report(Event.NONFINITE_DETECTED, {**f, "peer": None})
                for f in detected(view.nonfinite_log, msg.pid, fields, now)]
    out = [Report(Event.NONFINITE_DETECTED, {**f, "peer": None})
           for f in ended(view.nonfinite_log)]  # acted on: the next one is a first
    if isinstance(msg, RolledBack):
        view.rollbacks += 1
        if msg.group:  # a trainer group's rollback in place: its members' reports of the step are settled by it
            view.findings.group_in_place += 1
            for m in members(view, trainer):
                m.nonfinite_step, m.last_report = None, None
        trainer.rolled_back(msg.step - msg.restored_step, msg.restore_secs)  # goodput: re-done steps, a restore
        return out + [Report(Event.ROLLED_BACK, {"pid": msg.pid, "step": msg.step, "restored_step": msg.restored_step,
                                                 "source": _plain(msg.source), "path": msg.path, "skip": msg.skip,
                                                 "secs": round(msg.restore_secs, 4), "epoch": msg.epoch,
                                                 "batch": msg.batch, "group": msg.group})]
    if msg.step not in view.skipped_steps:
        view.skipped_steps = sorted([*view.skipped_steps, msg.step])
    return out + [Report(Event.STEP_SKIPPED, {"pid": msg.pid, "step": msg.step, "epoch": msg.epoch, "batch": msg.batch,
                                              "skipped": len(view.skipped_steps)})]


def _spike(view: RunView, msg: SpikeDetected | SpikeReplayed, slot: Optional[str]) -> list[Report]:
    """A loss spike (issue 68), as the trainer tells it: a lifecycle record each (a spike is one
    finding, said once by the trainer that judged it; its replay's verdict, its rollbacks and skips
    come as their own), tallied in :attr:`RunView.findings`; a transient fault that makes its host
    suspect (rules/findings) is also a ``host_suspect`` record and a line, once a host. A trainer group's
    chief under ``rollback`` asks for the group's rollback past it (exit 5): its onset is the step that
    rollback skips (``nonfinite_step``, as a non-finite step's)."""
    trainer = _trainer(view, msg.pid, slot)
    if trainer is None:
        return []
    found = view.findings
    if isinstance(msg, SpikeDetected) and msg.action == "rollback" and trainer.role == TRAINER \
            and len(members(view, trainer)) > 1:  # a group's chief asks for the group's rollback past the onset
        trainer.last_report = ("spike", msg.onset)
        trainer.nonfinite_step = min(msg.onset, msg.onset if trainer.nonfinite_step is None else trainer.nonfinite_step)
    if isinstance(msg, SpikeReplayed):
        out = [Report(Event.SPIKE_REPLAYED, {"pid": msg.pid, "step": msg.step, "onset": msg.onset,
                                             "reproduced": msg.reproduced, "loss": msg.loss,
                                             "replay_loss": msg.replay_loss, "host": msg.host,
                                             "differs_at": msg.differs_at})]
        if found.replayed(msg.host, msg.reproduced, msg.differs_at is not None):
            n = found.transient[msg.host]
            out.append(Report(Event.HOST_SUSPECT, {"host": msg.host, "faults": n, "limit": found.suspect_after,
                                                   "step": msg.step},
                              say=f"procsv: host {msg.host} is suspect: {n} transient fault(s) in this launch (loss "
                                  f"spikes that did not come again when replayed, the last at step {msg.step}; "
                                  f"--suspect-after {found.suspect_after}); reported only, nothing is excluded "
                                  "or stopped", err=True))
        return out
    found.spiked(SpikeSeen(msg.step, msg.onset, msg.loss, msg.threshold, msg.median, msg.action))
    return [Report(Event.SPIKE_DETECTED, {"pid": msg.pid, "step": msg.step, "onset": msg.onset, "loss": msg.loss,
                                          "threshold": msg.threshold, "median": msg.median, "action": msg.action,
                                          "epoch": msg.epoch, "batch": msg.batch})]


def _loading(view: RunView, msg: ServiceLoading, now: float) -> list[Report]:
    """A service loads what it needs (TensorFlow: a variant tensor), before its Hello or a commit: the
    stall rule leaves it alone meanwhile and counts its window from when it is loaded (readiness)."""
    child = view.children.get(msg.role)
    if child is None or child.pid != msg.pid or not child.live:
        return []
    if not msg.done:
        child.loading_since = now
        return []
    child.loading_since = None
    if child.state == ProcState.RUNNING:
        child.running_at = now
    return [Report(say=f"procsv: the {msg.role} service loaded {msg.what} in {msg.secs:.1f} s (its checkpoints "
                       "need it); its stall window counts from now")]


def _overdue(view: RunView, msg: SaveOverdue, now: float, stops: Sequence[Stop] = ()) -> list[Report]:
    """The trainer gave up waiting for a snapshot's result: the checkpoint service is stuck (rule 7).
    Also while the service says it is loading what that commit needs: a load that makes progress
    sends the trainer CommitLoading (slow, not dead: no SaveOverdue), so one comes only from a load
    that stopped (SIGSTOP, a deadlocked import, a stalled filesystem). Not when the job's suspension
    explains the wait: without the seconds the watchdog was stopped with it (``stops``) that the trainer's
    clock did not leave out already (``stopped_secs``: an injected clock leaves none out) it is within the
    deadline (said; the service's stall window still applies)."""
    child = _trainer(view, msg.pid)
    if child is None:
        return []
    if _suspended_wait(msg.waited_secs, msg.stopped_secs, msg.deadline_secs, now, stops):
        return [_not_overdue(f"the snapshot of step {msg.step}", msg.waited_secs, msg.stopped_secs, now, stops)]
    child.save_overdue = (f"the snapshot of step {msg.step} had no result within {msg.deadline_secs:.1f} s "
                          f"(waited {msg.waited_secs:.1f} s)")
    view.failed_saves += 1
    return []


def _summary_overdue(view: RunView, msg: SummaryOverdue, now: float, stops: Sequence[Stop] = ()) -> list[Report]:
    """The summary service confirmed none of the trainer's batches within the deadline. Only about
    a summary service that has run for a whole deadline since its Hello (the batch may have gone to the one
    before, whose replacement asks for it again within a heartbeat of its start), and whose wait the job's
    suspension does not explain (as :func:`_overdue`)."""
    if _trainer(view, msg.pid) is None:
        return []
    if _suspended_wait(msg.waited_secs, msg.stopped_secs, msg.deadline_secs, now, stops):
        return [_not_overdue(f"the summaries of step {msg.step}", msg.waited_secs, msg.stopped_secs, now, stops)]
    service = view.children.get(SUMMARY)
    if service is None or service.state != ProcState.RUNNING or service.running_at is None \
            or now - service.running_at < msg.deadline_secs:
        return []
    view.summary_overdue = (f"the summaries of step {msg.step} had no answer within {msg.deadline_secs:.1f} s "
                            f"(waited {msg.waited_secs:.1f} s)")
    view.summary_overdue_for = service.attempt
    return []


def _left_out(waited: float, stopped: float, now: float, stops: Sequence[Stop]) -> float:
    """Of a child's wait of ``waited`` seconds on its clock, which left ``stopped`` seconds of its own stops out
    already, the seconds of the watchdog's stops in it still to leave out (the child's clock was not watched, or
    the watchdog was stopped longer)."""
    return max(0.0, stopped_within(stops, now, waited + stopped) - stopped)


def _suspended_wait(waited: float, stopped: float, deadline: float, now: float, stops: Sequence[Stop]) -> bool:
    """A child's wait of ``waited`` seconds (its clock, without the ``stopped`` seconds it left out) passed its
    ``deadline`` only for the watchdog's stops in it (the job suspended: the child, stopped too, could not be
    answered meanwhile)."""
    return waited - _left_out(waited, stopped, now, stops) < deadline


def _not_overdue(what: str, waited: float, stopped: float, now: float, stops: Sequence[Stop]) -> Report:
    return Report(say=f"procsv: {what} waited {waited:.1f} s for its answer, {_left_out(waited, stopped, now, stops):.1f}"
                      " s of it while this launch was stopped: not overdue")


def attempt_began_wall(child: ChildView, launch_wall: float, wall_now: float, clock_now: float,
                       stopped: float = 0.0) -> float:
    """When ``child``'s attempt began (its spawn or promotion), on the wall clock the manifests'
    ``committed_at`` is on: only a manifest committed since then can be its commit. (Since the
    launch began was not enough: an earlier attempt's commit that the next attempts skip, say as
    unreadable, was then every later attempt's progress, and the run never gave up.) ``stopped``: the
    seconds the watchdog's clock left out since (its stops: ``WatchedClock.unwatched_since``), which
    the wall clock counted."""
    return max(launch_wall, wall_now - (clock_now - child.started) - stopped)


def unheard_floor(child: ChildView) -> int:
    """At a trainer's death: a manifest on disk above this step (committed since the launch began)
    is a commit of its attempt the watchdog has not heard of yet. Read at every death, also of an
    attempt already known to have made progress: its newest commit's notice may be the late one."""
    return max(child.commit_base, child.commit_seen)


def committed_on_disk(view: RunView, slot: str, attempt: int, step: int) -> None:
    """At a trainer's death: ``step`` was committed (a manifest on disk, since the launch began)
    while the watchdog has not heard of it yet. The checkpoint service tells the watchdog after
    the commit, and the trainer that waited for that commit may die before the notice is read:
    its progress must not be missed for it (the restart policy would count a failure without
    progress, and give up on a run that checkpoints every time it crashes)."""
    child = find(view, slot, attempt)
    if child is not None:
        child.commit_seen = max(child.commit_seen, step)
    view.commit_step = max(view.commit_step, step)  # the next attempt's base: the notice read later is not its progress


def end_came(view: RunView, slot: str, attempt: int, now: float) -> None:
    """A child's exit or death notice came in; what is read at its end (:mod:`procsv.watchdog.endreads`)
    is not back yet. Until :func:`death_noticed` or :func:`reaped` it is not judged hung, nor are the
    members of its group (rule 4): it is known to be dead."""
    child = find(view, slot, attempt)
    if child is not None and child.ending_at is None:
        child.ending_at = now


def death_noticed(view: RunView, slot: str, attempt: int, at: float, wall: float,
                  error: Optional[ChildError] = None) -> list[Report]:
    """The trainer's death notice (its mutex's owner died): an unclean death, before the reap.

    ``error``: its error file, if it wrote one (a restart cannot cure some exceptions: the decision
    then waits for the exit status instead of restarting at once; the same failure again gives up).
    """
    child = find(view, slot, attempt)
    if child is None or child.reaped or child.noticed_dead_at is not None:
        return []
    child.noticed_dead_at = at
    child.noticed_wall = wall
    child.noticed = error
    child.ended_at = at
    return [Report(Event.DEATH_NOTICED, {"role": _role(child), "attempt": attempt, "pid": child.pid, "noticed": wall})]


def reaped(view: RunView, slot: str, attempt: int, failure: Failure, now: float) -> list[Report]:
    """A child's exit status is known (``failure`` describes it, whatever the code)."""
    child = find(view, slot, attempt)
    if child is None or child.reaped:
        return []
    child.failure = failure
    if child.ended_at is None:
        child.ended_at = now
    noticed = child.noticed_wall if child.noticed_wall is not None else failure.time
    out = [Report(Event.NONFINITE_DETECTED, {**f, "peer": None})
           for f in (ended(view.nonfinite_log) if view.nonfinite_log.pid == child.pid
                     else [])]  # its last detections' record, if unwritten
    if child.role in (TRAINER, WORKER):  # every member that steps: its task's own breakdown (procsv.goodput)
        out.append(Report(Event.TRAINED, child.trained(now, failure.time)))
    out.append(Report(Event.EXITED, {"role": _role(child), "attempt": attempt, "pid": child.pid, "noticed": noticed,
                                     **failure.fields()}))
    if child.settled_early and child.group_rollback is None and not child.regroup:  # restarted on its death notice already: say how it
        # died, now that we know (a group's rollback said what it was when it restarted the group)
        view.last_error = blame(view, child).headline()  # in a group: the member whose end broke it
        out.append(Report(say=f"procsv: {view.last_error}; restarted (restart {view.history.restarts})", err=True))
    elif (view.stop_signal is not None or view.finishing) and failure.code != 0 and failure.error is not None \
            and child.role not in (WORKER, STANDBY):  # a group's worker fails in a collective once its chief
        # stopped, and a standby group's member in its run of the step on shadows once its peers were: expected
        # stopped in order, yet it ended on an exception of its own: the program's side of the story
        out.append(Report(say=f"procsv: while stopping, {failure.headline()}", err=True))
    return out


def logdir_lost(view: RunView, reason: str) -> None:
    """The logdir is no longer the directory the run started in (deleted, moved away, replaced).

    Only the first reason is kept; decision rule 9 stops the run, and its action says so.
    """
    if view.logdir_lost is None:
        view.logdir_lost = reason


def stop_requested(view: RunView, signum: int, now: float, grace: float) -> list[Report]:
    first = view.stop_signal is None
    request_stop(view, signum, now, grace)
    name = signal.Signals(signum).name
    if first:
        return [Report(Event.PREEMPTED, {"signal": name},
                       say=f"procsv: {name} received, asking the trainer to checkpoint and stop (up to {grace:g} s)")]
    if signum == signal.SIGINT:
        return [Report(say="procsv: second interrupt, killing the run now")]
    return []


ZYGOTE_STEADY_SECS = 600.0  # a pre-warmed trainer ready this long before its loss starts the count of losses again


def zygote_changed(view: RunView, state: ZygoteState, pid: int, import_secs: float = 0.0,
                   why: str = "", now: Optional[float] = None) -> list[Report]:
    """The pre-warmed trainer became ready, or was lost, at ``now`` (``why``: the line to say, if
    any). Losses count in a row unless the lost one had stayed ready ``ZYGOTE_STEADY_SECS``: one
    that becomes ready and is lost again soon (an OOM kill each time) is not restarted forever."""
    if view.zygote == state:
        return []
    view.zygote = state
    if state == ZygoteState.READY:
        view.zygote_ready_at = now
        return [Report(Event.ZYGOTE_READY, {"pid": pid, "import_secs": round(import_secs, 3)})]
    if state == ZygoteState.LOST:
        ready_at = view.zygote_ready_at
        steady = ready_at is not None and now is not None and now - ready_at >= ZYGOTE_STEADY_SECS
        view.zygote_losses = 1 if steady else view.zygote_losses + 1
        view.zygote_lost_at, view.zygote_ready_at = now, None
        return [Report(Event.ZYGOTE_GONE, {"pid": pid}, say=why, err=True)]
    return []


def _role(child: ChildView) -> str:
    """The role records name: a group's worker (a standby group's member, a group's auditor) by its task, ``worker1``
    (``standby1``, ``auditor1``), as its ``spawned`` record does."""
    return child.slot if child.role in (WORKER, STANDBY, AUDITOR) else child.role


def node_hello(view: RunView, msg: NodeHello, now: float) -> list[Report]:
    """Another host's agent beat (``--nnodes``): it joined, came back, or is still there."""
    node = view.nodes.setdefault(msg.node, NodeView(msg.node))
    back = node.last_beat is None or node.lost_at is not None
    if not back and node.last_beat is not None:  # (rule 12's detector learns the gaps of a connected agent only)
        node.gaps = [*node.gaps[1 - GAPS_KEPT:], now - node.last_beat]
    if msg.probe != node.probe:
        node.probe, node.probe_ok = msg.probe, False  # (a new agent: its port is proven again)
    # (a hello that says its agent hears nothing from node 0 keeps the probes sent since it first said so: their
    # answer, or its lack, is what tells a one-way cut from a late beat, rules.hosts.one_way_cut; its silence counted
    # from the last probe the host's kernel answered, if later: node 0's frames reached the host then, and the agent's
    # connection waits out its TCP's retransmission, as after a blip both ways)
    reached = node.waits.reached
    deaf = not back and min(msg.deaf, now - reached if reached is not None else msg.deaf) >= DEAF_SECS
    node.waits.deaf, node.waits.deaf_from = msg.deaf, (node.waits.deaf_from if node.waits.deaf_from is not None else now) if deaf else None
    node.unanswered = [s for s in node.unanswered if node.waits.deaf_from is not None and s >= node.waits.deaf_from]
    node.reset_at = None
    node.host, node.pid, node.addresses, node.live, node.last_beat = msg.host, msg.pid, list(msg.addresses), \
        list(msg.live), now
    kept = None if back else node.ready_at  # (a new agent: its own pre-warmed trainer)
    node.ready_at = kept if kept is not None or not msg.ready else now
    if not back or msg.live:  # (live: it still runs members of an old group; it stops them first, as an
        return []  # agent that lost us does)
    node.lost_at, node.joined_at = None, now
    return [Report(Event.NODE_JOINED, {"node": msg.node, "host": msg.host, "pid": msg.pid, "link": msg.link},
                   say=f"procsv: node {msg.node} ({msg.host}, agent pid {msg.pid}) joined")]


def starts_waiting(view: RunView, node: int, asked_at: Optional[float], members: list[str]) -> None:
    """The oldest start node 0 asked of host ``node``'s agent that no ``MemberStarted`` answered yet: first sent at
    ``asked_at`` (None: none waits), for ``members`` (``slot.attempt``); rule 12 bounds the wait
    (:func:`~procsv.watchdog.rules.hosts.start_unanswered`)."""
    n = view.nodes.get(node)
    if n is not None:
        n.waits.asked_at, n.waits.asked = asked_at, list(members)


def suspended(stops: list[Stop], total: float) -> list[Report]:
    """The watchdog's own process was stopped (``stops``: those its clock subtracted since the last round; ``total``:
    the seconds of all so far): one record and line each."""
    return [Report(Event.SUSPENDED, {"secs": round(s.secs, 3), "total": round(total, 3)},
                   say=f"procsv: this launch was stopped for {s.secs:.1f} s (SIGSTOP, then SIGCONT: a suspended job?); "
                       "its timers leave that time out")
            for s in stops]


def resumed(view: RunView, now: float) -> None:
    """Node 0's loop turns again at ``now`` after a stall of its own (a round ``OWN_STALL_SECS`` or more after the one
    before, on the watched clock: blocked or descheduled, a stop being left out of that clock; the agents' beats queued
    meanwhile are read a moment after): rule 12's
    ``--node-timeout`` bound counts each host's silence from now (:func:`~procsv.watchdog.rules.hosts.host_actions`)."""
    for n in view.nodes.values():
        n.watched_from = now


def probe_sent(view: RunView, node: int, sent: float) -> None:
    """Node 0 probed ``node``'s host at ``sent`` (rule 12's :func:`~procsv.watchdog.rules.hosts.probes_due`;
    the prober's clock once the handshake's first packet was out)."""
    n = view.nodes[node]
    n.probed_at = sent
    n.unanswered.append(sent)


def probes_looked(view: RunView, looked_at: float, answers: list[tuple[int, float, bool]]) -> None:
    """Node 0 looked for the answers to its probes at ``looked_at`` (its clock before it looked): ``answers``,
    ``(node, sent, handshake)`` (the probe sent at ``sent`` answered: ``handshake``, its agent's port accepted;
    else a reset: the host is up, its agent's port closed). A probe still out then went unanswered at least
    ``looked_at`` minus its send: what rule 12 counts, whenever node 0 decides after."""
    for node, sent, handshake in answers:
        n = view.nodes[node]
        n.unanswered = [s for s in n.unanswered if s > sent]
        n.probe_ok = n.probe_ok or handshake
        if handshake:  # (node 0's frames reach the host: no one-way cut since the agent's word, rules.hosts.one_way_cut)
            n.waits.reached = max(sent, n.waits.reached if n.waits.reached is not None else sent)
            if n.waits.deaf_from is not None and sent >= n.waits.deaf_from:
                n.waits.deaf_from = None
        if not handshake and n.last_beat is not None and sent > n.last_beat:  # (no agent listens since its last beat)
            n.reset_at = sent
    for n in view.nodes.values():
        n.looked_at = looked_at


def members_stopped(view: RunView, slots: set[str]) -> None:
    """Which members of this host are stopped (SIGSTOP) now: rule 4 signals those first."""
    for c in view.trainers() + workers(view):
        c.stopped = c.slot in slots


def stacks_back(view: RunView, slot: str, attempt: int, where: dict[str, str], culprit: str, path: str) -> None:
    """The stacks taken for ``slot``'s attempt judged hung are back (written to ``path``, or failed: the
    file says why): rule 4 signals it now, or the member they blame. ``where``: each member's main
    thread's innermost frame, by slot; ``culprit``: the group's member the stacks blame ("" if none),
    which is given the same record."""
    child = find(view, slot, attempt)
    if child is None or child.hang.stacks_asked_at is None:
        return
    blamed = find(view, culprit, attempt) if culprit else None
    for c in [child] + ([blamed] if blamed is not None and blamed is not child else []):
        c.hang = HangView(stacks_asked_at=child.hang.stacks_asked_at, reason=child.hang.reason, stacks_in=True,
                          where=where.get(c.slot, ""), culprit=culprit, stacks=path, samples=c.hang.samples,
                          quiet_max=c.hang.quiet_max, judged_max=c.hang.judged_max, stuck_for=child.hang.stuck_for)


def member_looked(view: RunView, msg: MemberLooked, now: float, limits: HangLimits) -> None:
    """A node agent's look at its member (:class:`MemberLooked`), kept as a look of this host's, at ``now``:
    the time it arrived (the hosts' clocks differ; the link adds milliseconds)."""
    looked_at(view, msg.slot, msg.attempt, Activity(now, msg.cpu, msg.io, msg.woke, msg.state, msg.syscall,
                                                    msg.kids_cpu, msg.kids_io), limits)


def looked_at(view: RunView, slot: str, attempt: int, sample: Activity, limits: HangLimits) -> None:
    """A look at ``slot``'s attempt from outside (its CPU, I/O, main thread): kept as long as the stuck
    rule may read it (:func:`looks_kept`)."""
    child = find(view, slot, attempt)
    if child is not None:
        keep = looks_kept(view, limits)
        kept = [a for a in child.hang.samples if a.at >= sample.at - keep]
        child.hang.samples = kept + [sample]
