"""A graph session's run of one fetch structure through a C++ callable, when the run allows it.

Runs in the trainer process (graph mode), on the thread that prepared the session: made once per
fetch structure by :class:`procsv.trainer.graph.session.GraphSession` (with the structure's
:class:`procsv.trainer.graph.runplan.RunPlan`) and called at each of that structure's runs.

``tf.compat.v1.Session.run`` spends about as long in its own Python as the digits MLP's step
takes to compute (about 100 us of a 210 us step here: it flattens the feed dict, converts and
checks each fed value, builds a fetch handler, extends the session's graph, and rebuilds the
result structure at every call). TensorFlow's callable API (``Session._make_callable_from_options``
and ``CallableOptions``: the C++ ``Session::MakeCallable``, which Keras's TF1 backend used for the
same reason) does that work once, for a fixed set of fed tensors, fetched tensors and target ops.

A :class:`FastRun` is that callable for one structure, made only when every run of the structure
is one the callable can do exactly as ``Session.run`` does: fetches that are a single tensor or
operation, or a plain list or tuple of distinct ones, of the session's graph, none of them fed;
fed keys that are feedable tensors of the graph; a local session. A run is taken by the callable
only when, in addition, it has no ``options`` and no ``run_metadata`` and every fed value is a numpy
array of exactly its tensor's dtype and of a shape the tensor's static shape accepts (what
``Session.run`` would pass on unchanged); any other value, or a closed session, makes
:meth:`FastRun.__call__` answer :data:`MISS`, and the caller runs ``Session.run`` as always. The
values returned are what ``Session.run`` returns (the same conversion of each tensor; ``None`` for
an operation; a list or tuple as given), and an op's error reaches the program as ``Session.run``
raises it (through the session's own ``_do_call``). ``PROCSV_GRAPH_FAST_RUN=0`` turns it off (the
:class:`~procsv.trainer.graph.session.GraphSession`'s ``fast_runs``, from the Supervisor's
:class:`~procsv.common.bootstrap.ChildConfig`).
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np


MISS: Any = object()  # this run is not one the callable does as Session.run would: run it the usual way
_ANY = -1  # a dimension the fed tensor's static shape leaves open


class FastRun:
    """One structure's runs through a callable: ``__call__(feed_dict)`` returns the run's values,
    or :data:`MISS` when this run's feed is not one the callable takes as ``Session.run`` would."""

    __slots__ = ("_sess", "_call", "_dtypes", "_dims", "_shapes", "_layout", "_kind", "_extra")

    def __init__(self, session: Any, call: Any, dtypes: list[Any], dims: list[tuple[int, ...]],
                 layout: list[int], kind: Any, extra: bool) -> None:
        self._sess = session
        self._call = call
        self._dtypes = dtypes  # each fed tensor's numpy dtype, in the feed dict's order
        self._dims = dims  # each fed tensor's static shape (_ANY where open)
        self._shapes: list[Any] = [None] * len(dims)  # the last shape seen fit, per fed tensor
        self._layout = layout  # per fetch: its index among the callable's fetches, -1 an operation
        self._kind = kind  # list or tuple (None: one fetch)
        self._extra = extra  # the callable fetches one more tensor after the structure's (the global step's read)

    def __call__(self, feed_dict: Any) -> Any:
        sess = self._sess
        if sess._closed:
            return MISS
        values = list(feed_dict.values()) if feed_dict else []
        shapes = self._shapes
        for i, value in enumerate(values):
            if value.__class__ is not np.ndarray or value.dtype != self._dtypes[i]:
                return MISS
            if value.shape != shapes[i]:
                if not _fits(value.shape, self._dims[i]):
                    return MISS
                shapes[i] = value.shape
        got = sess._do_call(self._call, *values)
        layout = self._layout
        if self._kind is None:
            out = None if layout[0] < 0 else got[layout[0]]
        else:
            out = self._kind([None if j < 0 else got[j] for j in layout])
        return (out, got[-1]) if self._extra else out


def _fits(shape: tuple[int, ...], dims: tuple[int, ...]) -> bool:
    return len(shape) == len(dims) and all(d == _ANY or d == s for s, d in zip(shape, dims))


def fast_run(session: Any, fetches: Any, feed_dict: Any, extra: Any = None) -> Optional[FastRun]:
    """The :class:`FastRun` of runs of ``fetches`` fed the keys of ``feed_dict`` (and, with
    ``extra``, one more tensor fetched after them), or None where a callable could differ from
    ``Session.run`` (see the module docstring)."""
    import tensorflow as tf
    from tensorflow.core.protobuf import config_pb2

    if session.sess_str or not hasattr(session, "_make_callable_from_options"):
        return None
    if extra is not None and not isinstance(extra, tf.Tensor):
        return None
    graph = session.graph
    kind = fetches.__class__
    leaves = list(fetches) if kind is list or kind is tuple else [fetches]
    fetched: list[Any] = []
    targets: list[Any] = []
    layout: list[int] = []
    seen: set[int] = set()  # ids, not `in` (a tensor's == may be elementwise)
    for leaf in leaves + ([extra] if extra is not None else []):
        if id(leaf) in seen:
            return None  # a repeated fetch: Session.run's own handling
        seen.add(id(leaf))
        if isinstance(leaf, tf.Operation) and leaf.graph is graph:
            targets.append(leaf)
            layout.append(-1)
        elif isinstance(leaf, tf.Tensor) and leaf.graph is graph and _plain_dtype(leaf.dtype):
            layout.append(len(fetched))
            fetched.append(leaf)
        else:
            return None  # a variable, a name, another graph's: Session.run's own handling
    feeds = list(feed_dict or ())
    if (feed_dict and feed_dict.__class__ is not dict) or any(
            not isinstance(k, tf.Tensor) or k.graph is not graph or not graph.is_feedable(k)
            or not _plain_dtype(k.dtype) or id(k) in seen for k in feeds):
        return None
    options = config_pb2.CallableOptions(feed=[k.name for k in feeds], fetch=[t.name for t in fetched],
                                         target=[op.name for op in targets])
    try:
        call = session._make_callable_from_options(options)
    except (tf.errors.OpError, ValueError, TypeError):
        return None  # Session.run will raise what it raises for this structure
    dims = [tuple(_ANY if d is None else d for d in k.shape.as_list()) if k.shape.rank is not None else None
            for k in feeds]
    if any(d is None for d in dims):
        return None  # a fed tensor of unknown rank: any shape fits, left to Session.run
    if extra is not None:
        layout = layout[:-1]  # the extra read is the callable's last fetch
    return FastRun(session, call, [k.dtype.as_numpy_dtype for k in feeds], dims,  # type: ignore[arg-type]
                   layout, kind if kind is list or kind is tuple else None, extra is not None)


def _plain_dtype(dtype: Any) -> bool:
    """A numeric or boolean dtype: fetched and fed the same way by both paths (not strings,
    resources or variants, whose conversions differ)."""
    import tensorflow as tf

    return (dtype.is_numpy_compatible and dtype.base_dtype not in (tf.string, tf.resource, tf.variant)
            and not dtype._is_ref_dtype)
