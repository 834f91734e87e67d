"""The one message schema spoken between procsv's processes.

Owned by no process: every process (watchdog, trainer, checkpoint service, summary service)
imports it. Each message is a frozen dataclass with a ``KIND`` tag; :mod:`procsv.ipc.codec` turns it into
ZeroMQ frames (a JSON header, then raw binary frames for tensor or proto payloads). Nothing is
ever pickled. Bump :data:`SCHEMA_VERSION` whenever a field changes meaning. Every field is typed
(no bare ``list`` or ``Any``) so the codec validates it element by element; a field that takes a
fixed set of values is a ``str`` enum whose values are what travels on the wire.

Who sends what (see docs/architecture.md for the full table):

* any child -> watchdog (PUSH to ``watchdog.sock``): :class:`Hello`, :class:`TrainerReady`,
  :class:`Progress`, :class:`SaveResult`.
* trainer <-> checkpoint service (DEALER/ROUTER on ``checkpoint.sock``): :class:`CheckpointSetup`,
  :class:`SaveData` (+ one frame per tensor) up; :class:`SaveRequest`, :class:`SaveResult` down.
* trainer / checkpoint service <-> summary service (DEALER/ROUTER on ``summary.sock``):
  :class:`SummaryBatch` (+ its payload frames, see :mod:`procsv.ipc.columns`) and
  :class:`SessionLogEvent` up; :class:`SummaryAck` down, to the trainer that sent the batches.
* watchdog -> summary service (a DEALER the watchdog connects to ``summary.sock``):
  :class:`RunScalars`, procsv's own TensorBoard scalars (no reply).
* watchdog <-> zygote (the pre-warmed trainer; length-prefixed frames on a pipe pair, see
  :mod:`procsv.ipc.pipe`): :class:`ForkRequest` down; :class:`ZygoteReady`, :class:`ForkReply`,
  :class:`ChildExit` up.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import ClassVar, Optional

SCHEMA_VERSION = 2  # 2: SummaryBatch lost its JSON scalar rows, its protos are ProtoRef; SummaryAck


class Role(StrEnum):
    """Which service or trainer a :class:`Hello` comes from."""

    TRAINER = "trainer"
    CHECKPOINT = "checkpoint"
    SUMMARY = "summary"


class SaveReason(StrEnum):
    """Why a checkpoint is taken (:class:`SaveRequest`, :class:`SaveData`) or what became of it.

    ``periodic``: the checkpoint service's ``save_model_secs`` timer; ``steps``: the trainer's
    every-``save_checkpoint_steps`` trigger; ``final``: the end of training; ``preempted``: the end
    after SIGTERM/SIGINT; ``lost`` (only in a :class:`SaveResult`): a restarted checkpoint service
    never received the snapshot in flight; ``memory`` (only in a :class:`SaveResult`): the service
    persisted the in-memory snapshot it held when its trainer died.
    """

    PERIODIC = "periodic"
    STEPS = "steps"
    FINAL = "final"
    PREEMPTED = "preempted"
    LOST = "lost"
    MEMORY = "memory"


class Busy(StrEnum):
    """What the trainer does on purpose between steps (:attr:`Progress.busy`); ``NONE`` is falsy."""

    NONE = ""
    SNAPSHOT = "snapshot"
    FINAL_CHECKPOINT = "final_checkpoint"


class SessionStatus(StrEnum):
    """A ``SessionLog`` status, with TensorBoard's meaning."""

    START = "start"
    STOP = "stop"
    CHECKPOINT = "checkpoint"


class ItemKind(StrEnum):
    """The kind of a :class:`SummaryItem`."""

    HISTOGRAM = "histogram"
    IMAGE = "image"
    TEXT = "text"


@dataclass(frozen=True)
class Message:
    """Base class; subclasses set ``KIND``."""

    KIND: ClassVar[str] = ""


@dataclass(frozen=True)
class Hello(Message):
    """A child process is up and connected."""

    KIND: ClassVar[str] = "hello"
    role: Role
    pid: int
    attempt: int


@dataclass(frozen=True)
class TrainerReady(Message):
    """The trainer restored (or initialized) its state and is about to run its first step."""

    KIND: ClassVar[str] = "trainer_ready"
    pid: int
    attempt: int
    step: int
    restored_from: Optional[str]
    restore_secs: float
    skipped: list[str] = field(default_factory=list)  # corrupt checkpoints passed over
    save_secs: Optional[float] = None  # its checkpoint schedule (save_model_secs), if checkpointing
    save_steps: Optional[int] = None  # ... and save_checkpoint_steps: the watchdog notices a stall


@dataclass(frozen=True)
class Progress(Message):
    """The trainer completed ``step`` (sent after the first step, then at most every 100 ms).

    ``busy`` names work the trainer does on purpose between steps (a ``snapshot``, the
    ``final_checkpoint``): the watchdog's hang clock pauses until the next Progress without it.
    ``Busy.NONE`` (the default) is the empty string, so ``bool(busy)`` is False when not busy.
    """

    KIND: ClassVar[str] = "progress"
    pid: int
    step: int
    wall_time: float
    busy: Busy = Busy.NONE


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
    answers :class:`SnapshotHeld`; it writes it to disk only if the trainer dies.
    """

    KIND: ClassVar[str] = "save_data"
    step: int
    reason: SaveReason
    basename: str
    tensors: list[TensorSpec]
    arena: Optional[ArenaRef] = None
    slot: int = 0
    persist: bool = True


@dataclass(frozen=True)
class SaveResult(Message):
    """Checkpoint service -> trainer and watchdog: a save committed (``ok``) or failed."""

    KIND: ClassVar[str] = "save_result"
    step: int
    reason: SaveReason
    ok: bool
    path: Optional[str]
    error: Optional[str]
    persist_secs: float


@dataclass(frozen=True)
class SummaryItem:
    """One histogram, image or text summary inside a :class:`SummaryBatch`; its data is one frame.

    The frame holds the raw values, validated by the trainer and turned into a TensorBoard summary
    by the service: ``histogram``: float64 values (C order) and ``buckets``; ``image``:
    ``[k, h, w, c]`` pixels of ``dtype`` uint8 or float32 (0..1); ``text``: the UTF-8 JSON list of
    the strings, ``shape`` their array shape.
    """

    kind: ItemKind
    tag: str
    step: int
    wall_time: float
    dtype: str
    shape: list[int]
    buckets: int = 0
    description: str = ""


@dataclass(frozen=True)
class ProtoRef:
    """The step and wall time of one serialized ``Summary`` proto inside a :class:`SummaryBatch`."""

    step: int
    wall_time: float


@dataclass(frozen=True)
class SummaryBatch(Message):
    """Trainer -> summary service: buffered summaries.

    Frames, in order: one per entry of ``protos`` (a serialized ``Summary`` proto); if ``columns``
    is not 0, one frame holding that many scalar rows as binary columns (its layout is
    :mod:`procsv.ipc.columns`'); one per entry of ``items``.

    Delivery (see ``services/summary/sessions.py``): ``session`` names the sending trainer process
    and ``seq`` numbers its batches 1, 2, ... as they are handed to ZeroMQ; the service writes a
    session's batches only in order and, after each write, answers the sender with a
    :class:`SummaryAck` naming the last one written. A batch with ``resync_from`` set restates
    everything not known to be written: the service first writes ``SessionLog START`` at that step
    (TensorBoard drops the events at or after it), then the batch. ``step``/``mono``/``wall_time``
    mark the trainer's progress when sent (the service derives ``global_step/sec`` every
    ``step_rate_secs``); ``dropped_total`` counts what the session had to drop so far, ``dropped``
    what it dropped since its previous batch.
    """

    KIND: ClassVar[str] = "summary_batch"
    protos: list[ProtoRef] = field(default_factory=list)
    dropped: int = 0
    session: str = ""
    seq: int = 0
    resync_from: Optional[int] = None
    columns: int = 0
    items: list[SummaryItem] = field(default_factory=list)
    step: int = -1
    mono: float = 0.0
    wall_time: float = 0.0
    step_rate_secs: Optional[float] = None
    dropped_total: int = 0


@dataclass(frozen=True)
class SummaryAck(Message):
    """Summary service -> the trainer that sent a session's batches: where that session stands.

    Sent after every write that involved a batch of ``session``: ``written`` is the last batch
    number written to the event file (and so survives a crash of the service); ``resync_after``,
    if not 0, is the number of a batch the service could not write in order (it never saw the
    session, or batches were lost): the trainer then restates what it still holds.
    """

    KIND: ClassVar[str] = "summary_ack"
    session: str
    written: int
    resync_after: int = 0


@dataclass(frozen=True)
class SessionLogEvent(Message):
    """A ``SessionLog`` record (TensorBoard semantics)."""

    KIND: ClassVar[str] = "session_log"
    status: SessionStatus
    step: int
    checkpoint_path: str = ""


@dataclass(frozen=True)
class RunScalars(Message):
    """Watchdog -> summary service: procsv's own scalars at global step ``step``.

    ``tags[i]`` has value ``values[i]`` (the service refuses lists of different lengths); the
    service writes them into the event file of the run ``procsv`` (``<logdir>/procsv/``), adding
    its own ``procsv/summaries_dropped``, so TensorBoard shows them beside the user's run. Sent
    without blocking; one the socket cannot take is dropped (the next carries the same series).
    """

    KIND: ClassVar[str] = "run_scalars"
    step: int
    wall_time: float
    tags: list[str]
    values: list[float]


@dataclass(frozen=True)
class ZygoteReady(Message):
    """Pre-warmed trainer (zygote) -> watchdog: TensorFlow is imported; forks are cheap now."""

    KIND: ClassVar[str] = "zygote_ready"
    pid: int
    import_secs: float


@dataclass(frozen=True)
class ForkRequest(Message):
    """Watchdog -> zygote: fork a trainer running ``argv`` (procsv.trainer's) with this environment."""

    KIND: ClassVar[str] = "fork_request"
    attempt: int
    argv: list[str]
    env: dict[str, str]
    log_path: str
    cwd: str


@dataclass(frozen=True)
class ForkReply(Message):
    """Zygote -> watchdog: the forked trainer's pid, or why the fork failed."""

    KIND: ClassVar[str] = "fork_reply"
    attempt: int
    pid: int
    error: Optional[str] = None


@dataclass(frozen=True)
class SaveOverdue(Message):
    """Trainer -> watchdog: the snapshot of ``step`` has had no :class:`SaveResult` for
    ``waited_secs``, past its deadline of ``deadline_secs`` (from the measured persist rate, with a
    floor). Sent once per deadline that passes; the watchdog replaces the checkpoint service."""

    KIND: ClassVar[str] = "save_overdue"
    pid: int
    step: int
    waited_secs: float
    deadline_secs: float


@dataclass(frozen=True)
class StandbyReady(Message):
    """Standby trainer -> watchdog: it has run the program up to restoring and waits to be promoted."""

    KIND: ClassVar[str] = "standby_ready"
    pid: int
    attempt: int
    prepare_secs: float


@dataclass(frozen=True)
class SnapshotHeld(Message):
    """Checkpoint service -> trainer: it now holds the in-memory snapshot of ``step`` (its newest)."""

    KIND: ClassVar[str] = "snapshot_held"
    step: int


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
class ChildExit(Message):
    """Zygote -> watchdog: a forked trainer was reaped; ``code`` < 0 means killed by signal -code."""

    KIND: ClassVar[str] = "child_exit"
    pid: int
    code: int


ALL_MESSAGES: tuple[type[Message], ...] = (
    Hello,
    TrainerReady,
    Progress,
    CheckpointSetup,
    SaveRequest,
    SaveData,
    SaveResult,
    SaveOverdue,
    StandbyReady,
    SnapshotHeld,
    RecoverQuery,
    RecoverReply,
    SummaryBatch,
    SummaryAck,
    SessionLogEvent,
    RunScalars,
    ZygoteReady,
    ForkRequest,
    ForkReply,
    ChildExit,
)
