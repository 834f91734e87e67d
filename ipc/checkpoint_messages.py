"""The messages of the checkpoint channel, between the trainer and the checkpoint service.

The trainer (DEALER) and the checkpoint service (ROUTER on ``checkpoint.sock``) send them: up,
:class:`CheckpointSetup`, :class:`SaveData` (with the :class:`TensorSpec` of each tensor and the
:class:`ArenaRef` of the snapshot memory), :class:`RecoverQuery`, :class:`DeleteCheckpoints`, and a
group's :class:`GroupQuery` and :class:`GroupFetch` (and the watchdog's :class:`AuditHold` and :class:`AuditQuarantine`, from a DEALER of
its own); down, :class:`SaveRequest`, :class:`SaveResult`
(also pushed to the watchdog), :class:`CommitLoading`, :class:`SnapshotHeld`, :class:`RecoverReply`,
:class:`CheckpointsDeleted`, :class:`GroupHeld` and :class:`GroupCopy`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Optional

from procsv.ipc.message_base import Message, SaveReason


@dataclass(frozen=True)
class CheckpointSetup(Message):
    """The trainer's checkpoint policy; sent at start and repeated as a heartbeat."""

    KIND: ClassVar[str] = "checkpoint_setup"
    pid: int
    basename: str
    save_model_secs: Optional[float]
    max_to_keep: int
    keep_checkpoint_every_n_hours: Optional[float]
    step: int
    arena: Optional[ArenaRef] = None  # the snapshot memory, so the service can map it ahead of time
    in_flight: Optional[int] = None  # the step of the snapshot awaiting its SaveResult, if any


@dataclass(frozen=True)
class ArenaRef:
    """The trainer's shared snapshot memory (a memfd): ``path`` is ``/proc/<pid>/fd/<fd>``.

    ``ino`` tells one memfd from a later one at the same path; ``size`` is its length in bytes.
    """

    path: str
    ino: int
    size: int


@dataclass(frozen=True)
class SaveRequest(Message):
    """Checkpoint service -> trainer: take a snapshot at your next step boundary."""

    KIND: ClassVar[str] = "save_request"
    reason: SaveReason


@dataclass(frozen=True)
class TensorSpec:
    """How one tensor travels: its checkpoint key, dtype name and shape.

    Numeric tensors travel as one raw frame (C order), or, when ``offset`` is set, lie at that
    byte offset of the snapshot memory named by ``SaveData.arena`` (no frame). String tensors
    travel as one frame of concatenated bytes with the element lengths in ``lengths``; variant
    tensors (e.g. a tf.data iterator's state) as one frame holding a serialized ``TensorProto``.
    """

    key: str
    dtype: str
    shape: list[int]
    lengths: Optional[list[int]] = None
    offset: Optional[int] = None


@dataclass(frozen=True)
class SaveData(Message):
    """Trainer -> checkpoint service: a snapshot of the state at ``step``.

    One frame per tensor without an ``offset``; the others lie in ``arena``, in snapshot slot
    ``slot``, which the trainer leaves untouched until the matching :class:`SaveResult` arrives.
    ``persist=False`` is an in-memory snapshot: the service holds it (the newest one only) and
    answers :class:`SnapshotHeld`; it writes it to disk only if the trainer dies. ``meta_graph``
    (graph mode): one more frame, last, a serialized ``MetaGraphDef`` the service writes as
    ``<prefix>.meta`` beside the checkpoint (TF's ``Saver.save(write_meta_graph=True)``), committed
    and retired with it. Every disk snapshot of a graph program carries it; an in-memory one only
    until the service said it holds this trainer's (:class:`SnapshotHeld` ``meta_graph``): the
    service keeps the last one each trainer sent and writes it with a held snapshot that came without.
    ``numbered=False`` (a graph without a global step): the checkpoint is ``<basename>``, not
    ``<basename>-<step>``, rewritten at each save as TF's Supervisor does; its manifest holds ``step``.
    ``revision`` > 0: a newer state of a step already committed (runs changed variables without
    advancing the global step, as TF's Supervisor saves ``model.ckpt-0`` again): the service rewrites
    that step's checkpoint in place if ``revision`` is above the committed copy's (its manifest's
    ``revision``), else answers ``again`` (a state never overwrites a newer one of its step). 0: a
    first commit of the step, never written over a committed one.
    ``member`` (a trainer group's in-memory snapshot, ``persist=False``): the sender's rank; the
    service copies it out of the slot and keeps it for the group's next attempt (``attempt``: the
    sender's), never writes it to disk (:class:`GroupQuery`); -1: a lone trainer's. ``attempt`` on a
    disk snapshot: the sender's too, echoed in its :class:`SaveResult` (0: not said).
    """

    KIND: ClassVar[str] = "save_data"
    step: int
    reason: SaveReason
    basename: str
    tensors: list[TensorSpec]
    arena: Optional[ArenaRef] = None
    slot: int = 0
    persist: bool = True
    meta_graph: bool = False
    numbered: bool = True
    revision: int = 0
    member: int = -1
    attempt: int = 0


@dataclass(frozen=True)
class SaveResult(Message):
    """Checkpoint service -> trainer and watchdog: a save committed (``ok``) or failed. ``again``: the
    step was committed already (a snapshot of a step on disk, sent by a trainer that could not know:
    a dead trainer's snapshot in flight, or one of the step a restarted trainer restored; or a rewrite
    whose ``revision`` is not above the committed copy's); nothing was written, the trainer's wait ends,
    and it is no new commit (no second record, no CHECKPOINT log). ``revision``: the committed copy's
    (:attr:`SaveData.revision`), which the trainer's next rewrite of that step goes past. ``attempt``:
    the attempt of the trainer that took the snapshot (:attr:`SaveData.attempt`; 0: not said), so that
    the watchdog tells a rolled-back group's late commit from one of the group after it."""

    KIND: ClassVar[str] = "save_result"
    step: int
    reason: SaveReason
    ok: bool
    path: Optional[str]
    error: Optional[str]
    persist_secs: float
    again: bool = False
    revision: int = 0
    attempt: int = 0


@dataclass(frozen=True)
class CommitLoading(Message):
    """Checkpoint service -> trainer: the commit of the snapshot of ``step`` waits for the service to
    load ``what`` it needs (TensorFlow, for a variant tensor), and that load moved in the last second
    (a module more, or CPU time of the import). Sent once when the load begins and then each second in
    which it moves, so the trainer takes the commit for slow, not dead, at its deadline; a load that
    hangs (a deadlocked import, SIGSTOP) sends none, and the deadline finds the commit overdue."""

    KIND: ClassVar[str] = "commit_loading"
    step: int
    what: str


@dataclass(frozen=True)
class SnapshotHeld(Message):
    """Checkpoint service -> trainer: it now holds the in-memory snapshot of ``step`` (its newest).
    ``meta_graph``: with this trainer's ``MetaGraphDef`` (the one it sent last, with this snapshot
    or an earlier one), which a commit of the snapshot writes as ``<prefix>.meta``; False tells a
    graph program's trainer to send it again (a restarted service has none)."""

    KIND: ClassVar[str] = "snapshot_held"
    step: int
    meta_graph: bool = False


@dataclass(frozen=True)
class RecoverQuery(Message):
    """Trainer -> checkpoint service, at a restart before restoring: persist the in-memory snapshot
    of a dead trainer now, if one is held and newer than every checkpoint, then answer."""

    KIND: ClassVar[str] = "recover_query"
    pid: int


@dataclass(frozen=True)
class RecoverReply(Message):
    """Checkpoint service -> trainer: the answer to :class:`RecoverQuery`. ``step`` is the step of
    the in-memory snapshot it just committed (at ``path``), -1 if none; ``note`` says why not."""

    KIND: ClassVar[str] = "recover_reply"
    step: int
    path: Optional[str]
    note: str


@dataclass(frozen=True)
class DeleteCheckpoints(Message):
    """Trainer -> checkpoint service, at the end (Keras ``delete_checkpoint=True`` once ``fit``
    completed): delete every committed checkpoint and the ``checkpoint`` state file, once no trainer
    restores, then answer :class:`CheckpointsDeleted`."""

    KIND: ClassVar[str] = "delete_checkpoints"
    pid: int


@dataclass(frozen=True)
class AuditHold(Message):
    """Watchdog -> checkpoint service (``--audit``, issue 71; a DEALER the watchdog connects to
    ``checkpoint.sock``, no reply): the committed steps an audit still needs, the whole set each time
    (the ends of the intervals waiting or being replayed, and the newest audited step, where a rollback goes).
    Retention keeps them past ``max_to_keep`` until a later :class:`AuditHold` leaves them out; the next
    commit's retention then deletes them. A restarted service is told again when its Hello is heard."""

    KIND: ClassVar[str] = "audit_hold"
    steps: list[int]


@dataclass(frozen=True)
class AuditQuarantine(Message):
    """Watchdog -> checkpoint service (``--audit``, issue 71; the DEALER of :class:`AuditHold`, no reply): the
    checkpoints of a wrong timeline, to be moved to ``.procsv/quarantine/`` as a corrupt one is. An audit proved
    that trainer ``attempt`` computed the interval from step ``after`` (S1) wrongly and rolled it back to S1:
    every checkpoint committed after S1 by that attempt or an earlier one holds a state derived from the wrong
    one. ``steps``: those the watchdog saw committed (sent at the rollback, and again for a late commit of such
    an attempt); ``reason``: the verdict, as the lifecycle says it. The service moves the checkpoint of each of
    ``steps`` only if it is after ``after`` and its manifest's attempt is ``attempt`` or earlier (never S1, never
    a checkpoint of the timeline after the rollback, which may have rewritten such a step in place)."""

    KIND: ClassVar[str] = "audit_quarantine"
    after: int
    attempt: int
    steps: list[int]
    reason: str


@dataclass(frozen=True)
class CheckpointsDeleted(Message):
    """Checkpoint service -> trainer: the answer to :class:`DeleteCheckpoints`: how many checkpoints
    were deleted, or why not (``error``)."""

    KIND: ClassVar[str] = "checkpoints_deleted"
    deleted: int
    error: Optional[str]


@dataclass(frozen=True)
class GroupQuery(Message):
    """A restarted group's chief -> checkpoint service, before restoring: the newest step whose
    in-memory copies the service holds for every one of ``nproc`` members (of one attempt), each
    verifying against its checksum, newer than ``after`` (the newest committed checkpoint's step) and,
    for a group started to roll back step B, older than ``before`` (B; None: no rollback). Before, the
    newest was answered whatever its step, and a chief whose newest was B or later passed over every
    copy, older ones before B too."""

    KIND: ClassVar[str] = "group_query"
    pid: int
    nproc: int
    after: int
    before: Optional[int] = None


@dataclass(frozen=True)
class GroupHeld(Message):
    """Checkpoint service -> a group's chief: the answer to :class:`GroupQuery`: ``step`` (-1: none
    is whole for the group, ``note`` says why) and the attempt that took it; ``peer``: a member's copy
    of it is held here for another host (``--nnodes``: the peer copy of a member of host 1..M-1)."""

    KIND: ClassVar[str] = "group_held"
    step: int
    attempt: int
    note: str
    peer: bool = False


@dataclass(frozen=True)
class GroupCopyHeld(Message):
    """Checkpoint service -> watchdog: it now holds member ``rank``'s in-memory copy of ``step`` of
    group attempt ``attempt``. Once every member's copy of a step of an attempt is held, the next
    group restores it as it would a committed checkpoint: that attempt made progress (the restart
    policy's backoff and ``--max-restarts`` count failures without progress)."""

    KIND: ClassVar[str] = "group_copy_held"
    rank: int
    attempt: int
    step: int


@dataclass(frozen=True)
class GroupCopyRefused(Message):
    """Node 0's checkpoint service -> a group member of another host, and -> the watchdog (its
    lifecycle record ``group_copy_refused``): member ``rank``'s copy of ``step`` of attempt
    ``attempt`` (``size`` bytes) is beyond what the service holds for one member (``limit`` bytes:
    :func:`procsv.services.checkpoint.group.peer_limit`) and is not held; a group restarted before
    that member's next copy is held restores from disk."""

    KIND: ClassVar[str] = "group_copy_refused"
    rank: int
    attempt: int
    step: int
    size: int
    limit: int


@dataclass(frozen=True)
class GroupFetch(Message):
    """A group member -> checkpoint service: send my copy (``rank``) of ``step`` of ``attempt``."""

    KIND: ClassVar[str] = "group_fetch"
    pid: int
    rank: int
    step: int
    attempt: int


@dataclass(frozen=True)
class GroupCopy(Message):
    """Checkpoint service -> a group member: its in-memory copy of ``step``, one frame per tensor
    (``tensors``: numeric ones raw, C order, strings and variants as in :class:`SaveData`), and the
    CRC-32C of those frames in order, taken when the service copied it (``crc``); ``step`` -1 and
    ``note``: not held."""

    KIND: ClassVar[str] = "group_copy"
    step: int
    tensors: list[TensorSpec]
    crc: int
    note: str


__all__ = ["CheckpointSetup", "ArenaRef", "SaveRequest", "TensorSpec", "SaveData", "SaveResult", "CommitLoading", "SnapshotHeld", "RecoverQuery",
           "RecoverReply", "DeleteCheckpoints", "AuditHold", "AuditQuarantine", "CheckpointsDeleted", "GroupQuery", "GroupHeld", "GroupFetch", "GroupCopy"]
