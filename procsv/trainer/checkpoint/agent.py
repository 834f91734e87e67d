"""The trainer's side of checkpointing: restore at start, snapshots at step boundaries, final save.

Runs in the trainer's main thread, called by :class:`procsv.Supervisor`. It restores the newest
committed checkpoint whose files pass their checksums (falling back past corrupt ones with one
clear line each; retrying, then failing, on an unreadable one; refusing to start from step 0 when
checkpoints exist but none restores: :mod:`procsv.trainer.checkpoint.restore_at_start`), answers the
checkpoint service's :class:`SaveRequest` (the ``save_model_secs`` timer lives in the service) and
its own every-``save_checkpoint_steps`` trigger with a snapshot, and at the end commits the last
completed step within ``stop_grace_secs`` (``final`` on a clean finish, ``preempted`` after
SIGTERM/SIGINT).

At a step boundary the agent observes, decides purely, and acts (:meth:`CheckpointAgent.work`):
it refreshes the :class:`~procsv.trainer.checkpoint.boundary_plan.BoundaryView` from what it and its
collaborators hold, asks :func:`~procsv.trainer.checkpoint.boundary_plan.plan` what to do (the
decision: when a snapshot of either tier is taken, when the service is read and heartbeated, when a
deadline is checked), performs each action (every TensorFlow, socket and shared-memory effect is
here), and folds the service's replies in through one function (``_note``). The three promises
below are the planner's, tested without TensorFlow in ``tests/test_boundary_plan.py``.

The loop pays only for the snapshot (:mod:`procsv.trainer.checkpoint.snapshot_store`: a copy into shared
memory set up once, right after the restore, and pre-faulted by a low-priority thread); the
service persists it while training goes on.

**At most one checkpoint is in flight**, because the snapshot memory is reused: the trainer does
not touch it again until the service's :class:`SaveResult` for that snapshot has arrived. A
trigger that comes while one is in flight (timer, every-N-steps, several of them) is remembered
once, not queued, and served at the first step boundary after the result, with the state of that
step: a checkpoint is never older than needed and the memory never holds two. If the service dies
with a snapshot in flight, the restarted service says so on the next heartbeat (a ``lost``
result) and the snapshot is taken again. The final checkpoint first waits, until a deadline, for
the one in flight to be answered (heartbeating on, so that a replaced service answers ``lost`` for a
snapshot it never received; past the snapshot's own deadline it is overdue), then commits the last
completed step within ``stop_grace_secs``, saying so in one line either way (:meth:`CheckpointAgent.final`).

**An explicit save (final, ``sv.saver.save``) is never refused for a full queue**: it blocks, up
to ``stop_grace_secs``, for a snapshot slot and socket room (:meth:`CheckpointAgent._free_slot`).

**Every snapshot in flight has a deadline**; each one that passes counts as a failed checkpoint
and makes the watchdog replace the checkpoint service (:mod:`procsv.trainer.checkpoint.commits`, which also
counts failed commits in a row). The memory stays untouched until the snapshot is answered or
reported ``lost``: a hung service may still be reading it.

One concern: the trainer's half of the checkpoint protocol, from the restore at start to the final commit.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional

from procsv.ipc.messages import (Busy, CheckpointSetup, CommitLoading, Progress, RestoreSource, SaveData, SaveReason,
                                 SaveRequest, SaveResult, SnapshotHeld, GroupCopyRefused)
from procsv.ipc.transport import NoReply
from procsv.common.clock.watched import stopped_since
from procsv.common.errors import CheckpointError, NonFiniteState
from procsv.common.layout import Layout, read_json
from procsv.common.manifests import Manifest, manifest_path
from procsv.trainer.checkpoint import memory_tier, restore_at_start
from procsv.trainer.channels import TrainerChannels
from procsv.trainer.checkpoint.commits import (CHECKPOINT_FAILURE_LIMIT, SAVE_DEADLINE_FLOOR, CommitTracker,
                                               bytes_being_written)
from procsv.trainer.checkpoint.boundary_plan import (HEARTBEAT_EVERY, NEVER, READ_EVERY, READ_IDLE,
                                                     Action, BoundaryPolicy, BoundaryView, CheckDeadline,
                                                     CheckGroupLosses, HandOffSummaries, Heartbeat, MemorySnapshot,
                                                     ReadService, Release, Snapshot, Trigger, next_bound, plan)
from procsv.trainer.checkpoint.memory import PLAN_MAX_AGE, MemoryTier
from procsv.trainer.checkpoint.name_based import NameBasedCheckpoint
from procsv.trainer.checkpoint.restore import ReadRetry
from procsv.trainer.checkpoint.revisions import Revisions
from procsv.trainer.checkpoint.snapshot import arena_bytes_needed, self_test
from procsv.trainer.checkpoint.snapshot_store import SnapshotStore, stuck_here

# the boundary's work the agent performs only when asked for all of it (:meth:`CheckpointAgent.work`)
_TIER_WORK = (HandOffSummaries, Snapshot, Release, MemorySnapshot, CheckGroupLosses)


@dataclass(frozen=True)
class ServicePolicy:
    """What the agent heartbeats to the checkpoint service (``CheckpointSetup``), which decides on it:
    the checkpoints' ``basename``, its ``save_model_secs`` timer and its retention."""

    basename: str
    save_model_secs: Optional[float]
    max_to_keep: int
    keep_checkpoint_every_n_hours: Optional[float]


def _nothing() -> None:
    """The wake-up of an agent no step boundary has claimed yet."""


def _no_step() -> bool:
    """Whether the session of an agent no step boundary has claimed yet completed a step: it did not."""
    return False


@dataclass
class SnapshotHooks:
    """What others have the agent call around its snapshots, registered by them: ``prepare``, internal
    preparations before every snapshot of either tier, in order (the step counter's sync, Keras's
    position); ``procsv.train``'s CheckpointSaverListeners, called with (step, reason) right before a
    disk snapshot (``before``) and with the step when the trainer learns it is committed
    (``committed``); the non-finite policy, called with (the refusal, at the final checkpoint) when a
    snapshot's state is not finite (``refused``); the checkpoints' keeper, called with TF's restore
    status after a restore from disk (``restored``: it checks, after the first step, what the restore did
    not reach); ``wake``: a save was requested outside the boundary (the step boundary opens its
    checkpoint half); and ``stepped``: whether the session completed a step yet (the step boundary's
    progress reports know), said in the Progress around each snapshot."""

    prepare: list[Callable[[], None]] = field(default_factory=list)
    before: list[Callable[[int, SaveReason], None]] = field(default_factory=list)
    committed: list[Callable[[int], None]] = field(default_factory=list)
    refused: list[Callable[[NonFiniteState, bool], None]] = field(default_factory=list)
    restored: list[Callable[[str, Any], None]] = field(default_factory=list)
    wake: Callable[[], None] = _nothing
    stepped: Callable[[], bool] = _no_step
    # a trainer group's check at its K-th steps, with the group's verdict (procsv.trainer.nonfinite.group_verdict;
    # None: each member checks its own losses alone, and one that finds a bad step asks for the group's restart)
    group_check: Optional[Callable[[int], None]] = None

    def claim(self, wake: Callable[[], None], stepped: Callable[[], bool]) -> None:
        """A step boundary claims the agent: its wake-up, and whether its session completed a step."""
        self.wake, self.stepped = wake, stepped


class CheckpointAgent:
    """The trainer's checkpointing for one session: restore, the step boundary's executor, final commit.

    Owns what the step boundary decides on (``view``: the save pending, the newest step known
    committed, the service link's rhythm), the policy it heartbeats to the checkpoint service
    (``policy``), the restore's rules and what it restored, the revisions of committed steps
    (``revisions``), and what others registered (``hooks``: the preparations before every snapshot,
    ``procsv.train``'s listeners, the non-finite policy, the boundary's wake-up). Its
    :class:`SnapshotStore` is the snapshot memory, its :class:`CommitTracker` the snapshot in flight
    to disk and the failed commits, its :class:`MemoryTier` (``memory``: schedule, costs, the
    snapshot waiting for its summaries) the in-memory tier, which shares that memory; callers' uses
    of the tier's names on the agent forward to it (``memory_snapshot``).
    """

    meta_graph: Optional[bytes] = None  # graph mode: a serialized MetaGraphDef written beside each checkpoint

    def __init__(self, checkpoint: Any, global_step: Any, layout: Layout, *, basename: str,
                 save_model_secs: Optional[float], save_checkpoint_steps: Optional[int], max_to_keep: int,
                 keep_checkpoint_every_n_hours: Optional[float], allow_reinit: bool = False,
                 failure_limit: int = CHECKPOINT_FAILURE_LIMIT, save_deadline_floor: float = SAVE_DEADLINE_FLOOR,
                 read_retry: ReadRetry = ReadRetry(), clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep, saving: bool = True,
                 memory_budget: float = 0.0, group: Optional[tuple[int, int, int]] = None,
                 attempt: int = 0, remote: bool = False) -> None:
        self.checkpoint, self.global_step = checkpoint, global_step
        self.attempt = attempt  # this trainer's attempt (0: not said), named in every disk snapshot it sends
        self.commits = CommitTracker(failure_limit, save_deadline_floor)
        self.layout, self.clock = layout, clock
        self.policy = ServicePolicy(basename, save_model_secs, max_to_keep, keep_checkpoint_every_n_hours)
        self.restore_rules = restore_at_start.RestoreRules(allow_reinit, read_retry, sleep)
        self.restored_from: Optional[str] = None
        # a newer state of a committed step (runs that did not advance it): ``changes`` the Supervisor's step state
        # (``changed``, set at the boundary); the revisions of committed steps, and of those a rollback passed over
        self.changes: Any = None
        self.revisions = Revisions()
        self._followed = 0  # the restarted checkpoint services the channels followed (TrainerChannels.followed)
        # the in-memory tier (procsv.trainer.checkpoint.memory_tier): off when the budget is 0; in a trainer
        # group (rank, attempt, K) every member's, every K steps (procsv.trainer.checkpoint.group_restore)
        self.group = group if group is not None and group[2] > 0 and not isinstance(checkpoint, NameBasedCheckpoint) \
            else None
        budget = memory_budget if saving or self.group is not None else 0.0
        # what the step boundary decides on (boundary_plan): the save pending, the newest step committed, the
        # service link's rhythm; the snapshot in flight and the in-memory tier observed into it before each plan
        self.view = BoundaryView(BoundaryPolicy(saving, save_checkpoint_steps,
                                                self.group[2] if self.group is not None else 0))
        self.restored_source: Optional[RestoreSource] = None  # where the restore read the state (None: initialized)
        self.store = SnapshotStore(checkpoint, memory_tier.SLOTS if budget > 0 else 1, clock)
        self.hooks = SnapshotHooks()
        self.memory = MemoryTier(self.store, budget, basename, self.hooks.prepare,
                                 self.view.answer_awaited)  # the in-memory tier, which shares the snapshot memory
        self.memory.numbered = getattr(global_step, "numbered", True)
        if self.group is not None:
            self.memory.member, self.memory.attempt, self.memory.every_steps = self.group
            self.memory.remote = remote  # a member of host 1..M-1: its copies go to node 0's service
        self.refused_final = False  # the final checkpoint was refused: its state is not finite (procsv.trainer.nonfinite)
        # restore() creates save_counter; create it now so every snapshot contains it, as save() does
        _ = checkpoint.save_counter
        self_test(checkpoint)

    @property
    def in_flight(self) -> Optional[int]:
        """The step of the snapshot in flight to disk (None: none is)."""
        return self.commits.step

    @property
    def pending(self) -> Optional[SaveReason]:
        """The save pending for the next step boundary (None: none)."""
        return self.view.pending

    @property
    def last_committed(self) -> int:
        """The newest step known committed (-1: none)."""
        return self.view.last_committed

    @property
    def saving(self) -> bool:
        """False for a worker replica: it restores the chief's checkpoints, never saves."""
        return self.view.policy.saving

    @property
    def failure(self) -> Optional[CheckpointError]:
        """Set once ``failure_limit`` checkpoints in a row failed to commit: the Supervisor stops with it."""
        return self.commits.failure

    # ------------------------------------------------------------------ the in-memory tier's names, forwarded to it
    @property
    def memory_taken(self) -> int:
        return self.memory.taken

    def memory_due(self, step: int, now: float) -> bool:  # call after poll() said no disk snapshot is due
        return self.memory.due(step, now)

    def memory_snapshot(self, ch: TrainerChannels, step: int, unwritten_from: Optional[int] = None) -> bool:
        return self.memory.snapshot(ch, step, self.meta_graph, unwritten_from)

    def check_group_step(self, step: int) -> None:
        """A group member's every-K-th step (where every member snapshots), or the chief's
        every-``save_checkpoint_steps``-th (:func:`~.boundary_plan.group_losses_due` decides): the
        watched losses kept since the last check are checked even if its snapshot was not taken (no
        slot free, the last one not yet acknowledged or still in flight to disk, one waiting for its
        summaries, the memory still populating): raises :class:`NonFiniteState` as a refused snapshot
        does. No read when nothing is kept unchecked (the snapshot's own check just ran). A worker's
        losses are checked nowhere else (the final checkpoint is the chief's alone): a NaN only this
        member saw, before a snapshot it skipped, went undetected, the group trained on and exited 0. At a
        K-th step, with the non-finite rollback's ``hooks.group_check``, the check is the group's verdict
        (every member's finding exchanged: :mod:`procsv.trainer.nonfinite.group_verdict`), which may roll the
        group back in place (raises :class:`~procsv.common.errors.GroupRolledBack`)."""
        watch = self.store.watch
        if watch is not None and self.group is not None:
            if self.hooks.group_check is not None and step % self.group[2] == 0:
                self.hooks.group_check(step)
            else:
                watch.precheck(step)

    def check_group_end(self, step: int) -> None:
        """A group member other than the chief, at its session's end (the loop finished, a stop, or a
        peer's end that broke its collective): the watched losses kept since its last check are
        checked (one read), as the chief's final checkpoint checks the chief's: raises
        :class:`NonFiniteState`. Before: a worker's losses since its last group snapshot step were
        never checked, and a NaN in its batch at step B, whose gradient all-reduced into every
        member's weights, was blamed on step B+1, the first the chief saw: the group skipped the
        wrong step again and again and gave up as diverging."""
        watch = self.store.watch
        if watch is not None and self.group is not None:
            watch.precheck(step)

    def charge_memory(self, step: int, start: float, end: float) -> None:
        self.memory.charge(step, start, end)

    def memory_held(self, msg: SnapshotHeld) -> None:
        self.memory.held(msg)

    def waiting(self) -> bool:
        return self.memory.waiting()

    def release_memory(self, ch: TrainerChannels, unwritten_from: Optional[int]) -> bool:
        return self.memory.release(ch, unwritten_from)

    # ------------------------------------------------------------------ start
    def restore_or_init(self, init: Callable[[], None], pinned: Optional[restore_at_start.Pinned] = None,
                        before: Optional[int] = None, target: Optional[Any] = None) -> list[str]:
        """Restore the newest committed checkpoint that verifies and restores; return the corrupt
        prefixes passed over. With none committed: a plain-TF checkpoint of the logdir, else ``init``.

        ``before``: only a checkpoint of a step below it (a group's rollback of step ``before``). Raises
        :class:`UnreadableCheckpoint` (a file stayed unreadable for ``read_retry.total_secs``) and
        :class:`NoRestorableCheckpoint` (all corrupt, not ``allow_reinit``): :mod:`.restore`'s rules.
        ``target``: what is restored instead of the checkpoint object (a front-end's choice:
        :meth:`procsv.trainer.frontend.port.FrontEnd.restore_into`); the global step is set either way.
        """
        done = restore_at_start.restore_or_init(self.checkpoint if target is None else target, self.global_step, self.layout, init,
                                                  allow_reinit=self.restore_rules.allow_reinit,
                                                  read_retry=self.restore_rules.read_retry, clock=self.clock,
                                                  sleep=self.restore_rules.sleep, pinned=pinned, before=before)
        if done.path is not None:
            self.restored_from, self.restored_source = done.path, RestoreSource.DISK
            if done.status is not None:
                for restored in self.hooks.restored:
                    restored(done.path, done.status)
        self.revisions.passed_over({m.step: m.revision for m in done.passed})
        if self.restored_from:
            self.view.restored(int(self.global_step.numpy()))
            done_manifest = Manifest.from_json(read_json(manifest_path(self.layout, os.path.basename(self.restored_from))))
            self.revisions.restored(done_manifest.revision if done_manifest is not None else 0)
        # the restored (or initial) state is on disk or rebuilt by init: the first in-memory
        # snapshot is of a step trained after it
        self.memory.start(int(self.global_step.numpy()), self.clock())
        if self.saving or self.group is not None:
            self.store.arena_for(arena_bytes_needed(self.checkpoint), background=True)
        return done.corrupt

    def replaying_from(self, step: int, path: str) -> None:
        """An auditor restored committed checkpoint ``step`` (prefix ``path``) itself (issue 71: no
        :meth:`restore_or_init`): the newest committed step is that one (a save of it asked at the session's start
        is done), and the program resumes from it as a restarted trainer does (Keras ``fit``: at its position)."""
        self.view.restored(step)
        self.restored_from, self.restored_source = path, RestoreSource.DISK

    def restored_memory(self, step: int, newest_committed: int, peer: bool = False,
                        passed: Optional[Mapping[int, int]] = None) -> None:
        """The group's in-memory snapshot of ``step`` was restored (not on disk: the newest committed
        checkpoint is ``newest_committed``'s; ``peer``: some member's copy was held by another host
        than its own); the next in-memory snapshot is of a step trained after it. ``passed``: the
        checkpoints a group's rollback passed over (step -> revision), rewritten when the group
        commits their step again, as after a restore from disk."""
        self.restored_from = f"the group's in-memory snapshot of step {step}"
        self.restored_source = RestoreSource.PEER if peer else RestoreSource.MEMORY
        self.revisions.passed_over(passed or {})
        self.view.restored(newest_committed)
        self.memory.start(step, self.clock())
        self.store.arena_for(arena_bytes_needed(self.checkpoint), background=True)

    # ------------------------------------------------------------------ during training
    def heartbeat(self, ch: TrainerChannels, step: int, now: float) -> None:
        """Tell the checkpoint service our policy (again); it is how a restarted service finds us."""
        self.view.heartbeat_sent(now)
        policy = self.policy
        ch.setup(CheckpointSetup(os.getpid(), policy.basename, policy.save_model_secs, policy.max_to_keep,
                                 policy.keep_checkpoint_every_n_hours, step,
                                 self.store.arena.ref() if self.store.arena is not None else None, self.in_flight))

    def poll(self, ch: TrainerChannels, step: int, now: float, ahead: float = 0.0) -> bool:
        """At a step boundary (``step`` steps completed): heartbeat, read the service's messages,
        check the deadline of the snapshot in flight, apply the every-N-steps trigger; True if a
        snapshot of ``step`` is due now (then :meth:`snapshot`). A heartbeat or read due within
        ``ahead`` s is done now (the boundary runs anyway: one rhythm, not two). :meth:`work` does the
        whole boundary."""
        self.view.begin(step, now)
        return self._run(ch, step, now, ahead)

    def work(self, ch: TrainerChannels, step: int, now: float, hand_off_summaries: Callable[[], None],
             unwritten_from: Callable[[], Optional[int]], ahead: float = 0.0) -> None:
        """The checkpoint work of the completed ``step``, before the next one runs, as
        :func:`~procsv.trainer.checkpoint.boundary_plan.plan` decides it: the service's messages and
        heartbeat when due, then a snapshot to disk if one is due, else the hand-off of an in-memory
        snapshot waiting for its summaries, else a new in-memory snapshot if one is due; a group
        member's every-K-th step has its watched losses checked. The summaries the program logged
        for ``step`` are handed off before a snapshot of it (``hand_off_summaries``), so that a commit
        never gets ahead of them; ``unwritten_from`` gives the lowest step with a summary not
        confirmed written. Raises :class:`NonFiniteState` when a snapshot or a check was refused."""
        self.view.begin(step, now)
        self._run(ch, step, now, ahead, (hand_off_summaries, unwritten_from))

    def _run(self, ch: TrainerChannels, step: int, now: float, ahead: float,
             tier: Optional[tuple[Callable[[], None], Callable[[], Optional[int]]]] = None) -> bool:
        """Observe, plan, act, until the plan asks for nothing more at this boundary. Without ``tier``
        (:meth:`poll`) the snapshots are left to the caller: returns whether a disk one is due."""
        while True:
            actions = plan(self._observe(now, tier[1] if tier is not None else None), step, now, ahead)
            for action in actions:
                if tier is None and isinstance(action, _TIER_WORK):
                    return any(isinstance(a, Snapshot) for a in actions)
                self._perform(ch, action, now, tier)
                self.view.did(action)
            if not actions or not isinstance(actions[-1], (ReadService, Release)):
                return False

    def _observe(self, now: float, unwritten_from: Optional[Callable[[], Optional[int]]] = None,
                 busy_enough: bool = False) -> BoundaryView:
        """The view, with what the collaborators hold now: the snapshot in flight and its deadline,
        whether runs changed the state, the in-memory tier (``unwritten_from`` asked only while an
        in-memory snapshot waits for its summaries). ``busy_enough`` (for :meth:`next_work`): the
        tier's readiness is not looked at when a save is pending, a snapshot in flight, one waiting
        or one being measured (every boundary has work then, whatever it says)."""
        view, memory, commits = self.view, self.memory, self.commits
        changed = self.changes is not None and bool(self.changes.changed)
        view.observe(commits.step, commits.overdue_at, changed)
        waiting = memory.waiting_step()
        measuring = memory.measuring()
        if busy_enough and (view.pending is not None or commits.step is not None or waiting is not None or measuring):
            ready = False
        else:
            ready = memory.ready(now)
        view.observe_memory(memory.step, waiting, measuring, ready,
                            memory.next_due() if ready and self.group is None else NEVER, memory.refused_by_peer,
                            unwritten_from() if waiting is not None and unwritten_from is not None else None)
        return view

    def _perform(self, ch: TrainerChannels, action: Action, now: float,
                 tier: Optional[tuple[Callable[[], None], Callable[[], Optional[int]]]]) -> None:
        """Do what the plan asked for (every socket, TensorFlow and shared-memory effect of the boundary)."""
        if isinstance(action, Heartbeat):
            self.heartbeat(ch, action.step, now)
        elif isinstance(action, ReadService):
            self._read_service(ch, action.step, now)
        elif isinstance(action, CheckDeadline):
            self._overdue(ch, now)
        elif isinstance(action, Trigger):
            self.view.requested(action.reason)
        elif tier is None:
            raise ValueError(f"{action}: the snapshots are the caller's after poll()")
        elif isinstance(action, HandOffSummaries):
            tier[0]()
        elif isinstance(action, Snapshot):
            self._send(ch, action.step, action.reason)
        elif isinstance(action, Release):
            self.memory.release(ch, self.view.unwritten_from)
        elif isinstance(action, MemorySnapshot):
            self.memory.snapshot(ch, action.step, self.meta_graph, tier[1]())
        elif isinstance(action, CheckGroupLosses):
            self.check_group_step(action.step)

    def behind(self, step: int) -> bool:
        """Whether ``step`` is committed but runs changed the state since its snapshot without advancing
        the step: its next snapshot is a newer revision of it, which the service rewrites in place."""
        return step == self.last_committed and self.changes is not None and bool(self.changes.changed)

    def _read_service(self, ch: TrainerChannels, step: int, now: float) -> None:
        """Take every message the checkpoint service has sent (without waiting)."""
        self._note(ch.poll_checkpoint() if self.in_flight is not None else self.memory.poll_for_ack(ch), ch.clock)
        followed = getattr(ch, "followed", 0)  # (a stand-in for the channels has none)
        if followed != self._followed:  # node 0's restarted service: the dead one acknowledges nothing
            self._followed = followed
            self.memory.followed(ch, now)  # (the copy it lost handed to the new one)
        self.view.read(step, now + (READ_EVERY if self.in_flight is not None
                                         else self.memory.read_wait(now, READ_IDLE)))

    def snapshot(self, ch: TrainerChannels, step: int) -> bool:
        """Take and send the due snapshot of ``step`` (call only after :meth:`poll` said so)."""
        pending = self.view.pending
        assert pending is not None
        return self._send(ch, step, pending)

    def request(self, reason: SaveReason) -> None:
        """Checkpoint at the next step boundary (coalesced with any trigger already pending)."""
        self.view.requested(reason)
        self.hooks.wake()

    def next_work(self, step: int, now: float) -> tuple[float, float]:
        """After the checkpoint work at boundary ``step``: the first boundary and time (on the clock)
        it may have work again (:func:`~procsv.trainer.checkpoint.boundary_plan.next_bound`)."""
        return next_bound(self._observe(now, busy_enough=True), step, now)

    def _overdue(self, ch: TrainerChannels, now: float) -> None:
        """A deadline of the snapshot in flight passed: unless its commit is still writing (slow, not
        dead: said once), a failed checkpoint, and the watchdog is told."""
        if self.commits.progressing(bytes_being_written(self.layout.tmp), now):
            if self.commits.extended == 1:
                doing = (f"the checkpoint service still loads {self.commits.loading} for it" if self.commits.loading
                         else f"still being written ({self.commits.written / 1e6:.1f} MB so far)")
                print(f"procsv: the checkpoint of step {self.commits.step} is slow: {doing} after "
                      f"{now - self.commits.since:.1f} s; waiting while it makes progress", file=sys.stderr, flush=True)
            return
        overdue = self.commits.overdue(now, stopped_since(ch.clock, self.commits.since))
        ch.to_watchdog(overdue)
        self.commits.failed(overdue.step,
                            f"no result from the checkpoint service within {overdue.deadline_secs:.1f} s")

    def _on_result(self, msg: SaveResult, clock: Callable[[], float]) -> None:
        if msg.step != self.in_flight:
            return  # an answer to a snapshot we no longer wait for (we gave up on it)
        self.commits.answered()
        slot = self.store.slots.disk
        self.store.slots.disk_done()
        if msg.reason != SaveReason.LOST:
            self.store.slots.acknowledged(msg.step, slot)  # the service holds it (the newest it has)
        retake = self.revisions.answered(msg.step, msg.ok, msg.again, msg.revision, self.last_committed)
        if retake and self.changes is not None:
            self.changes.changed = True  # that newer state of the step is not on disk (or a newer one is): taken again
        if msg.ok:
            self.view.committed(msg.step)
            self.commits.committed(msg.persist_secs, clock() - self.commits.since)
            for committed in self.hooks.committed:
                committed(msg.step)
        elif msg.reason == SaveReason.LOST:
            print(f"procsv: the checkpoint service restarted with the snapshot of step {msg.step} in flight; "
                  "taking it again", file=sys.stderr, flush=True)
            self.view.requested(self.commits.reason)
        else:
            self.commits.failed(msg.step, msg.error)

    def _free_slot(self, ch: TrainerChannels, step: int, deadline: float) -> bool:
        """Before an explicit save's snapshot: the in-memory one waiting for its summaries is older, so it
        is dropped (coalesced); a slot still spoken for (held or unacknowledged) is waited for, reading
        the service's answers, until ``deadline`` (blocking: the program is told that step committed)."""
        self.memory.superseded()
        while self.store.slots.free(ch.clock()) is None:
            left = deadline - ch.clock()
            if left <= 0:
                return False
            self._note(ch.poll_checkpoint(timeout=min(left, READ_EVERY)), ch.clock)
        return True

    def _noting(self, ch: TrainerChannels) -> Callable[[Any], None]:
        """What takes one message that came while a wait read for another (an in-memory snapshot's acknowledgment
        during a final commit's wait: dropped, its slot stayed spoken for until the grace ran out)."""
        return lambda msg: self._note([msg], ch.clock)

    def _note(self, messages: list[Any], clock: Callable[[], float]) -> None:
        """Fold the checkpoint service's messages in (the one way its replies reach the agent's state):
        save requests, commit results, acknowledgments of in-memory snapshots, refusals, loading. ``clock``:
        the channels' (a commit's wait is measured on it)."""
        for msg in messages:
            if isinstance(msg, SaveRequest):
                self.view.requested(msg.reason)
            elif isinstance(msg, SaveResult):
                self._on_result(msg, clock)
            elif isinstance(msg, SnapshotHeld):
                self.memory.held(msg)
            elif isinstance(msg, GroupCopyRefused):
                self.memory.refused(msg)
            elif isinstance(msg, CommitLoading):
                self.commits.load_moved(msg)

    def _send(self, ch: TrainerChannels, step: int, reason: SaveReason, busy_after: Busy = Busy.NONE,
              until: Optional[float] = None) -> bool:  # until: an explicit save waits for socket room
        slot = self.store.slots.free(ch.clock())
        if slot is None:  # cannot happen with no snapshot in flight to disk; wait for a slot all the same
            return False
        for before in self.hooks.before:
            before(step, reason)
        for prepare in self.hooks.prepare:
            prepare()
        t0 = ch.clock()
        # the snapshot is work on purpose, not a hang: the watchdog's hang clock pauses meanwhile
        stepped = self.hooks.stepped()  # (the start-up snapshot, before any step: not the first step)
        ch.to_watchdog(Progress(os.getpid(), step, time.time(), Busy.SNAPSHOT, stepped))
        stuck_here("snapshot")
        self.checkpoint.save_counter.assign_add(1)
        reuse = self.store.plan_reusable(t0, PLAN_MAX_AGE)
        try:
            snap = self.store.take(step, slot, fresh=not reuse)
        except NonFiniteState:  # refused: nothing is sent, nor retried before the next trigger
            ch.to_watchdog(Progress(os.getpid(), step, time.time(), busy_after, stepped))
            self.view.served()
            self.memory.skipped(step, ch.clock())
            raise
        if snap.step is not None:  # named by the global step stored in it, not by the step counted here
            step = snap.step
        revision = self.revisions.take(step, self.last_committed)  # a newer state of a committed step
        arena = self.store.ref_of(snap)
        meta = self.meta_graph  # graph mode: <prefix>.meta too (TF's Saver.save(write_meta_graph=True))
        sent = ch.send_snapshot(SaveData(step, reason, self.policy.basename, snap.specs, arena, slot, True, meta is not None,
                                         getattr(self.global_step, "numbered", True), revision,
                                         attempt=self.attempt),
                                snap.frames if meta is None else [*snap.frames, meta], until)
        ch.to_watchdog(Progress(os.getpid(), step, time.time(), busy_after, stepped))
        self.memory.superseded()  # an in-memory snapshot still waiting is older than this one: never send it
        self.memory.disk_taken(step, ch.clock())
        if sent:
            if self.changes is not None:
                self.changes.changed = False  # (this snapshot holds what the runs changed)
            self.store.slots.sent_disk(slot)
            nbytes = snap.arena_bytes + sum(int(getattr(f, "nbytes", 0) or len(f)) for f in snap.frames)
            self.commits.sent(step, reason, nbytes, ch.clock())
            self.view.answer_awaited(ch.clock() + READ_EVERY)
            self.view.served()
        return sent

    # ------------------------------------------------------------------ the end of a session
    def _await_in_flight(self, ch: TrainerChannels, step: int, deadline: float) -> tuple[bool, Optional[SaveResult]]:
        """Wait until ``deadline`` for the snapshot in flight to be answered, as :meth:`poll` would at
        steps: past its own deadline it is overdue (the watchdog replaces the service), and heartbeats
        go on, so that a replaced service answers ``LOST`` for a snapshot it never received. Returns
        whether it was answered, and the last answer."""
        result: Optional[SaveResult] = None
        while self.in_flight is not None:
            now = ch.clock()
            if now >= deadline:
                break
            if now >= self.commits.overdue_at:
                self._overdue(ch, now)
            if now - self.view.last_heartbeat >= HEARTBEAT_EVERY:
                self.heartbeat(ch, step, now)
            try:
                result = ch.wait_save_result(self.in_flight, min(deadline, self.commits.overdue_at, now + HEARTBEAT_EVERY),
                                             self._noting(ch))
            except NoReply:
                continue
            self._note([result], ch.clock)
        return self.in_flight is None, result

    def wait_in_flight(self, ch: TrainerChannels, step: int, deadline: float) -> bool:
        """Wait until ``deadline`` for the snapshot in flight to be answered (a stop that takes no
        checkpoint of its own: the one in flight is the last); True if it was."""
        return self._await_in_flight(ch, step, deadline)[0]

    def final(self, ch: TrainerChannels, step: int, reason: SaveReason, grace_secs: float) -> Optional[SaveResult]:
        """Commit ``step`` (unless it already is, with the state as it is now) within ``grace_secs``;
        return the result. A committed step whose state changed since (:meth:`behind`) is rewritten."""
        if step <= self.last_committed and not self.behind(step):
            return None
        deadline = ch.clock() + grace_secs
        if self.in_flight is not None:
            waited_for = self.in_flight
            answered, result = self._await_in_flight(ch, step, deadline)
            if not answered:  # the service may still read the snapshot memory: do not overwrite it
                print(f"procsv: the checkpoint of step {waited_for} did not commit within "
                      f"stop_grace_secs={grace_secs:g}; the previous checkpoint is kept", file=sys.stderr, flush=True)
                return None
            if step <= self.last_committed and not self.behind(step):  # the one in flight was of ``step`` as it is
                if result is not None and result.ok and result.step == step:
                    print(f"procsv: {reason} checkpoint committed at step {step}", flush=True)
                return result
        for _ in range(2):  # a second snapshot only when the first was a revision the service had already (below)
            self.heartbeat(ch, step, ch.clock())  # a just-restarted service learns our settings before the snapshot
            try:
                sent = self._free_slot(ch, step, deadline) and self._send(ch, step, reason, Busy.FINAL_CHECKPOINT, deadline)
            except NonFiniteState as bad:
                self.refused_final = True
                for refused in self.hooks.refused:
                    refused(bad, True)  # the policy: --on-nonfinite stop raises
                return None
            if not sent:
                print(f"procsv: the {reason} checkpoint at step {step} could not be handed to the checkpoint service "
                      f"within stop_grace_secs={grace_secs:g}; the previous checkpoint is kept", file=sys.stderr, flush=True)
                return None
            step = self.in_flight if self.in_flight is not None else step  # the step stored in it names it
            try:
                result = ch.wait_save_result(step, deadline, self._noting(ch))
            except NoReply:
                print(f"procsv: the {reason} checkpoint at step {step} did not commit within "
                      f"stop_grace_secs={grace_secs:g}; the previous checkpoint is kept", file=sys.stderr, flush=True)
                return None
            self._note([result], ch.clock)
            # ``again`` for a newer revision of a committed step: the service has that revision already, an
            # older state (a service that died after its commit point, before its answer, or a dead trainer's
            # snapshot); the answer named it, so this state goes again as the revision above it
            if not (result.ok and result.again and self.revisions.sent and self.behind(step)):
                break
        if result is not None and result.ok:
            print(f"procsv: {reason} checkpoint committed at step {step}", flush=True)
        return result
