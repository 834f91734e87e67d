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
"""

from __future__ import annotations

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
