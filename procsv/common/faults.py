"""Fault injection points for tests: the one parser of ``PROCSV_FAULT``.

Runs in whichever process reaches a point (the watchdog, the trainer, the checkpoint service);
each process counts its own hits. ``PROCSV_FAULT`` is ``<process>:<point>[:<n>[-<m>]][@<a>]``: the point
fires the n-th time that process reaches it (default the first), or every time from the n-th to
the m-th, and only in the process's attempt ``a`` (``PROCSV_ATTEMPT``; default the first), so that its
restart runs normally. Several specs, separated by ``,``, each fire on their own (a test kills a service at
one point in its first attempt, at another in its second, and so on, in one launch). What a firing point does
(die, hang, raise) is the caller's: this module only says whether it fires. Never set outside tests. The
variables are read through :func:`procsv.common.bootstrap.read_faults` at each point (a test may set them
in-process).
"""

from __future__ import annotations

import os
import time
from typing import NamedTuple

from procsv.common.bootstrap import read_faults

STALL_MAX = 120.0  # seconds a stalling point blocks at most when its gate never opens

_hits: dict[tuple[str, str], int] = {}


class Spec(NamedTuple):
    """One spec of ``PROCSV_FAULT``: ``process:point`` fires at its hits ``lo`` to ``hi`` in ``attempt``."""

    process: str
    point: str
    lo: int
    hi: int
    attempt: int


def parse(spec: str) -> list[Spec]:
    """The specs of a ``PROCSV_FAULT`` value (pure; a spec without a point is left out)."""
    found = []
    for one in spec.split(","):
        body, _, at = one.strip().partition("@")
        process, _, rest = body.partition(":")
        point, _, nth = rest.partition(":")
        if not process or not point:
            continue
        first, _, last = nth.partition("-")
        lo = int(first) if first.isdigit() else 1
        found.append(Spec(process, point, lo, int(last) if last.isdigit() else lo, int(at) if at.isdigit() else 1))
    return found


def fires(process: str, point: str) -> bool:
    """Whether ``PROCSV_FAULT`` names ``process:point`` in this attempt and this is a hit it names (the
    hits of a point named for this attempt are counted)."""
    faults = read_faults()
    named = [s for s in parse(faults.spec) if (s.process, s.point, s.attempt) == (process, point, faults.attempt)]
    if not named:
        return False
    key = (process, point)
    _hits[key] = _hits.get(key, 0) + 1
    return any(s.lo <= _hits[key] <= s.hi for s in named)


def stall(process: str, point: str) -> None:
    """A stalling point: if it :func:`fires`, block until the file ``PROCSV_FAULT_GATE`` names exists
    (at most :data:`STALL_MAX` seconds), as an ``open`` or a ``read`` on a stalled network
    filesystem blocks until the stall ends."""
    if fires(process, point):
        wait_gate()


def wait_gate() -> None:
    """Block until the file ``PROCSV_FAULT_GATE`` names exists (at most :data:`STALL_MAX` seconds)."""
    gate = read_faults().gate
    deadline = time.monotonic() + STALL_MAX
    while gate and not os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.02)
