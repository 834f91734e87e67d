"""The checkpoint agent's decision at a step boundary: what the boundary knows in, actions out.

Pure: no TensorFlow, no socket, no shared memory, no file and no clock of its own (the time is
passed in); ``tests/test_rooms.py`` checks by the syntax tree that nothing it imports reaches any.
It is asked in the trainer's main thread by :class:`~procsv.trainer.checkpoint.agent.CheckpointAgent`,
which observes the :class:`BoundaryView`, performs the actions :func:`plan` returns (every
TensorFlow, socket and shared-memory effect is the agent's), records each in the view
(:meth:`BoundaryView.did`) and asks again, until nothing is left to do at that boundary; then
:func:`next_bound` says at which step and time the boundary next has work
(:class:`~procsv.trainer.step_boundary.StepState`'s checkpoint bounds).
``tests/test_boundary_plan.py`` drives it with a fake clock and scripted replies.

What it decides, in the order the boundary does it:

1. **Heartbeat** the policy to the checkpoint service every :data:`HEARTBEAT_EVERY` s (a saving
   trainer's; a group's worker keeps no service state).
2. **Read** the service's messages when due (every ``next_read`` on the clock, every
   :data:`READ_EVERY_STEPS` steps whatever the clock says). What follows depends on what it reads,
   so the plan ends there; the agent folds the replies into the view and asks again.
3. **Check the deadline** of the snapshot in flight once it passed (the agent looks whether its
   commit still makes progress; if not, that is a failed checkpoint and the watchdog is told).
4. **Trigger** the every-``save_checkpoint_steps`` save, except at a step already committed (the one
   a restart restored from); with a snapshot in flight, read the service once more first at that
   step (it may have committed: the step is then saved now).
5. **Snapshot** ``step`` to disk if a save is pending, none is in flight, and ``step`` is not
   committed already (or its state changed since without advancing it: a newer revision), the
   summaries of the step handed off first. Else **release** the in-memory snapshot waiting for its
   step's summaries once they are written (the plan ends there: a release that could not be sent
   drops the snapshot, and a new one may be due at once), else take an **in-memory snapshot** when
   due.
6. **Check a group member's losses** at its every-K-th step, and the chief's at its every-``save_checkpoint_steps``-th
   too, snapshot or not (:func:`group_losses_due`): the step a NaN is found at is the same at any load. The
   check goes before the snapshot of that boundary (step 5's): at a K-th step it is the group's verdict, which
   may roll every member back in place, and the snapshot is then of a state that is no more.

The three promises of the agent, as this function keeps them:

* **At most one snapshot in flight**: no :class:`Snapshot` while ``in_flight`` is set.
* **A trigger during a flight is served once**: a trigger sets ``pending`` only if none is pending
  (coalesced, not queued), and the one pending is served at the first boundary after the result,
  with that step's state.
* **A passed deadline is a failure**: every boundary past ``overdue_at`` with a snapshot in flight
  asks for :class:`CheckDeadline` (the agent then counts a failure unless the commit is still writing).

Each kind of work is done at most once per boundary (``done``): one heartbeat, one read, one
snapshot of either tier.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

from procsv.ipc.message_base import SaveReason

# the service's messages are read at a step boundary every READ_EVERY while an answer is awaited (a
# snapshot in flight or unacknowledged), else every READ_IDLE (only a timer's SaveRequest can come), or
# every READ_EVERY_STEPS steps whatever the clock says. A read that finds nothing is one system call,
# yet 20-70 us right after a TF step (2 us if repeated at once): the boundary's main cost
READ_EVERY = 0.01
READ_IDLE = 0.1
READ_EVERY_STEPS = 256
HEARTBEAT_EVERY = 2.0  # seconds between CheckpointSetup heartbeats to the checkpoint service
NEVER = float("inf")
_NOTHING: frozenset[type] = frozenset()


# --------------------------------------------------------------------------- the actions
@dataclass(frozen=True)
class Heartbeat:
    """Send the policy (``CheckpointSetup``) to the checkpoint service: how a restarted one finds us."""

    step: int


@dataclass(frozen=True)
class ReadService:
    """Take every message the checkpoint service sent (without waiting), and plan again."""

    step: int


@dataclass(frozen=True)
class CheckDeadline:
    """The deadline of the snapshot of ``step`` in flight passed: unless its commit still makes
    progress, a failed checkpoint, and the watchdog is told (``SaveOverdue``)."""

    step: int


@dataclass(frozen=True)
class Trigger:
    """A save is pending from now on, for ``reason`` (the every-N-steps trigger)."""

    reason: SaveReason


@dataclass(frozen=True)
class HandOffSummaries:
    """Hand the summaries logged up to this step to the summary sender before a snapshot of it, so
    that a commit never gets ahead of them."""


@dataclass(frozen=True)
class Snapshot:
    """Take the snapshot of ``step`` and hand it to the checkpoint service to persist, for ``reason``."""

    step: int
    reason: SaveReason


@dataclass(frozen=True)
class Release:
    """Hand the in-memory snapshot of ``step``, waiting for its summaries, to the service (they are
    written now); plan again."""

    step: int


@dataclass(frozen=True)
class MemorySnapshot:
    """Copy the state of ``step`` into a free slot of the snapshot memory, for the service to hold."""

    step: int


@dataclass(frozen=True)
class CheckGroupLosses:
    """A group member's every-K-th step (the chief's every-``save_checkpoint_steps``-th too): check the
    watched losses kept since the last check (:func:`group_losses_due`)."""

    step: int


Action = Union[Heartbeat, ReadService, CheckDeadline, Trigger, HandOffSummaries, Snapshot, Release, MemorySnapshot,
               CheckGroupLosses]


# --------------------------------------------------------------------------- what the boundary knows
@dataclass(frozen=True)
class BoundaryPolicy:
    """The checkpoint policy the boundary applies, fixed for an agent: ``saving`` (False for a group's
    worker, which never saves to disk nor heartbeats), the every-``save_steps`` trigger (None: none),
    and a group member's K (``group_every``: its in-memory snapshots and loss checks at every K-th step;
    0: not a group's)."""

    saving: bool = True
    save_steps: Optional[int] = None
    group_every: int = 0


@dataclass(slots=True)
class BoundaryView:
    """What the checkpoint agent's step boundary decides on, as plain data.

    Its own (written by its methods, which the agent calls): the save ``pending``, the newest step
    known committed, the service link's rhythm (the last heartbeat, the next read and the step of the
    last read) and what was done at the boundary being worked (``done``); given: the ``policy``.
    Observed (refreshed by the agent before each question, :meth:`observe` and
    :meth:`observe_memory`): the snapshot in flight to disk and
    its deadline (the agent's :class:`~procsv.trainer.checkpoint.commits.CommitTracker` keeps them),
    whether runs changed the state without advancing the step (the step state's ``changed``), and
    the in-memory tier as far as the boundary decides on it.
    """

    policy: BoundaryPolicy = BoundaryPolicy()
    pending: Optional[SaveReason] = None
    last_committed: int = -1
    last_heartbeat: float = 0.0
    next_read: float = 0.0
    read_step: int = -READ_EVERY_STEPS  # the step of the last read of the service
    boundary: tuple[int, float] = (-1, -NEVER)  # the boundary being worked: (step, now)
    done: frozenset[type] = _NOTHING  # the kinds of action done at it
    # observed: the disk tier
    in_flight: Optional[int] = None
    overdue_at: float = NEVER
    changed: bool = False
    # observed: the in-memory tier (its step: the last snapshot of either tier; waiting: the step of the
    # in-memory snapshot waiting for its summaries; unwritten_from: the lowest step whose summaries are not
    # confirmed written, looked at only while one waits)
    memory_step: int = -1
    memory_waiting: Optional[int] = None
    memory_measuring: bool = False
    memory_ready: bool = False
    memory_next_due: float = NEVER
    memory_refused: bool = False
    unwritten_from: Optional[int] = None

    # -- the boundary
    def begin(self, step: int, now: float) -> None:
        """The boundary after ``step`` at ``now`` is worked from here on: nothing done at it yet."""
        self.boundary, self.done = (step, now), _NOTHING

    def did(self, action: Action) -> None:
        """``action`` was performed at the boundary being worked."""
        self.done = self.done | {type(action)}

    # -- its own state
    def requested(self, reason: SaveReason) -> None:
        """A save is asked for: coalesced with any pending (served once, not queued)."""
        self.pending = self.pending or reason

    def served(self) -> None:
        """The pending save was served (its snapshot handed over), or refused (not finite)."""
        self.pending = None

    def committed(self, step: int) -> None:
        """The checkpoint of ``step`` is committed (or was restored)."""
        self.last_committed = max(self.last_committed, step)

    def restored(self, step: int) -> None:
        """The state of ``step``, committed, was restored: the newest committed step is that one."""
        self.last_committed = step

    def heartbeat_sent(self, now: float) -> None:
        self.last_heartbeat = now

    def read(self, step: int, next_read: float) -> None:
        """The service was read at the boundary after ``step``; the next read is due at ``next_read``."""
        self.read_step, self.next_read = step, next_read

    def answer_awaited(self, at: float) -> None:
        """A snapshot was handed to the service: its answer is read by ``at``."""
        self.next_read = min(self.next_read, at)

    # -- observed
    def observe(self, in_flight: Optional[int], overdue_at: float, changed: bool) -> None:
        self.in_flight, self.overdue_at, self.changed = in_flight, overdue_at, changed

    def observe_memory(self, step: int, waiting: Optional[int], measuring: bool, ready: bool, next_due: float,
                       refused: bool, unwritten_from: Optional[int]) -> None:
        self.memory_step, self.memory_waiting, self.memory_measuring = step, waiting, measuring
        self.memory_ready, self.memory_next_due, self.memory_refused = ready, next_due, refused
        self.unwritten_from = unwritten_from


# --------------------------------------------------------------------------- the decisions
def behind(view: BoundaryView, step: int) -> bool:
    """``step`` is committed but runs changed the state since its snapshot without advancing the step:
    its next snapshot is a newer revision of it, which the service rewrites in place."""
    return step == view.last_committed and view.changed


def steps_trigger(view: BoundaryView, step: int) -> bool:
    """The every-``save_checkpoint_steps`` trigger fires at ``step`` (never for a step already
    committed: the one a restart restored from, which would save again at its next step; nor for the
    step in flight: a boundary of the same step again, after a graph program's run that advanced no
    step, would save a second checkpoint at the next step)."""
    every = view.policy.save_steps
    return bool(view.policy.saving and every and step > max(0, view.last_committed) and step % every == 0
                and step != view.in_flight)


def snapshot_due(view: BoundaryView, step: int, pending: Optional[SaveReason]) -> bool:
    """A disk snapshot of ``step`` is due with ``pending`` the save pending: never while one is in flight."""
    return pending is not None and view.in_flight is None and (step > view.last_committed or behind(view, step))


def memory_due(view: BoundaryView, step: int, now: float) -> bool:
    """An in-memory snapshot of ``step`` is due at ``now``; a group member's at every K-th step, on no
    clock (every member takes the same ones)."""
    if view.memory_waiting is not None or step <= view.memory_step or not view.memory_ready:
        return False
    if view.policy.group_every:
        return not view.memory_refused and step % view.policy.group_every == 0
    return now >= view.memory_next_due


def group_losses_due(view: BoundaryView, step: int) -> bool:
    """A group member's watched losses are checked at the boundary after ``step``, whether or not a
    snapshot is taken there: every member's at every K-th step (the group's in-memory snapshot steps),
    the chief's (the member that saves) at every ``save_checkpoint_steps``-th step too, the steps its
    every-N-steps trigger fires at. A check that went with the snapshot alone moved with it: a trigger
    that met a snapshot still in flight (a busy machine) left the save pending, and the losses since
    the last snapshot unchecked, until the pending snapshot or the next K-th step: a NaN at step 40
    was found at 40 on a quiet machine, at 50 at load (K 50), and under ``--on-nonfinite stop`` the
    whole group trained on to it. Where the snapshot is taken the check after it reads nothing (its
    own check just ran)."""
    policy = view.policy
    if not policy.group_every:
        return False
    return step % policy.group_every == 0 or bool(policy.saving and policy.save_steps and step % policy.save_steps == 0)


def plan(view: BoundaryView, step: int, now: float, ahead: float = 0.0) -> tuple[Action, ...]:
    """What the boundary after ``step`` (``step`` steps completed) does at ``now``, in order, beyond
    what it did already (``view.done``: the caller's :meth:`BoundaryView.begin` names the boundary).
    A heartbeat or read due within ``ahead`` s is done now (the boundary runs anyway: one rhythm, not
    two). A plan ending in :class:`ReadService` or :class:`Release` is asked again once it is performed."""
    done = view.done if view.boundary == (step, now) else _NOTHING
    out: list[Action] = []
    if Heartbeat not in done and view.policy.saving and now + ahead - view.last_heartbeat >= HEARTBEAT_EVERY:
        out.append(Heartbeat(step))
    if ReadService not in done and (now + ahead >= view.next_read or step - view.read_step >= READ_EVERY_STEPS):
        out.append(ReadService(step))
        return tuple(out)
    if CheckDeadline not in done and view.in_flight is not None and now >= view.overdue_at:
        out.append(CheckDeadline(view.in_flight))
    pending = view.pending
    if steps_trigger(view, step):
        if pending is None:
            out.append(Trigger(SaveReason.STEPS))
            pending = SaveReason.STEPS
        if view.in_flight is not None and ReadService not in done and view.read_step != step:
            out.append(ReadService(step))  # the snapshot in flight may have committed: save at this step then
            return tuple(out)
    if CheckGroupLosses not in done and group_losses_due(view, step):
        # before the snapshot: a group's check at its K-th step is the group's verdict, which may roll every member
        # back in place (procsv.trainer.nonfinite.group_verdict); the snapshot's own check then reads nothing
        out.append(CheckGroupLosses(step))
    if Snapshot in done or MemorySnapshot in done:
        pass  # one snapshot a boundary
    elif pending is not None and snapshot_due(view, step, pending):
        out += [HandOffSummaries(), Snapshot(step, pending)]
    elif Release not in done and view.memory_waiting is not None:
        if view.unwritten_from is None or view.unwritten_from > view.memory_waiting:
            out.append(Release(view.memory_waiting))
            return tuple(out)
    elif memory_due(view, step, now):
        out += [HandOffSummaries(), MemorySnapshot(step)]
    return tuple(out)


def next_bound(view: BoundaryView, step: int, now: float) -> tuple[float, float]:
    """After the checkpoint work at boundary ``step``: the first boundary and time (on the clock)
    it may have work again; exact for step triggers, and never after the next read of the
    service (a freed slot or a ready memory is seen then). Every boundary while a save is
    pending, a snapshot in flight or one waiting for its summaries, and the one after an in-memory
    snapshot (its cost is measured there)."""
    if view.pending is not None or view.in_flight is not None or view.memory_waiting is not None \
            or view.memory_measuring:
        return step + 1, now
    at_step: float = view.read_step + READ_EVERY_STEPS
    if view.policy.save_steps:
        at_step = min(at_step, (step // view.policy.save_steps + 1) * view.policy.save_steps)
    at = min(view.next_read, view.last_heartbeat + HEARTBEAT_EVERY if view.policy.saving else NEVER)
    if view.policy.group_every:  # a group's in-memory snapshots: by the step alone
        at_step = min(at_step, (step // view.policy.group_every + 1) * view.policy.group_every)
    elif view.memory_ready:
        at = min(at, view.memory_next_due)
    return at_step, at  # (an in-memory snapshot blocked by a slot or an ack: looked at again at the read)
