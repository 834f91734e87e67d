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

Checking a reused walk (:func:`unchanged`, before each in-memory snapshot that reuses one) lists
nothing again where it need not: TensorFlow's own ``_trackable_children`` for a checkpoint (and
AutoTrackable's, Keras 3 layers', and its list and dict wrappers' after their own checks, which
are run) returns exactly the entries of the object's ``_self_unconditional_checkpoint_dependencies``,
the list every tracking call (``_track_trackable``: an attribute set, a list appended to, a
variable added, an optimizer's slots built) appends to or replaces an entry of. So :func:`walk`
keeps, per object walked (:class:`Marks`), that list and a copy of its entries, and the check
compares them by identity (a replaced entry is a new object): one C-level pass per object instead
of TF's Python per object (0.39 -> 0.10 ms of each in-memory snapshot of the digits model, at
load 3-6; issue 54 point 5). If every object's children are the same, the objects reached are the
same too, so the check needs no queue. An object of any other class (one that overrides
``_trackable_children``, ``_checkpoint_dependencies`` or ``_maybe_initialize_trackable`` anywhere in
its MRO with something else) has its children listed again each time, as before; a TF1-style
optimizer's slots are counted again each time. Rejected, because each can miss a change silently:
a global counter of tracking calls (only as sound as the guess that nothing edits the list
another way, and a patch of TensorFlow's classes), checking every k-th snapshot (the snapshots
between a change and its check would leave the new state out, and one of them may be what a
kill restores), and walking off the step path (a change after the walk and before the copy is
still missed).

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

import operator
from typing import Any, Optional

Shape = list[tuple[int, str, Any]]  # (parent's position, edge name, child); (-1 - position, "", slot count)

_DEPS = "_self_unconditional_checkpoint_dependencies"  # Trackable's own list of its children, in order
# how an object's children are checked again (:class:`Marks`): from the list Trackable lists them
# from (_PLAIN; _LIST and _DICT: TensorFlow's list and dict wrappers, whose own checks run first),
# by listing them again (_OTHER), or a TF1-style optimizer's slot count (_SLOTS)
_PLAIN, _LIST, _DICT, _OTHER, _SLOTS = range(5)
_Mark = tuple[int, Any, Any, Any, Any]  # (how, object, its class, its list of children or slot count, a copy)
_KINDS: dict[type, int] = {}  # a class -> how its objects' children are checked (_kind)


class Marks:
    """What :func:`unchanged` checks the graph by: per object walked, in the walk's order, the list
    its children come from (and a copy of its entries), or the children themselves, or its slot count.
    Holds the objects, so that none of them is freed and its ``id`` reused while it is kept."""

    __slots__ = ("entries",)

    def __init__(self, entries: list[_Mark]) -> None:
        self.entries: tuple[_Mark, ...] = tuple(entries)


def shape(ckpt: Any) -> Optional[Shape]:
    """The edges of ``ckpt``'s object graph (see the module docstring), or None if they cannot be
    told apart from a change reliably. A name-based checkpoint (a TF1 graph's variables) has one
    edge per variable, from itself: its variables never change."""
    return walk(ckpt)[0]


def walk(ckpt: Any) -> tuple[Optional[Shape], Optional[Marks]]:
    """:func:`shape`, and the :class:`Marks` :func:`unchanged` checks it by later (None: none, as for
    a name-based checkpoint, or when the shape itself is None)."""
    import tensorflow as tf

    from procsv.trainer.checkpoint.name_based import NameBasedCheckpoint

    if isinstance(ckpt, NameBasedCheckpoint):
        return [(0, key, ckpt) for key in ckpt.keys()], None

    trackable = tf.__internal__.tracking.Trackable
    seen = {id(ckpt)}
    queue = [ckpt]
    edges: Shape = []
    marks: list[_Mark] = []
    at = 0
    while at < len(queue):
        obj = queue[at]
        if callable(getattr(obj, "get_slot_names", None)):  # slot variables outside the edges
            slots = _slot_count(obj)
            if slots is None:
                return None, None
            edges.append((-1 - at, "", slots))  # a negative parent: no edge has one
            marks.append((_SLOTS, obj, type(obj), slots, None))
        children = _children(obj, trackable)
        kind = _kind(type(obj))
        deps = getattr(obj, _DEPS, None) if kind != _OTHER else None
        if isinstance(deps, list) and len(deps) == len(children) \
                and all(ref.ref is child for ref, (_, child) in zip(deps, children)):
            marks.append((kind, obj, type(obj), deps, tuple(deps)))
        else:  # listed by a class of its own: listed again at each check
            marks.append((_OTHER, obj, type(obj), None, tuple(children)))
        for name, child in children:
            edges.append((at, name, child))
            if id(child) not in seen:
                seen.add(id(child))
                queue.append(child)
        at += 1
    return edges, Marks(marks)


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


def unchanged(marks: Optional[Marks]) -> bool:
    """Whether the graph :func:`walk` made ``marks`` from still has the same edges to the very same
    objects, as :func:`same` would tell from a new :func:`shape`, without listing them again where
    TensorFlow lists them from Trackable's own list (see the module docstring). None: never."""
    if marks is None:
        return False
    is_ = operator.is_
    trackable: Any = None
    for kind, obj, cls, deps, copy in marks.entries:
        if type(obj) is not cls:
            return False
        if kind == _SLOTS:
            if _slot_count(obj) != deps:
                return False
            continue
        if kind == _OTHER:
            if trackable is None:
                import tensorflow as tf

                trackable = tf.__internal__.tracking.Trackable
            now = _children(obj, trackable)
            if len(now) != len(copy) or not all(n == m and c is d for (n, c), (m, d) in zip(now, copy)):
                return False
            continue
        if kind == _LIST:  # what ListWrapper._trackable_children checks before listing (it raises then)
            obj._check_external_modification()
            if obj._external_modification or obj._non_append_mutation:
                return False
        elif kind == _DICT:  # _DictWrapper's (the same)
            obj._check_self_external_modification()
            if obj._self_external_modification or obj._self_non_string_key:
                return False
        listed = getattr(obj, _DEPS, None)
        if listed is not deps or len(listed) != len(copy) or not all(map(is_, listed, copy)):
            return False
    return True


def _kind(cls: type) -> int:
    """How the children of ``cls``'s objects are checked again: _PLAIN (or _LIST, _DICT) if every
    ``_trackable_children`` in its MRO is one known to list, for a checkpoint, exactly Trackable's own
    list (after its own checks, for TensorFlow's list and dict wrappers) and it overrides neither
    ``_checkpoint_dependencies`` nor ``_maybe_initialize_trackable``; else _OTHER."""
    kind = _KINDS.get(cls)
    if kind is None:
        kind = _KINDS[cls] = _kind_of(cls)
    return kind


def _kind_of(cls: type) -> int:
    import sys

    import tensorflow as tf
    from tensorflow.python.trackable import autotrackable, data_structures

    base = tf.__internal__.tracking.Trackable
    known: dict[Any, int] = {
        base.__dict__["_trackable_children"]: _PLAIN,
        autotrackable.AutoTrackable.__dict__["_trackable_children"]: _PLAIN,  # a checkpoint's: Trackable's
        data_structures.ListWrapper.__dict__["_trackable_children"]: _LIST,
        data_structures._DictWrapper.__dict__["_trackable_children"]: _DICT,
    }
    keras_layer = sys.modules.get("keras.src.backend.tensorflow.layer")  # Keras 3's (a checkpoint's: AutoTrackable's)
    if keras_layer is not None and "_trackable_children" in getattr(keras_layer, "TFLayer", object).__dict__:
        known[keras_layer.TFLayer.__dict__["_trackable_children"]] = _PLAIN
    kinds = set()
    for klass in cls.__mro__:
        if klass is base:
            continue
        if "_checkpoint_dependencies" in klass.__dict__ or "_maybe_initialize_trackable" in klass.__dict__:
            return _OTHER
        fn = klass.__dict__.get("_trackable_children")
        if fn is not None:
            if fn not in known:
                return _OTHER
            kinds.add(known[fn])
    kinds.discard(_PLAIN)
    return _PLAIN if not kinds else kinds.pop() if len(kinds) == 1 else _OTHER


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
