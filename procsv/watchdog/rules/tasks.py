"""Rule 14 of the decision function: with parameter servers each task restarts alone.

Runs in the watchdog. Pure: reads the observed :class:`~procsv.watchdog.rules.state.RunView`, the
time ``now`` passed in, the :class:`~procsv.watchdog.rules.limits.Limits` and the backoff ``draw``;
returns actions.

``procsv launch --ps N --workers M`` (TF1 between-graph replication; ``view.tasks_alone``) runs N
parameter servers (slots ``ps0`` ...), the chief (worker 0, slot ``trainer``) and workers 1 .. M-1
(slots ``worker1`` ...). Unlike a ``--nproc`` group (:mod:`procsv.watchdog.rules.group`) no task's
end breaks the others: the variables live on the parameter servers, and every worker's session
finds them there.

- The chief is judged as a lone trainer is (rule 1, :mod:`procsv.watchdog.rules.judge`): its own
  restart history, restarted alone by rule 3.
- A worker that exits 0 finished (nothing more); a parameter server or a worker that ends any other
  way is judged by the restart policy (:func:`procsv.watchdog.rules.policy.decide`) with *its own*
  history (``view.task_history``), so ``--max-restarts`` counts per task: :class:`RestartTask` (at
  once, or after the backoff), or, past ``--max-restarts``, a give-up: for a parameter server
  :class:`GiveUp` (the run stops in order and fails: its variables cannot be served); for a non-chief
  worker :class:`GiveUpTask` (``--on-worker-give-up continue``, the default: the others train on
  without it, as under TensorFlow's own Supervisor, where one replica's end stops no other) or
  :class:`GiveUp` (``stop``).
- A due task start (``view.task_due``) is :class:`Spawn` of that slot alone, never while a stop is
  requested or once the outcome is decided.

- A parameter server that ended lost its variables, and every worker's session with them (their
  runs fail, ``UnavailableError`` while it is down, then ``FailedPreconditionError`` on the
  uninitialized variables of the restarted one, but only after gRPC notices: seconds). So with its
  :class:`RestartTask` every live worker and the chief are SIGKILLed at once (:class:`Kill`, cause
  ``ps_lost``); each is restarted alone, the chief restores the newest checkpoint into the
  parameter servers and the others wait for ``ready_op`` (``docs/parameter-servers.md``). A worker
  procsv killed so is restarted at once and not counted (the parameter server's death is); the
  chief is judged by rule 1 as any killed trainer.

``--coordinator`` (TF2 ``ParameterServerStrategy``; ``limits.coordinator``): the M workers are plain
servers too (role ``server``, slots ``worker0`` ...), judged as a parameter server is, and the chief
(slot ``trainer``) is the coordinator, the only process that runs TARGET. A worker server that ended
is restarted alone and nothing else is touched: the coordinator's ``ClusterCoordinator`` reschedules
the functions it lost on the other workers and uses it again once it is back. A parameter server
that ended takes the coordinator with it (``ParameterServerStrategy`` cannot survive it): the
coordinator is SIGKILLed with the restart, restarted once the new parameter server serves
(:func:`ps_not_serving`), and restores the newest checkpoint into the
parameter servers before it dispatches again; the worker servers hold no state and keep running.

Over several hosts (``--nnodes K``, TF1 mode; :func:`task_node`): the parameter servers and the
chief run on node 0, the workers are spread over the hosts in blocks, as ``--nproc`` spreads a
group's members. A task is restarted on its own host (node 0 decides, that host's agent starts
it); a host found lost (rule 12) ends every task on it (judged here as any end), and a task of a
host that is lost or not back yet is started only once its host is connected again (a host that
stays away past ``--rejoin-timeout`` stops the run, rule 12).
"""

from __future__ import annotations


from procsv.watchdog.rules.actions import Action, Cause, GiveUp, GiveUpTask, Kill, RestartTask, Settle, Spawn
from procsv.watchdog.rules.failures import killed_from_outside
from procsv.watchdog.rules.lifecycle import ProcState
from procsv.watchdog.rules.limits import Limits
from procsv.watchdog.rules.membership import connected
from procsv.watchdog.rules.policy import Action as Verdict
from procsv.watchdog.rules.policy import History, TrainerExit
from procsv.watchdog.rules.policy import decide as restart_verdict
from procsv.watchdog.rules.group import rank_of
from procsv.watchdog.rules.state import PS, SERVER, TRAINER, WORKER, ChildView, RunView

# How long a restarted parameter server serves before a --coordinator coordinator is started on it. The
# worker servers' gRPC channels to it failed while it was down, and a channel in that state fails every
# call at once until its next reconnect attempt: TensorFlow caps gRPC's reconnect backoff at 1 s
# (GRPC_ARG_MAX_RECONNECT_BACKOFF_MS in its GetChannelArguments), with gRPC's jitter of 20 %: 1.2 s,
# and a little for the worker's poller to be scheduled.
PS_RECONNECT_SECS = 1.5


def ps_slot(index: int) -> str:
    """The slot (and the log name) of parameter server ``index``: ``ps0``, ``ps1``, ..."""
    return f"{PS}{index}"


def role_of(slot: str, coordinator: bool) -> str:
    """The role of a --ps task's slot other than the chief's: ``ps``, or ``worker`` (``server`` with
    ``--coordinator``)."""
    return PS if slot.startswith(PS) else SERVER if coordinator else WORKER


def task_node(slot: str, workers: int, nnodes: int) -> int:
    """The host (node rank) that runs ``slot`` over ``nnodes`` hosts: the parameter servers and the
    chief (worker 0) on node 0, worker R on node ``R * nnodes // workers`` (blocks as even as the
    count allows, node 0's first: ``--workers 4 --nnodes 2`` puts workers 0, 1 on node 0 and 2, 3 on node 1)."""
    if nnodes <= 1 or slot.startswith(PS) or workers <= 0:
        return 0
    return rank_of(slot) * nnodes // workers


def judge_task(view: RunView, child: ChildView, now: float, limits: Limits, draw: float) -> list[Action]:
    """Rule 14: a parameter server or a non-chief worker was reaped (judged on its exit status, which tells
    whether it finished: rule 1 waits for it)."""
    if child.role == WORKER and child.exit_code == 0:
        return [Settle(child.slot, child.attempt)]  # it finished; the chief decides the run
    history = view.task_history.get(child.slot, History())
    if child.role == WORKER and child.killed and not child.hang.cause and view.stop_signal is None:
        return [RestartTask(child.slot, child.attempt, 0.0, history)]  # procsv killed it (ps_lost): not counted
    server = child.role in (PS, SERVER)  # serves until the run's end: exiting before it is a loss
    code = 1 if child.exit_code is None or (server and child.exit_code == 0) else child.exit_code
    ex = TrainerExit(code, child.first_step_at is not None or server, child.made_progress, view.stop_signal is not None,
                     preempted=child.failure is not None and child.failure.preempted,
                     killed_from_outside=killed_from_outside(child.exit_code))
    verdict = restart_verdict(limits.restart, history, ex, draw)
    if verdict.action == Verdict.STOPPED:
        return [Settle(child.slot, child.attempt)]
    if verdict.action == Verdict.GIVE_UP:
        if child.role in (WORKER, SERVER) and limits.worker_give_up == "continue":  # a --coordinator worker too
            return [GiveUpTask(child.slot, child.attempt, f"{child.slot}: {verdict.reason}", verdict.history)]
        return [GiveUp(child.slot, child.attempt, f"{child.slot}: {verdict.reason}", view.history)]
    out: list[Action] = [RestartTask(child.slot, child.attempt, verdict.delay, verdict.history)]
    if child.role == PS:  # every worker's session lost its variables: end them now, not when gRPC notices
        why = f"{child.slot} (pid {child.pid}) ended"
        out += [Kill(w.slot, w.attempt, Cause.PS_LOST, why) for w in view.children.values()
                if w.role in (TRAINER, WORKER) and w.live and not w.killed]
    return out


def stop_workers_first(view: RunView, now: float, grace: float,
                       resend_secs: float) -> tuple[list[Action], bool]:
    """Rule 14 under a stop (rule 2): the non-chief workers are stopped before the chief is asked to
    commit, so that its last checkpoint holds every update applied to the parameter servers (a
    worker stepping after the chief's commit would lose its steps). SIGTERM to each (it stops at its
    step boundary; again every ``resend_secs``: :meth:`ChildView.stopping`), SIGKILL once half
    the stop grace has passed; returns the actions and whether
    the chief must still wait (a non-chief worker is live)."""
    if not view.tasks_alone or view.stop_signal is None:
        return [], False
    out: list[Action] = []
    live = [w for w in view.children.values() if w.role == WORKER and w.live]
    half = view.stop_deadline - grace / 2 if view.stop_deadline is not None else now
    for w in live:
        out += w.stopping(now, half, resend_secs, Cause.STOP, Cause.STOP_GRACE)
    return out, bool(live)


def ps_held(view: RunView) -> bool:
    """Rule 6 with parameter servers: a parameter server is stopped only once no worker (the chief
    included) is live, since a worker whose parameter server is gone blocks in its run until gRPC
    gives up, and would not stop at its step boundary."""
    return view.tasks_alone and any(c.live and c.role in (TRAINER, WORKER) for c in view.children.values())


def ps_not_serving(view: RunView, now: float, limits: Limits) -> bool:
    """Rule 3 with ``--coordinator``: a restarted coordinator waits until every parameter server serves
    again (its Hello: the server is up). ``ParameterServerStrategy`` fails at once on a parameter
    server that does not answer yet (``UnavailableError``, connection refused): a coordinator forked
    from the zygote while the parameter server it took along still imported TensorFlow (2 s at load)
    failed so and cost a restart of its own, counted. A TF1 session waits for the cluster itself.
    A parameter server live but silent for ``--startup-timeout`` since its start (stopped, an import
    that never returns) holds it no longer: no hang rule watches a parameter server, so the wait
    would be for ever; the coordinator starts, and its own hang rule bounds what it meets.
    A parameter server that serves holds it :data:`PS_RECONNECT_SECS` more: until then a worker server's
    channel to it may still fail every call ("Connection refused" from the worker), and the
    coordinator's first step on that worker failed so, a restart of its own (1 launch in 4 at load 7)."""
    if not (limits.coordinator and view.attempts):
        return False
    startup = limits.hang.startup_timeout
    limit = startup if startup and startup > 0 else None

    def holds(c: ChildView) -> bool:
        if not c.live:
            return True
        if c.state != ProcState.RUNNING:
            return limit is None or now - c.started < limit
        return c.running_at is not None and now - c.running_at < PS_RECONNECT_SECS

    return any(slot.startswith(PS) for slot in view.task_due) or any(
        holds(c) for c in view.children.values() if c.role == PS)


def chief_held(view: RunView) -> bool:
    """Rule 3 with parameter servers: an attempt of the chief is not reaped yet. Its gRPC server (the
    Supervisor's ``server_target()``, or ``ParameterServerStrategy``'s coordinator) holds the port
    ``TF_CONFIG`` gives the chief, the same for the next attempt, and TensorFlow's server does not
    share a port: a next chief started before the reap fails with "Could not start gRPC server" and
    costs a restart. So the next one waits for the reap (milliseconds after a death notice)."""
    return view.tasks_alone and any(c.role == TRAINER and not c.reaped for c in view.attempts)


def due_starts(view: RunView, now: float, limits: Limits) -> list[Action]:
    """Rule 14: the tasks whose restart is due, each started alone on its host; a task whose host is
    lost (or has not joined) waits for it."""
    if view.stop_signal is not None or view.finishing:
        return []
    return [Spawn(slot, role_of(slot, limits.coordinator)) for slot, due in sorted(view.task_due.items())
            if now >= due and connected(view, task_node(slot, limits.nproc, limits.nnodes))]
