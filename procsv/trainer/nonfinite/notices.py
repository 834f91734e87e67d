"""What the trainer tells the watchdog about non-finite training, the moment it happens (issue 41).

Runs in the trainer's main thread, at step boundaries (:mod:`procsv.trainer.nonfinite.rollback`
calls it). Each function builds one message of the schema (:mod:`procsv.ipc.watchdog_messages`):
:class:`~procsv.ipc.messages.NonfiniteDetected` when a poisoned loss or state is found,
:class:`~procsv.ipc.messages.RolledBack` when ``--on-nonfinite rollback`` restored a finite state
in place, :class:`~procsv.ipc.messages.StepSkipped` when a step is skipped,
:class:`~procsv.ipc.messages.SpikeDetected` when the loss spiked (issue 68) and
:class:`~procsv.ipc.messages.SpikeReplayed` when its replay told whose it was; :func:`tell` pushes it
to the watchdog (non-blocking; nothing is sent in plain python, where no watchdog listens). The
watchdog writes each as a lifecycle event and counts them (``procsv status``, the report, metrics).
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any, Callable, Optional

from procsv.ipc.messages import (Message, NonfiniteDetected, RestoreSource, RolledBack, SpikeDetected, SpikeReplayed,
                                 StepSkipped)
from procsv.trainer.nonfinite.spike import Spike

# the input position of a step, where procsv knows it (Keras fit: (epoch, batch)); None: the step is the position
Position = Callable[[int], Optional[tuple[int, int]]]


def tell(channels: Any, msg: Message) -> None:
    """Push ``msg`` to the watchdog, if this trainer has one (a full queue drops it: never blocks)."""
    if channels is not None:
        channels.to_watchdog(msg)


def _at(position: Optional[Position], step: int) -> tuple[Optional[int], Optional[int]]:
    where = position(step) if position is not None else None
    return (None, None) if where is None else where


def detected(step: int, what: str, position: Optional[Position] = None) -> NonfiniteDetected:
    epoch, batch = _at(position, step)
    return NonfiniteDetected(os.getpid(), step, time.time(), what, epoch, batch)


def rolled_back(step: int, restored: int, source: RestoreSource, path: str, skip: bool, secs: float,
                position: Optional[Position] = None, group: bool = False) -> RolledBack:
    epoch, batch = _at(position, step)
    return RolledBack(os.getpid(), step, restored, source, path, skip, secs, time.time(), epoch, batch, group)


def skipped(step: int, count: int, position: Optional[Position] = None) -> StepSkipped:
    epoch, batch = _at(position, step)
    return StepSkipped(os.getpid(), step, time.time(), count, epoch, batch)


def spiked(spike: Spike, action: str, position: Optional[Position] = None) -> SpikeDetected:
    epoch, batch = _at(position, spike.step)
    return SpikeDetected(os.getpid(), spike.step, spike.onset, spike.loss, spike.threshold, spike.median, action,
                         time.time(), epoch, batch)


def replayed(spike: Spike, reproduced: bool, replay_loss: Optional[float],
             differs_at: Optional[int] = None) -> SpikeReplayed:
    return SpikeReplayed(os.getpid(), spike.step, spike.onset, reproduced, spike.loss, replay_loss, socket.gethostname(),
                         time.time(), differs_at)
