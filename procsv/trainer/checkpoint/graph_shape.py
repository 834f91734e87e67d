"""Has the checkpoint's object graph changed since it was last walked? A cheap structural check.

Runs in the trainer, at the step boundary of a snapshot. Walking the object graph the way
``Checkpoint.write()`` does (:func:`procsv.trainer.checkpoint.snapshot.plan`: names, saveables, the
serialized graph) costs milliseconds even for a small model (about 3 ms for a 3-layer Keras MLP
with Adam here, 14 ms for a larger one), more than copying its variables, so a snapshot reuses the
last walk when it can. It can only if the graph has the same objects in the same places: an
optimizer builds its slot variables at its first update, a layer is added or a variable replaced,
and a reused walk would silently leave them out of the snapshot (a restart from it would reset
them). :func:`shape` lists what the walk follows -- every edge, as (the parent's position, the
edge's name, the child object) in breadth-first order -- about a tenth of the walk's cost, and
:func:`same` compares two such lists by identity. The list holds the objects themselves, so that
none of them can be freed and its ``id`` reused by a new object while a walk that saw it is kept.

TF1-style optimizers (``tf.compat.v1.train`` and the legacy Keras ones) keep their slot variables
outside the graph's edges; for them the count of slot variables is part of the shape, and one
whose slots cannot be counted makes every walk fresh (:func:`shape` returns None).

The edges are listed as TensorFlow's walk lists them (``ObjectGraphView.list_children``: each
object's ``_trackable_children`` for a checkpoint, each child made trackable), without the part of
that call that costs most and finds nothing on an object walked before: its
``_maybe_initialize_trackable``, which sets attributes under a guard and so, on a Keras object,
runs Keras's attribute tracking twice per object (on the digits model's 48 edges, repeated: 0.59 ms
a check before, 0.12 after; at a snapshot, right after a step has emptied the caches: 0.45 ms
before, 0.37 after, quiet; issue 54). It is still called on an object that has not set up its dependencies,
and on every object whose class has its own ``_maybe_initialize_trackable`` (such a class may add
children there at any walk, as TensorFlow's ``DelegatingTrackableMixin`` forwards it to the wrapped
object): only Trackable's own is known to do nothing on an object already set up.
"""

from __future__ import annotations

from typing import Any, Optional

Shape = list[tuple[int, str, Any]]  # (parent's position, edge name, child); (-1 - position, "", slot count)


def shape(ckpt: Any) -> Optional[Shape]:
    """The edges of ``ckpt``'s object graph (see the module docstring), or None if they cannot be
    told apart from a change reliably. A name-based checkpoint (a TF1 graph's variables) has one
    edge per variable, from itself: its variables never change."""
    import tensorflow as tf

    from procsv.trainer.checkpoint.name_based import NameBasedCheckpoint

    if isinstance(ckpt, NameBasedCheckpoint):
        return [(0, key, ckpt) for key in ckpt.keys()]

    seen = {id(ckpt)}
    queue = [ckpt]
    edges: Shape = []
    at = 0
    while at < len(queue):
        obj = queue[at]
        if callable(getattr(obj, "get_slot_names", None)):  # slot variables outside the edges
            slots = _slot_count(obj)
            if slots is None:
                return None
            edges.append((-1 - at, "", slots))  # a negative parent: no edge has one
        for name, child in _children(obj, tf.__internal__.tracking.Trackable):
            edges.append((at, name, child))
            if id(child) not in seen:
                seen.add(id(child))
                queue.append(child)
        at += 1
    return edges


def _children(obj: Any, trackable: Any) -> list[tuple[str, Any]]:
    """``obj``'s children in a checkpoint's object graph, named, as TensorFlow's walk lists them (see
    the module docstring)."""
    from tensorflow.python.trackable import converter

    # what list_children does first; skipped only where it is Trackable's own (which does nothing on
    # an object set up): a class's own may still add children at every walk
    if type(obj)._maybe_initialize_trackable is not trackable._maybe_initialize_trackable \
            or not hasattr(obj, "_self_unconditional_checkpoint_dependencies"):
        obj._maybe_initialize_trackable()
    return [(name, child if isinstance(child, trackable) else converter.convert_to_trackable(child, parent=obj))
            for name, child in obj._trackable_children("checkpoint").items()]


def same(a: Optional[Shape], b: Optional[Shape]) -> bool:
    """Whether two shapes are the same graph: the same edges to the very same objects."""
    if a is None or b is None or len(a) != len(b):
        return False
    for (pa, na, ca), (pb, nb, cb) in zip(a, b):
        if pa != pb or na != nb or (ca is not cb if pa >= 0 else ca != cb):
            return False
    return True


def _slot_count(optimizer: Any) -> Optional[int]:
    """How many slot variables a TF1-style optimizer holds (both kinds keep a dict of dicts)."""
    slots = getattr(optimizer, "_slots", None)
    if not isinstance(slots, dict):
        return None
    try:
        return sum(len(inner) for inner in slots.values())
    except TypeError:
        return None
