"""A benchmark's results table: the cell for a figure measured over several repeats.

Used by ``bench_group.py``, ``bench_ps.py``, ``bench_summary.py`` and ``bench_summary_outage.py`` (each imports it from its own folder, first on
``sys.path`` when the script runs). A cell is the repeats' median, then their spread, so that a
reader sees at once how much a figure moved from one repeat to the next on a noisy machine.
"""

from __future__ import annotations

import statistics


def median_spread(values: list[float], fmt: str = ".3f", sep: str = "-") -> str:
    """``median (min<sep>max)`` of ``values``, each in ``fmt``: ``0.324 (0.301-0.355)``."""
    return f"{statistics.median(values):{fmt}} ({min(values):{fmt}}{sep}{max(values):{fmt}})"


def span(values: list[float], fmt: str) -> str:
    """``min to max`` of ``values``, each in ``fmt``: the spread a table's note quotes."""
    return f"{format(min(values), fmt)} to {format(max(values), fmt)}"
