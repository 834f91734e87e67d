"""The trainer's side of checkpointing: restore at start, snapshots at step boundaries, final save.

Runs in the trainer's main thread, called by :class:`procsv.Supervisor`. It restores the newest
committed checkpoint whose files pass their checksums (falling back past corrupt ones with one
clear line each; retrying, then failing, on an unreadable one; refusing to start from step 0 when
checkpoints exist but none restores: :mod:`procsv.trainer.restore`), answers the checkpoint
service's :class:`SaveRequest` (the ``save_model_secs`` timer lives in the service) and its own
every-``save_checkpoint_steps`` trigger with a snapshot, and at the end commits the last completed
step within ``stop_grace_secs`` (``final`` on a clean finish, ``preempted`` after SIGTERM/SIGINT).

The loop pays only for the snapshot (:mod:`procsv.trainer.snapshot`: a copy into shared memory
set up once, right after the restore, and pre-faulted by a low-priority thread); the service
persists it while training goes on.

**At most one checkpoint is in flight**, because the snapshot memory is reused: the trainer does
not touch it again until the service's :class:`SaveResult` for that snapshot has arrived. A
trigger that comes while one is in flight (timer, every-N-steps, several of them) is remembered
once, not queued, and served at the first step boundary after the result, with the state of that
step: a checkpoint is never older than needed and the memory never holds two. If the service dies
with a snapshot in flight, the restarted service says so on the next heartbeat (a ``lost``
result) and the snapshot is taken again. The final checkpoint first waits for the one in flight.

**Every snapshot in flight has a deadline** (:func:`save_deadline`: ten times what its size takes
at the persist rate measured on earlier commits, never under ``save_deadline_floor``). Each time a
deadline passes without a result (the deadline, then each time the wait has tripled: the service's
replacement takes time), that counts as a failed checkpoint and the watchdog is told
(:class:`SaveOverdue`): it replaces the checkpoint service, whose successor reports the snapshot
``lost``, and it is taken again. The memory stays untouched until then: a hung service may still
be reading it.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, Callable, Optional

from procsv.ipc.messages import (Busy, CheckpointSetup, Progress, RecoverQuery, SaveData, SaveOverdue, SaveReason,
                                 SaveRequest, SaveResult, SnapshotHeld)
from procsv.ipc.transport import NoReply
from procsv.common.errors import (CheckpointError, CorruptCheckpoint, MismatchedCheckpoint, NoRestorableCheckpoint,
                                  UnreadableCheckpoint)
from procsv.common import faults
from procsv.common.layout import Layout
from procsv.common.manifests import (Manifest, damaged_manifests, list_committed, step_of_prefix, unreadable_file,
                                     verify)
from procsv.trainer import restore
from procsv.trainer.channels import TrainerChannels
from procsv.trainer.restore import ReadRetry
from procsv.trainer import memory_tier
from procsv.trainer.memory_tier import Slots
from procsv.common.snapshot_memory import SLOT_COMPLETE, SLOT_WRITING
from procsv.trainer.snapshot import Plan, Snapshot, SnapshotArena, arena_bytes_needed, plan, self_test, take

HEARTBEAT_EVERY = 2.0  # seconds between CheckpointSetup heartbeats to the checkpoint service
SAVE_DEADLINE_FLOOR = 30.0  # seconds: no snapshot is declared overdue sooner (a loaded disk's fsync)
SAVE_DEADLINE_FACTOR = 10.0  # ... nor before this many times its expected persist time
ASSUMED_PERSIST_RATE = 10e6  # bytes/s before any commit was measured (a slow network filesystem)
PLAN_MAX_AGE = 10.0  # seconds an in-memory snapshot may reuse the object-graph walk of an earlier snapshot
RECOVER_WAIT = 15.0  # seconds a restarted trainer waits for the service to persist a held in-memory snapshot


def save_deadline(nbytes: int, rate: Optional[float], floor: float = SAVE_DEADLINE_FLOOR) -> float:
    """Seconds a snapshot of ``nbytes`` may take to commit, given the measured persist ``rate``
    (bytes/s; None before the first commit)."""
    expected = nbytes / (rate if rate and rate > 0 else ASSUMED_PERSIST_RATE)
    return max(floor, SAVE_DEADLINE_FACTOR * expected)


def measured_rate(previous: Optional[float], nbytes: int, persist_secs: float) -> Optional[float]:
    """The persist rate (bytes/s) after one more commit of ``nbytes`` in ``persist_secs``.

    Averaged as time per byte, and never faster than the new measurement: one slow commit
    lengthens the deadlines at once, one fast commit (the page cache, say) shortens them by at most
    a third."""
    if nbytes <= 0 or persist_secs <= 0:
        return previous
    per_byte = persist_secs / nbytes
    if previous is None:
        return 1.0 / per_byte
    return 1.0 / max(per_byte, 0.7 / previous + 0.3 * per_byte)


def _stuck_here(name: str, detail: str = "") -> None:
    """Hang here for good if ``PROCSV_FAULT`` is ``trainer:<name>[:<n>]`` (tests only: a snapshot
    copy stuck on a page fault of dead storage looks like this; a kill meanwhile leaves a copy half
    done)."""
    if faults.fires("trainer", name):
        print(f"procsv: fault injected: stuck at {name}{detail} (PROCSV_FAULT)", file=sys.stderr, flush=True)
        while True:
            time.sleep(3600)


class CheckpointAgent:
    def __init__(self, checkpoint: Any, global_step: Any, layout: Layout, *, basename: str,
                 save_model_secs: Optional[float], save_checkpoint_steps: Optional[int], max_to_keep: int,
                 keep_checkpoint_every_n_hours: Optional[float], allow_reinit: bool = False,
                 failure_limit: int = 3, save_deadline_floor: float = SAVE_DEADLINE_FLOOR,
                 read_retry: ReadRetry = ReadRetry(), clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep, saving: bool = True,
                 memory_budget: float = 0.0) -> None:
        self.checkpoint = checkpoint
        self.saving = saving  # False for a worker replica: it restores the chief's checkpoints, never saves
        self.global_step = global_step
        self.failure_limit = failure_limit  # failed commits in a row that stop training (0: never)
        self.failures_in_a_row = 0
        self.failure: Optional[CheckpointError] = None  # set once they did: the Supervisor stops with it
        self.layout = layout
        self.basename = basename
        self.save_model_secs = save_model_secs
        self.save_checkpoint_steps = save_checkpoint_steps
        self.max_to_keep = max_to_keep
        self.keep_checkpoint_every_n_hours = keep_checkpoint_every_n_hours
        self.allow_reinit = allow_reinit  # every committed checkpoint corrupt: start from step 0 instead of failing
        self.read_retry = read_retry  # how long an unreadable checkpoint file is retried at restore
        self.clock = clock
        self.sleep = sleep
        self.restored_from: Optional[str] = None
        self.last_committed = -1
        self.in_flight: Optional[int] = None
        self.in_flight_reason = SaveReason.PERIODIC
        self.in_flight_bytes = 0
        self.in_flight_since = 0.0  # when it was sent (the agent's clock)
        self.overdue_at = 0.0  # when it is (next) declared overdue
        self.save_deadline_floor = save_deadline_floor
        self.persist_rate: Optional[float] = None  # bytes/s measured on commits
        self.pending: Optional[SaveReason] = None
        self.last_heartbeat = 0.0
        self.arena: Optional[SnapshotArena] = None
        # the in-memory tier (procsv.trainer.memory_tier): off when the budget is 0
        self.memory_budget = memory_budget if saving else 0.0
        self.slots = Slots(memory_tier.SLOTS if self.memory_budget > 0 else 1)
        self.copy_cost: Optional[float] = None  # seconds an in-memory snapshot reusing a walk stops the loop (smoothed)
        self.walk_cost = 0.0  # seconds the last walk of the object graph added to its snapshot
        self.memory_at = float("-inf")  # when the last snapshot (either tier) was taken
        self.memory_step = -1  # ... and of which step
        self.memory_taken = 0  # in-memory snapshots taken by this process
        # an in-memory snapshot copied but not handed to the service until its step's summaries
        # are written (its SaveData and frames): see release_memory
        self._waiting: Optional[tuple[SaveData, list[Any]]] = None
        self.plan: Optional[Plan] = None  # the last object-graph walk (snapshot.Plan) and when it was made
        self.plan_at = float("-inf")
        # internal preparations before every snapshot of either tier (Keras writes its position)
        self.prepare_snapshot: list[Callable[[], None]] = []
        self.last_snapshot_secs = 0.0  # how long the loop was stopped by the last snapshot
        # procsv.train's CheckpointSaverListeners: called with (step, reason) right before a snapshot is
        # taken, and with the step when the trainer learns that its checkpoint is committed
        self.before_snapshot: list[Callable[[int, SaveReason], None]] = []
        self.on_commit: list[Callable[[int], None]] = []
        # restore() creates save_counter; create it now so every snapshot contains it, as save() does
        _ = checkpoint.save_counter
        self_test(checkpoint)

    # ------------------------------------------------------------------ start
    def restore_or_init(self, init: Callable[[], None]) -> list[str]:
        """Restore the newest committed checkpoint that verifies and restores; return the corrupt
        prefixes passed over. With none committed: a plain-TF checkpoint of the logdir, else ``init``.

        Raises :class:`UnreadableCheckpoint` (a file stayed unreadable for ``read_retry.total_secs``)
        and :class:`NoRestorableCheckpoint` (every committed checkpoint is corrupt and not
        ``allow_reinit``): the rules are in :mod:`procsv.trainer.restore`.
        """
        import tensorflow as tf

        committed = list_committed(self.layout)
        damaged = damaged_manifests(self.layout)
        for name in damaged:
            print(f"procsv: ignoring damaged manifest {os.path.join(self.layout.manifests, name)} (not a valid "
                  "manifest: truncated or edited?); its checkpoint is not restored; move the file aside once you "
                  "have looked at it", file=sys.stderr, flush=True)
        if damaged and not committed and not self.allow_reinit:
            raise NoRestorableCheckpoint(
                f"refusing to start from step 0: the {len(damaged)} checkpoint manifest(s) in "
                f"{self.layout.manifests} are damaged and no other checkpoint is committed; restore them, or "
                "launch with --allow-reinit to start from scratch")

        def on_corrupt(manifest: Manifest, why: str) -> None:
            print(f"procsv: skipping corrupt checkpoint {manifest.prefix} ({why}); trying an older one",
                  file=sys.stderr, flush=True)

        choice = restore.choose(committed, self._verify_and_restore, allow_reinit=self.allow_reinit,
                                retry=self.read_retry, clock=self.clock, sleep=self.sleep, on_corrupt=on_corrupt)
        if choice.restored is None:
            legacy = tf.train.latest_checkpoint(self.layout.logdir) if not committed and not damaged else None
            if legacy:
                self._restore(legacy)
            else:
                if committed:
                    print(f"procsv: none of the {len(committed)} committed checkpoints can be restored; "
                          "starting from scratch as allowed (allow_reinit)", file=sys.stderr, flush=True)
                init()
        if choice.corrupt:
            names = ", ".join(m.prefix for m, _ in choice.corrupt)
            print(f"procsv: the checkpoint service moves the corrupt {names} to {self.layout.quarantine}/ "
                  "(not deleted: look at them there)", file=sys.stderr, flush=True)
        if self.restored_from:
            self.last_committed = int(self.global_step.numpy())
        # the restored (or initial) state is on disk or rebuilt by init: the first in-memory
        # snapshot is of a step trained after it
        self.memory_step, self.memory_at = int(self.global_step.numpy()), self.clock()
        if self.saving:
            self._arena_for(arena_bytes_needed(self.checkpoint), background=True)
        return [m.prefix for m, _ in choice.corrupt]

    def _verify_and_restore(self, manifest: Manifest) -> None:
        """Verify then restore one committed checkpoint; TF's read errors become
        :class:`CorruptCheckpoint` (data loss, not found) or :class:`UnreadableCheckpoint`."""
        import tensorflow as tf

        verify(self.layout, manifest)
        try:
            self._restore(manifest.path(self.layout.logdir))
        except (tf.errors.DataLossError, tf.errors.NotFoundError) as exc:
            raise CorruptCheckpoint(f"{manifest.prefix}: {str(exc).splitlines()[0]}") from None
        except (tf.errors.PermissionDeniedError, tf.errors.UnavailableError) as exc:
            raise UnreadableCheckpoint(f"{manifest.prefix}: {str(exc).splitlines()[0]}") from None
        except FileNotFoundError as exc:
            raise CorruptCheckpoint(f"{manifest.prefix}: {exc}") from None
        except OSError as exc:
            raise unreadable_file(manifest.prefix, exc.filename or "?", exc) from None

    def _arena_for(self, nbytes: int, background: bool = False) -> Optional[SnapshotArena]:
        """The snapshot memory, (re)created when the state has outgrown it (new variables)."""
        if self.arena is not None and self.arena.slot_size >= nbytes:
            return self.arena
        if self.arena is not None:
            # nothing in flight to disk when we get here; the service keeps its own mapping of a held snapshot
            self.arena.close()
            self.arena = None
            self.slots = Slots(self.slots.n)
        try:
            self.arena = SnapshotArena(nbytes, self.slots.n)
        except OSError as exc:  # no memfd here: snapshots travel as ZeroMQ frames instead
            print(f"procsv: no shared snapshot memory ({exc}); checkpoints copy through ZeroMQ",
                  file=sys.stderr, flush=True)
            return None
        self.arena.populate(background)
        return self.arena

    def _restore(self, path: str) -> None:
        """Restore ``path``; a checkpoint that does not match the program (a variable missing, or of
        another shape: a changed layer size) is a :class:`CheckpointError` naming the variable."""
        try:
            status = self.checkpoint.restore(path)
            status.assert_existing_objects_matched()
        except (AssertionError, ValueError) as exc:  # ValueError: "incompatible tensor with shape ... name ..."
            raise MismatchedCheckpoint(
                f"checkpoint {path} does not match this program's state ({str(exc).splitlines()[0]}); "
                "restore it with the program that wrote it, or use a new --logdir"
            ) from None
        self.restored_from = path
        step = step_of_prefix(path)
        if step is not None and int(self.global_step.numpy()) != step:
            self.global_step.assign(step)

    # ------------------------------------------------------------------ during training
    def heartbeat(self, ch: TrainerChannels, step: int, now: float) -> None:
        """Tell the checkpoint service our policy (again); it is how a restarted service finds us."""
        self.last_heartbeat = now
        ch.setup(CheckpointSetup(os.getpid(), self.basename, self.save_model_secs, self.max_to_keep,
                                 self.keep_checkpoint_every_n_hours, step,
                                 self.arena.ref() if self.arena is not None else None, self.in_flight))

    def poll(self, ch: TrainerChannels, step: int, now: float) -> bool:
        """At a step boundary (``step`` steps completed): heartbeat, read the service's messages,
        apply the every-N-steps trigger; True if a snapshot of ``step`` is due now."""
        if now - self.last_heartbeat >= HEARTBEAT_EVERY:
            self.heartbeat(ch, step, now)
        for msg in ch.poll_checkpoint():
            if isinstance(msg, SaveRequest):
                self.pending = self.pending or msg.reason
            elif isinstance(msg, SaveResult):
                self._on_result(msg)
            elif isinstance(msg, SnapshotHeld):
                self.slots.acknowledged(msg.step)
        if self.in_flight is not None and now >= self.overdue_at:
            self._overdue(ch, now)
        if self.save_checkpoint_steps and step > 0 and step % self.save_checkpoint_steps == 0:
            self.pending = self.pending or SaveReason.STEPS
        return bool(self.pending) and self.in_flight is None and step > self.last_committed

    def snapshot(self, ch: TrainerChannels, step: int) -> bool:
        """Take and send the due snapshot of ``step`` (call only after :meth:`poll` said so)."""
        assert self.pending is not None
        return self._send(ch, step, self.pending)

    def request(self, reason: SaveReason) -> None:
        """Checkpoint at the next step boundary (coalesced with any trigger already pending)."""
        self.pending = self.pending or reason

    def _overdue(self, ch: TrainerChannels, now: float) -> None:
        """A deadline of the snapshot in flight passed: a failed checkpoint, and the watchdog is told."""
        assert self.in_flight is not None
        waited = now - self.in_flight_since
        deadline = save_deadline(self.in_flight_bytes, self.persist_rate, self.save_deadline_floor)
        self.overdue_at = now + 2 * waited  # the next is due at twice the wait: the service's replacement takes time
        ch.to_watchdog(SaveOverdue(os.getpid(), self.in_flight, waited, deadline))
        self._failed(self.in_flight, f"no result from the checkpoint service within {deadline:.1f} s")

    def _failed(self, step: int, error: Optional[str]) -> None:
        self.failures_in_a_row += 1
        if 0 < self.failure_limit <= self.failures_in_a_row and self.failure is None:
            self.failure = CheckpointError(
                f"{self.failures_in_a_row} checkpoints in a row failed to commit, the last at step {step}: "
                f"{error}; training stops rather than go on without any way to keep its progress "
                "(fix the cause and run again, or pass --on-checkpoint-failure continue)")
        print(f"procsv: checkpoint at step {step} failed: {error}", file=sys.stderr, flush=True)

    def _on_result(self, msg: SaveResult) -> None:
        if msg.step != self.in_flight:
            return  # an answer to a snapshot we no longer wait for (we gave up on it)
        self.in_flight = None
        self.slots.disk_done()
        if msg.reason != SaveReason.LOST:
            self.slots.acknowledged(msg.step)  # the service holds it (the newest it has)
        if msg.ok:
            self.last_committed = max(self.last_committed, msg.step)
            self.failures_in_a_row = 0
            self.persist_rate = measured_rate(self.persist_rate, self.in_flight_bytes, msg.persist_secs)
            for committed in self.on_commit:
                committed(msg.step)
        elif msg.reason == SaveReason.LOST:
            print(f"procsv: the checkpoint service restarted with the snapshot of step {msg.step} in flight; "
                  "taking it again", file=sys.stderr, flush=True)
            self.pending = self.pending or self.in_flight_reason
        else:
            self._failed(msg.step, msg.error)

    # ------------------------------------------------------------------ the in-memory tier
    def memory_due(self, step: int, now: float) -> bool:
        """An in-memory snapshot of ``step`` may be taken now (call after :meth:`poll` said no disk one)."""
        return (self.memory_budget > 0 and self.arena is not None and not self.arena.populating()
                and step > self.memory_step and not self.slots.unacked_pending(now) and self._waiting is None
                and now - self.memory_at >= memory_tier.interval(self.copy_cost or 0.0, self.memory_budget,
                                                                 walk_secs=self.walk_cost, walk_every=PLAN_MAX_AGE)
                and self.slots.free(now) is not None)

    def memory_snapshot(self, ch: TrainerChannels, step: int, unwritten_from: Optional[int] = None) -> bool:
        """Copy the state of ``step`` into a free slot; hand it to the service to hold (not to
        persist) now or, if summaries of ``step`` or before are not written yet (``unwritten_from``,
        see :meth:`release_memory`), at a later step boundary. True if handed over now."""
        t0 = ch.clock()
        slot = self.slots.free(t0)
        if slot is None:
            return False
        for prepare in self.prepare_snapshot:
            prepare()
        reuse = self.plan is not None and self.plan.reusable and t0 - self.plan_at < PLAN_MAX_AGE
        snap = self._take(step, slot, fresh=not reuse)
        arena = self.arena.ref() if self.arena is not None and snap.arena_bytes else None
        now = ch.clock()
        if reuse:
            self.copy_cost = memory_tier.smoothed_cost(self.copy_cost, now - t0)
        else:
            self.walk_cost = max(0.0, now - t0 - (self.copy_cost or 0.0))
        self.memory_at, self.memory_step = now, step
        self.memory_taken += 1
        self._waiting = (SaveData(step, SaveReason.MEMORY, self.basename, snap.specs, arena, slot, False),
                         list(snap.frames))
        self.slots.wait_to_send(slot, step)
        return self.release_memory(ch, unwritten_from)

    def waiting(self) -> bool:
        """An in-memory snapshot is copied and waits for its summaries (see :meth:`release_memory`)."""
        return self._waiting is not None

    def release_memory(self, ch: TrainerChannels, unwritten_from: Optional[int]) -> bool:
        """Hand the waiting in-memory snapshot to the service once the summary service has written
        every summary of its step and before (``unwritten_from``: the lowest step with a summary
        not confirmed written, None if none); call at every step boundary. True if sent now.

        Until then the service holds the one before: a trainer killed meanwhile restarts from
        there and re-does the steps whose summaries died with it, instead of skipping them."""
        if self._waiting is None:
            return False
        msg, frames = self._waiting
        if unwritten_from is not None and unwritten_from <= msg.step:
            return False
        self._waiting = None
        sent = ch.send_snapshot(msg, frames)
        if sent:
            self.slots.sent_memory(msg.slot, msg.step, ch.clock())
        else:
            self.slots.drop_waiting()
        return sent

    def recover_memory(self, ch: TrainerChannels, wait_secs: float = RECOVER_WAIT) -> None:
        """At a restart, before restoring: ask the service to persist the in-memory snapshot it held
        for the dead trainer (if newer than every checkpoint) and wait for that, then restore as usual."""
        if self.memory_budget <= 0 or ch.ckpt is None:
            return
        t0 = ch.clock()
        reply = ch.recover(RecoverQuery(os.getpid()), t0 + wait_secs)
        if reply is None:
            print(f"procsv: no answer from the checkpoint service within {wait_secs:g} s about an in-memory "
                  "snapshot; restoring the newest checkpoint on disk", file=sys.stderr, flush=True)
        elif reply.step >= 0:
            print(f"procsv: the checkpoint service persisted the in-memory snapshot of step {reply.step} "
                  f"(waited {ch.clock() - t0:.2f} s)", flush=True)

    def _take(self, step: int, slot: int, fresh: bool = True) -> Snapshot:
        """Copy the state into ``slot`` (its header says writing, then complete) and gather the rest;
        walk the object graph again unless not ``fresh`` (then :attr:`plan` is reused)."""
        if fresh or self.plan is None:
            self.plan, self.plan_at = plan(self.checkpoint), self.clock()
        def place(nbytes: int) -> Optional[tuple[SnapshotArena, int]]:
            arena = self._arena_for(nbytes)
            if arena is None:
                return None
            arena.mark(slot, SLOT_WRITING, step)
            return arena, arena.base(slot)

        snap = take(self.checkpoint, place, self.plan)
        if self.arena is not None and snap.arena_bytes:
            _stuck_here("slot_complete", f" of step {step} in slot {slot}")
            self.arena.mark(slot, SLOT_COMPLETE, step)
            self.slots.written(slot, step)
        return snap

    def _send(self, ch: TrainerChannels, step: int, reason: SaveReason, busy_after: Busy = Busy.NONE) -> bool:
        slot = self.slots.free(ch.clock())
        if slot is None:  # cannot happen with no snapshot in flight to disk; wait for a slot all the same
            return False
        for before in self.before_snapshot:
            before(step, reason)
        for prepare in self.prepare_snapshot:
            prepare()
        t0 = ch.clock()
        # the snapshot is work on purpose, not a hang: the watchdog's hang clock pauses meanwhile
        ch.to_watchdog(Progress(os.getpid(), step, time.time(), Busy.SNAPSHOT))
        _stuck_here("snapshot")
        self.checkpoint.save_counter.assign_add(1)
        snap = self._take(step, slot)
        arena = self.arena.ref() if self.arena is not None and snap.arena_bytes else None
        sent = ch.send_snapshot(SaveData(step, reason, self.basename, snap.specs, arena, slot, True), snap.frames)
        ch.to_watchdog(Progress(os.getpid(), step, time.time(), busy_after))
        if self._waiting is not None:  # an in-memory snapshot still waiting is older than this one: never send it
            self._waiting = None
            self.slots.drop_waiting()
        self.last_snapshot_secs = ch.clock() - t0
        self.memory_at, self.memory_step = ch.clock(), step
        if sent:
            self.slots.sent_disk(slot)
            self.in_flight = step
            self.in_flight_reason = reason
            self.in_flight_bytes = snap.arena_bytes + sum(int(getattr(f, "nbytes", 0) or len(f)) for f in snap.frames)
            self.in_flight_since = now = ch.clock()
            self.overdue_at = now + save_deadline(self.in_flight_bytes, self.persist_rate, self.save_deadline_floor)
            self.pending = None
        return sent

    # ------------------------------------------------------------------ end
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
            if now >= self.overdue_at:
                self._overdue(ch, now)
            if now - self.last_heartbeat >= HEARTBEAT_EVERY:
                self.heartbeat(ch, step, now)
            try:
                result = ch.wait_save_result(self.in_flight, min(deadline, self.overdue_at, now + HEARTBEAT_EVERY))
            except NoReply:
                continue
            self._on_result(result)
        return self.in_flight is None, result

    def final(self, ch: TrainerChannels, step: int, reason: SaveReason, grace_secs: float) -> Optional[SaveResult]:
        """Commit ``step`` (unless it already is) within ``grace_secs``; return the result."""
        if step <= self.last_committed:
            return None
        deadline = ch.clock() + grace_secs
        if self.in_flight is not None:
            waited_for = self.in_flight
            answered, result = self._await_in_flight(ch, step, deadline)
            if not answered:  # the service may still read the snapshot memory: do not overwrite it
                print(f"procsv: the checkpoint of step {waited_for} did not commit within "
                      f"stop_grace_secs={grace_secs:g}; the previous checkpoint is kept", file=sys.stderr, flush=True)
                return None
            if step <= self.last_committed:
                return result
        self.heartbeat(ch, step, ch.clock())  # a just-restarted service learns our settings before the snapshot
        if not self._send(ch, step, reason, busy_after=Busy.FINAL_CHECKPOINT):
            print(f"procsv: the {reason} checkpoint at step {step} could not be handed to the checkpoint "
                  "service (queue full); the previous checkpoint is kept", file=sys.stderr, flush=True)
            return None
        try:
            result = ch.wait_save_result(step, deadline)
        except NoReply:
            print(f"procsv: the {reason} checkpoint at step {step} did not commit within "
                  f"stop_grace_secs={grace_secs:g}; the previous checkpoint is kept", file=sys.stderr, flush=True)
            return None
        self._on_result(result)
        if result.ok:
            print(f"procsv: {reason} checkpoint committed at step {step}", flush=True)
        return result
