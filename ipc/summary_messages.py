"""The messages of the summary channel, to and from the summary service (ROUTER on ``summary.sock``).

Up, from DEALERs: the trainer sends :class:`SummaryBatch` (its payload described by
:class:`ProtoRef` and :class:`SummaryItem`, its scalar rows by :mod:`procsv.ipc.columns`) and, in
graph mode, :class:`GraphEvent` (a GraphDef or MetaGraphDef for TensorBoard's graph view); the
trainer and the checkpoint service send :class:`SessionLogEvent`; the watchdog sends
:class:`RunScalars` (no reply). Down: the summary service answers the trainer that sent the
batches with :class:`SummaryAck`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Optional

from procsv.ipc.message_base import ItemKind, Message, SessionStatus


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
    what it dropped since its previous batch. ``purge`` False (only on a session's first batch, when
    its steps repeat none already logged: nothing restored, not a restart, and no ``SessionLog
    START`` that TF's Supervisor would write) registers the session without the START.
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
    purge: bool = True


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
class GraphEvent(Message):
    """Trainer (graph mode, the chief) -> summary service: one payload frame, a serialized
    ``GraphDef`` (``meta`` False: TF's ``SummaryWriter.add_graph``) or ``MetaGraphDef`` (``meta``
    True: ``add_meta_graph``), written as an ``Event`` at ``step`` into the run's event file. The
    service refuses a frame that does not parse as one. No reply."""

    KIND: ClassVar[str] = "graph_event"
    step: int
    wall_time: float
    meta: bool = False


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


__all__ = ["SummaryItem", "ProtoRef", "SummaryBatch", "SummaryAck", "SessionLogEvent", "GraphEvent", "RunScalars"]
