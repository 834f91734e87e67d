"""The lines and lifecycle events the executor records for the signals, kills, restarts and lost hosts.

Runs in the watchdog. Pure: each function reads the view (and the limits) and returns
:class:`~procsv.watchdog.publish.events.Report` values; :class:`procsv.watchdog.executor.Executor`
writes them when it performs the action.
"""

from __future__ import annotations

import signal

from procsv.watchdog.rules.actions import (Cause, GiveUpTask, Kill, NodeLost, Restart, Signal, StandbyGone, StartsDropped,
                                           StopFailing)
from procsv.watchdog.rules.bookkeeping import find
from procsv.watchdog.rules.group import blame, members, restarts_after
from procsv.watchdog.rules.hosts import START_ANSWER_SECS
from procsv.watchdog.publish.events import Event, Report
from procsv.watchdog.rules.limits import Limits
from procsv.watchdog.rules.state import SERVER, STANDBY, SUMMARY, TRAINER, WORKER, RunView


def signal_reports(view: RunView, action: Signal, limits: Limits, now: float) -> list[Report]:
    """What to record when a signal is sent to a child (a hang, a group stop, chaos) at ``now``."""
    child = find(view, action.slot, action.attempt)
    assert child is not None
    if action.cause == Cause.HANG:
        name = child.slot if child.role == WORKER else "trainer"
        h = child.hang
        where = h.where if h.stacks_in else (f"its stacks were not back within {limits.hang.stacks_secs:g} s"
                                             if h.stacks_asked_at is not None else "")
        said = (f"; {where}" if where else "") + (f"; the stacks blame {h.culprit}" if h.culprit else "") + \
            (f" (every trainer's stacks: {h.stacks})" if h.stacks else "")
        return [Report(Event.HANG_DETECTED, {"pid": child.pid, "attempt": child.attempt, "step": child.step,
                                             "reason": action.reason, "where": where, "culprit": h.culprit,
                                             "stacks": h.stacks, "stacks_secs": round(now - h.stacks_asked_at, 3)
                                             if h.stacks_asked_at is not None else 0.0},
                       say=f"procsv: {name} attempt {child.attempt} (pid {child.pid}) is hung: {action.reason}{said}; "
                           f"sending SIGTERM, SIGKILL in {limits.hang_grace_secs:g} s", err=True)]
    if action.cause == Cause.GROUP:
        who = child.slot if child.role == WORKER else "chief"
        chief = view.children.get(TRAINER)
        then = "; the whole group restarts together" if chief is None or restarts_after(view, chief) else ""
        return [Report(say=f"procsv: {action.reason}: stopping the group's {who} (pid {child.pid}){then}", err=True)]
    if action.cause == Cause.CHAOS:
        name = signal.Signals(action.sig).name
        return [Report(Event.CHAOS_KILL, {"role": child.role, "pid": child.pid, "signal": name},
                       say=f"procsv: chaos: sending {name} to the {child.role} (pid {child.pid})")]
    return []


def kill_reports(view: RunView, action: Kill, limits: Limits) -> list[Report]:
    """What to record when a child's process group is SIGKILLed."""
    child = find(view, action.slot, action.attempt)
    assert child is not None
    if action.cause == Cause.STALL and child.role == SUMMARY:
        return [Report(Event.SUMMARY_STALLED, {"pid": child.pid, "reason": action.reason},
                       say=f"procsv: the summary service is stuck ({action.reason}); replacing it (pid {child.pid})",
                       err=True)]
    if action.cause == Cause.STALL:
        return [Report(Event.CHECKPOINT_STALLED, {"pid": child.pid, "reason": action.reason},
                       say=f"procsv: checkpoints stalled ({action.reason}); replacing the checkpoint service "
                           f"(pid {child.pid})", err=True)]
    if action.cause == Cause.STOP_GRACE and child.role == WORKER:  # --ps: the other workers stop first (rule 14)
        return [Report(say=f"procsv: {child.slot} did not stop within {limits.stop_grace_secs / 2:g} s (half of "
                           "--stop-grace-secs); killing it before the chief commits", err=True)]
    grace = limits.hang_grace_secs if action.cause == Cause.HANG else limits.stop_grace_secs
    if action.cause == Cause.AUDIT:  # (its line is the audit's verdict, said with its record)
        return []
    if action.cause == Cause.REGROUP:  # (said once, for the chief)
        return [] if child.role == WORKER else [Report(say=_KILL_LINES[action.cause].format(reason=action.reason),
                                                      err=True)]
    role = child.slot if action.cause == Cause.GROUP_NOW else child.role  # (a group's: which member, worker2)
    return [Report(say=_KILL_LINES[action.cause].format(grace=grace, role=role, reason=action.reason))]


def restart_reports(view: RunView, action: Restart) -> list[Report]:
    """What to record when a trainer attempt is to be restarted."""
    child = find(view, action.slot, action.attempt)
    assert child is not None
    nxt = {"attempt": action.attempt + 1, "delay": round(action.delay, 3), "rollback_step": action.skip}
    if action.regroup:  # rule 15 (or an audit's rollback): ended on purpose; the line was said at the kill
        return [Report(Event.RESTARTING, {**nxt, "error": view.findings.audit_rollbacks.get(child.attempt, "regroup")})]
    if action.preempted:
        return [Report(say=f"procsv: trainer attempt {action.attempt} was preempted and saved its state; "
                           "restarting"),
                Report(Event.RESTARTING, {**nxt, "error": "preempted"})]
    if action.skip is not None:  # a group's rollback (rules/policy): the skip recorded, the group restarted
        # the member that reported the step skipped (a NaN in one member's batch: the others' losses are
        # non-finite one step later, and the chief's report of that one may have come in first); the member the
        # attempt is judged by first, if it reported that step (at a group snapshot step a peer reports the same
        # step for its weights alone, while the member whose batch held the NaN found the loss and asked)
        who = blame(view, child)
        if who.nonfinite_step != action.skip:
            who = next((m for m in members(view, child) if m.nonfinite_step == action.skip), who)
        return [Report(Event.STEP_SKIPPED, {"pid": who.pid, "step": action.skip, "epoch": None, "batch": None,
                                            "skipped": len(view.skipped_steps)}),
                Report(say=f"procsv: the trainer group rolls back: {who.slot} (pid {who.pid}) found "
                           + (f"a loss spike at step {action.skip} (its onset)" if who.last_report == ("spike", action.skip)
                              else f"the loss of step {action.skip} non-finite")
                           + "; restarting the group, whose members restore the newest state before it and skip it "
                           f"(steps skipped: {', '.join(map(str, view.skipped_steps))})", err=True),
                Report(Event.RESTARTING, {**nxt, "error": view.last_error})]
    if action.early:  # how it died is said when it is reaped
        return [Report(Event.RESTARTING, {**nxt, "error": view.last_error})]
    return [Report(say=f"procsv: {view.last_error}; restarting in {action.delay:.1f} s "
                       f"(restart {view.history.restarts})", err=True),
            Report(Event.RESTARTING, {**nxt, "error": view.last_error})]


def membership_reports(view: RunView, before: tuple[int, ...], nodes: tuple[int, ...], now: float,
                       limits: Limits) -> list[Report]:
    """What to record when a trainer group starts on the hosts ``nodes`` (``before``: the last group's; the
    view's trainer is the last attempt): the ``membership`` record and one line if they are other hosts
    than the last group's (rule 15), or the first group's are fewer than every host; else nothing."""
    everyone = tuple(range(limits.nnodes))
    if not nodes or nodes == (before or everyone) or limits.ps:
        return []
    prev = view.children.get(TRAINER)
    attempt = prev.attempt + 1 if prev is not None else 1
    left = [n for n in (before or everyone) if n not in nodes]
    joined = [n for n in nodes if before and n not in before]
    whys = []
    for node in left:
        n = view.nodes.get(node)
        whys.append(f"node {node} did not join within --rejoin-timeout {limits.rejoin_timeout:g} s" if n is None or
                    n.last_beat is None else f"node {node} ({n.host}) is gone" + (
                        f" (found lost {now - n.lost_at:.1f} s ago)" if n.lost_at is not None else ""))
    whys += [f"node {node} ({view.nodes[node].host}) is back" for node in joined if node in view.nodes]
    world = len(nodes) * limits.nproc
    reason = "; ".join(whys) or "every host"
    return [Report(Event.MEMBERSHIP, {"attempt": attempt, "nodes": list(nodes), "hosts": len(nodes), "world": world,
                                      "left": left, "joined": joined, "reason": reason},
                   say=f"procsv: the trainer group starts on {len(nodes)} of {limits.nnodes} hosts (nodes "
                       f"{', '.join(map(str, nodes))}; {world} trainers; --min-nodes {limits.min_nodes}): {reason}",
                   err=True)]


_KILL_LINES = {
    Cause.STOP_GRACE: "procsv: trainer did not stop within {grace:g} s; killing it",
    Cause.REGROUP: "procsv: {reason}: ending the group at this checkpoint boundary",
    Cause.HANG: "procsv: hung trainer did not exit within {grace:g} s; killing it",
    Cause.SHUTDOWN: "procsv: the {role} process did not stop in time; killing it",
    Cause.STANDBY_UNREADY: "procsv: the standby trainer is not ready yet; forking a new trainer instead",
    Cause.GROUP: "procsv: a member of the trainer group did not stop in time; killing it",
    Cause.STANDBY_LOST: "procsv: a member of the standby group ended; killing the rest of it (another is prepared)",
    Cause.GROUP_NOW: "procsv: a member of the trainer group ended ({reason}) and the standby group is ready; "
                     "killing the group's {role} process at once",
    Cause.PS_LOST: "procsv: a parameter server died and its variables with it; killing the {role} task (it is "
                   "restarted alone; the chief restores the newest checkpoint)",
}


def node_lost_reports(action: NodeLost, host: str, limits: Limits) -> list[Report]:
    """What to record when a host is found lost (rule 12): its cause, named with ``--node-timeout``, with
    the probes its host's kernel left unanswered (the fast path: a silent host, not a slow agent), or with the
    reset its host answered (its agent gone)."""
    silent = round(action.silent_secs, 3)  # (the record's figure: its line says the same, rounded from it)
    if action.unstarted:
        what = ", ".join(f"{slot} (attempt {attempt})" for slot, _, attempt in (m.rpartition(".") for m in action.unstarted))
        why = f"its agent answered no start of {what} for {action.start_secs:.1f} s while it beat on (the request " \
              f"lost, or the agent's loop wedged; bound: {START_ANSWER_SECS:g} s of its own fork bound + " \
              f"--node-timeout {limits.node_timeout:g}); if it happens again, look at `procsv launch --node-rank " \
              f"{action.node}` on that host (its stderr, `py-spy dump --pid` of its agent)"
    elif action.reset:
        why = f"its agent sent no heartbeat for {silent:.2f} s and its host answered a probe with a " \
              f"reset (no agent listens on its probe port: the agent is gone; before --node-timeout " \
              f"{limits.node_timeout:g})"
    elif action.unanswered is None:
        why = f"its agent sent no heartbeat for {silent:.1f} s (--node-timeout {limits.node_timeout:g})"
    elif action.deaf:
        why = f"its agent said it had heard nothing from node 0 for {action.deaf:.2f} s (its heartbeats still coming, " \
              f"the last {silent:.2f} s ago) and its host answered no probe for {action.unanswered:.2f} s (node 0's " \
              f"packets to it are lost: a one-way cut; before --node-timeout {limits.node_timeout:g})"
    else:
        why = f"its agent sent no heartbeat for {silent:.2f} s and its host answered no probe for " \
              f"{action.unanswered:.2f} s (silent, not slow; before --node-timeout {limits.node_timeout:g})"
    return [Report(Event.NODE_LOST, {"node": action.node, "host": host, "silent_secs": silent,
                                     "reason": why},
                   say=f"procsv: node {action.node} ({host}) is lost: {why}; its trainers count as dead; the group "
                       + (f"restarts at once on the hosts left (--min-nodes {limits.min_nodes}), and takes it back at "
                          "a checkpoint once it is back" if limits.elastic else
                          f"restarts once it is back (waiting up to --rejoin-timeout {limits.rejoin_timeout:g} s)"),
                   err=True)]


def starts_dropped_reports(action: StartsDropped, host: str) -> list[Report]:
    """The line for a stop that waits for no start of another host (rule 12: :class:`StartsDropped`)."""
    what = ", ".join(f"{slot} (attempt {attempt})" for slot, _, attempt in (m.rpartition(".") for m in action.members))
    return [Report(say=f"procsv: node {action.node} ({host}) has not answered the start of {what}, asked "
                       f"{action.waited:.1f} s ago: the stop does not wait for it (its agent is told to stop whatever "
                       "it started)", err=True)]


def task_gave_up_reports(view: RunView, action: GiveUpTask) -> list[Report]:
    """What to record when a ``--ps`` worker is given up on and the others train on (rule 14)."""
    child = find(view, action.slot, action.attempt)
    assert child is not None
    left = sum(1 for c in view.children.values() if c.role in (WORKER, SERVER) and c.live)
    return [Report(Event.TASK_GAVE_UP, {"role": action.slot, "attempt": action.attempt, "reason": action.reason,
                                        "error": view.last_error},
                   say=f"procsv: giving up on {action.reason}; training on without it (the chief and {left} other "
                       f"worker(s); --on-worker-give-up continue).\n{child.root_cause()}", err=True)]


def stop_failing_reports(action: StopFailing, logdir: str) -> list[Report]:
    """What to record when the run is stopped in order to fail (rules 8, 9 and 12)."""
    if action.cause == "logdir":
        return [Report(Event.LOGDIR_LOST, {"path": logdir, "reason": action.reason},
                       say=f"procsv: the logdir {logdir} was lost while the run was live ({action.reason}); stopping "
                           "the run in order, nothing more is written there; if you moved it, launch again with "
                           "--logdir at its new place to resume", err=True)]
    say = (f"procsv: giving up: {action.error}. Stopping the run in order (use --on-checkpoint-failure continue to "
           "train on without checkpoints)") if action.cause == "checkpoints" else \
        f"procsv: giving up: {action.reason}; stopping the run in order"
    return [Report(Event.GAVE_UP, {"reason": action.reason, "error": action.error}, say=say, err=True)]


def standby_gone_reports(view: RunView, action: StandbyGone, now: float) -> list[Report]:
    """The line for a standby that ended on its own (noted already: ``standby_after`` is set), or for a
    standby group's member that could not run the step on shadows (the group is replaced, and the next skip it)."""
    child = find(view, action.slot, action.attempt)
    if child is None:
        return []
    if action.unsuitable:
        return [Report(say=f"procsv: no hot standby for this run: the standby trainer ({child.slot}, pid {child.pid}) "
                           "could not start what only one process may hold (the program's own tf.train.Server, on a "
                           "port the trainer holds; its log says which); restarts fork from the pre-warmed trainer",
                       err=True)]
    if action.no_shadow:
        return [Report(say=f"procsv: standby group member {child.slot} could not run the step on shadows (its log says "
                           "why): replacing the group; the run's next standby groups skip the shadow run", err=True)]
    if action.failed:  # (a standby group's member other than the chief's is named by its slot: standby1, on its host)
        who = f"the standby trainer {child.headline().split(' ', 1)[-1]}" if child.slot == STANDBY else \
            f"the standby group's member {child.headline()}"
        return [Report(say=f"procsv: {who}; preparing another in {view.standby_after - now:.0f} s", err=True)]
    return []
