"""Per-call cost of rendering histogram and text summaries: procsv's render vs TensorBoard's ``*_pb``.

``.venv/bin/python scripts/bench_render.py [--runs 7]``. Runs in one process, no TensorFlow. For
a histogram of 1,000 / 100,000 / 1,000,000 normal values (30 buckets) and a short text, it times
``procsv.services.summary.render.render`` against TensorBoard's ``histogram_pb`` / ``text_pb``
(plus ``SerializeToString``) on the same input, checks that both give the same bytes, and prints
the median, min and max per call over ``--runs`` runs (each run repeats the call for >= 0.2 s).
This measurement is why render.py keeps its own histogram buckets and uses ``text_pb``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import timeit
from typing import Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
from tensorboard.plugins.histogram.summary_v2 import histogram_pb  # noqa: E402
from tensorboard.plugins.text.summary_v2 import text_pb  # noqa: E402

from procsv.ipc.messages import SummaryItem  # noqa: E402
from procsv.services.summary.render import render  # noqa: E402


def per_call(fn: Callable[[], object], runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        timer = timeit.Timer(fn)
        n, _ = timer.autorange()
        out.append(timer.timeit(n) / n)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    cases: list[tuple[str, Callable[[], bytes], Callable[[], bytes]]] = []
    for n in (1_000, 100_000, 1_000_000):
        values = rng.normal(size=n)
        item = SummaryItem("histogram", "h", 1, 0.0, "float64", [n], buckets=30)
        frame = values.tobytes()
        cases.append((f"histogram, {n:,} values",
                      lambda item=item, frame=frame: render(item, frame),
                      lambda values=values: histogram_pb("h", values, buckets=30).SerializeToString()))
    strings = ["step 1000: loss 0.25, accuracy 0.93"]
    text_item = SummaryItem("text", "t", 1, 0.0, "json", [1])
    text_frame = json.dumps(strings).encode()
    cases.append(("text, one short string", lambda: render(text_item, text_frame),
                  lambda: text_pb("t", np.array(strings, dtype=object)).SerializeToString()))
    print(f"{'case':<28} {'procsv median':>14} {'TensorBoard median':>19} {'ratio':>6}   (min-max, {args.runs} runs)")
    for name, ours, theirs in cases:
        if ours() != theirs():
            raise SystemExit(f"{name}: procsv and TensorBoard give different bytes")
        a, b = per_call(ours, args.runs), per_call(theirs, args.runs)
        ma, mb = statistics.median(a), statistics.median(b)
        print(f"{name:<28} {ma * 1e6:>11.1f} us {mb * 1e6:>16.1f} us {mb / ma:>6.1f}   "
              f"({min(a) * 1e6:.1f}-{max(a) * 1e6:.1f} vs {min(b) * 1e6:.1f}-{max(b) * 1e6:.1f} us)")


if __name__ == "__main__":
    main()
