"""The ops procsv adds to a TF1 graph, built once per graph.

Runs in the trainer process (graph mode). A Supervisor finalizes its graph, as TensorFlow's did; a
second Supervisor on the same graph (the seed's retry loop: a new ``Supervisor`` after an
``AbortedError``) cannot add ops to it. TensorFlow's own Supervisor reuses what the first one put
in the graph's collections; procsv's pieces (the step probe's reads, the checkpoint's read,
restore and assign ops, the global step's assigns) are reused the same way: :func:`once_per_graph`
builds them the first time and hands the same ops out afterwards. Nothing here holds a session.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable, Hashable, TypeVar

T = TypeVar("T")

_BUILT: "weakref.WeakKeyDictionary[Any, dict[Hashable, Any]]" = weakref.WeakKeyDictionary()


def once_per_graph(graph: Any, key: Hashable, make: Callable[[], T]) -> T:
    """What ``make()`` built for ``graph`` under ``key``: built the first time only."""
    per = _BUILT.setdefault(graph, {})
    if key not in per:
        per[key] = make()
    built: T = per[key]
    return built
