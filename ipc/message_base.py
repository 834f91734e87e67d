"""The base of every message and the enums its fields take (one file, shared by all channels).

Owned by no process: every process imports it, through :mod:`procsv.ipc.messages`. A field that
takes a fixed set of values is one of these ``str`` enums; their values are what travels on the
wire (the codec refuses any other), so changing one is a schema change
(:data:`procsv.ipc.messages.SCHEMA_VERSION`).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import ClassVar


class Role(StrEnum):
    """Which service or trainer a :class:`Hello` comes from."""

    TRAINER = "trainer"
    CHECKPOINT = "checkpoint"
    SUMMARY = "summary"
    PS = "ps"  # a parameter-server task of --ps N (its Hello names its slot: ps0, ...)
    SERVER = "server"  # a worker server of --ps N --workers M --coordinator (slot worker0, ...)


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
    INPUT = "input"  # before its first step: a resumed Keras fit reading its earlier epochs' input again
    WAITING = "waiting"  # the program's own marked wait (Supervisor.waiting), until its next step


class SessionStatus(StrEnum):
    """A ``SessionLog`` status, with TensorBoard's meaning."""

    START = "start"
    STOP = "stop"
    CHECKPOINT = "checkpoint"


class RestoreSource(StrEnum):
    """Where a restore read its state: the in-memory tier (``peer``: a group's, with some member's copy
    held by another host than its own, issue 54), or a committed checkpoint on disk."""

    MEMORY = "memory"
    PEER = "peer"
    DISK = "disk"


class ItemKind(StrEnum):
    """The kind of a :class:`SummaryItem`."""

    HISTOGRAM = "histogram"
    IMAGE = "image"
    TEXT = "text"


@dataclass(frozen=True)
class Message:
    """Base class; subclasses set ``KIND``."""

    KIND: ClassVar[str] = ""


__all__ = ["Message", "Role", "SaveReason", "Busy", "SessionStatus", "ItemKind", "RestoreSource"]
