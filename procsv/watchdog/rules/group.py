"""Rule 11 of the decision function: a group of trainers (``procsv launch --nproc N``) lives and dies together.

Runs in the watchdog. Pure: reads the observed :class:`~procsv.watchdog.rules.state.RunView`, the
time ``now`` passed in and the :class:`~procsv.watchdog.rules.limits.Limits`; returns actions.

A ``tf.distribute`` worker group cannot outlive one of its members: when a worker dies the
others fail in their next collective and can never continue, and a restarted worker alone
cannot rejoin them (``../shared/reference/tf-distribute-facts.md``). So the group is the unit
of an attempt: the chief (task 0) holds the ``trainer`` slot and is the attempt the restart
policy judges; the other tasks hold ``worker<R>`` slots with the chief's attempt number.

- The first member whose end breaks the group -- the chief ending in any way, or a worker
  dying or exiting with a non-zero code (a worker that finished cleanly breaks nothing: the
  chief finishes too) -- is the group's *breaker*; :func:`blame` names it, and the chief's
  judgement (:mod:`procsv.watchdog.rules.judge`) uses its exit code, error and hang.
  A member found hung, else one that stopped on diverging training (exit code 4, or 5: it asked for
  the group's rollback, and :func:`rollback_step` is the first step a member reported), is blamed before
  the breaker: its peers' failures in their next collective are its consequence, and their ends
  may come in first (the chief's attempt waits for the exit status of a member that reported a
  non-finite step: :func:`reporter_unreaped`). A chief that exited 0 is judged by itself, unless a
  member reported a non-finite step and stopped on it: a worker whose own loss of the last step is
  non-finite finds it at its end, after the chief committed its final checkpoint (which checks the
  chief's losses only), and asks for the group's rollback or stops it as diverging. So a chief's 0 is
  judged only once the other members ended on their own, up to the stop grace after the chief's end,
  with nothing sent to them meanwhile (:func:`awaits_own_ends`): that end may come after the program's
  own wind-down, and a SIGTERM before it would cut its check.
- Likewise a member *cut off* (:func:`cut_off`: killed by a signal the watchdog did not send, the
  OOM killer's or a user's SIGKILL, or its host lost) is blamed before a breaker that failed in a
  collective (:data:`PEER_ERRORS`: ``UnavailableError`` and the like), as soon as its end is known.
  Node 1's agent's report of its member's end (or ``node_lost``) often comes in after the chief's own
  collective failure, which is judged at once (the restart waits for no other host): when it comes in
  after that judgement, :func:`late_breaker` names it, and the watchdog records it as the attempt's
  breaker (the ``breaker`` record) in place of the one judged.
- Every other live member then gets SIGTERM (cause ``group``), and SIGKILL after
  ``group_grace_secs``: a survivor can only fail in its next collective. With a standby group ready
  to be promoted (:mod:`procsv.watchdog.rules.standby`) it is SIGKILLed at once (cause ``group_now``):
  the next group restores the members' in-memory copies, not what a survivor would save; but not in
  a rollback (:func:`rolling_back`): a survivor checks its kept losses on its way out, and its first
  non-finite step may be the group's (a NaN in its batch whose gradient reached every member). A member
  whose death notice came in is dead already and gets neither (the chief's judgement may restart
  it in the same decision).
- The next attempt starts all N together, only once every member of the last one is reaped
  and settled (:func:`draining`): its ports are free and no old process can join the new group.
- Rule 4 in a group (:func:`hung_first`): members silent at once are judged one at a time; one
  capture of every member's stacks is taken, for the first judged, and the member they blame (not
  inside TensorFlow while its peers wait there: :func:`procsv.watchdog.stacks.capture.culprit`) is the one
  signalled hung.

One concern: the trainer group as the unit of an attempt (who broke it, who is hung, who is stopped with it).
"""

from __future__ import annotations

import math
import signal
from typing import Any, Optional, TypeGuard, Union

from procsv.common.exitcodes import DIVERGING_ERROR, EXIT_DIVERGING, EXIT_GROUP_ROLLBACK, GROUP_ROLLBACK_ERROR
from procsv.watchdog.rules.actions import Action, Cause, Kill, Signal, TakeStacks
from procsv.watchdog.rules.hang import stacks_asked
from procsv.watchdog.rules.failures import killed_from_outside
from procsv.watchdog.rules.lifecycle import ProcState
from procsv.watchdog.rules.state import TRAINER, WORKER, ChildView, RunView


# the errors a member meets in its next collective once a peer is gone (tf-distribute-facts): the
# consequence of another member's end, never a cause of their own while a member was cut off
PEER_ERRORS = frozenset({"UnavailableError", "AbortedError", "CancelledError", "DeadlineExceededError"})
HOST_LOST = "HostLost"  # the error a member of a lost host is given (rule 12: procsv.watchdog.rules.bookkeeping)
NOT_STARTED = "NotStarted"  # ... and a member asked of another host, unanswered when a stop came (StartsDropped)


def worker_slot(rank: int) -> str:
    """The slot (and the log and error file name) of task ``rank`` >= 1 of the group."""
    return f"worker{rank}"


def rank_of(slot: str) -> int:
    """The task of a member's slot: 0 for the chief's ``trainer``, R for ``worker<R>``; a standby's too
    (:mod:`procsv.watchdog.rules.standby`): 0 for ``standby``, R for ``standby<R>``."""
    return int("".join(c for c in slot if c.isdigit()) or 0)


def group_state(view: RunView) -> str:
    """The group as ``procsv status`` shows it: ``starting`` (not every member has taken a step),
    ``running``, ``restarting`` (a member ended: the rest are being stopped, or the next group is
    due), or the run's own state once it is decided."""
    if view.finishing:
        return view.run.value
    chief = view.children.get(TRAINER)
    if chief is None:
        return "starting"
    if view.restart_at is not None or breaker(view, chief) is not None:
        return "restarting"
    return "running" if all(m.first_step_at is not None for m in members(view, chief)) else "starting"


def workers(view: RunView) -> list[ChildView]:
    """The workers' current attempts (task 1, 2, ...)."""
    return [c for c in view.children.values() if c.role == WORKER]


def members(view: RunView, chief: ChildView) -> list[ChildView]:
    """The chief's attempt and the workers started with it (with ``--ps`` the chief alone: rule 14)."""
    return [chief] + [w for w in workers(view) if w.attempt == chief.attempt and not view.tasks_alone]


def breaks(child: ChildView) -> bool:
    """Whether this member's end breaks its group: the chief's end, or a worker's unclean end."""
    if not child.reaped and child.noticed_dead_at is None:
        return False
    return child.role == TRAINER or not child.reaped or child.exit_code != 0


def breaker(view: RunView, chief: ChildView) -> Optional[ChildView]:
    """The member whose end broke the chief's attempt first (None: the group is whole)."""
    return _first_ended([m for m in members(view, chief) if breaks(m)])


def blame(view: RunView, chief: ChildView) -> ChildView:
    """The member whose end the chief's attempt is judged and reported by: the member found hung
    first, else a member that stopped on non-finite training (:func:`diverged_member`), else the
    breaker, else the chief.

    A chief that exited 0 is judged by itself (a worker failing after the last step lost nothing),
    unless a member stopped on non-finite training: a worker that found its own loss of the last step
    non-finite at its end (the chief's final checkpoint checks the chief's losses only, and may have
    committed that step) asks for the group's rollback (exit 5) or stops it as diverging (exit 4); the
    chief's 0 says nothing of that step."""
    if chief.role != TRAINER:
        return chief
    if chief.broken_by is not None:  # recorded when it was judged: the next group may hold the slots now
        return chief.broken_by
    if chief.reaped and chief.exit_code == 0:  # (a member's own exit 4 or 5 with no step reported: after the end)
        return diverged_member(view, chief, reported=True) or chief
    hung = [m for m in members(view, chief) if m.hang.cause]
    if hung:  # a member found hung is the cause, whoever ended first (its peers failed waiting for it)
        return min(hung, key=lambda m: m.signalled_at if m.signalled_at is not None else math.inf)
    diverged = diverged_member(view, chief)
    if diverged is not None:  # a member that stopped on non-finite training is the cause, whoever's end came in
        # first: its peers failed in their next collective when it left, and their deaths can be noticed before its exit
        return diverged
    first = breaker(view, chief)
    if first is not None and error_type(first) in PEER_ERRORS:
        return first_cut_off(view, chief) or first
    return first or chief


def diverged_member(view: RunView, chief: ChildView, reported: bool = False) -> Optional[ChildView]:
    """The member of the chief's attempt that stopped on non-finite training (:func:`diverging`) the
    chief's attempt is judged by (None: none did; ``reported``: only one that reported a non-finite
    step counts). A member that asked for the group's rollback (exit 5) before one that stopped alone
    (exit 4): a NaN in one member's batch at a group snapshot step makes a peer's weights non-finite
    with its own losses finite there ("the step that made them so is not known": exit 4), while the
    member whose batch it was knows the step; of those that asked, the one that reported the step
    skipped (:func:`rollback_step`: its message says that step), else the first whose end came in;
    with none that asked, the one that found the earliest step, the chief on a tie (:func:`_first_found`)."""
    stopped = [m for m in members(view, chief) if diverging(m) and (not reported or m.nonfinite_step is not None)]
    asked = [m for m in stopped if not _diverged_alone(m)]
    step = rollback_step(view, chief)
    return _first_ended([m for m in asked if m.nonfinite_step == step]) or _first_ended(asked) \
        or _first_found(stopped)


def error_type(member: ChildView) -> str:
    """The exception a member's error file named ("" if none): read at its exit, else at its death notice."""
    if member.failure is not None:
        return member.failure.error.type if member.failure.error is not None else ""
    return member.noticed_error


def cut_off(member: ChildView) -> bool:
    """Whether this member was cut off from its group from outside: killed by a signal another process
    sends (SIGKILL, SIGTERM, ...: :data:`~procsv.watchdog.rules.failures.OUTSIDE_SIGNALS`) that is not
    the group's stop the watchdog sent it, or its host was found lost. The group's stop: a member of
    another host is cut off if its agent says no signal of the watchdog reached it alive
    (:attr:`~procsv.watchdog.rules.failures.Failure.signalled`); one of this host, if it died of a
    signal the watchdog did not send it (SIGKILL with none sent, or one sent only SIGTERM: the group's,
    a hang's, or the run's stop's when it ends or gives up; a chaos SIGKILL counts, it is procsv's own cut)."""
    if not member.reaped:
        return False  # a death notice alone does not say how
    if error_type(member) == HOST_LOST:
        return True
    code = member.exit_code
    if not killed_from_outside(code):
        return False
    if member.failure is not None and member.failure.signalled is not None:
        return not member.failure.signalled
    if member.killed:
        return False  # the watchdog's SIGKILL, as far as this host can tell
    return (member.signalled_at is None and member.stop_sent_at is None) or code == -signal.SIGKILL


def first_cut_off(view: RunView, chief: ChildView) -> Optional[ChildView]:
    """The member of the chief's attempt cut off first (:func:`cut_off`; None: none was)."""
    return _first_ended([m for m in members(view, chief) if cut_off(m)])


def _first_found(ms: list[ChildView]) -> Optional[ChildView]:
    """Of members that stopped alone (exit 4), the one that reported the earliest non-finite step (the
    step a member found is the cause; a peer's later step is its consequence), the chief on a tie (both
    found the same step in the same batch: the chief's line names the newest finite checkpoint, a
    worker's none), else the first whose end came in (None: ``ms`` is empty). Which end came in first
    is a race between the members' own wind-downs and says nothing of the cause."""
    def key(m: ChildView) -> tuple[float, int, float]:
        found = m.nonfinite_step if m.nonfinite_step is not None else math.inf
        return found, 0 if m.role == TRAINER else 1, m.ended_at if m.ended_at is not None else math.inf

    return min(ms, key=key, default=None)


def _first_ended(ms: list[ChildView]) -> Optional[ChildView]:
    """The one of ``ms`` whose end came in first (None: ``ms`` is empty)."""
    return min(ms, key=lambda m: m.ended_at if m.ended_at is not None else math.inf, default=None)


def late_breaker(view: RunView, chief: ChildView) -> Optional[ChildView]:
    """A member of the chief's attempt, judged already (:attr:`ChildView.broken_by`) by a breaker that
    failed in a collective, found cut off since (its end came in after the judgement: another host's
    agent's report, or its host lost): the attempt's true breaker, to be recorded in place of the one
    judged (None: nothing to correct). Pure, like :func:`blame`."""
    judged = chief.broken_by
    if chief.role != TRAINER or judged is None or error_type(judged) not in PEER_ERRORS or cut_off(judged):
        return None
    if any(m.hang.cause or diverging(m) for m in members(view, chief)):
        return None  # blamed before a member cut off (a hung member's peers are stopped by the watchdog)
    found = first_cut_off(view, chief)
    return found if found is not None and found is not judged else None


def diverging(member: ChildView) -> bool:
    """Whether this member stopped on its own because its training diverged (exit code 4, or its
    error file names ``TrainingDiverged``) or to ask for the group's rollback (5, ``GroupRollback``)."""
    return (member.reaped and member.exit_code in (EXIT_DIVERGING, EXIT_GROUP_ROLLBACK)) \
        or member.noticed_error in (DIVERGING_ERROR, GROUP_ROLLBACK_ERROR)


def rollback_step(view: RunView, chief: ChildView) -> Optional[int]:
    """The first step any member of the chief's attempt reported non-finite (None: none did, or the
    trainer is alone, not a group of two or more: a lone trainer rolls back in place and never asks for
    a group's rollback, so its exit 5 is its program's own, a failure like any other): the step its
    group's rollback skips, however many members found it."""
    group = members(view, chief)
    steps = [m.nonfinite_step for m in group if m.nonfinite_step is not None]
    return min(steps) if steps and len(group) > 1 else None


def rolling_back(view: RunView, chief: ChildView) -> bool:
    """Whether a member of the chief's group (of two or more) reported a non-finite step, or ended
    asking for the group's rollback (exit 5, ``GroupRollback``: its report may come in after its end)."""
    group = members(view, chief)
    return len(group) > 1 and any(m.nonfinite_step is not None or (diverging(m) and not _diverged_alone(m))
                                  for m in group)


def _diverged_alone(member: ChildView) -> bool:
    """A member that stopped with exit 4 (``TrainingDiverged``): no rollback asked."""
    return (member.reaped and member.exit_code == EXIT_DIVERGING) or member.noticed_error == DIVERGING_ERROR


def reporter_unreaped(view: RunView, chief: ChildView) -> bool:
    """Whether the chief's attempt waits before it is judged: a member of its group (of two or more)
    reported a non-finite step, and a member has not ended yet (neither reaped nor noticed dead). The group's rollback skips the
    first step any member reports (:func:`rollback_step`), and that is known only once every member
    ended: a NaN in one member's batch whose gradient all-reduced into every member's weights makes
    the others' losses non-finite one step later, and a member that found its own at a later check
    than the chief's (a worker checks at the group's snapshot steps and at its end; the chief at its
    checkpoints too) reports it on its way out, once the chief left. And a reporter's exit status
    (5: it asks for the group's rollback) may come in after a peer's end or the chief's death notice:
    they fail in their next collective when it leaves, and their ends say nothing of the step."""
    group = members(view, chief)
    if len(group) < 2 or all(m.nonfinite_step is None for m in group):
        return False
    return any((m.nonfinite_step is not None and not m.reaped)  # its exit status says whether it asks
               or (not m.reaped and m.noticed_dead_at is None) for m in group)  # (a death notice: it says no more)


def awaits_own_ends(view: RunView, chief: ChildView, now: float, bound: float) -> bool:
    """Whether the chief's attempt, its chief having exited 0, waits before it is judged for the rest of
    its group (of two or more) to end on their own: a member has neither been reaped nor noticed dead, and
    less than ``bound`` seconds passed since the chief's end. Meanwhile the watchdog sends the members
    nothing (:func:`group_actions`). Not during a stop (rule 2 stops the workers once the chief ended).

    A worker checks the losses it kept since its last check at its session's end
    (:func:`procsv.trainer.nonfinite.policy.member_checks_at_end`), after whatever wind-down its program
    does after the loop, inside the session: its own non-finite loss of the group's last step is found
    there or nowhere, and the chief's 0 says nothing of it (its final checkpoint checks the chief's
    losses only). Judged at once, the chief's 0 ended the run before that report came in: ``rollback``'s
    exit 5 was only settled (the step stayed applied), and under ``stop`` the run's finishing SIGTERM
    reached the worker before its end, which then checked nothing (an end not of its own). Once its
    report came in, :func:`reporter_unreaped` waits for its exit status, and :func:`blame` picks it.

    The watchdog cannot tell the program's own ``on_nonfinite`` (the Supervisor's, when ``--on-nonfinite``
    is not given), so every group waits; an ordinary group's workers end within milliseconds of the
    chief, so the wait costs nothing then; one that never ends on its own (blocked in a collective the
    chief left) costs at most ``bound``, and is then stopped by the run's end (rule 6) as before."""
    if chief.role != TRAINER or not chief.reaped or chief.exit_code != 0 or view.stop_signal is not None:
        return False
    group = members(view, chief)
    if len(group) < 2 or (chief.ended_at is not None and now >= chief.ended_at + bound):
        return False
    return any(not m.reaped and m.noticed_dead_at is None for m in group)


def copy_held(view: RunView, rank: int, attempt: int, step: int) -> list[Any]:
    """The checkpoint service holds member ``rank``'s in-memory copy of ``step`` of ``attempt``
    (``GroupCopyHeld``): once every member of the chief's attempt has a copy of its held past the
    step it restored, that attempt made progress (:attr:`ChildView.made_progress`: the next group
    restores it, as it would a committed checkpoint). Nothing to record: an empty list of reports."""
    chief = view.children.get(TRAINER)
    if chief is None or chief.attempt != attempt or step <= chief.restored_step:
        return []  # (a dead attempt's copy; a copy of no step past its restore: no progress)
    chief.held_by_rank[rank] = max(step, chief.held_by_rank.get(rank, -1))
    if len(chief.held_by_rank) == len(members(view, chief)):
        chief.held_whole = min(chief.held_by_rank.values())
    return []


def group_actions(view: RunView, now: float, grace: float, at_once: bool, wait: float) -> list[Action]:
    """Rule 11: once a member broke the group, stop the rest (SIGTERM, SIGKILL after ``grace``;
    ``at_once``, a standby group being ready: SIGKILL now; a member already stopping for the run's stop:
    SIGKILL ``grace`` after the break); but nothing while a chief that exited 0 waits up to ``wait`` seconds
    for the others' own ends (:func:`awaits_own_ends`)."""
    chief = view.children.get(TRAINER)
    if chief is None or awaits_own_ends(view, chief, now, wait):
        return []
    first = breaker(view, chief)  # (a lone trainer, or a --ps chief, is a group of one: nobody else to stop)
    if first is None:
        return []
    out: list[Action] = []
    if at_once and rolling_back(view, chief):
        at_once = False  # a rollback: the survivors say, on their way out, the first step they found non-finite
    broke = first.ended_at if first.ended_at is not None else first.noticed_dead_at
    for m in members(view, chief):
        if m is first or not m.live or m.killed:
            continue
        dead = m.noticed_dead_at is not None  # (dead already, and its judgement may restart it in this very decision)
        if at_once and not dead:
            out.append(Kill(m.slot, m.attempt, Cause.GROUP_NOW, _why(first)))
        elif m.state in (ProcState.STARTING, ProcState.RUNNING) and not dead:
            out.append(Signal(m.slot, m.attempt, signal.SIGTERM, Cause.GROUP, _why(first)))
        elif m.signalled_at is not None and now >= m.signalled_at + grace:
            out.append(Kill(m.slot, m.attempt, Cause.GROUP, _why(first)))
        elif m.signalled_at is None and m.stop_sent_at is not None and broke is not None and not dead \
                and now >= broke + grace:
            # stopping for the run's stop (rule 2's SIGTERM came first) when the group broke: its orderly stop
            # waits for the broken member in a collective, so it gets rule 11's grace from the break, not the
            # stop's (120 s by default; TensorFlow ends such a wait only sometimes: a host lost as node 0 was
            # SIGTERMed left node 0 waiting in one of three runs, seen in a fresh-clone CI run; a member that never
            # started, asked of another host, breaks it the same way: the rest wait in their first collective)
            out.append(Kill(m.slot, m.attempt, Cause.GROUP, _why(first)))
    return out


def draining(view: RunView) -> bool:
    """A worker of the last attempt is not reaped and settled yet: the next group must wait."""
    return not view.tasks_alone and any(not w.reaped or not w.settled for w in workers(view))


def _why(first: ChildView) -> str:
    name = "the chief" if first.role == TRAINER else first.slot
    if _diverged_alone(first):  # (what follows is judged once every member ended: restarts_after)
        return f"{name} (pid {first.pid}) stopped on non-finite training (exit code {EXIT_DIVERGING})"
    return f"{name} (pid {first.pid}) ended"


def restarts_after(view: RunView, chief: ChildView) -> bool:
    """Whether the group's stop is said to be followed by the whole group's restart: not once anything
    non-finite is in the group (a member reported a step, or ended diverging or asking for a rollback).
    What follows then is judged only once every member ended (a rollback's restart, or the run given up
    as diverging: :func:`blame`), and that judgement's own line says which."""
    return not any(m.nonfinite_step is not None or diverging(m) for m in members(view, chief))


def hung_first(view: RunView, actions: list[Action]) -> list[Action]:
    """Rule 4 in a group: while a member is seen stopped (SIGSTOP), only stopped members are
    signalled as hung: the others are blocked waiting for them in a collective. Once a member
    broke the group, a member's end came in (observed once what is read at its end is back), or a
    member is already being stopped as hung (once SIGKILLed it is no longer seen stopped, and its exit
    may not have come in yet), none other is signalled as hung any more: rule 11 stops them all."""
    chief = view.children.get(TRAINER)
    if view.tasks_alone:
        return actions  # --ps: no collectives, each task is judged alone (rule 14)
    ending = chief is not None and any(c.live and (c.ending_at is not None or bool(c.hang.cause))
                                       for c in [chief, *workers(view)])
    if chief is not None and workers(view) and (ending or breaker(view, chief) is not None):
        return [a for a in actions if not _hung(a)]
    stopped = {c.slot for c in view.children.values() if c.stopped and c.live}
    if stopped:
        actions = [a for a in actions if not (_hung(a) and a.slot not in stopped)]
    # one capture at a time: it takes the stacks of every member, for the first member judged hung
    taking = chief is not None and any(c.live and stacks_asked(c) and not c.hang.stacks_in and not c.hang.cause
                                       for c in [chief, *workers(view)])
    # (and none once a member is signalled: the group is stopped with it)
    first = None if any(isinstance(a, Signal) and a.cause == Cause.HANG for a in actions) else \
        next((a for a in actions if isinstance(a, TakeStacks)), None)
    out: list[Action] = []
    for a in actions:  # (a member the stacks blame may be signalled for its peer's judgement and its own: once)
        if (isinstance(a, TakeStacks) and (a is not first or taking)) or \
                (isinstance(a, Signal) and a.cause == Cause.HANG and any(
                    isinstance(b, Signal) and b.cause == Cause.HANG and (b.slot, b.attempt) == (a.slot, a.attempt)
                    for b in out)):
            continue
        out.append(a)
    return out


def _hung(action: Action) -> TypeGuard[Union[TakeStacks, Signal]]:
    """A step of rule 4 for one member: its stacks taken, or its SIGTERM as hung."""
    return isinstance(action, TakeStacks) or (isinstance(action, Signal) and action.cause == Cause.HANG)


def peer_found(view: RunView, member: ChildView, step: int) -> Optional[ChildView]:
    """The other member of ``member``'s trainer group (the same attempt) whose latest report named
    ``step`` too (None: none did, or ``member`` is no group's): the same finding, counted once."""
    if member.role not in (TRAINER, WORKER) or view.tasks_alone:
        return None
    return next((m for m in view.children.values() if m is not member and m.role in (TRAINER, WORKER)
                 and m.attempt == member.attempt and m.last_report == ("nonfinite", step)), None)


def silent_members(view: RunView, now: float) -> list[ChildView]:
    """The live group members of this host that reported nothing for a second (worth a look at their
    process state)."""
    return [c for c in view.trainers() + workers(view)
            if c.node == 0 and c.live and c.last_progress_at is not None and now - c.last_progress_at > 1.0]
