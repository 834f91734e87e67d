"""The hot standby's rules: whether one may run, when one is prepared, what a restart does with it.

Runs in the watchdog. Pure: called by :func:`procsv.watchdog.rules.decide.decide` with the observed
:class:`~procsv.watchdog.rules.state.RunView` and the time, and by the launcher with two numbers for the
memory rule; nothing here touches a process.

A hot standby is a second trainer process, forked from the pre-warmed zygote, that runs the
program up to the point of restoring (its module imported, data loaded, model and optimizer
built, the Supervisor created) and waits there for SIGUSR1 (:mod:`procsv.trainer.standby.wait`).
When the trainer dies, the restart promotes it instead of forking: it restores the newest
checkpoint (the in-memory snapshot the checkpoint service just persisted) and trains on. Rules:

- **Prepare** one once the current trainer has completed a step (so a program that never
  creates a Supervisor never gets one, and the standby never competes with a trainer's start),
  while the zygote is ready, no fork is pending, no stop is under way, and the memory rule allows.
  After a standby ends on its own (a crash, or killed from outside), the next waits
  :func:`backoff` seconds; after :data:`GIVE_UP_AFTER` such ends in a row there is none for the
  rest of the run (restarts fork from the zygote, as with ``--standby fork``).
- **Promote** it when a trainer restart is due and it is ready for that attempt; a standby that is
  not ready yet (several kills in a row) is killed and the restart forks from the zygote. A standby
  *group* is promoted whole for its attempt even before every member said ready (:func:`promotable`
  with ``ready=False``): a member still preparing is further on than a fork (the same work, begun
  earlier), and once woken at normal CPU priority it finishes that work and restores without waiting.
- **Memory** (``--standby auto``, the default): a standby holds at most what the trainer held
  before its first step, so it is started only if the memory available is at least twice the
  trainer's resident size plus 1 GiB (:func:`memory_allows`), measured once at the first
  trainer's first step (a group's: the chief's size times ``--nproc``).

**The standby group over hosts** (``--nnodes M --standby hot``, issue 70): the standby group is prepared over
the current group's hosts (``RunView.group_nodes``), ``--nproc`` members on each, each other host's members
(``standby<R>``) started by its agent from its own pre-warmed trainer and promoted by it (node 0 asks:
:mod:`procsv.watchdog.multihost.standbys`); the rules below hold for it as on one host, and it is promotable
only if every member sits on its task's host of the next group (:func:`promotable`'s ``nodes``). A host lost
with a standby group prepared takes the group along: its members there end with the host (``NodeLost``),
:func:`broken` kills the rest, and the restart forks over the hosts left (an elastic group's smaller group,
or every host once the lost one is back); the next standby group is prepared over the new group's hosts once
it stepped, after the backoff (the loss counts as a standby's end), and promoted as any (:func:`members` leaves
out the lost host's member of the old group, settled: a smaller group's standby is whole without it).
``--standby auto`` stays ``fork`` with ``--nnodes`` (the memory rule measures node 0's host only).

**The standby group** (``--nproc N`` on one host): the standby is N processes, slots ``standby``
(task 0) and ``standby<R>``, forked together with the *next* group attempt's ``TF_CONFIG`` (ports
of their own), so they bring their strategy up among themselves, build the model, trace the step
and wait. It is prepared once every member of the current group is live and the chief has
completed a step; it is promotable only whole (:func:`promotable`: every member live, for the
next attempt), ready or not (a group's restart, a rollback's above all, would otherwise kill a
group half prepared at idle priority and fork one that starts from nothing). A member that ends before
its promotion ends the rest of it (:func:`broken`: a
group with a member gone can never take a collective step); another is prepared after the
backoff, and a restart meanwhile forks. A member promoted before it said ready whose run of the step on
shadows (below) then does not complete still exits with ``EXIT_NO_SHADOW_RUN``: a start-up failure of that
attempt like any other (its peers, stuck in the run's collective, are SIGKILLed after the group's grace),
and the group after it is forked (no standby group is prepared before a step). At a member's death with the standby group ready the
survivors are SIGKILLed at once (:func:`procsv.watchdog.rules.group.group_actions`: they can only
fail in their next collective, and the group restores from the members' in-memory copies).
Its members run the step once on shadows among themselves, all or none: a member whose run does not
complete exits with ``EXIT_NO_SHADOW_RUN`` instead of saying ready (its peers may wait in the step's
collective for good), :func:`broken` kills the rest, and :func:`gone` marks the run's next standby
groups "without shadow run" (``PROCSV_SHADOW_RUN=0`` in every member's environment: none runs it).
"""

from __future__ import annotations

from procsv.common.exitcodes import EXIT_NO_SHADOW_RUN, EXIT_NO_STANDBY
from procsv.watchdog.rules import group
from procsv.watchdog.rules.actions import Action, Cause, Kill, StandbyGone
from procsv.watchdog.rules.state import STANDBY, TRAINER, ChildView, RunView, ZygoteState

GIVE_UP_AFTER = 5  # standby ends in a row (not caused by the watchdog) after which none is prepared
HEADROOM = 1 << 30  # bytes of memory left over beyond twice the trainer's size


def backoff(failures: int) -> float:
    """Seconds before the next standby after ``failures`` ends in a row (1, 2, 4, ... at most 30)."""
    return min(30.0, 2.0 ** max(0, failures - 1))


def memory_allows(trainer_rss: int, available: int, nproc: int = 1) -> tuple[bool, str]:
    """Whether a standby (a standby group of ``nproc``) fits beside a trainer (a group of ``nproc``)
    whose chief uses ``trainer_rss`` bytes, and a line saying why."""
    size = trainer_rss * nproc
    ok = available >= 2 * size + HEADROOM
    who = (f"the trainer uses {size / 2**20:.0f} MiB" if nproc == 1 else
           f"the group's {nproc} trainers use {size / 2**20:.0f} MiB ({trainer_rss / 2**20:.0f} MiB the chief)")
    why = (f"{who} and {available / 2**30:.1f} GiB are available "
           f"({'at least' if ok else 'less than'} twice {'the trainer' if nproc == 1 else 'the group'}'s size plus 1 GiB)")
    return ok, why


def slot(rank: int) -> str:
    """The slot of the standby for task ``rank`` of the next group (``standby`` for the chief's)."""
    return STANDBY if rank == 0 else f"{STANDBY}{rank}"


def members(view: RunView) -> list[ChildView]:
    """The standby's processes (one; a standby group's N), by task: not one whose end was judged already (rule 1),
    the member of a group replaced since whose slot the new group has not taken (a smaller group's: an elastic
    group's after a host's loss, whose standby was never whole, and killed as unready at every restart, before)."""
    return sorted((c for c in view.children.values() if c.role == STANDBY and not c.settled),
                  key=lambda c: group.rank_of(c.slot))


def may_prepare(view: RunView, now: float) -> bool:
    """Rule 10: a standby (a standby group) should be prepared now."""
    if view.standby_ok is not True or view.stop_signal is not None or view.finishing:
        return False
    if view.zygote != ZygoteState.READY or view.forking or view.restart_at is not None:
        return False
    if members(view):
        return False
    trainer = view.children.get(TRAINER)
    if trainer is None or not trainer.live or trainer.first_step_at is None:
        return False
    if group.workers(view) and (group.breaker(view, trainer) is not None
                                or not all(m.live for m in group.members(view, trainer))):
        return False
    return view.standby_failures < GIVE_UP_AFTER and now >= view.standby_after


def promotable(view: RunView, size: int, ready: bool = True, nodes: tuple[int, ...] = (0,)) -> bool:
    """The standby (all ``size`` members of a standby group) can become the next attempt: every member live,
    not being killed, forked for that attempt, and (``ready``) every member said ready. Over hosts (``nodes``,
    the next group's, node 0 first, ``size // len(nodes)`` members each) every member is on its task's host:
    a standby group prepared over other hosts than the next group's (an elastic group's change) is not."""
    trainer = view.children.get(TRAINER)
    sbs = members(view)
    each = max(1, size // max(1, len(nodes)))
    return (trainer is not None and len(sbs) == size and sorted(group.rank_of(c.slot) for c in sbs) == list(range(size))
            and all(c.live and not c.killed and (c.standby_ready_at is not None or not ready)
                    and c.attempt == trainer.attempt + 1 and c.node == nodes[group.rank_of(c.slot) // each]
                    for c in sbs))


def broken(view: RunView) -> list[Action]:
    """A standby group's member ended before its promotion: the rest of it is SIGKILLed (it can never
    take a collective step without that member); rule 1 settles each, and another group is prepared."""
    sbs = members(view)
    if len(sbs) < 2 or not any((c.reaped or c.noticed_dead_at is not None) and not c.settled for c in sbs):
        return []
    return [Kill(c.slot, c.attempt, Cause.STANDBY_LOST) for c in sbs if c.live and not c.killed
            and c.noticed_dead_at is None]


def gone(view: RunView, child: ChildView) -> StandbyGone:
    """A standby's process was reaped (rule 1). It failed unless the watchdog ended it (a kill, a stop).
    A standby group's member that exited with ``EXIT_NO_SHADOW_RUN`` (its run of the step on shadows did
    not complete, so its peers may wait in the step's collective for good) is no failure of the standby:
    :func:`broken` kills the rest, and the run's next standby groups skip the shadow run
    (``RunView.shadow_runs``), prepared without backoff. One that exited with ``EXIT_NO_STANDBY`` (the
    program starts what only one process may hold: its own ``tf.train.Server`` on the trainer's port)
    is no failure either: the run has no standby from then on (``RunView.standby_ok``)."""
    own = not child.killed and view.stop_signal is None
    no_shadow = own and child.exit_code == EXIT_NO_SHADOW_RUN
    unsuitable = own and child.exit_code == EXIT_NO_STANDBY
    return StandbyGone(child.slot, child.attempt, own and not no_shadow and not unsuitable, no_shadow, unsuitable)


def unready(view: RunView) -> list[Action]:
    """A restart is due and the standby is not ready (every member): SIGKILL what of it lives."""
    return [Kill(c.slot, c.attempt, Cause.STANDBY_UNREADY) for c in members(view) if c.live and not c.killed]
