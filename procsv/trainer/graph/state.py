"""A TF1 graph program's training state, as the checkpoint agent handles it.

Runs in the trainer process, main thread, graph mode only. :class:`GraphCheckpoint` presents a
graph's variables through the surface of ``tf.train.Checkpoint`` that
:class:`~procsv.trainer.checkpoint.agent.CheckpointAgent`, :mod:`procsv.trainer.checkpoint.snapshot`
and :mod:`procsv.trainer.checkpoint.restore_at_start` use
(:class:`~procsv.trainer.checkpoint.name_based.NameBasedCheckpoint`): a snapshot reads every variable
with one ``session.run`` and keys it by its TF1 name (``w1``, ``w1/Momentum``, ``global_step``: what
``tf.compat.v1.train.Saver`` writes), with no object graph; a restore assigns them by name in the
live session. :class:`GraphGlobalStep` looks like the eager global step: ``numpy()``, ``assign``,
``assign_add``.

Every op either needs is built once, at construction (the Supervisor finalizes the graph after
that): a snapshot, a restore or an assignment adds nothing to the graph, however often it runs.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Optional, Sequence, Union

import numpy as np

from procsv.common.errors import UnsupportedState
from procsv.trainer.graph.built import once_per_graph
from procsv.trainer.checkpoint.name_based import NameBasedCheckpoint, RestoreStatus

SessionGetter = Callable[[], Any]  # returns the live tf.compat.v1.Session (or anything with its run())
SCOPE = "procsv"  # the name scope of the ops built here


class SaveCounter:
    """``tf.train.Checkpoint.save_counter``'s surface, as a plain counter (a TF1 checkpoint has none)."""

    def __init__(self) -> None:
        self.value = 0

    def assign_add(self, n: int) -> None:
        self.value += int(n)

    def numpy(self) -> np.int64:
        return np.int64(self.value)


def _variables(graph: Any) -> list[Any]:
    import tensorflow as tf

    seen: dict[int, Any] = {}
    for key in (tf.compat.v1.GraphKeys.GLOBAL_VARIABLES, tf.compat.v1.GraphKeys.LOCAL_VARIABLES,
                tf.compat.v1.GraphKeys.SAVEABLE_OBJECTS, tf.compat.v1.GraphKeys.MODEL_VARIABLES):
        for v in graph.get_collection(key):
            seen.setdefault(id(v), v)
    return list(seen.values())


def _as_variable(key: str, value: Any) -> Any:
    """``value`` as a variable: a variable as it is; a tensor standing for one (what
    ``Saver``'s own normalization of a var list gives: a resource variable's read, a reference
    variable's ref) as the variable of its graph it reads."""
    import tensorflow as tf

    if isinstance(value, tf.Variable):
        if getattr(value, "_save_slice_info", None) is not None:
            raise UnsupportedState(f"{key}: partitioned (sliced) variables are not supported")
        return value
    if isinstance(value, (list, tuple)) or not hasattr(value, "op"):
        raise UnsupportedState(f"{key}: {type(value).__name__} in the saver's var list; procsv checkpoints "
                               "variables only (partitioned variables and SaveableObjects are not supported)")
    op = value.op
    if op.type in ("ReadVariableOp", "Identity") and op.inputs:
        op = op.inputs[0].op
    for var in _variables(value.graph):
        if var.op is op:
            return var
    raise UnsupportedState(f"{key}: {value.name} is no variable of its graph; procsv checkpoints variables only")


def normalize(var_list: Union[Mapping[str, Any], Sequence[Any]]) -> dict[str, Any]:
    """``var_list`` as ``tf.compat.v1.train.Saver`` keys it: a mapping kept (values made variables),
    a list keyed by each variable's graph name (``var.op.name``)."""
    if isinstance(var_list, Mapping):
        return {str(k): _as_variable(str(k), v) for k, v in var_list.items()}
    out: dict[str, Any] = {}
    for v in var_list:
        var = _as_variable(getattr(v, "name", "?"), v)
        key = var.op.name
        if key in out and out[key] is not var:
            raise ValueError(f"two variables are saved under the same name {key!r}")
        out[key] = var
    return out


def split(var_list: Union[Mapping[str, Any], Sequence[Any]]) -> tuple[Any, Any]:
    """``var_list`` as plain variables (kept as given) and what TF's Saver saves through its
    SaveableObjects: partitioned variables (their parts, or a ``PartitionedVariable``) and objects
    that save themselves (a ``MutableHashTable``); the second is None when there is none."""
    import tensorflow as tf

    def plain(v: Any) -> bool:
        if isinstance(v, tf.Variable):
            return getattr(v, "_save_slice_info", None) is None
        return isinstance(v, tf.Tensor)  # a variable's read or ref, as the Saver's normalization gives it

    kept: Any
    if isinstance(var_list, Mapping):
        kept = {k: v for k, v in var_list.items() if plain(v)}
        rest: Any = {k: v for k, v in var_list.items() if not plain(v)}
    else:
        kept, rest = [v for v in var_list if plain(v)], [v for v in var_list if not plain(v)]
    return kept, (rest or None)


def _slice_of(spec: str) -> tuple[list[int], tuple[slice, ...]]:
    """A slice spec (``"10 4 0,5:0,4"``: the full shape, then start,length or ``-`` per dimension)."""
    *full, parts = spec.split(" ")
    index = tuple(slice(None) if p == "-" else slice(int(p.split(",")[0]), sum(map(int, p.split(","))))
                  for p in parts.split(":"))
    return [int(n) for n in full], index


class GraphCheckpoint(NameBasedCheckpoint):
    """The variables of ``var_list`` (checkpoint key -> variable, or a list of variables keyed by
    their graph names), read and assigned through ``session()``, the live session. What TF's Saver
    saves through SaveableObjects (:func:`split`) is saved as its Saver writes it: a partitioned
    variable as one tensor under its full name (its parts assembled; TF's restore of each part
    reads its slice of it), a ``MutableHashTable`` as its exported keys and values, restored by the
    table's own restore op.

    Build it before the graph is finalized: its read, restore and assign ops are made here.
    ``session()`` is called only when a snapshot or a restore runs (the agent's ``restore_or_init``
    is the first), so the session may be created after this.
    """

    def __init__(self, var_list: Union[Mapping[str, Any], Sequence[Any]], session: SessionGetter) -> None:
        import tensorflow as tf

        from tensorflow.python.training.saving import saveable_object_util

        var_list, rest = split(var_list)
        self.var_list = normalize(var_list)
        if rest is not None and not isinstance(rest, Mapping):
            rest = saveable_object_util.op_list_to_dict(rest)  # keyed as TF's Saver keys them
        self._saveables = saveable_object_util.validate_and_slice_inputs(rest) if rest is not None else []
        self._specs = [spec for saveable in self._saveables for spec in saveable.specs]
        if not self.var_list and not self._specs:
            raise ValueError("GraphCheckpoint: no variables to checkpoint")
        self.session = session
        self.save_counter = SaveCounter()
        graphs = {id(v.graph): v.graph for v in self.var_list.values()}
        if len(graphs) > 1:
            raise ValueError("GraphCheckpoint: the variables belong to more than one graph")
        self.graph = next(iter(graphs.values())) if graphs else tf.compat.v1.get_default_graph()
        self._keys = list(self.var_list)
        self._extra_keys = list(dict.fromkeys(spec.name for spec in self._specs))
        self._dtypes = [v.dtype.base_dtype for v in self.var_list.values()]
        def build() -> tuple[list[Any], Any, list[Any], list[Any]]:
            with self.graph.as_default(), tf.name_scope(f"{SCOPE}/checkpoint"):
                reads = [_read_op(v) for v in self.var_list.values()]
                reads += [spec.tensor() if callable(spec.tensor) else spec.tensor for spec in self._specs]
                prefix = tf.compat.v1.placeholder(tf.string, shape=[], name="restore_prefix")
                assigns: list[Any] = []
                for key, var, dtype in zip(self._keys, self.var_list.values(), self._dtypes):
                    with tf.device("/cpu:0"):
                        value = tf.raw_ops.RestoreV2(prefix=prefix, tensor_names=[key], shape_and_slices=[""],
                                                     dtypes=[dtype])[0]
                    value.set_shape(var.shape)
                    assigns.append(var.assign(value, read_value=False))
                extra: list[Any] = []
                for saveable in self._saveables:  # as TF's Saver restores them: each spec's slice, then its op
                    with tf.device("/cpu:0"):
                        values = [tf.raw_ops.RestoreV2(prefix=prefix, tensor_names=[spec.name],
                                                       shape_and_slices=[spec.slice_spec], dtypes=[spec.dtype])[0]
                                  for spec in saveable.specs]
                    extra.append(saveable.restore(values, None))
            return reads, prefix, assigns, extra

        # a second Supervisor on the same (finalized) graph reuses them (procsv.trainer.graph.built)
        key = ("checkpoint", tuple((k, v.name) for k, v in self.var_list.items()),
               tuple((spec.name, spec.slice_spec) for spec in self._specs))
        self._reads, self._prefix, self._assigns, self._extra_restores = once_per_graph(self.graph, key, build)

    def keys(self) -> list[str]:
        return self._keys + self._extra_keys

    def key_of(self, variable: Any) -> Optional[str]:
        for key, var in self.var_list.items():
            if var is variable:
                return key
        return None

    def gather(self) -> list[tuple[str, np.ndarray]]:
        """Every variable's value, read with one ``session.run``."""
        values = self.session().run(self._reads)
        out = [(key, np.asarray(value)) for key, value in zip(self._keys, values)]
        whole: dict[str, np.ndarray] = {}
        for spec, value in zip(self._specs, values[len(self._keys):]):
            if not spec.slice_spec:
                whole[spec.name] = np.asarray(value)
                continue
            full, index = _slice_of(spec.slice_spec)  # a part of a partitioned variable: into its whole
            if spec.name not in whole:
                whole[spec.name] = np.zeros(full, dtype=np.asarray(value).dtype)
            whole[spec.name][index] = value
        return out + list(whole.items())

    def restore(self, path: str) -> RestoreStatus:
        """Assign every variable (but those left out) its value in ``path``, in one ``session.run``.

        Checked first against the checkpoint's index, so that nothing is assigned unless everything
        matches: a variable missing from it or stored with another shape or dtype raises
        ``ValueError`` naming it. A damaged file raises TensorFlow's own error (``DataLossError``:
        the restore at start then passes over to an older checkpoint)."""
        import tensorflow as tf

        reader = tf.train.load_checkpoint(path)
        shapes = reader.get_variable_to_shape_map()
        dtypes = reader.get_variable_to_dtype_map()
        run: list[Any] = []
        for key, var, dtype, assign in zip(self._keys, self.var_list.values(), self._dtypes, self._assigns):
            if key in self.left_out:
                continue
            if key not in shapes:
                raise ValueError(f"variable {key!r} is not in the checkpoint {path}")
            if list(shapes[key]) != var.shape.as_list():
                raise ValueError(f"variable {key!r} has shape {var.shape.as_list()} in this program and "
                                 f"{list(shapes[key])} in the checkpoint {path}")
            if dtypes[key] != dtype:
                raise ValueError(f"variable {key!r} is {dtype.name} in this program and {dtypes[key].name} "
                                 f"in the checkpoint {path}")
            run.append(assign)
        for key in self._extra_keys:
            if key not in shapes and key not in self.left_out:
                raise ValueError(f"{key!r} is not in the checkpoint {path}")
        run += [op for saveable, op in zip(self._saveables, self._extra_restores)
                if not {spec.name for spec in saveable.specs} & self.left_out]
        if run:
            self.session().run(run, feed_dict={self._prefix: path})
        return RestoreStatus()


def _read_op(var: Any) -> Any:
    """A tensor reading ``var``'s current value: a resource variable's new ``ReadVariableOp`` (so
    call this once per use), a reference variable's snapshot."""
    return var.value()


class CountedStep:
    """The step of a graph without a global step (and of an eager ``Supervisor(global_step=None)``),
    with :class:`GraphGlobalStep`'s surface: a count kept in Python (the session counts every run as a
    step; a restore sets it from the checkpoint's manifest). Nothing is built in the program's graph:
    TF's Supervisor adds no global step either."""

    var: Any = None
    tensor: Any = None
    numbered = False  # its checkpoints are named ``<basename>``, as TF's Supervisor names them

    def __init__(self) -> None:
        self.observed = 0

    @property
    def dtype(self) -> Any:
        import tensorflow as tf

        return tf.int64

    def observe(self, value: Any) -> None:
        self.observed = int(value)

    def forget(self) -> None:
        """A new session: the count goes on (there is no variable to read it from)."""

    def numpy(self) -> np.int64:
        return np.int64(self.observed)

    def assign(self, value: Any) -> None:
        self.observed = int(value)

    def assign_add(self, value: Any, read_value: bool = True) -> None:
        self.observed += int(value)


class GraphGlobalStep:
    """The graph's global step variable, as the rest of procsv sees an eager global step.

    ``numpy()`` is the value :meth:`observe` last set (the graph session calls it after each
    ``run``, which fetches the step anyway), read through the session when nothing was observed
    since construction or :meth:`forget`. ``assign`` and ``assign_add`` run ops built here, once.
    """

    def __init__(self, var: Any, session: SessionGetter) -> None:
        import tensorflow as tf

        self.var = var
        self.session = session
        self.observed: Optional[int] = None
        dtype = var.dtype.base_dtype
        def build() -> tuple[Any, Any, Any, Any]:
            with var.graph.as_default(), tf.name_scope(f"{SCOPE}/global_step"):
                value = tf.compat.v1.placeholder(dtype, shape=[], name="value")
                return value, var.assign(value, read_value=True), var.assign_add(value, read_value=True), _read_op(var)

        built = once_per_graph(var.graph, ("global_step", var.name), build)
        self._value, self._assign, self._assign_add, self._read = built

    @property
    def dtype(self) -> Any:
        return self.var.dtype.base_dtype

    @property
    def tensor(self) -> Any:
        """A tensor reading the step (built once): what a graph session adds to each run's fetches."""
        return self._read

    def observe(self, value: Any) -> None:
        """The step's value after a run (fetched with it)."""
        self.observed = int(value)

    def forget(self) -> None:
        """The variable may have changed outside the runs observed (a new session, an init): the next
        :meth:`numpy` reads it."""
        self.observed = None

    def numpy(self) -> np.int64:
        if self.observed is not None:
            return np.int64(self.observed)
        return np.int64(self.session().run(self._read))

    def assign(self, value: Any) -> None:
        self.observed = int(self.session().run(self._assign, feed_dict={self._value: int(value)}))

    def assign_add(self, value: Any) -> None:
        self.observed = int(self.session().run(self._assign_add, feed_dict={self._value: int(value)}))
