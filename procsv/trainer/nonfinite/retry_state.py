"""The state just before a retried step, kept so that the skip after a failed retry need not replay.

Runs in the trainer's main thread, at a step boundary, called by the non-finite rollback
(:mod:`procsv.trainer.nonfinite.rollback`). A non-finite loss at step B is handled by two rollbacks:
the first restores the newest finite state R and replays R+1 .. B-1, then retries B; if B is
non-finite again, the second used to restore R once more and replay R+1 .. B-1 again before the
skip, computing the very state the first replay had reached. Instead, at the boundary after the
first replay (the state of step B-1, before the retry runs B), every value the checkpoint would
save is kept here (:func:`keep`: the variables as host copies, a ``tf.data`` iterator's state as
its serialized tensor), and the second rollback puts them back (:func:`put_back`): the same state,
bit for bit, with no replay. The copy costs one walk of the object graph and one host copy of the
state, only while a step is being retried; it is dropped at the retry's judgement (finite: not
needed) or used and dropped at the skip.

A TF1 graph program's state (:class:`~procsv.trainer.checkpoint.name_based.NameBasedCheckpoint`) has
no assign ops outside its frozen graph: nothing is kept, and both rollbacks restore from disk.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from procsv.trainer.checkpoint import graph_shape
from procsv.trainer.checkpoint.name_based import NameBasedCheckpoint
from procsv.trainer.checkpoint.snapshot import serialize_object_graph


@dataclass(frozen=True)
class KeptState:
    """Every value of the checkpoint at ``step`` (the step before the retried one): for each
    saveable of the object graph, its tensors' values (NumPy copies; a variant or string tensor as
    it was read, which no later op changes)."""

    step: int
    values: tuple[tuple[Any, tuple[Any, ...]], ...]  # (saveable, its values in spec order)
    shape: Optional[graph_shape.Shape]  # the object graph's edges when it was kept


def keep(ckpt: Any, step: int) -> Optional[KeptState]:
    """The state of ``ckpt`` now, as the state of ``step``; None where it cannot be put back in place
    (no checkpoint, a TF1 graph program's)."""
    import tensorflow as tf

    if ckpt is None or isinstance(ckpt, NameBasedCheckpoint) or not tf.executing_eagerly():
        return None
    named, _ = serialize_object_graph(ckpt)
    values = []
    for saveable in named:
        held = []
        for spec in saveable.specs:
            tensor = spec.tensor  # reads the live value (a variable's ReadVariableOp)
            if spec.dtype in (tf.variant, tf.string):
                held.append(tensor)
            else:
                held.append(np.array(tensor, copy=True))  # the update after it must not reach this copy
        values.append((saveable, tuple(held)))
    return KeptState(step, tuple(values), graph_shape.shape(ckpt))


def put_back(ckpt: Any, kept: KeptState) -> bool:
    """Assign every kept value to the object it was read from; False (nothing assigned) if the object
    graph is not the one :func:`keep` walked (the retried step built a variable: an optimizer's
    slots at its first update), so that the caller restores a snapshot instead."""
    import tensorflow as tf

    if kept.shape is None or not graph_shape.same(kept.shape, graph_shape.shape(ckpt)):
        return False

    for saveable, held in kept.values:
        tensors = [value if spec.dtype in (tf.variant, tf.string) else tf.constant(value, dtype=spec.dtype)
                   for spec, value in zip(saveable.specs, held)]
        saveable.restore(tensors, None)
    return True
