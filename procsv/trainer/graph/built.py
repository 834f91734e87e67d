"""The ops procsv adds to a TF1 graph, built once per graph.

Runs in the trainer process (graph mode). A Supervisor finalizes its graph, as TensorFlow's did; a
second Supervisor on the same graph (the seed's retry loop: a new ``Supervisor`` after an
``AbortedError``) cannot add ops to it. TensorFlow's own Supervisor reuses what the first one put
in the graph's collections; procsv's pieces (the step probe's reads, the checkpoint's read,
restore and assign ops, the global step's assigns) are reused the same way: :func:`once_per_graph`
builds them the first time and hands the same ops out afterwards. Nothing here holds a session.
"""

from __future__ import annotations

from typing import Any, Callable, Hashable, TypeVar

T = TypeVar("T")

_ATTR = "_procsv_built"  # the graph's own attribute: what was built lives and dies with the graph


def once_per_graph(graph: Any, key: Hashable, make: Callable[[], T]) -> T:
    """What ``make()`` built for ``graph`` under ``key``: built the first time only.

    Kept on the graph itself: a module-level ``WeakKeyDictionary`` keyed by the graph never let a
    graph go, since what is built (its ops, variables) refers to the graph (one graph and its
    ops kept per Supervisor's graph for the life of the process)."""
    per: "dict[Hashable, Any] | None" = getattr(graph, _ATTR, None)
    if per is None:
        per = {}
        setattr(graph, _ATTR, per)  # (a tf.Graph takes attributes, though vars() has none to show)
    if key not in per:
        per[key] = make()
    built: T = per[key]
    return built
