"""Benchmark: the bare cost of supervision for a TF1 graph program, procsv's graph-mode Supervisor
against a plain ``tf.compat.v1.Session`` loop over the same graph (issue 40's cost goal).

Runs in one process (the "trainer") plus the checkpoint and summary services a plain ``python
train.py`` Supervisor starts, as ``bench_supervision.py`` does for the eager step:
``.venv/bin/python scripts/bench_graph.py [--repeats 3]``.

The digits example's MLP (``procsv.examples.digits``: 64-64-10, ReLU, Adam 1e-3, batches of 64
drawn by ``batch_indices`` from the step) as a graph program: ``tf.compat.v1.get_variable`` and
``tf.matmul``, placeholders fed with ``feed_dict``, ``AdamOptimizer.minimize(global_step=...)``,
op determinism on. Each series builds that graph once and trains it in two sessions side by
side, in short interleaved blocks (ABBA, so drift from other processes on the machine cancels out
in pairs):

* ``plain``: ``sess.run([train_op, loss], feed_dict)`` in a ``tf.compat.v1.Session`` of its own,
  no supervisor at all;
* ``procsv``: the same call on the session of ``procsv.Supervisor(graph=...).managed_session()``
  (graph mode), supervision alone: no checkpoints in the timed window (``save_model_secs`` a
  million seconds), no summaries (``summary_op=None``, ``save_summaries_secs=0``), once with
  the in-memory snapshot tier off (``PROCSV_MEMORY_SNAPSHOTS=0``: the goal's measurement) and
  once with it on (the default 0.01);
* ``procsv-session``: ``procsv`` with its callable road off (``PROCSV_GRAPH_FAST_RUN=0``): every run
  through ``Session.run``, so what supervision itself costs beside a plain loop;
* ``callable``: a plain loop through one TensorFlow C++ callable
  (``Session._make_callable_from_options``), the fastest plain loop TF 1 offers and the road
  procsv's session takes for such runs (:mod:`procsv.trainer.graph.fastrun`): its ratio bounds
  what procsv's can reach;
* ``floor``: a second plain ``Session`` whose every run also fetches the global step (one more
  fetch in the same call): the least a supervisor adds that learns of each step by fetching the
  global step with the program's own run, as procsv's graph session does (issue 40's design);
* optionally (``--contenders ...,tf``) TensorFlow's own ``tf.compat.v1.train.Supervisor`` on the
  same terms, for reference (with ``summary_writer=None``: its session is then a plain ``Session``
  and nothing of it runs during the timed window, an A/A check of the harness).

Both sessions start from the same initial values (the graph's seed) and see the same batches (by
their own step), so they must end bit-equal. As in ``bench_supervision.py`` the Supervisor's clock
(:class:`lockstep.TrainingClock`) stands still during the plain blocks, so that the step
boundary's timers fire as often per supervised step as in a loop of its own.

Throughput is steps per second; the ratio supervised / plain of each series is the median of the
per-pair ratios. Prints a table with the spread over the repeats, then one line:
``graph_supervision_ratio=<x> graph_supervision_ratio_tier=<x> step_ms_plain=<x> step_ms=<x>``
(medians over repeats; also ``graph_fetch_floor_ratio=<x>``, and ``graph_tf_supervisor_ratio=<x>``
with the ``tf`` contender). Exits 1
if a correctness check fails: the supervised global step must equal the ``sess.run`` calls made,
both sessions must start equal and end bit-equal (every global variable: weights, Adam slots,
``global_step``) with the same last loss, and with the tier on procsv must have taken in-memory
snapshots.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from bench_summary import settle  # noqa: E402  # scripts/ is this script's folder, first on sys.path
from lockstep import TrainingClock  # noqa: E402

BATCH = 64
SEED = 0
CONTENDERS = {"procsv": "procsv, supervision only (tier off)", "procsv-tier": "procsv, with the in-memory tier",
              "procsv-session": "procsv, no callable (Session.run inside)",
              "callable": "plain, through TF's C++ callable",
              "floor": "floor: plain, + the global step fetched", "tf": "TensorFlow's own Supervisor"}


@dataclass
class Graph:
    """The digits MLP as a graph: what both sessions run."""

    graph: Any
    x: Any
    y: Any
    train_op: Any
    loss: Any
    global_step: Any
    init_op: Any
    variables: list[Any]
    step_read: Any  # a read of the global step (unordered with the run's increment): what the floor fetches with each run


def build_graph() -> Graph:
    import tensorflow as tf

    g = tf.Graph()
    with g.as_default():
        tf.compat.v1.set_random_seed(SEED)
        x = tf.compat.v1.placeholder(tf.float32, [None, 64], name="x")
        y = tf.compat.v1.placeholder(tf.int64, [None], name="y")
        glorot, zeros = tf.compat.v1.glorot_uniform_initializer(), tf.compat.v1.zeros_initializer()
        w1 = tf.compat.v1.get_variable("w1", [64, 64], initializer=glorot)
        b1 = tf.compat.v1.get_variable("b1", [64], initializer=zeros)
        w2 = tf.compat.v1.get_variable("w2", [64, 10], initializer=glorot)
        b2 = tf.compat.v1.get_variable("b2", [10], initializer=zeros)
        logits = tf.matmul(tf.nn.relu(tf.matmul(x, w1) + b1), w2) + b2
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
        global_step = tf.compat.v1.train.get_or_create_global_step()
        train_op = tf.compat.v1.train.AdamOptimizer(1e-3).minimize(loss, global_step=global_step)
        init_op = tf.compat.v1.global_variables_initializer()
        variables = tf.compat.v1.global_variables()
        step_read = tf.identity(global_step.read_value(), name="step_read")
    return Graph(g, x, y, train_op, loss, global_step, init_op, variables, step_read)


class FetchingStep:
    """The floor contender's session: a plain ``Session`` whose every ``run`` also fetches the global
    step, in the same call, and returns only what was asked."""

    def __init__(self, m: Graph) -> None:
        import tensorflow as tf

        self._sess = tf.compat.v1.Session(graph=m.graph)
        self._sess.run(m.init_op)
        self._step = m.step_read

    def run(self, fetches: Any, feed_dict: Optional[dict[Any, Any]] = None) -> Any:
        return self._sess.run([fetches, self._step], feed_dict)[0]


class CallableStep:
    """The callable contender's session: a plain ``Session`` whose ``run([train_op, loss], {x:, y:})``
    goes through one TensorFlow C++ callable (``Session._make_callable_from_options``), as a
    hand-tuned TF1 loop (or Keras's TF1 backend) would: no Python feed or fetch handling per run."""

    def __init__(self, m: Graph) -> None:
        import tensorflow as tf
        from tensorflow.core.protobuf import config_pb2

        self._sess = tf.compat.v1.Session(graph=m.graph)
        self._sess.run(m.init_op)
        self._x, self._y = m.x, m.y
        self._call = self._sess._make_callable_from_options(config_pb2.CallableOptions(
            feed=[m.x.name, m.y.name], fetch=[m.loss.name], target=[m.train_op.name]))

    def run(self, fetches: Any, feed_dict: Optional[dict[Any, Any]] = None) -> Any:
        if isinstance(fetches, list) and feed_dict is not None:
            return [None, self._call(feed_dict[self._x], feed_dict[self._y])[0]]
        return self._sess.run(fetches, feed_dict)  # the checks' reads


@contextlib.contextmanager
def floor_session(m: Graph, contender: str = "floor") -> Iterator[Any]:
    sess = FetchingStep(m) if contender == "floor" else CallableStep(m)
    try:
        yield sess
    finally:
        sess._sess.close()


def supervisor(contender: str, m: Graph, logdir: str, clock: TrainingClock) -> Any:
    """The supervised side's Supervisor: checkpoints and summaries out of the timed window."""
    import tensorflow as tf

    if contender == "tf":
        # summary_writer=None: with save_summaries_secs=0 TF's step-counter thread would spin without a pause
        return tf.compat.v1.train.Supervisor(graph=m.graph, logdir=logdir, init_op=m.init_op, summary_op=None,
                                             summary_writer=None, save_model_secs=10**6, save_summaries_secs=0)
    import procsv

    return procsv.Supervisor(graph=m.graph, logdir=logdir, init_op=m.init_op, summary_op=None,
                             save_model_secs=10**6, save_summaries_secs=0, clock=clock)


def snapshots_taken(sv: Any) -> Optional[int]:
    """In-memory snapshots procsv's Supervisor took (None: it does not say)."""
    keeper = getattr(sv, "_keeper", None)
    taken = keeper.agent.memory_taken if keeper is not None else None
    return int(taken) if taken is not None else None


def series(tmp: str, contender: str, blocks: int, block_steps: int, data: tuple[np.ndarray, np.ndarray]) -> dict[str, Any]:
    """One ABBA series of plain and supervised blocks; returns the medians, the paired ratio and checks."""
    import tensorflow as tf

    from procsv.examples.digits import batch_indices

    x_train, y_train = data
    os.environ["PROCSV_MEMORY_SNAPSHOTS"] = "0.01" if contender == "procsv-tier" else "0"
    os.environ["PROCSV_GRAPH_FAST_RUN"] = "0" if contender == "procsv-session" else "1"
    logdir = tempfile.mkdtemp(dir=tmp)
    m = build_graph()
    clock = TrainingClock()  # stands still during the plain blocks
    plain = tf.compat.v1.Session(graph=m.graph)
    plain.run(m.init_op)
    per: dict[bool, list[float]] = {True: [], False: []}
    steps = {True: 0, False: 0}
    last_loss: dict[bool, float] = {}
    sv = supervisor(contender, m, logdir, clock) if contender not in ("floor", "callable") else None
    try:
        with (sv.managed_session() if sv is not None else floor_session(m, contender)) as sess:
            settle()
            start = int(sess.run(m.global_step))
            same_start = all(np.array_equal(a, b) for a, b in zip(plain.run(m.variables), sess.run(m.variables)))
            sessions = {True: sess, False: plain}

            def block(supervised: bool) -> float:
                run: Callable[..., Any] = sessions[supervised].run
                if not supervised:
                    clock.pause()
                t0 = time.perf_counter()
                for _ in range(block_steps):
                    steps[supervised] += 1
                    idx = batch_indices(SEED, steps[supervised], len(x_train), BATCH)
                    _, last_loss[supervised] = run([m.train_op, m.loss], {m.x: x_train[idx], m.y: y_train[idx]})
                secs = time.perf_counter() - t0
                clock.resume()
                return secs / block_steps

            block(True), block(False)  # warm up both sessions (their first runs prune and place the graph)
            for k in range(blocks):
                for supervised in ((True, False) if k % 2 else (False, True)):
                    per[supervised].append(block(supervised))
            advanced = int(sess.run(m.global_step)) - start
            same_end = all(np.array_equal(a, b) for a, b in zip(plain.run(m.variables), sess.run(m.variables)))
            taken = snapshots_taken(sv) if contender == "procsv-tier" else None
    finally:
        plain.close()
        shutil.rmtree(logdir, ignore_errors=True)
    ratios = [p / s for p, s in zip(per[False], per[True])]  # throughput supervised / plain, per pair
    return {"plain": statistics.median(per[False]), "supervised": statistics.median(per[True]),
            "ratio": statistics.median(ratios), "runs": steps[True], "advanced": advanced, "taken": taken,
            "same_start": same_start, "same_end": same_end and last_loss[True] == last_loss[False]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3, help="series per contender (>= 3 for quoted figures)")
    p.add_argument("--blocks", type=int, default=300, help="ABBA block pairs per series")
    p.add_argument("--block-steps", type=int, default=50)
    p.add_argument("--contenders", default="procsv,procsv-session,callable,procsv-tier,floor",
                   help=f"comma-separated, of {', '.join(CONTENDERS)} (tf: TensorFlow's own Supervisor, for reference)")
    args = p.parse_args()
    contenders = [c for c in args.contenders.split(",") if c]
    unknown = [c for c in contenders if c not in CONTENDERS]
    if unknown or not contenders:
        print(f"bench_graph: unknown contender(s) {unknown or '(none given)'}; choose from {', '.join(CONTENDERS)}",
              file=sys.stderr)
        return 2

    import tensorflow as tf

    from procsv.examples.digits import load_data

    tf.compat.v1.disable_eager_execution()
    tf.config.experimental.enable_op_determinism()
    x_train, y_train, _, _ = load_data(SEED)
    tmp = tempfile.mkdtemp(prefix="bench-graph-")
    results: dict[str, list[dict[str, Any]]] = {c: [] for c in contenders}
    try:
        for _ in range(args.repeats):
            for c in contenders:
                results[c].append(series(tmp, c, args.blocks, args.block_steps, (x_train, y_train)))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    ok = True
    for c, rs in results.items():
        for r in rs:
            problems = []
            if r["advanced"] != r["runs"]:
                problems.append(f"the global step advanced {r['advanced']} for {r['runs']} sess.run calls")
            if not r["same_start"]:
                problems.append("the two sessions started from different variables")
            if not r["same_end"]:
                problems.append("the two sessions ended with different variables or last loss after the same steps")
            if c == "procsv-tier" and not r["taken"]:
                problems.append(f"the in-memory tier was on and took no snapshot (taken: {r['taken']})")
            for problem in problems:
                print(f"FAILED ({c}): {problem}", file=sys.stderr)
                ok = False

    def med(c: str, key: str) -> float:
        return float(statistics.median(r[key] for r in results[c]))

    def spread(c: str, key: str) -> str:
        vals = [r[key] for r in results[c]]
        return f"{min(vals):.4f}-{max(vals):.4f}"

    print(f"{'digits MLP graph, no summaries, no checkpoints':<44}{'plain Session':>16}{'supervised':>14}"
          f"{'throughput ratio':>18}   spread over {args.repeats} repeats (ratio)")
    for c in contenders:
        print(f"{CONTENDERS[c]:<44}{med(c, 'plain') * 1e3:>13.3f} ms{med(c, 'supervised') * 1e3:>11.3f} ms"
              f"{med(c, 'ratio'):>18.4f}   {spread(c, 'ratio')}")
    if "procsv-tier" in results:
        print(f"snapshots taken with the tier: {', '.join(str(r['taken']) for r in results['procsv-tier'])}")
    print("goal: throughput ratio >= 0.98 (procsv, supervision only)")
    keys = {"procsv": "graph_supervision_ratio", "procsv-tier": "graph_supervision_ratio_tier",
            "procsv-session": "graph_session_run_ratio", "callable": "graph_callable_ratio",
            "floor": "graph_fetch_floor_ratio", "tf": "graph_tf_supervisor_ratio"}
    first = contenders[0]
    print(" ".join([f"{keys[c]}={med(c, 'ratio'):.4f}" for c in contenders]
                   + [f"step_ms_plain={med(first, 'plain') * 1e3:.3f}", f"step_ms={med(first, 'supervised') * 1e3:.3f}",
                      f"repeats={args.repeats}", f"verified={int(ok)}"]))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
