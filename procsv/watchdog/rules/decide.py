"""The watchdog's one decision function: observations in, actions out.

Runs in the watchdog, but reads no clock, touches no process and no file:
:func:`decide` ``(view, now, limits, draw) -> list[Action]`` looks at the observed state
(:class:`~procsv.watchdog.rules.state.RunView`), the time ``now`` (the watchdog's monotonic clock,
passed in) and a uniform random ``draw`` in [0, 1) for the backoff jitter, and returns what to
do. :func:`procsv.watchdog.rules.bookkeeping.note` applies an action's consequences to the view. The
executor performs an action and notes it; deciding again with nothing new observed then returns
nothing new. Tests drive both with a fake clock and scripted observations
(``tests/test_watchdog_decide.py``).

This module owns the order of the rules and the run-level ones (2, 3, 6, 8, 9, 10, 13); the other
rules live in pure modules it composes: rule 1 in :mod:`procsv.watchdog.rules.judge`, rule 4 in
:mod:`procsv.watchdog.rules.hang`, rule 5 in :mod:`procsv.watchdog.rules.chaos`, rule 7 in
:mod:`procsv.watchdog.rules.stall`; the limits they read are :class:`~procsv.watchdog.rules.limits.Limits`.

Rules, in the order they are considered:

1. **Ended children.** A trainer attempt that was reaped, or whose death notice arrived, is
   judged (:mod:`procsv.watchdog.rules.judge`) by the restart policy (:func:`procsv.watchdog.rules.policy.decide`): finish, stopped,
   restart (at once after progress or a preemption, else with backoff), or give up -- at once if
   it failed before its first step with an error a restart cannot cure (``permanent_errors``:
   a usage error, no restorable checkpoint, a checkpoint of another model, a syntax error), and
   at any step if it failed as a program (``program_errors``: a NaN loss). A death
   notice alone only ever restarts (any other verdict waits for the exit status, so that it is
   reported exactly). A service that dies is restarted at once, unless it (each service counts alone)
   died more than ``service_restart_limit`` times within ``service_restart_window`` seconds: then
   the run stops in order and fails; a death procsv caused (a stall kill, chaos) is not counted. Anything ending after the run's outcome is decided is only settled.
2. **Stop.** A stop request (SIGTERM/SIGINT) sends SIGTERM to a running trainer (a group's chief gets it
   again every ``stop_resend_secs``: TensorFlow's ``MultiWorkerMirroredStrategy`` swallows one that arrives
   before the Supervisor's handlers are in place); past
   ``stop_grace_secs`` it is SIGKILLed; once no trainer is left (and none is being forked by the
   zygote: it is stopped in turn once it exists) the run is ``stopped``.
3. **Restart timer.** A pending trainer start happens when due -- but the first one waits up to
   ``zygote_wait`` seconds for the pre-warmed trainer to be ready.
4. **Hangs.** A trainer silent beyond its limit (:func:`procsv.watchdog.rules.hang.hang_reason`; busy
   on purpose has a longer limit, never none) gets SIGTERM, then SIGKILL after ``hang_grace_secs``.
   If it then exits with "saved, restart me" (42), that still counts as a failure.
5. **Chaos.** The target is armed once per attempt (after the trainer's first step, or when a
   service starts) with the next delay of the plan, and signalled when due -- never while it is
   busy with a snapshot or its final checkpoint: then as soon as it is not.
6. **Shutdown.** Once the outcome is decided, every live child gets SIGTERM, and SIGKILL after
   ``min(stop_grace_secs, services_grace_secs)`` (a group's worker whose chief ended: after
   ``group_grace_secs``, as under rule 11). A process that leaves foreign stop signals to the
   watchdog (a service, a group's worker, a server task, the standby: ``state.LEAVES_STOPS``) gets its SIGTERM
   again every ``stop_resend_secs`` until then (also under rule 14's stop of the workers): one sent
   while a job-wide SIGTERM was still pending in it is merged into that one, which it leaves to the
   watchdog.
7. **Checkpoint stalls.** The trainer says a snapshot passed its deadline (``SaveOverdue``), or
   steps complete but nothing commits for ``stall_factor`` times the trainer's save interval (at
   least ``stall_floor_secs``): the checkpoint service is SIGKILLed, which rule 1 then restarts;
   the restarted service tells the trainer its snapshot was lost. An overdue snapshot also counts
   as a failed checkpoint for rule 8. The trainer says the summary service confirmed none of its
   batches within the deadline (``SummaryOverdue``; only believed of a service that has run that long): the summary
   service is SIGKILLed, rule 1 restarts it, and its successor asks the trainer for what was not
   written (an in-memory snapshot waits for its step's summaries, so a stuck summary service
   would otherwise stop the in-memory tier too).
8. **Failing checkpoints.** ``checkpoint_failure_limit`` commits in a row fail (a full disk, a
   permission): training would go on burning compute that cannot be kept, so the run is stopped
   in order (the trainer still tries its emergency checkpoint) and fails with exit code 3.
   ``--on-checkpoint-failure continue`` (a limit of 0) trains on.
9. **Lost logdir.** The logdir was deleted, moved away or replaced while the run is live
   (``view.logdir_lost``, from filesystem events and a check every round): nothing the run
   writes from now on would land where the user looks, so the run is stopped in order and fails
   (exit 1). Considered first, like rule 8; not while a stop is already under way.
10. **Hot standby** (:mod:`procsv.watchdog.rules.standby`): one is prepared (forked from the zygote)
   once the trainer has completed a step; a due restart (rule 3) promotes it if it is ready for
   that attempt, else kills it and forks. A standby that ends is settled by rule 1
   (``StandbyGone``: counted, with backoff, unless the watchdog ended it). With ``--nproc N`` on
   one host it is a standby group of N, promoted only whole, ready or still preparing (ahead of a
   fork either way); a member that ends takes the rest of it along. With ``--nnodes M --standby hot``
   it is a standby group over the current group's hosts (each other host's members started and woken by
   its agent), promoted only if every member sits on its task's host of the next group.
11. **Groups** (:mod:`procsv.watchdog.rules.group`, ``--nproc N``): the first member of a trainer
   group whose end breaks it (the chief's end; a worker's death or non-zero exit) is what the
   chief's attempt is judged by (rule 1); the other members get SIGTERM, SIGKILL after
   ``group_grace_secs``; a chief that exited 0 is judged only once the other members ended on their own,
   or ``stop_grace_secs`` after its end, with nothing sent to them meanwhile (``group.awaits_own_ends``);
   rule 3 starts the next group only once every worker is reaped. Rules 2
   (stop: the chief is asked to checkpoint; its workers are stopped once it ended) and 4 (hangs:
   of every member) apply to the group's members.
12. **Hosts** (:mod:`procsv.watchdog.rules.hosts`, ``--nnodes M``): a host whose agent is silent for
   ``node_timeout`` is lost: its members count as dead (rule 11 restarts the group, rule 3 waits
   until every host is back); one that does not join, or come back, within ``rejoin_timeout``
   stops the run in order, which fails. Considered first, like rules 8 and 9.
13. **The pre-warmed trainer.** One that was lost (it died, or stopped answering) is started
   again (``StartZygote``) ``zygote_retry_secs`` after the loss, doubled per loss in a row (at
   most ``zygote_retry_cap``), until ``zygote_retries`` were lost in a row (the count starts
   again after one stayed ready for 10 minutes). Meanwhile restarts start fresh trainers; once it
   is ready they fork again, and the hot standby (rule 10) is prepared again.
14. **Parameter-server tasks** (:mod:`procsv.watchdog.rules.tasks`, ``--ps N --workers M``): no
   task's end breaks another; a parameter server or a non-chief worker that ended is judged by
   the restart policy with its own history and started again alone when due; the chief is
   judged by rule 1 and restarted alone by rule 3. A non-chief worker given up on ends the run
   (``--on-worker-give-up stop``) or not (``continue``, the default). A stop (rule 2) goes to the
   non-chief workers first and to the chief once none is live; rule 6 stops a parameter server
   only once no worker is live.
15. **Elastic groups** (:mod:`procsv.watchdog.rules.membership`, ``--nnodes M --min-nodes K``): a host
   found lost (or absent past ``rejoin_timeout`` at the start) no longer stops the run while K hosts are
   left: the next group (rule 3) starts at once on the hosts connected, ranks dense in their order. A
   host lost twice or more within 600 s is in a group again only once it stayed connected for the
   restart backoff (``membership.hold_down``; without ``--min-nodes`` too). A host that comes back is taken
   back at the next checkpoint boundary: once it is ready and a checkpoint commits after that (not the trainer's
   final one: the group ends on its own), every member is SIGKILLed (cause ``regroup``) and rule 1 restarts the
   group at once, not counting it as a failure; its commit is progress (``--max-restarts`` counts failures in
   a row without one).
"""

from __future__ import annotations

from typing import Optional

from procsv.watchdog.rules import group
from procsv.watchdog.rules import membership, standby, tasks
from procsv.watchdog.rules.actions import (Action, Cause, Finish, GiveUp, Promote, Spawn, StartZygote,
                                           StopFailing)
from procsv.watchdog.rules.bookkeeping import EXIT_CHECKPOINTS_FAILING, EXIT_LOGDIR_LOST
from procsv.watchdog.rules.chaos import chaos_actions
from procsv.watchdog.rules.hang import hang_actions
from procsv.watchdog.rules.group import group_actions
from procsv.watchdog.rules.hosts import host_actions
from procsv.watchdog.rules.judge import EXIT_STOP_UNSAVED, judge
from procsv.watchdog.rules.lifecycle import ProcState, RunState
from procsv.watchdog.rules.limits import Limits
from procsv.watchdog.rules.stall import stall_actions
from procsv.watchdog.rules.state import PS, STANDBY, TRAINER, WORKER, ChildView, RunView, ZygoteState

__all__ = ["Limits", "decide"]


def decide(view: RunView, now: float, limits: Limits, draw: float) -> list[Action]:
    """What to do now, given what has been observed. Pure: the view is not changed."""
    if view.logdir_lost is not None and view.stop_signal is None and not view.finishing:
        return [StopFailing("logdir", view.logdir_lost, f"the logdir was lost while the run was live: {view.logdir_lost}",
                            EXIT_LOGDIR_LOST)]  # rule 9 comes first: an exit it causes is a stop
    if 0 < limits.checkpoint_failure_limit <= view.failed_saves and view.stop_signal is None \
            and not view.finishing:  # rule 8 comes first: an exit it causes is a stop
        last = (view.last_error or "").removeprefix("checkpoint ")
        return [StopFailing("checkpoints", "checkpoints keep failing", f"{view.failed_saves} checkpoints in a row "
                            f"failed to commit; the last: {last}", EXIT_CHECKPOINTS_FAILING)]
    hosts = host_actions(view, now, limits)
    if any(isinstance(a, StopFailing) for a in hosts):
        return hosts  # rule 12 comes first too: an exit it causes is a stop
    actions: list[Action] = hosts
    ended = view.unsettled()
    for child in ended:
        actions += judge(view, child, now, limits, draw)
    if any(isinstance(a, (Finish, GiveUp)) for a in actions):
        return actions  # the run's outcome is decided; the next round shuts down
    if view.finishing:
        return actions + _shutdown(view, now, limits)
    actions += _stop(view, now, limits)
    actions += membership.take_back(view, now, limits)
    actions += group_actions(view, now, limits.group_grace_secs, wait=limits.stop_grace_secs,
                             at_once=_standby_whole(view, limits, view.group_nodes or tuple(range(limits.nnodes))))
    actions += standby.broken(view)
    actions += _restart_due(view, now, limits)
    actions += tasks.due_starts(view, now, limits)
    hangs: list[Action] = []
    for member in view.trainers() + group.workers(view):
        hangs += hang_actions(view, member, now, limits.hang)
    actions += group.hung_first(view, hangs)
    actions += chaos_actions(view, now, limits.chaos)
    actions += stall_actions(view, now, limits)
    actions += _zygote_due(view, now, limits)
    if standby.may_prepare(view, now) and not any(isinstance(a, (Spawn, Promote)) for a in actions):
        actions.append(Spawn(STANDBY, STANDBY))
    return actions


# ------------------------------------------------------------------------------ run-level rules
def _stop(view: RunView, now: float, limits: Limits) -> list[Action]:
    """Rule 2: a stop was requested (with parameter servers the other workers are stopped first: rule 14)."""
    if view.stop_signal is None:
        return []
    out, workers_first = tasks.stop_workers_first(view, now, limits.stop_grace_secs, limits.stop_resend_secs)
    live = [t for t in view.trainers() if t.live]
    for t in live:
        if not (workers_first and t.state in (ProcState.STARTING, ProcState.RUNNING)):
            # a group's chief gets it again every stop_resend_secs: MultiWorkerMirroredStrategy's preemption
            # notifier (a C handler put in place under Python's) swallows one sent before the Supervisor's
            # handlers replace it, and the group then trained on to the grace's SIGKILL (seen during a restart)
            out += t.stopping(now, view.stop_deadline, limits.stop_resend_secs, Cause.STOP, Cause.STOP_GRACE,
                              resend=limits.world > 1 and not limits.ps)
    # stopped before a trainer started, or while a restart was pending; a start asked and not answered (a fork of
    # the zygote) is waited for only until the stop's grace ends (its deadline, or None once the grace's SIGKILL went
    # out); one asked of another host is not: rule 12 drops it in the stop's first round (StartsDropped), and the
    # view forks no more once the executor did (before, a StartMembers never answered held the stop its whole grace)
    waited = view.forking and view.stop_deadline is not None and now < view.stop_deadline
    if not live and not waited:
        out.append(_stopped_between(view, 128 + view.stop_signal))
    return out


def _stopped_between(view: RunView, code: int) -> Finish:
    """Rule 2 with no live trainer: the run ends stopped, with ``code`` (128+signal: nothing lost) unless a
    group's snapshot newer than the newest commit was held in memory for every member of the last attempt:
    the restart would have restored it, the stop drops it (never persisted): an unsaved stop, exit 1."""
    last = view.children.get(TRAINER)
    if last is not None and last.held_whole > view.commit_step:
        return Finish(TRAINER, last.attempt, RunState.STOPPED, EXIT_STOP_UNSAVED, view.history, unsaved=True)
    return Finish(TRAINER, 0, RunState.STOPPED, code, view.history)


def _restart_due(view: RunView, now: float, limits: Limits) -> list[Action]:
    """Rule 3: a pending trainer start."""
    if view.restart_at is None or now < view.restart_at or view.stop_signal is not None:
        return []
    if view.zygote == ZygoteState.WARMING and not view.attempts and now - view.launch_start < limits.zygote_wait:
        return []  # the first trainer waits for the first pre-warmed one; a restart never waits for a new one
    nodes = membership.next_nodes(view, now, limits)
    if group.draining(view) or (nodes is None and not (view.tasks_alone and view.attempts)):
        # rule 11: the last group's workers are not all reaped yet (their ports, their collectives); rules 12
        # and 15: a group waits for every host it still waits for. With --ps only the first start does (every
        # task's address): the chief's restart is its own, on node 0
        return []
    if tasks.chief_held(view) or tasks.ps_not_serving(view, now, limits):
        return []  # rule 14: --ps, the last chief still holds its port; --coordinator, a ps is not back
    if view.forking:
        return []  # a standby asked of the zygote: wait for its answer (milliseconds), then decide
    hosts = (nodes or tuple(range(limits.nnodes))) if limits.nnodes > 1 and not limits.ps else ()
    if _standby_whole(view, limits, hosts, ready=limits.world < 2):  # (a standby group: all its members together,
        # every host's, chief first; ready or still preparing: ahead of a fork either way)
        return [Promote(sb.slot, sb.attempt) for sb in standby.members(view)]
    # not ready yet (kills in a row, a member of a standby group lost, its hosts not the next group's): fork instead
    return standby.unready(view) + [Spawn(TRAINER, TRAINER, hosts)]


def _standby_whole(view: RunView, limits: Limits, hosts: tuple[int, ...], ready: bool = True) -> bool:
    """Rule 10: the standby (group) can become the next attempt over ``hosts`` (node 0 first; with ``--nnodes``
    a standby group over them, ``--nproc`` members on each)."""
    hosts = hosts if limits.nnodes > 1 and not limits.ps and hosts else (0,)
    return standby.promotable(view, limits.nproc * len(hosts), ready, hosts)


def zygote_retry_delay(losses: int, limits: Limits) -> float:
    """How long after its ``losses``-th loss in a row a pre-warmed trainer is started again."""
    return float(min(limits.zygote_retry_cap, limits.zygote_retry_secs * 2.0 ** max(0, losses - 1)))


def _zygote_due(view: RunView, now: float, limits: Limits) -> list[Action]:
    """Rule 13: the pre-warmed trainer was lost (it died, or stopped answering): a new one is
    started after a backoff, so that a week-long run does not restart fresh, and without a
    standby, for the rest of its life after one loss; not after ``zygote_retries`` in a row (a
    loss counts anew only after one stayed ready for ``observe.ZYGOTE_STEADY_SECS``)."""
    if view.zygote != ZygoteState.LOST or view.zygote_lost_at is None or view.stop_signal is not None \
            or view.zygote_losses >= limits.zygote_retries or view.forking \
            or now < view.zygote_lost_at + zygote_retry_delay(view.zygote_losses, limits):
        return []
    return [StartZygote(view.zygote_attempt + 1)]


def _shutdown(view: RunView, now: float, limits: Limits) -> list[Action]:
    """Rule 6: the outcome is decided; stop whatever still runs."""
    out: list[Action] = []
    for c in view.live_children():
        if c.live and not (c.role == PS and tasks.ps_held(view)):  # (rule 14: a parameter server after its workers)
            out += c.stopping(now, _kill_after(c, view, limits), limits.stop_resend_secs, Cause.SHUTDOWN, Cause.SHUTDOWN)
    return out


def _kill_after(c: ChildView, view: RunView, limits: Limits) -> Optional[float]:
    """When rule 6 SIGKILLs ``c``: once the services' grace ended; a group's worker whose chief ended
    ``group_grace_secs`` after its SIGTERM (rule 11's or rule 6's), as rule 11 does: it can only fail in its
    next collective, or wait for its chief's restore (a promoted standby member still preparing when its chief stopped, seen
    waiting for its pin up to the 30 s of the services' grace)."""
    deadline, sent = view.services_deadline, c.signalled_at if c.signalled_at is not None else c.stop_sent_at
    chief = view.children.get(TRAINER)
    if c.role == WORKER and not view.tasks_alone and sent is not None and deadline is not None \
            and (chief is None or not chief.live):  # (a live chief's last checkpoint is collective: never before its end)
        return min(deadline, sent + limits.group_grace_secs)  # (before a resend: every stop_resend_secs)
    return deadline
