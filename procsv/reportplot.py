"""``procsv report DIR --plot out.png``: the run's timeline as a picture, drawn with matplotlib.

Runs in the user's shell (the CLI), never in a process of the run. matplotlib is the optional
extra ``procsv[plot]``; without it :func:`draw` raises a :class:`~procsv.common.errors.UsageError`
that says how to install it. It uses the Agg backend (no display needed) and draws: the global
step over wall time since the launch (the watchdog's downsampled ``series``), each restart as a
vertical line labelled with its cause, each committed checkpoint as a tick on the curve, each step
skipped as non-finite (issue 41) as a cross at its step, and the goodput in the title; below it, where
the time went (:mod:`procsv.goodput`): a stacked bar per launch of the logdir, and one of all of them.
The picture is :data:`WIDTH` x :data:`HEIGHT` pixels.
"""

from __future__ import annotations

import os
from typing import Any

from procsv.common.errors import UsageError
from procsv.goodput import KINDS
from procsv.report import RunReport, plain_restarts

WIDTH, HEIGHT, DPI = 1200, 500, 100
COLORS = {"productive": "#2ca02c", "startup": "#9467bd", "restoring": "#8c564b", "checkpoint": "#17becf",
          "redone": "#ff7f0e", "restart": "#e377c2", "stopped": "#7f7f7f", "unaccounted": "#bcbd22"}
INSTALL_HINT = "pip install 'procsv[plot]'"


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise UsageError(f"--plot needs matplotlib, which is not installed: {INSTALL_HINT}") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def time_unit(span_secs: float) -> tuple[float, str]:
    """Divisor and name of the x axis' unit for a launch of ``span_secs``."""
    if span_secs < 180:
        return 1.0, "s"
    if span_secs < 3 * 3600:
        return 60.0, "min"
    return 3600.0, "h"


def segments(series: list[tuple[float, int]]) -> list[list[tuple[float, int]]]:
    """``series`` cut before each point whose step is lower than the one before (a restart resumed
    from an older checkpoint), so no line joins two attempts."""
    out: list[list[tuple[float, int]]] = []
    for point in series:
        if not out or point[1] < out[-1][-1][1]:
            out.append([])
        out[-1].append(point)
    return out


def draw(rep: RunReport, path: str) -> None:
    """Write the timeline of ``rep`` to the PNG file ``path`` (replaced atomically)."""
    plt = _pyplot()
    times = [t for t, _ in rep.series] + [t for t, _ in rep.checkpoints] + [r.at for r in rep.restarts]
    t0 = rep.started_at if rep.started_at is not None else min(times, default=0.0)
    skipped = [(t, s) for t, s in rep.skipped if t >= t0]  # an earlier launch's skips: before this timeline
    times += [t for t, _ in skipped]
    t_end = max([*times, rep.ended_at or t0, t0])
    div, unit = time_unit(t_end - t0)

    fig = plt.figure(figsize=(WIDTH / DPI, HEIGHT / DPI), dpi=DPI)
    try:
        bars = [(f"launch {n}", b) for n, b in rep.launches]
        if rep.lifetime is not None and len(bars) > 1:
            bars.append(("all", rep.lifetime))
        ax = fig.add_axes((0.07, 0.42 if bars else 0.12, 0.91, 0.49 if bars else 0.79))
        if bars:
            _time_bars(fig.add_axes((0.07, 0.1, 0.91, 0.16)), bars)
        for i, seg in enumerate(segments(rep.series)):  # one per trainer attempt: the gaps are the recoveries
            ax.plot([(t - t0) / div for t, _ in seg], [s for _, s in seg], color="#1f77b4", linewidth=1.5,
                    marker="." if len(seg) == 1 else None, label="global step" if i == 0 else None)
        if rep.checkpoints:
            ax.plot([(t - t0) / div for t, _ in rep.checkpoints], [s for _, s in rep.checkpoints], linestyle="none",
                    marker="|", markersize=12, markeredgewidth=1.5, color="#2ca02c",
                    label=f"checkpoint committed ({len(rep.checkpoints)})")
        if skipped:
            ax.plot([(t - t0) / div for t, _ in skipped], [s for _, s in skipped], linestyle="none",
                    marker="x", markersize=9, markeredgewidth=2, color="#ff7f0e",
                    label=f"step skipped, non-finite ({len(skipped)})")
        top = max([s for _, s in rep.series] + [s for _, s in rep.checkpoints] + [rep.step, 1])
        for i, r in enumerate(rep.restarts):
            x = (r.at - t0) / div
            ax.axvline(x, color="#d62728", linestyle="--", linewidth=1.2,
                       label="restart (cause)" if i == 0 else None)
            ax.annotate(r.label, xy=(x, top), xytext=(3, -4), textcoords="offset points", rotation=90,
                        va="top", ha="left", fontsize=9, color="#d62728")
        ax.set_xlim(0, max((t_end - t0) / div, 1e-9))
        ax.set_ylim(0, top * 1.05)
        ax.set_xlabel(f"wall time since launch ({unit})")
        ax.set_ylabel("global step")
        good = "-" if rep.goodput is None else f"{rep.goodput:.1%}"
        ax.set_title(f"procsv: {os.path.basename(rep.logdir.rstrip('/'))} -- {rep.state}, step {rep.step}, "
                     f"{len(plain_restarts(rep.restarts))} restart(s), goodput {good}")
        ax.grid(True, alpha=0.3)
        if rep.series or rep.checkpoints or rep.restarts or rep.skipped:
            ax.legend(loc="lower right")
        tmp = f"{path}.tmp-{os.getpid()}.png"
        fig.savefig(tmp, dpi=DPI, format="png")
        os.replace(tmp, path)
    finally:
        plt.close(fig)


def _time_bars(ax: Any, bars: list[tuple[str, Any]]) -> None:
    """Where the time went: one horizontal bar per launch (and all of them), stacked by kind, in
    shares of its wall time."""
    for row, (label, spent) in enumerate(bars):
        left = 0.0
        for kind in KINDS:
            share = spent.secs[kind] / spent.wall if spent.wall > 0 else 0.0
            ax.barh(row, share, left=left, color=COLORS[kind], label=kind if row == 0 else None, height=0.7)
            left += share
    ax.set_yticks(range(len(bars)), [label for label, _ in bars], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, 1)
    ax.set_xlabel("share of the wall time (where the time went)", fontsize=8)
    ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.02), ncol=len(KINDS), fontsize=8, frameon=False)
