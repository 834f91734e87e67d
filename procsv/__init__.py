"""procsv: a fault-tolerant supervisor for long-running TensorFlow 2 training.

What a training program imports: :class:`Supervisor` (the trainer-side API), or
:mod:`procsv.train` (TensorFlow's ``tf.compat.v1.train`` names: MonitoredSession, hooks). The ``procsv``
command (:mod:`procsv.cli`) runs the watchdog. TensorFlow is imported lazily, so that the CLI
and the watchdog start fast.
"""

from __future__ import annotations

from typing import Any

from procsv.common.errors import (
    CheckpointError,
    CorruptCheckpoint,
    LogdirLocked,
    MismatchedCheckpoint,
    NoRestorableCheckpoint,
    ProcsvError,
    TrainingStopped,
    UnreadableCheckpoint,
    UsageError,
)

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name in ("Supervisor", "ManagedSession"):
        from procsv.trainer import supervisor

        return getattr(supervisor, name)
    if name in ("train", "cluster"):
        import importlib

        return importlib.import_module(f"procsv.{name}")
    if name == "SpikeThresholds":
        from procsv.trainer.nonfinite.spike import SpikeThresholds

        return SpikeThresholds
    if name == "Coordinator":
        from procsv.trainer.coordinator import Coordinator

        return Coordinator
    raise AttributeError(name)


__all__ = [
    "Supervisor",
    "ManagedSession",
    "Coordinator",
    "SpikeThresholds",
    "cluster",
    "ProcsvError",
    "UsageError",
    "LogdirLocked",
    "CheckpointError",
    "CorruptCheckpoint",
    "UnreadableCheckpoint",
    "NoRestorableCheckpoint",
    "MismatchedCheckpoint",
    "TrainingStopped",
]
