"""The one message schema spoken between procsv's processes.

Owned by no process: every process (watchdog, trainer, checkpoint service, summary service)
imports it. Each message is a frozen dataclass with a ``KIND`` tag; :mod:`procsv.ipc.codec` turns it into
ZeroMQ frames (a JSON header, then raw binary frames for tensor or proto payloads). Nothing is
ever pickled. Bump :data:`SCHEMA_VERSION` whenever a field changes meaning. Every field is typed
(no bare ``list`` or ``Any``) so the codec validates it element by element; a field that takes a
fixed set of values is a ``str`` enum whose values are what travels on the wire.

Who sends what (see docs/architecture.md for the full table):

* any child -> watchdog (PUSH to ``watchdog.sock``): :class:`Hello`, :class:`TrainerReady`,
  :class:`Progress`, :class:`SaveOverdue`, :class:`ServiceLoading`, :class:`SummaryOverdue`, :class:`StandbyReady`, :class:`AuditResult` (an auditor), :class:`Promotion`, :class:`SaveResult`,
  :class:`GroupCopyHeld` (checkpoint service), and non-finite training's :class:`NonfiniteDetected`, :class:`RolledBack`, :class:`StepSkipped`, a loss spike's :class:`SpikeDetected` and :class:`SpikeReplayed` (trainer).
* trainer <-> checkpoint service (DEALER/ROUTER on ``checkpoint.sock``): :class:`CheckpointSetup`,
  :class:`SaveData` (+ one frame per tensor), :class:`RecoverQuery`, :class:`DeleteCheckpoints`,
  :class:`GroupQuery`, :class:`GroupFetch` up; :class:`SaveRequest`, :class:`SaveResult`, :class:`CommitLoading`,
  :class:`SnapshotHeld`, :class:`RecoverReply`, :class:`CheckpointsDeleted`, :class:`GroupHeld`, :class:`GroupCopy` down.
* trainer / checkpoint service <-> summary service (DEALER/ROUTER on ``summary.sock``):
  :class:`SummaryBatch` (+ its payload frames, see :mod:`procsv.ipc.columns`) and
  :class:`SessionLogEvent` up (the trainer also :class:`GraphEvent`, + its one frame); :class:`SummaryAck`
  down, to the trainer that sent the batches.
* watchdog -> summary service (a DEALER the watchdog connects to ``summary.sock``):
  :class:`RunScalars`, procsv's own TensorBoard scalars (no reply).
* watchdog -> checkpoint service (``--audit``: a DEALER the watchdog connects to ``checkpoint.sock``):
  :class:`AuditHold`, the committed steps retention must keep for an audit, and :class:`AuditQuarantine`, the
  checkpoints of a timeline an audit rolled back (no reply).
* watchdog <-> zygote (the pre-warmed trainer; length-prefixed frames on a pipe pair, see
  :mod:`procsv.ipc.pipe`): :class:`ForkRequest` down (to a zygote seed, :class:`ZygoteStart` first); :class:`ZygoteReady`,
  :class:`ForkReply` up
  (a forked trainer is the watchdog's own child: its exit status is the watchdog's ``waitpid``).
* watchdog -> a service seed (the same framing, one pipe): one :class:`ServiceStart`.
* master watchdog <-> node agents (``--nnodes M``: a ROUTER on ``--master-addr``, a DEALER per
  agent; ZeroMQ TCP with CURVE): :class:`NodeHello`, :class:`MemberStarted`, :class:`MemberEnded`,
  :class:`Relayed` (a member's own report, one of :data:`RELAYABLE`) up; :class:`MasterBeat`,
  :class:`StartMembers`, :class:`PromoteMember`, :class:`SignalMember`, :class:`NodeStop`, :class:`NodeRefused` down
  (:mod:`procsv.ipc.node_messages`); and :class:`StacksAsked` down, :class:`StacksTaken` up: the
  stacks of an agent's members (:mod:`procsv.ipc.stack_messages`).
* ``procsv stacks`` <-> node 0's watchdog (``--nnodes M``: a DEALER to the watchdog's ``stacks.sock``
  ROUTER): :class:`StacksAsked` up, :class:`StacksTaken` down (the other hosts' members).
* node 0's checkpoint service <-> node 1's holder (``--nnodes M``: the service's peer link, a
  ROUTER with CURVE; the holder a DEALER in node 1's agent): :class:`ReplicaHello` up,
  :class:`ReplicaCopy` (+ one frame per tensor) both ways (:mod:`procsv.ipc.replica_messages`).

This module is the schema's public entry: it holds :data:`SCHEMA_VERSION` and the registry
:data:`ALL_MESSAGES` (every message type, by which the codec finds a ``KIND``), and re-exports the
messages from the modules that define them, one per channel: :mod:`procsv.ipc.watchdog_messages`,
:mod:`procsv.ipc.checkpoint_messages`, :mod:`procsv.ipc.summary_messages`,
:mod:`procsv.ipc.zygote_messages`, :mod:`procsv.ipc.node_messages`, :mod:`procsv.ipc.replica_messages`,
:mod:`procsv.ipc.stack_messages`, with the base class and the field enums in
:mod:`procsv.ipc.message_base`. A new message joins :data:`ALL_MESSAGES` and ``__all__`` here.
"""

from __future__ import annotations

from procsv.ipc.checkpoint_messages import (ArenaRef, AuditHold, AuditQuarantine, CheckpointSetup, CommitLoading, CheckpointsDeleted, DeleteCheckpoints, GroupCopy, GroupCopyHeld,
                                            GroupCopyRefused,
                                            GroupFetch, GroupHeld, GroupQuery, RecoverQuery, RecoverReply, SaveData,
                                            SaveRequest, SaveResult, SnapshotHeld, TensorSpec)
from procsv.ipc.message_base import Busy, ItemKind, Message, RestoreSource, Role, SaveReason, SessionStatus
from procsv.ipc.summary_messages import (GraphEvent, ProtoRef, RunScalars, SessionLogEvent, SummaryAck, SummaryBatch,
                                         SummaryItem)
from procsv.ipc.watchdog_messages import (AuditResult, Hello, NonfiniteDetected, Progress, Promotion, RolledBack, SaveOverdue,
                                         ServiceLoading, SpikeDetected, SpikeReplayed, StandbyReady, StepSkipped,
                                         SummaryOverdue, TrainerReady)
from procsv.ipc.zygote_messages import ForkReply, ForkRequest, ServiceStart, ZygoteReady, ZygoteStart
from procsv.ipc.node_messages import (RELAYABLE, MasterBeat, MemberEnded, MemberLooked, MemberStarted, NodeHello,
                                      NodeRefused, NodeStop, PromoteMember, Relayed, SignalMember, StartMembers)
from procsv.ipc.replica_messages import ReplicaCopy, ReplicaHello
from procsv.ipc.stack_messages import Frame, ProcessStacks, StacksAsked, StacksTaken, ThreadStack

SCHEMA_VERSION = 2  # 2: SummaryBatch lost its JSON scalar rows, its protos are ProtoRef; SummaryAck

ALL_MESSAGES: tuple[type[Message], ...] = (
    Hello,
    AuditResult,
    TrainerReady,
    Progress,
    CheckpointSetup,
    SaveRequest,
    SaveData,
    SaveResult,
    SaveOverdue,
    ServiceLoading,
    SummaryOverdue,
    StandbyReady,
    Promotion,
    NonfiniteDetected,
    RolledBack,
    StepSkipped,
    SpikeDetected,
    SpikeReplayed,
    CommitLoading,
    SnapshotHeld,
    RecoverQuery,
    RecoverReply,
    DeleteCheckpoints,
    AuditHold,
    AuditQuarantine,
    CheckpointsDeleted,
    GroupQuery,
    GroupHeld,
    GroupFetch,
    GroupCopy,
    GroupCopyHeld,
    GroupCopyRefused,
    ReplicaHello,
    ReplicaCopy,
    SummaryBatch,
    SummaryAck,
    SessionLogEvent,
    GraphEvent,
    RunScalars,
    ZygoteReady,
    ZygoteStart,
    ServiceStart,
    ForkRequest,
    ForkReply,
    NodeHello,
    MasterBeat,
    StartMembers,
    PromoteMember,
    SignalMember,
    NodeStop,
    NodeRefused,
    MemberStarted,
    MemberEnded,
    MemberLooked,
    Relayed,
    StacksAsked,
    StacksTaken,
)


__all__ = [
    "SCHEMA_VERSION", "ALL_MESSAGES", "Message", "AuditResult",
    "Role", "SaveReason", "Busy", "SessionStatus", "ItemKind", "RestoreSource",
    "Hello", "TrainerReady", "Progress", "SaveOverdue", "ServiceLoading", "SummaryOverdue", "StandbyReady",
    "NonfiniteDetected", "RolledBack", "StepSkipped", "SpikeDetected", "SpikeReplayed", "Promotion",
    "CheckpointSetup", "ArenaRef", "SaveRequest", "TensorSpec", "SaveData", "SaveResult", "CommitLoading", "SnapshotHeld",
    "RecoverQuery", "RecoverReply", "DeleteCheckpoints", "AuditHold", "AuditQuarantine", "CheckpointsDeleted",
    "GroupQuery", "GroupHeld", "GroupFetch", "GroupCopy", "GroupCopyHeld", "GroupCopyRefused",
    "ReplicaHello", "ReplicaCopy",
    "SummaryItem", "ProtoRef", "SummaryBatch", "SummaryAck", "SessionLogEvent", "GraphEvent", "RunScalars",
    "ZygoteReady", "ZygoteStart", "ServiceStart", "ForkRequest", "ForkReply",
    "NodeHello", "MasterBeat", "StartMembers", "PromoteMember", "SignalMember", "NodeStop", "NodeRefused", "MemberStarted", "MemberEnded",
    "MemberLooked", "Relayed", "RELAYABLE",
    "Frame", "ThreadStack", "ProcessStacks", "StacksAsked", "StacksTaken",
]
