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

When the graph has no global step, procsv creates one (``get_or_create_global_step``) that no op
of the program writes: then every ``run`` is a step, and its extra fetch is an increment
(``counts_every_run``), as an eager ``sess.run(step_fn)`` is one step.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

_READS = {"ReadVariableOp", "VarIsInitializedOp", "Identity", "IsVariableInitialized", "VariableShape"}
CACHE_MAX = 256  # fetch structures remembered (a program uses a handful)


def global_step_of(graph: Any, given: Any) -> tuple[Any, bool]:
    """The global step variable (``given``, else the graph's collection or ``global_step:0``,
    else a new one) and whether procsv created it (then nothing of the program writes it)."""
    import tensorflow as tf

    if given is not None:
        return _variable_of(graph, given), False
    found = tf.compat.v1.train.get_global_step(graph)
    if found is not None:
        return _variable_of(graph, found), False
    with graph.as_default():
        return tf.compat.v1.train.get_or_create_global_step(graph), True


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

    ``variable``: the global step; ``counts_every_run``: procsv advances it at every run (the
    program has none); ``after``: writer op name -> a read of the global step that runs after it.
    """

    def __init__(self, graph: Any, variable: Any, counts_every_run: bool) -> None:
        import tensorflow as tf

        self.graph = graph
        self.variable = variable
        self.counts_every_run = counts_every_run
        self._cache: dict[tuple[Any, ...], Optional[Any]] = {}
        self.after: dict[str, Any] = {}
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

    def extra_fetch(self, fetches: Any, feed_dict: Any) -> Optional[Any]:
        """What to fetch beside ``fetches`` to learn the global step after the run, or None when
        this run writes no global step (no step)."""
        if self.counts_every_run:
            return self.increment
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

    def _walk(self, fetches: Any, feed_dict: Any) -> Optional[Any]:
        """The read after the first writer the fetches reach (inputs and control inputs, stopping
        at fed tensors, whose producers do not run)."""
        if not self.after:
            return None
        fed: set[int] = set()
        for key in (feed_dict or {}):
            try:
                fed.add(id(self.graph.as_graph_element(key)))
            except (TypeError, ValueError, KeyError):
                continue
        seen: set[int] = set()
        stack = [e if hasattr(e, "control_inputs") else e.op for e in _flatten(self.graph, fetches)
                 if id(e) not in fed]
        while stack:
            op = stack.pop()
            if id(op) in seen:
                continue
            seen.add(id(op))
            if op.name in self.after:
                return self.after[op.name]
            stack.extend(t.op for t in op.inputs if id(t) not in fed)
            stack.extend(op.control_inputs)
        return None


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
