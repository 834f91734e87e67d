"""Which ``sess.run`` of a graph program is a training step, and the global step it reached.

Runs in the trainer process (graph mode): built by the Supervisor's constructor, before the graph
is finalized; read by :class:`procsv.trainer.graph.session.GraphSession` at every ``run``.

A step is a ``run`` during which the graph's global step changed (TF1's convention: the train op
is ``optimizer.minimize(loss, global_step=...)``). Fetching the global step in the same ``run``
does not tell: the read has no dependency on the train op, and TensorFlow runs it first (measured:
300 runs of 300 returned the value from before the run). A second ``run`` after each one costs a
tenth of a small model's step. So :class:`StepProbe` finds, once, the ops that write the global
step (its ``AssignAdd``...), and builds for each a read of the global step that runs after it (a
control dependency). A ``run`` whose fetches reach such a writer is a step, and fetches that read
as one extra fetch in the same call: the value after the run, at no extra cost, since the writer
runs anyway. Which writers a structure of fetches reaches is a walk of the graph, made once per
fetch structure (keyed by the fetched objects' identities and the fed keys) and cached.

Most programs' writer adds a constant (``minimize(global_step=...)`` adds 1): a run that reaches
one such writer, and no other, needs no extra fetch: the step it made is the one before plus that
constant (:attr:`StepProbe.increments`; ``plan`` says which). The session fetches the read
beside the run's fetches only where the exact value matters (a boundary may be due at the step
the run makes: decided before the run, from the step inferred and the clock), every
:data:`VERIFY_EVERY` inferred steps, and after a run from another thread reached a writer; a
fetch of the global step costs 2-3 % of a small model's step (``scripts/bench_graph.py``'s floor),
an inference nothing. When a boundary's time comes during a run (it was not due when the run
began) the session reads the global step after it with a run of ``read`` alone (a whole
``Session.run``), so that the boundary is not put off to the next step (a slow step's progress
would reach the watchdog a step late).

A run that reaches no writer of the global step is no step; :meth:`StepProbe.writes` says whether
it writes any variable all the same (an op that assigns or applies a gradient to one, a table's
insert, or a function call, which may; not a local variable's write), once per fetch structure: the graph session then marks the
state changed since its last snapshot (``minimize(loss)`` without ``global_step=`` trains so), and
the committed checkpoint of the step is rewritten with it (:mod:`procsv.services.checkpoint.inplace`).

When the graph has no global step, procsv adds none (the program's graph is the program's: its
``init_op`` and ``ready_op`` were built without one, as TF's Supervisor leaves it): every ``run``
of the session is a step, counted in Python (``variable`` None, ``counts_every_run``; the session
counts, :class:`procsv.trainer.graph.state.CountedStep` holds the count). With
``increment_global_step=True`` on a graph that has one, procsv advances it at every run instead
(its extra fetch is an increment).
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

_READS = {"ReadVariableOp", "VarIsInitializedOp", "Identity", "IsVariableInitialized", "VariableShape"}
CACHE_MAX = 256  # fetch structures remembered (a program uses a handful)
VERIFY_EVERY = 100  # inferred steps between two reads of the global step at the most
_ADDS = {"AssignAddVariableOp", "AssignAdd"}
# ops that write a variable or a table (by type prefix), or may (a function call): a run reaching one changes the state
_WRITES = ("Assign", "Apply", "ResourceApply", "SparseApply", "ResourceSparseApply", "Scatter", "ResourceScatter",
           "StridedSliceAssign", "ResourceStridedSliceAssign", "LookupTableInsert", "LookupTableImport",
           "LookupTableRemove", "StatefulPartitionedCall", "PartitionedCall")


class Plan:
    """What one fetch structure's run does to the global step: ``read``, a read of it that runs
    after the run's writer (fetched beside the program's fetches when the value is needed), and
    ``add``, the constant the run adds to it, when that is known (else None: fetch ``read``)."""

    __slots__ = ("read", "add")

    def __init__(self, read: Any, add: Optional[int]) -> None:
        self.read = read
        self.add = add


def global_step_of(graph: Any, given: Any) -> Optional[Any]:
    """The global step variable (``given``, else the graph's collection or ``global_step:0``), or
    None when the graph has none: procsv creates none (it counts the runs instead)."""
    import tensorflow as tf

    if given is not None:
        return _variable_of(graph, given)
    found = tf.compat.v1.train.get_global_step(graph)
    return None if found is None else _variable_of(graph, found)


def _variable_of(graph: Any, value: Any) -> Any:
    """The variable behind a global step given as a tensor (``global_step:0``), else ``value``."""
    import tensorflow as tf

    if isinstance(value, tf.Variable):
        return value
    name = getattr(value, "name", None)
    for var in graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES):
        if var.name == name or getattr(var, "_graph_element", None) is value:
            return var
    raise TypeError(f"global_step must be a variable of the graph, not {value!r}")


def _flatten(graph: Any, fetches: Any) -> list[Any]:
    """The graph elements of a structure of fetches (what ``Session.run`` accepts)."""
    import tensorflow as tf

    out: list[Any] = []
    stack = [fetches]
    while stack:
        item = stack.pop()
        if item is None:
            continue
        if isinstance(item, Mapping):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
        elif isinstance(item, str):
            out.append(graph.as_graph_element(item, allow_tensor=True, allow_operation=True))
        elif isinstance(item, tf.Variable):
            out.append(item.op)
        elif hasattr(item, "op") or hasattr(item, "control_inputs"):
            out.append(item)
        elif hasattr(item, "__attrs_attrs__"):
            stack.extend(getattr(item, a.name) for a in item.__attrs_attrs__)
    return out


class StepProbe:
    """The global step's writers, a read after each, and which of them each fetch structure runs.

    ``variable``: the global step (None: the graph has none, every run is a step counted in Python,
    and nothing is built); ``counts_every_run``: every run is a step (procsv advances ``variable``
    at each, when there is one); ``after``: writer op name -> a read of the global step that runs after it.
    """

    def __init__(self, graph: Any, variable: Any, counts_every_run: bool) -> None:
        import tensorflow as tf

        self.graph = graph
        self.variable = variable
        self.counts_every_run = counts_every_run
        self._cache: dict[tuple[Any, ...], Optional[Plan]] = {}
        self._writes: dict[tuple[Any, ...], bool] = {}
        self.after: dict[str, Any] = {}
        self.increments: dict[str, tuple[int, Any]] = {}  # writer name -> (the constant it adds, its Const tensor)
        self.read: Any = None  # a read of the global step alone (a run of its own, after another)
        self.increment: Any = None
        if variable is None:  # nothing to read or advance: the graph stays as the program built it
            self.counts_every_run = True
            return
        with graph.as_default():
            if counts_every_run:
                self.increment = tf.compat.v1.assign_add(variable, 1, use_locking=True, name="procsv_step_increment")
                return
            handle = getattr(variable, "handle", None)
            source = handle if handle is not None and handle.dtype == tf.resource else variable.op.outputs[0]
            initializer = variable.initializer
            for op in source.consumers():
                if op.type in _READS or op is initializer:
                    continue
                with tf.control_dependencies([op]):
                    self.after[op.name] = tf.identity(variable.read_value(), name=f"procsv_step_after_{len(self.after)}")
                added = _constant_added(op)
                if added is not None:
                    self.increments[op.name] = added
            self.read = tf.identity(variable.read_value(), name="procsv_step_read")

    def extra_fetch(self, fetches: Any, feed_dict: Any) -> Optional[Any]:
        """What to fetch beside ``fetches`` to learn the global step after the run, or None when
        this run writes no global step (no step)."""
        if self.counts_every_run:
            return self.increment
        plan = self.plan(fetches, feed_dict)
        return None if plan is None else plan.read

    def plan(self, fetches: Any, feed_dict: Any) -> Optional[Plan]:
        """What a run of ``fetches`` does to the global step (None: it writes none, no step).
        Not for ``counts_every_run`` (every run is a step there, its fetch the increment)."""
        key = (_key(fetches), _key(tuple(feed_dict)) if feed_dict else ())
        try:
            return self._cache[key]
        except KeyError:
            pass
        found = self._walk(fetches, feed_dict)
        if len(self._cache) >= CACHE_MAX:
            self._cache.clear()
        self._cache[key] = found
        return found

    def writes(self, fetches: Any, feed_dict: Any) -> bool:
        """Whether a run of ``fetches`` runs an op that writes (or may write) a variable other than a
        local one (``LOCAL_VARIABLES``: a ``tf.compat.v1.metrics`` update, which no Saver saves)."""
        import tensorflow as tf

        key = (_key(fetches), _key(tuple(feed_dict)) if feed_dict else ())
        found = self._writes.get(key)
        if found is None:
            local = {id(v.op) for v in self.graph.get_collection(tf.compat.v1.GraphKeys.LOCAL_VARIABLES)}
            found = any(op.type.startswith(_WRITES) and not (op.inputs and id(op.inputs[0].op) in local)
                        for op in self._ops(fetches, feed_dict))
            if len(self._writes) >= CACHE_MAX:
                self._writes.clear()
            self._writes[key] = found
        return found

    def _fed(self, feed_dict: Any) -> set[int]:
        """The identities of the graph elements ``feed_dict`` feeds (keys that are none are left out)."""
        fed: set[int] = set()
        for key in (feed_dict or {}):
            try:
                fed.add(id(self.graph.as_graph_element(key)))
            except (TypeError, ValueError, KeyError):
                continue
        return fed

    def _ops(self, fetches: Any, feed_dict: Any) -> list[Any]:
        """The ops a run of ``fetches`` runs (inputs and control inputs, stopping at fed tensors,
        whose producers do not run), each once, from the fetches back."""
        fed = self._fed(feed_dict)
        seen: set[int] = set()
        stack = [e if hasattr(e, "control_inputs") else e.op for e in _flatten(self.graph, fetches)
                 if id(e) not in fed]
        out: list[Any] = []
        while stack:
            op = stack.pop()
            if id(op) in seen:
                continue
            seen.add(id(op))
            out.append(op)
            stack.extend(t.op for t in op.inputs if id(t) not in fed)
            stack.extend(op.control_inputs)
        return out

    def _walk(self, fetches: Any, feed_dict: Any) -> Optional[Plan]:
        """The read after the first writer the fetches reach (:meth:`_ops`), and the constant added
        when that writer is the only one reached and adds an unfed constant."""
        if not self.after:
            return None
        fed = self._fed(feed_dict)
        writers = [op.name for op in self._ops(fetches, feed_dict) if op.name in self.after]
        if not writers:
            return None
        first = writers[0]
        added = self.increments.get(first) if len(writers) == 1 else None
        return Plan(self.after[first], added[0] if added is not None and id(added[1]) not in fed else None)


def _constant_added(op: Any) -> Optional[tuple[int, Any]]:
    """The constant an ``AssignAdd`` writer adds (and its tensor: feeding it would change it), or None."""
    import tensorflow as tf

    if op.type not in _ADDS or len(op.inputs) < 2:
        return None
    value = op.inputs[1]
    if value.op.type != "Const":
        return None
    try:
        array = tf.make_ndarray(value.op.get_attr("value"))
    except (TypeError, ValueError):
        return None
    if array.size != 1 or array.dtype.kind not in "iu":
        return None
    added = int(array.reshape(()))
    return (added, value) if added != 0 else None


def _key(fetches: Any) -> tuple[Any, ...]:
    """A cache key of a structure of fetches: the identities of its leaves, in order (the
    structure's lists and dicts are new at every call; the tensors and ops in it are the graph's)."""
    out: list[Any] = []
    stack = [fetches]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            out.append(len(item))
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            out.append(len(item))
            stack.extend(item)
        else:  # (a string names a graph element: itself; an object of the graph lives as long as it)
            out.append(item if isinstance(item, str) else id(item))
    return tuple(out)
