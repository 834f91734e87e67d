"""Fault injection points for tests: the one parser of ``PROCSV_FAULT``.

Runs in whichever process reaches a point (the watchdog, the trainer, the checkpoint service);
each process counts its own hits. ``PROCSV_FAULT`` is ``<process>:<point>[:<n>[-<m>]]``: the point
fires the n-th time that process reaches it (default the first), or every time from the n-th to
the m-th, and only in the process's first attempt, so that its restart runs normally. What a firing point does (die, hang, raise) is the
caller's: this module only says whether it fires. Never set outside tests. The variables are read
through :func:`procsv.common.bootstrap.read_faults` at each point (a test may set them in-process).
"""

from __future__ import annotations

import os
import time

from procsv.common.bootstrap import read_faults

STALL_MAX = 120.0  # seconds a stalling point blocks at most when its gate never opens

_hits: dict[tuple[str, str], int] = {}


def fires(process: str, point: str) -> bool:
    """Whether ``PROCSV_FAULT`` names ``process:point`` and this is the hit it names (counted)."""
    faults = read_faults()
    spec = faults.spec
    if not spec.startswith(f"{process}:") or not faults.first_attempt:
        return False
    name, _, nth = spec[len(process) + 1:].partition(":")
    if name != point:
        return False
    key = (process, point)
    _hits[key] = _hits.get(key, 0) + 1
    first, _, last = nth.partition("-")
    lo = int(first) if first.isdigit() else 1
    hi = int(last) if last.isdigit() else lo
    return lo <= _hits[key] <= hi


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
