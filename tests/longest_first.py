"""The suite's order under xdist: each worker's share of the long tests first (runs in each xdist worker,
at collection; ``conftest.pytest_collection_modifyitems``).

``--dist worksteal`` hands worker ``k`` the ``k``-th of ``n`` contiguous, equal slices of the collected
order (the sizes :func:`slice_sizes` computes as xdist does) and, once a worker runs dry, moves half of
the longest queue's tail to it. In file order the long tests (a minute of waiting on real processes
each) land wherever their files fall, and the run ends with one worker finishing a long test that
started late while the others are idle. Here the tests whose measured wall time (``durations.json``,
written by ``scripts/suite_cpu.py --durations``) is at least :data:`LONG` seconds lead the slices: each
module's long tests as one block in file order (its module-scoped fixtures are set up once on that
worker), the blocks dealt longest first, each to the slice with the least long time so far (LPT).
The other tests follow in file order, in contiguous runs, so stealing, which takes a queue's tail,
moves short tests only. Every
test is kept, once; a test the file does not name counts as short.
"""

from __future__ import annotations

import json
import os
from typing import Mapping, Sequence, TypeVar

T = TypeVar("T")

LONG = 2.0  # seconds of wall time from which a test leads its slice
DURATIONS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "durations.json")


def load(path: str = DURATIONS) -> dict[str, float]:
    """The measured wall time of each test node id (an empty mapping if the file is missing)."""
    try:
        with open(path) as fh:
            return {str(k): float(v) for k, v in json.load(fh).items()}
    except FileNotFoundError:
        return {}


def slice_sizes(total: int, workers: int) -> list[int]:
    """How many tests of ``total`` xdist's work-stealing scheduler sends each of ``workers`` idle
    workers at the start, in order (``len(pending) // nodes_remaining`` each)."""
    sizes, left = [], total
    for i in range(workers):
        sizes.append(left // (workers - i))
        left -= sizes[-1]
    return sizes


def order(ids: Sequence[str], items: Sequence[T], workers: int, durations: Mapping[str, float]) -> list[T]:
    """``items`` (whose node ids are ``ids``) reordered for ``workers`` workers (see the module)."""
    if workers < 2 or len(items) < workers:
        return list(items)
    sizes = slice_sizes(len(items), workers)
    units: dict[str, list[int]] = {}  # each module's long tests, in file order: one block (one fixture set-up)
    for i, nid in enumerate(ids):
        if durations.get(nid, 0.0) >= LONG:
            units.setdefault(nid.split("::")[0], []).append(i)

    def weight(unit: list[int]) -> float:
        return sum(durations[ids[i]] for i in unit)

    heads: list[list[int]] = [[] for _ in range(workers)]
    busy = [0.0] * workers
    for unit in sorted(units.values(), key=lambda u: (-weight(u), u[0])):
        room = [k for k in range(workers) if len(heads[k]) + len(unit) <= sizes[k]]
        k = min(room, key=lambda k: (busy[k], k)) if room else max(range(workers), key=lambda k: sizes[k] - len(heads[k]))
        fits = unit[:sizes[k] - len(heads[k])]  # (a block larger than a slice's room: the rest is short tests' order)
        heads[k] += fits
        busy[k] += weight(fits)
    taken = {i for head in heads for i in head}
    short = iter(i for i in range(len(items)) if i not in taken)
    out: list[T] = []
    for k in range(workers):
        out += [items[i] for i in heads[k]]
        out += [items[next(short)] for _ in range(sizes[k] - len(heads[k]))]
    return out
