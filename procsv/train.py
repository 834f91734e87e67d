"""``procsv.train``: TensorFlow's ``tf.compat.v1.train`` training API under its own names, for TF2.

What a training program imports (it runs in the trainer process). Porting a TF1 program is:
replace ``tf.compat.v1.train.`` with ``procsv.train.``, turn the train op into a step function that
returns the step's values, and run ``sess.run(step_fn, *args)``. The code lives in
:mod:`procsv.trainer` (``monitored``, ``scaffold``, ``hooks``, ``basic_hooks``, ``supervisor``,
``coordinator``); this module only re-exports it. ``Saver`` is TensorFlow's own
``tf.compat.v1.train.Saver`` (looked up when first used, so that importing this module imports no
TensorFlow): passed as ``Supervisor(saver=)`` or ``Scaffold(saver=)`` it names what procsv's
checkpoint service saves, with TF1's names. See ``docs/parity.md`` for what each name means in TF2
and what is not there yet.
"""

from __future__ import annotations

from typing import Any

from procsv.trainer.monitored.basic_hooks import (CheckpointSaverHook, CheckpointSaverListener, FeedFnHook, FinalOpsHook,
                                        GlobalStepWaiterHook, LoggingTensorHook, NanLossDuringTrainingError,
                                        NanTensorHook, ProfilerHook, StepCounterHook, StopAtStepHook,
                                        SummarySaverHook)
from procsv.trainer.coordinator import Coordinator, LooperThread
from procsv.trainer.monitored.hooks import (SecondOrStepTimer, SessionRunArgs, SessionRunContext, SessionRunHook,
                                  SessionRunValues, get_global_step, get_or_create_global_step)
from procsv.trainer.monitored.session import (MonitoredSession, MonitoredTrainingSession, SingularMonitoredSession,
                                      StepContext)
from procsv.trainer.monitored.scaffold import ChiefSessionCreator, Scaffold, SessionCreator, WorkerSessionCreator
from procsv.trainer.graph.session_manager import SessionManager
from procsv.trainer.supervisor import Supervisor

__all__ = [
    "Supervisor", "SessionManager", "Coordinator", "LooperThread",
    "MonitoredSession", "MonitoredTrainingSession", "SingularMonitoredSession", "SessionCreator", "ChiefSessionCreator",
    "WorkerSessionCreator", "Scaffold", "StepContext",
    "SessionRunHook", "SessionRunArgs", "SessionRunContext", "SessionRunValues", "SecondOrStepTimer",
    "CheckpointSaverHook", "CheckpointSaverListener", "SummarySaverHook", "StepCounterHook", "StopAtStepHook",
    "NanTensorHook", "NanLossDuringTrainingError", "LoggingTensorHook", "FinalOpsHook", "GlobalStepWaiterHook",
    "FeedFnHook", "ProfilerHook", "get_global_step", "get_or_create_global_step", "Saver",
]


def __getattr__(name: str) -> Any:
    """``Saver``: ``tf.compat.v1.train.Saver`` itself (the same class, imported at first use)."""
    if name == "Saver":
        import tensorflow as tf

        return tf.compat.v1.train.Saver
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
