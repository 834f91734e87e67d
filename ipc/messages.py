"""The one message schema spoken between procsv's processes.

Owned by no process: every process (watchdog, trainer, checkpoint service, summary service)
imports it. Each message is a frozen dataclass with a ``KIND`` tag; :mod:`ipc.codec` turns it into
ZeroMQ frames (a JSON header, then raw binary frames for tensor or proto payloads). Nothing is
ever pickled. Bump :data:`SCHEMA_VERSION` whenever a field changes meaning.

Who sends what (see docs/architecture.md for the full table):

* any child -> watchdog (PUSH to ``watchdog.sock``): :class:`Hello`, :class:`TrainerReady`,
  :class:`Progress`, :class:`SaveResult`.
* trainer <-> checkpoint service (DEALER/ROUTER on ``checkpoint.sock``): :class:`CheckpointSetup`,
  :class:`SaveData` (+ one frame per tensor) up; :class:`SaveRequest`, :class:`SaveResult` down.
* trainer / checkpoint service -> summary service (PUSH to ``summary.sock``):
  :class:`SummaryBatch` (+ one frame per serialized proto), :class:`SessionLogEvent`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Optional

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class Message:
    """Base class; subclasses set ``KIND``."""

    KIND: ClassVar[str] = ""


@dataclass(frozen=True)
class Hello(Message):
    """A child process is up and connected. ``role`` is trainer|checkpoint|summary."""

    KIND: ClassVar[str] = "hello"
    role: str
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


@dataclass(frozen=True)
class Progress(Message):
    """The trainer completed ``step`` (sent after the first step, then at most every 100 ms).

    ``busy`` names work the trainer does on purpose between steps (``final_checkpoint``):
    the watchdog's hang clock pauses until the next Progress without it.
    """

    KIND: ClassVar[str] = "progress"
    pid: int
    step: int
    wall_time: float
    busy: str = ""


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


@dataclass(frozen=True)
class SaveRequest(Message):
    """Checkpoint service -> trainer: take a snapshot at your next step boundary."""

    KIND: ClassVar[str] = "save_request"
    reason: str


@dataclass(frozen=True)
class TensorSpec:
    """How one tensor travels: its checkpoint key, dtype name and shape.

    Numeric tensors travel as one raw frame (C order). String tensors travel as one frame of
    concatenated bytes with the element lengths in ``lengths``.
    """

    key: str
    dtype: str
    shape: list[int]
    lengths: Optional[list[int]] = None


@dataclass(frozen=True)
class SaveData(Message):
    """Trainer -> checkpoint service: a snapshot of the state at ``step``; one frame per tensor."""

    KIND: ClassVar[str] = "save_data"
    step: int
    reason: str
    basename: str
    tensors: list[TensorSpec]


@dataclass(frozen=True)
class SaveResult(Message):
    """Checkpoint service -> trainer and watchdog: a save committed (``ok``) or failed."""

    KIND: ClassVar[str] = "save_result"
    step: int
    reason: str
    ok: bool
    path: Optional[str]
    error: Optional[str]
    persist_secs: float


@dataclass(frozen=True)
class SummaryBatch(Message):
    """Trainer -> summary service: buffered summaries.

    ``scalars`` rows are ``[tag, step, value, wall_time]``. ``protos`` rows are
    ``[step, wall_time]``, each matched with one frame holding a serialized ``Summary`` proto.
    """

    KIND: ClassVar[str] = "summary_batch"
    scalars: list[list]
    protos: list[list]
    dropped: int = 0


@dataclass(frozen=True)
class SessionLogEvent(Message):
    """A ``SessionLog`` record: ``status`` is start|stop|checkpoint (TensorBoard semantics)."""

    KIND: ClassVar[str] = "session_log"
    status: str
    step: int
    checkpoint_path: str = ""


ALL_MESSAGES: tuple[type[Message], ...] = (
    Hello,
    TrainerReady,
    Progress,
    CheckpointSetup,
    SaveRequest,
    SaveData,
    SaveResult,
    SummaryBatch,
    SessionLogEvent,
)
