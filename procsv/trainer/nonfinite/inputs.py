"""The input of a skipped step, where procsv knows it: the ``tf.data`` iterators the checkpoint tracks.

Runs in the trainer's main thread, at the step boundary where the rollback skips a step
(:mod:`procsv.trainer.nonfinite.rollback`). A skipped step's function is not called, so the element
it would have taken is still next in each checkpointed iterator: :func:`consume` takes it (one
``get_next`` per iterator, the element discarded), so that the data position moves past the
skipped step as it would have had the step run, and the replay after a later rollback passes the
same element over again. Input procsv cannot see (a Python generator, a ``feed_dict``, an iterator
outside the checkpoint) is the program's: with the input a function of the step, nothing is to do.
"""

from __future__ import annotations

from typing import Any

from procsv.trainer.checkpoint.name_based import NameBasedCheckpoint


def iterators(ckpt: Any) -> list[Any]:
    """The ``tf.data`` iterators in ``ckpt``'s object graph (none for a TF1 graph program's state)."""
    if ckpt is None or isinstance(ckpt, NameBasedCheckpoint):
        return []
    import tensorflow as tf

    return [obj for obj in tf.__internal__.tracking.ObjectGraphView(ckpt).descendants()
            if isinstance(obj, tf.data.Iterator)]


def consume(ckpt: Any) -> int:
    """Take and discard the next element of every iterator ``ckpt`` tracks; returns how many were
    advanced (an exhausted one is left as it is: the program's own next call meets its end)."""
    advanced = 0
    for it in iterators(ckpt):
        if bool(it.get_next_as_optional().has_value()):
            advanced += 1
    return advanced
