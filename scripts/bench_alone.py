"""The tail every ``bench_group_*.py`` part shares when it runs alone (``python scripts/bench_group_X.py``):
a fresh folder for its runs, the load average around them, its table and its one line of figures.

Run by the benchmark's own process (imported from its folder, first on ``sys.path``); the parts
``bench_group.py`` runs beside its own measures call ``measure`` and ``report`` themselves.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from typing import Callable, TypeVar

from bench_group import BenchError

T = TypeVar("T")


def run_alone(name: str, measure: Callable[[str], T], report: Callable[[T], str]) -> int:
    """``measure(root)`` in a fresh folder under /tmp (removed after), then ``report``'s table, the load
    average at the start and the end, and ``report``'s line; 1 (saying why) if the measure failed."""
    root = tempfile.mkdtemp(prefix=f"{name}-", dir="/tmp")
    load = [os.getloadavg()[0]]
    t0 = time.monotonic()
    try:
        out = measure(root)
    except (BenchError, OSError) as e:
        print(f"{name}: FAILED: {e}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(root, ignore_errors=True)
    load.append(os.getloadavg()[0])
    line = report(out)
    print(f"load average (1 min): at the start {load[0]:.1f}, at the end {load[1]:.1f}; {time.monotonic() - t0:.0f} s")
    print(line)
    return 0
