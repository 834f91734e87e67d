"""The checkpoint service's in-memory tier: the newest in-memory snapshot its trainer handed over,
and the decision to write it to disk when that trainer dies.

Runs in the checkpoint service. The trainer copies its state into a slot of its snapshot memory
(which this service maps) every few hundred milliseconds and sends a :class:`SaveData` with
``persist=False``; the service keeps only the newest (:class:`HeldSnapshot`: the message, its
small frames, and its pinned mapping, which outlives the trainer) and answers
:class:`SnapshotHeld`. It watches the trainer with a pidfd (:class:`TrainerLife`); when the
trainer dies, or a restarted trainer asks (:class:`RecoverQuery`) before restoring, the held
snapshot is committed like any checkpoint (reason ``memory``) if it is newer than every committed
one (:func:`persist_decision`) and its slot header says its copy was whole.

A graph program's trainer sends its ``MetaGraphDef`` (one more frame) with every disk snapshot
but with an in-memory one only until the service says it holds it: the service keeps the last one
a trainer sent (:class:`KeptMetaGraph`, by the trainer's connection) and adds it to that trainer's
in-memory snapshots that come without (:func:`with_kept_meta_graph`), so that a commit of one has
its ``<prefix>.meta`` as a disk snapshot's has. A new trainer (a restart, perhaps of another
graph) is a new connection: it never gets a dead trainer's graph, and sends its own.
"""

from __future__ import annotations

import dataclasses
import os
import select
from dataclasses import dataclass
from typing import Any, Optional

from procsv.ipc.messages import SaveData
from procsv.services.checkpoint.arena import ArenaView


@dataclass
class HeldSnapshot:
    """The newest in-memory snapshot held for a trainer: the message, its payload and where it lives."""

    msg: SaveData
    payload: list[Any]
    view: Optional[ArenaView]
    identity: bytes  # the ZeroMQ identity of the trainer that sent it
    pid: Optional[int]  # that trainer's pid, from its CheckpointSetup (None: not known yet)


@dataclass(frozen=True)
class KeptMetaGraph:
    """The ``MetaGraphDef`` frame a trainer (graph mode) sent last, and that trainer's identity."""

    identity: bytes  # the ZeroMQ identity of the trainer's connection
    frame: Any


def kept_meta_graph(msg: SaveData, payload: list[Any], identity: bytes,
                    kept: Optional[KeptMetaGraph]) -> Optional[KeptMetaGraph]:
    """What the service keeps after ``msg`` from ``identity``: the ``MetaGraphDef`` it carries
    (its last frame), else what it kept before."""
    if msg.meta_graph and payload:
        return KeptMetaGraph(identity, payload[-1])
    return kept


def with_kept_meta_graph(msg: SaveData, payload: list[Any], identity: bytes,
                         kept: Optional[KeptMetaGraph]) -> tuple[SaveData, list[Any]]:
    """``msg`` with the ``MetaGraphDef`` its trainer sent before (as the last frame), if it came
    without and the one kept is that trainer's; else as it is."""
    if msg.meta_graph or kept is None or kept.identity != identity:
        return msg, payload
    return dataclasses.replace(msg, meta_graph=True), [*payload, kept.frame]


class TrainerLife:
    """Whether one trainer process is still alive, asked without blocking (a pidfd; Linux 5.3+)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.fd: Optional[int] = None
        self._dead = False
        if not 0 < pid < 1 << 31:  # not a process id at all (a malformed or fuzzed setup): no such trainer
            self._dead = True
            return
        try:
            self.fd = os.pidfd_open(pid)
        except ProcessLookupError:
            self._dead = True
        except (OSError, AttributeError):  # no pidfd: fall back to a signal-0 probe
            self.fd = None

    def wait_dead(self, timeout: float) -> bool:
        """Whether the process ends within ``timeout`` seconds (a trainer whose death the watchdog
        noticed by its mutex may still be in its exit path for a moment)."""
        if self.fd is not None and not self._dead:
            self._dead = bool(select.select([self.fd], [], [], timeout)[0])
        return self.dead()

    def dead(self) -> bool:
        if self._dead:
            return True
        if self.fd is not None:
            self._dead = bool(select.select([self.fd], [], [], 0)[0])
        else:
            try:
                os.kill(self.pid, 0)
            except ProcessLookupError:
                self._dead = True
            except PermissionError:
                pass
        return self._dead

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def persist_decision(held_step: int, newest_committed: Optional[int], has_settings: bool, slot_problem: str) -> str:
    """Why the held in-memory snapshot of ``held_step`` must not be persisted; empty if it must."""
    if newest_committed is not None and held_step <= newest_committed:
        return f"step {held_step} is not newer than the committed checkpoint of step {newest_committed}"
    if not has_settings:
        return "its trainer's checkpoint settings never arrived (retention is never guessed)"
    if slot_problem:
        return f"its snapshot memory is not whole: {slot_problem}"
    return ""
