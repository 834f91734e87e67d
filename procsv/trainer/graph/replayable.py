"""Whether a TF1 graph program's steps can be replayed exactly after a restore: its input is not read
inside its graph from state that no checkpoint puts back (a queue, a reader, a ``tf.data`` iterator).

Runs in the trainer process (graph mode), once, when the Supervisor is built around the program's
finalized graph (:func:`procsv.trainer.supervisor_setup.collaborators`); reads the graph's op list only
(no session runs, nothing changes). A rollback restores the variables of the state before a bad step
and lets the loop run the steps after it again: a step's input must come again with them, as it does
when the loop feeds it (``feed_dict``) or computes it from the global step (a ``py_func`` of it, a
slice of constants). Input dequeued from a queue (``tf.compat.v1.train.batch``, a reader's queue
runners), read by a reader op, or taken from a ``tf.data`` iterator inside the graph
(``make_one_shot_iterator().get_next()``) moves on with each run and is not restored with the
variables: a replay would train other batches than the first run did. ``--on-spike rollback`` (whose
replay must give a spike's losses again bit for bit, and whose skip must drop the spiking batches) is
refused there as the Supervisor starts (:func:`procsv.trainer.nonfinite.spike.refusal`), rather than
done wrong.
"""

from __future__ import annotations

from typing import Any

# op types that take a step's input from state the graph keeps between runs (no checkpoint restores it)
_QUEUES = frozenset({"QueueDequeue", "QueueDequeueV2", "QueueDequeueMany", "QueueDequeueManyV2",
                     "QueueDequeueUpTo", "QueueDequeueUpToV2"})
_READERS = frozenset({"ReaderRead", "ReaderReadV2", "ReaderReadUpTo", "ReaderReadUpToV2"})
_ITERATORS = frozenset({"IteratorGetNext", "IteratorGetNextSync", "IteratorGetNextAsOptional",
                        "MultiDeviceIteratorGetNextFromShard"})


def input_inside(graph: Any) -> str:
    """The first op of ``graph`` (a ``tf.Graph``) that reads a step's input inside the graph from state
    no checkpoint restores, said in a few words ("" if none: the input is fed, or computed from the
    global step or from constants)."""
    for op in graph.get_operations():
        kind = op.type
        if kind in _QUEUES:
            return f"its input is dequeued from a queue inside the graph (op '{op.name}', {kind})"
        if kind in _READERS:
            return f"its input is read by a reader inside the graph (op '{op.name}', {kind})"
        if kind in _ITERATORS:
            return f"its input is taken from a tf.data iterator inside the graph (op '{op.name}', {kind})"
    return ""
