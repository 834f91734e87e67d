"""Benchmark: what procsv's in-graph summary write costs the digits step, beside its floor.

Runs in one process, without a Supervisor and without the summary service: only the graph side of
logging inside a ``tf.function`` (:mod:`procsv.trainer.summaries.graph_rings`), which
``scripts/bench_summary.py`` (c) measures together with the hand-off and the rest of a supervised
step, on a machine whose speed drifts by several percent within a second. Here the digits model's
step (the ten values of ``bench_summary`` (c)) runs in blocks of 50 steps, one block of each kind
in turn, the order rotated every round (300 rounds by default), and each kind's figure is the
median over rounds of its block's time against the "off" block of the same round:

- ``off``: the step, returning the ten values;
- ``ring``: the same step logging the ten with ``GraphRings.log`` (procsv's ring write: a counter and
  three scatters, the last the row's completion mark), drained every 20 rounds, outside the timing;
- ``floor``: the same step with the ten stacked into one tensor and assigned to a variable: one
  ``Pack`` and one ``AssignVariableOp``, the least an in-graph logger adds (the values must reach
  state that outlives the call);
- ``stack``: the ten stacked and returned as one more output (no state written).

Prints a table and the line ``ring=<x> floor=<x> stack=<x> ring_above_floor=<x> rounds=<n>
verified=<0|1>`` (fractions of the step). Exits 1 if the rings did not hand back exactly one row
per logged step with none lost. Usage: ``python scripts/bench_graph_ring.py [--rounds N]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any, Callable

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

BLOCK = 50  # steps a block


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=300, help="rounds of one block of each kind (default 300)")
    args = p.parse_args()

    import tensorflow as tf

    from bench_summary import ten_values_step  # scripts/ is this script's folder, first on sys.path
    from procsv.examples.digits import batch_indices, build_model, load_data
    from procsv.trainer.summaries.graph_rings import GraphRings

    x_train, y_train, _, _ = load_data(0)
    model, optimizer, loss_fn = build_model()
    rings = GraphRings()  # its own rings, not the process's

    metrics_of = ten_values_step(model, optimizer, loss_fn)  # bench_summary (c)'s ten values

    sink = tf.Variable(tf.zeros([10]), trainable=False)

    @tf.function  # type: ignore[untyped-decorator]  # TensorFlow ships no type information
    def off(x: Any, y: Any) -> dict[str, Any]:
        return metrics_of(x, y)

    @tf.function  # type: ignore[untyped-decorator]
    def ring(x: Any, y: Any) -> dict[str, Any]:
        m = metrics_of(x, y)
        rings.log({f"g/{k}": v for k, v in m.items()}, step=optimizer.iterations)
        return m

    @tf.function  # type: ignore[untyped-decorator]
    def floor(x: Any, y: Any) -> dict[str, Any]:
        m = metrics_of(x, y)
        sink.assign(tf.stack(list(m.values())))
        return m

    @tf.function  # type: ignore[untyped-decorator]
    def stack(x: Any, y: Any) -> dict[str, Any]:
        m = metrics_of(x, y)
        return {**m, "_row": tf.stack(list(m.values()))}

    kinds: dict[str, Callable[[Any, Any], Any]] = {"off": off, "ring": ring, "floor": floor, "stack": stack}
    batches = [(x_train[i], y_train[i]) for i in (batch_indices(0, s, len(x_train), 64) for s in range(1, BLOCK + 1))]
    logged = rows = lost = 0

    def block(kind: str) -> float:
        nonlocal logged
        fn = kinds[kind]
        t0 = time.perf_counter()
        for x, y in batches:
            fn(x, y)
        if kind == "ring":
            logged += BLOCK
        return time.perf_counter() - t0

    def drain() -> None:
        nonlocal rows, lost
        got = rings.drain()
        rows += len(got.steps)
        lost += got.lost

    for kind in kinds:  # trace and warm up
        block(kind)
        block(kind)
    per: dict[str, list[float]] = {k: [] for k in kinds}
    names = list(kinds)
    for r in range(args.rounds):
        for kind in names[r % len(names):] + names[:r % len(names)]:
            per[kind].append(block(kind))
        if r % 20 == 19:  # outside the timed blocks: 1000 rows, well within a ring's CAPACITY (4096)
            drain()
    drain()
    rel = {k: [a / b - 1 for a, b in zip(per[k], per["off"])] for k in kinds if k != "off"}
    verified = rows == logged * 10 and lost == 0
    step_us = statistics.median(per["off"]) / BLOCK * 1e6
    print(f"digits step {step_us:.1f} us; {args.rounds} rounds of {BLOCK}-step blocks, the order rotated each round")
    print(f"{'kind':8s} {'overhead':>9s} {'spread (quartiles)':>22s}")
    for kind, values in rel.items():
        q = statistics.quantiles(values, n=4)
        print(f"{kind:8s} {statistics.median(values) * 100:+8.2f}% {q[0] * 100:+9.2f}%..{q[2] * 100:+.2f}%")
    print(f"ring rows collected: {rows} of {logged * 10} (values of {logged} steps), lost {lost}: "
          f"{'ok' if verified else 'NOT OK'}")
    med = {k: statistics.median(v) for k, v in rel.items()}
    print(f"ring={med['ring']:.4f} floor={med['floor']:.4f} stack={med['stack']:.4f} "
          f"ring_above_floor={med['ring'] - med['floor']:.4f} rounds={args.rounds} verified={int(verified)}")
    return 0 if verified else 1


if __name__ == "__main__":
    sys.exit(main())
