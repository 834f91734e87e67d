"""Microbenchmark: the Python a graph-mode procsv session adds to each ``sess.run``, in one process.

``.venv/bin/python scripts/bench_graph_run.py [--repeats 15] [--runs 5000]``

``bench_graph.py`` measures issue 40's cost goal end to end (steps/s of the digits MLP, procsv
against a plain ``tf.compat.v1.Session`` loop); on a machine shared with other work its figures
move by more than the few microseconds a step of procsv's Python is worth beside a 100-200 us
step. This measures that Python on its own, in-process, as the minimum over ``--repeats``
interleaved blocks of ``--runs`` runs (the minimum: what the code costs when nothing else
interferes; the Python alone is timed on this thread's CPU clock, which a process of another
engineer taking the core does not advance):

* ``procsv_python_us``: a graph-mode ``procsv.Supervisor``'s session (supervision only: no
  checkpoint or summary due, the in-memory tier off) running ``[train_op, loss]`` with a new list
  and feed dict each time, as a training loop does, with its ``tf.compat.v1.Session`` replaced by a
  stub that returns at once, minus the stub called alone: step inference, the step's bookkeeping,
  the watched loss's check, the boundary's bounds (the plans are made over the stub, which has no
  callables: the ``Session.run`` road's Python);
* ``run_us``, ``make_callable_us``, ``c_callable_us``: one real step of the digits MLP in a plain
  ``Session``: ``sess.run([train_op, loss], feed_dict)``; ``sess.make_callable([train_op, loss],
  [x, y])`` (with a feed list TensorFlow 2.21's callable builds the feed dict and calls
  ``Session.run``: the same cost, so a plain loop using it is no faster contender); the C++
  callable (``Session._make_callable_from_options``: no Python fetch or feed handling, the part of
  ``run_us`` that is TensorFlow's own Python is ``run_us - c_callable_us``).
* ``procsv_step_us``: the same real step on the procsv session (interleaved with ``run_us``'s blocks),
  which takes the C++ callable for it (:mod:`procsv.trainer.graph.fastrun`): compare with
  ``c_callable_us``;
* each real figure again as ``*_cpu_us``: this process's CPU time per step (all its threads:
  TensorFlow's too), which other processes on the machine do not advance.

The procsv session's stub is swapped in through its private ``_sess``; the step counts stay
consistent (the stub counts the steps its runs make and answers the global step's reads with
that count). Prints one line of ``key=value``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from typing import Any, Callable

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
os.environ["PROCSV_MEMORY_SNAPSHOTS"] = "0"
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from bench_graph import BATCH, Graph, build_graph, supervisor  # noqa: E402
from lockstep import TrainingClock  # noqa: E402


class StubSession:
    """Returns at once what ``Session.run`` would for the runs measured: ``[None, loss]`` for the
    list, with the global step's read beside it for a tuple ``(fetches, read)``, the step count for
    a read alone."""

    sess_str = ""

    def __init__(self, step: int) -> None:
        self.step = step
        self.loss = np.float32(0.5)

    def run(self, fetches: Any, feed_dict: Any = None, options: Any = None, run_metadata: Any = None) -> Any:
        if fetches.__class__ is tuple:
            self.step += 1
            return [None, self.loss], self.step
        if fetches.__class__ is list:
            self.step += 1
            return [None, self.loss]
        return self.step


def per_run(run: Callable[..., Any], m: Graph, feeds: list[tuple[np.ndarray, np.ndarray]], n: int,
            clock: Callable[[], float] = time.perf_counter) -> float:
    """Microseconds per ``run([train_op, loss], {x: .., y: ..})``, a new list and dict each time."""
    x, y, train_op, loss = m.x, m.y, m.train_op, m.loss
    k = len(feeds)
    t0 = clock()
    for i in range(n):
        a, b = feeds[i % k]
        run([train_op, loss], {x: a, y: b})
    return (clock() - t0) / n * 1e6


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--runs", type=int, default=5000, help="runs per block of the stub measurement")
    p.add_argument("--steps", type=int, default=500, help="real steps per block")
    args = p.parse_args()
    if args.repeats < 1 or args.runs < 1 or args.steps < 1:
        print("bench_graph_run: --repeats, --runs and --steps must be >= 1", file=sys.stderr)
        return 2

    import tensorflow as tf
    from tensorflow.core.protobuf import config_pb2

    tf.compat.v1.disable_eager_execution()
    rng = np.random.default_rng(0)
    feeds = [(rng.random((BATCH, 64), dtype=np.float32), rng.integers(0, 10, BATCH)) for _ in range(16)]
    m = build_graph()
    logdir = tempfile.mkdtemp(prefix="bench-graph-run-")
    plain = tf.compat.v1.Session(graph=m.graph)
    plain.run(m.init_op)
    sv = supervisor("procsv", m, logdir, TrainingClock())
    out: dict[str, float] = {}
    try:
        with sv.managed_session() as sess:
            # the real step: plain Session.run, make_callable, the C++ callable, procsv's session
            call = plain.make_callable([m.train_op, m.loss], [m.x, m.y])
            options = config_pb2.CallableOptions(feed=[m.x.name, m.y.name], fetch=[m.loss.name],
                                                 target=[m.train_op.name])
            fast = plain._make_callable_from_options(options)
            real: dict[str, Callable[..., Any]] = {
                "run_us": plain.run, "procsv_step_us": sess.run,
                "make_callable_us": lambda fetches, feed: call(*feed.values()),
                "c_callable_us": lambda fetches, feed: fast(*feed.values())}
            times: dict[str, list[float]] = {k: [] for k in real}
            cpu: dict[str, list[float]] = {k: [] for k in real}
            for k, run in real.items():
                per_run(run, m, feeds, 50)  # warm up
            for r in range(args.repeats):
                for k in (list(real) if r % 2 else list(reversed(real))):
                    c0 = time.process_time()
                    times[k].append(per_run(real[k], m, feeds, args.steps))
                    cpu[k].append((time.process_time() - c0) / args.steps * 1e6)
            out.update({k: min(v) for k, v in times.items()})
            out.update({k.replace("_us", "_cpu_us"): min(v) for k, v in cpu.items()})

            # procsv's Python alone: the session over a stub
            raw = sess._sess
            stub = StubSession(int(raw.run(m.global_step)))
            sess._sess = stub
            sess._plans.clear()  # plans made over the stub (no callable: Session.run's road, the stub's)
            try:
                base, over = [], []
                for _ in range(args.repeats):
                    base.append(per_run(stub.run, m, feeds, args.runs, time.thread_time))
                    over.append(per_run(sess.run, m, feeds, args.runs, time.thread_time))
            finally:
                sess._sess = raw
                sess._plans.clear()
            # the stub's steps trained nothing: the Supervisor's step back to the variable's
            step = int(raw.run(m.global_step))
            sv._state.step = step
            sv._tf1.graph.step.observe(step)
            out["procsv_python_us"] = min(over) - min(base)
            out["stub_us"] = min(base)
    finally:
        plain.close()
        shutil.rmtree(logdir, ignore_errors=True)
    print(" ".join(f"{k}={v:.2f}" for k, v in out.items()) + f" repeats={args.repeats}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
