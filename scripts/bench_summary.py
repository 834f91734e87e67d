"""Benchmark of procsv's summary path, side by side with TensorFlow/TensorBoard, in one run.

Runs in one process (the "trainer") plus the summary service processes it starts:

  (a) trainer-side cost per logged scalar: a real ``procsv.Supervisor`` (its ``log_scalars`` plus
      the hand-off at step boundaries) vs eager ``tf.summary.scalar`` under a default file writer;
  (b) end-to-end throughput into event files: the trainer-side buffer and sender against a real
      summary service, from the first scalar logged to the last one acknowledged as written, then
      verified by reading the files back with TensorBoard's ``EventAccumulator``; TensorBoard's own
      ``EventFileWriter`` (one ``simple_value`` event per scalar) as the baseline. The logging loop
      here outruns the service (~1.5 M scalars/s), and a trainer's buffer drops its oldest
      scalars beyond 100,000 rather than wait; so this loop waits instead whenever the buffer is
      full (the time is part of the measurement), and any drop fails the verification: the
      number is a sustained rate with every scalar written;
  (c) step-time overhead of logging 10 scalars every step on the digits example's model: blocks
      of 1000 steps with logging on, off, and with the same ten values only read with
      ``Tensor.numpy()`` (the floor any logger of eager values pays: ``read_floor``), interleaved
      in alternating order (ABC CBA); the overhead is the median of the per-round ratios to the
      block without logging, so drift from other processes on the machine cancels out (the ratio
      of the two overall medians is printed beside it). Each block ends with the hand-off of what
      it logged, inside its own timing: part of logging's cost is paid at the hand-off, every
      0.1 s, and in blocks shorter than that (50 steps, before) it fell as often into a block
      without logging, which hid about half of it. A fourth kind of block runs the same step with
      the ten values logged inside its ``tf.function`` (``sv.log_scalars(..., step=
      optimizer.iterations)``: written by the graph into ring-buffer variables, read at the
      hand-off): ``graph_overhead``; its check is that every row the graph wrote was collected
      and none dropped. A fifth kind is that logging's floor, without procsv: the same step with
      the ten values stacked into one tensor and assigned to a variable in the graph (one
      ``Pack`` and one ``AssignVariableOp``, the least an in-graph logger adds: the values must
      reach state that outlives the call): ``graph_floor``.

Runs (a), (b) and (c) ``--repeats`` times (default 3) and prints a table of medians with the
spread (min to max), then the line ``cost_ratio=<x> throughput_per_s=<x> step_overhead=<x>
step_overhead_min=<x> step_overhead_max=<x> read_floor=<x> above_floor=<x> graph_overhead=<x>
graph_floor=<x> repeats=<n> verified=<0|1>`` (medians).
Exits 1 if a verification failed in any run (a scalar of (b) not confirmed, dropped, or not read
back exactly; a row of (c)'s in-graph logging not collected, or any dropped). Usage: ``python scripts/bench_summary.py [--quick] [--repeats N]``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import psutil  # noqa: E402
import zmq  # noqa: E402

from procsv.ipc.transport import Endpoints, make_socket, send  # noqa: E402
from procsv.common import spawn  # noqa: E402
from procsv.common.layout import Layout, read_json  # noqa: E402
from procsv.trainer.channels import read_summary_acks  # noqa: E402
from procsv.trainer.summaries import SummaryBuffer, SummarySender  # noqa: E402
from results_table import span  # noqa: E402  # scripts/ is this script's folder, first on sys.path

TAGS10 = [f"metric/{i}" for i in range(10)]


def settle(max_secs: float = 20.0) -> None:
    """Wait until this process's children are idle (the checkpoint service imports TensorFlow)."""
    deadline = time.monotonic() + max_secs
    kids = psutil.Process().children(recursive=True)
    while time.monotonic() < deadline:
        busy = sum(p.cpu_percent(interval=0.3) for p in kids if p.is_running())
        if busy < 10:
            return


def wrap_timer(obj: Any, name: str, acc: list[float]) -> None:
    """Accumulate the time spent in ``obj.name`` into ``acc[0]``."""
    inner: Callable[..., Any] = getattr(obj, name)

    def timed(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            acc[0] += time.perf_counter() - t0

    setattr(obj, name, timed)


# ----------------------------------------------------------------------------- (a)
def cost_per_scalar(tmp: str, steps: int) -> dict[str, float]:
    import tensorflow as tf

    import procsv

    values = {t: tf.constant(float(i)) for i, t in enumerate(TAGS10)}  # eager scalars, as a step returns them
    floats = {t: float(i) for i, t in enumerate(TAGS10)}
    writer = tf.summary.create_file_writer(os.path.join(tmp, "tf-a"))
    with writer.as_default():
        for i in range(50):
            tf.summary.scalar("warm", 1.0, step=i)
        n_tf = max(200, steps // 10)
        t0 = time.perf_counter()
        for i in range(n_tf // 10):
            for t, v in values.items():
                tf.summary.scalar(t, v, step=i)
        tf_tensor = (time.perf_counter() - t0) / n_tf
        t0 = time.perf_counter()
        for i in range(n_tf // 10):
            for t, v in floats.items():
                tf.summary.scalar(t, v, step=i)
        tf_float = (time.perf_counter() - t0) / n_tf
        writer.flush()

    sv = procsv.Supervisor(logdir=os.path.join(tmp, "a"), checkpoint=None, save_summaries_secs=10)
    out: dict[str, float] = {"tf_tensor": tf_tensor, "tf_float": tf_float}
    with sv.managed_session() as sess:
        settle()
        sess.run(lambda: None)
        handoff = [0.0]
        wrap_timer(sv._summaries.sender, "at_boundary", handoff)
        for name, vals in (("procsv_tensor", values), ("procsv_float", floats)):
            handoff[0] = 0.0
            spent = 0.0
            for _ in range(steps):
                sess.run(lambda: None)
                t0 = time.perf_counter()
                sv.log_scalars(vals)
                spent += time.perf_counter() - t0
            out[name] = (spent + handoff[0]) / (steps * len(vals))
    return out


# ----------------------------------------------------------------------------- (b)
def start_service(logdir: str, runtime: str) -> "subprocess.Popen[bytes]":
    env = spawn.child_env(role="summary", attempt=1, logdir=logdir, runtime_dir=runtime, supervised=False)
    proc = spawn.spawn(spawn.service_argv("summary"), env, os.path.join(logdir, "logs", "summary.1.log"))
    deadline = time.monotonic() + 30
    while (read_json(Layout(logdir).summary_stats) or {}).get("pid") != proc.pid:  # written once it is up
        if time.monotonic() > deadline or proc.poll() is not None:
            raise RuntimeError("the summary service did not start")
        time.sleep(0.05)
    return proc


def read_back(logdir: str) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing import event_accumulator as ea

    acc = ea.EventAccumulator(logdir, size_guidance={ea.SCALARS: 0})
    acc.Reload()
    return {t: [(e.step, e.value) for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]}


def throughput(tmp: str, steps: int) -> dict[str, float]:
    logdir, runtime = os.path.join(tmp, "b"), os.path.join(tmp, "b-rt")
    Layout(logdir).create()
    os.makedirs(runtime, mode=0o700)
    service = start_service(logdir, runtime)
    zctx = zmq.Context()
    push = make_socket(zctx, zmq.DEALER, sndhwm=256, linger_ms=3000)  # as TrainerChannels
    push.connect(Endpoints(runtime).summary)
    buf = SummaryBuffer()
    sender = SummarySender(buf, lambda m, f: send(push, m, f), lambda t: read_summary_acks(push, t))
    row = {t: 0.0 for t in TAGS10}
    waited = 0.0
    t0 = time.perf_counter()
    for step in range(1, steps + 1):
        for i, t in enumerate(TAGS10):
            row[t] = step + i / 10
        buf.scalars(row, step, time.time())
        sender.at_boundary(step)
        if buf.room() < len(TAGS10):  # the next step would make the buffer drop: wait for the service
            w0 = time.perf_counter()
            while buf.room() < len(TAGS10):
                time.sleep(0.0005)
                sender.at_boundary(step)
            waited += time.perf_counter() - w0
    left = sender.close(steps, timeout=120)
    elapsed = time.perf_counter() - t0
    dropped = buf.dropped_total
    service.terminate()
    service.wait(timeout=30)
    push.close()
    zctx.term()
    got = read_back(logdir)
    expected = {t: [(s, float(np.float32(s + i / 10))) for s in range(1, steps + 1)] for i, t in enumerate(TAGS10)}
    bad = [t for t in TAGS10 if got.get(t) != expected[t]]
    ok = left == 0 and dropped == 0 and not bad
    if not ok:
        print(f"(b) verification failed: {left} scalars unconfirmed, {dropped} dropped by the full buffer "
              f"(never sent, so never acknowledged); tags differing: "
              f"{[(t, len(got.get(t, [])), next(((g, e) for g, e in zip(got.get(t, []), expected[t]) if g != e), None)) for t in bad[:2]]}",
              file=sys.stderr)
    n = steps * len(TAGS10)

    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    base_dir = os.path.join(tmp, "b-tb")
    n_base = max(1000, n // 5)
    w = EventFileWriter(base_dir, max_queue_size=10000, flush_secs=120)
    t0 = time.perf_counter()
    for k in range(n_base):
        summ = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=TAGS10[k % 10], simple_value=float(k))])
        w.add_event(event_pb2.Event(wall_time=time.time(), step=k // 10 + 1, summary=summ))
    w.close()
    base_elapsed = time.perf_counter() - t0
    base_count = sum(len(v) for v in read_back(base_dir).values())
    base_ok = base_count == n_base
    if not base_ok:
        print(f"(b) baseline verification failed: {base_count} of {n_base} scalars read back", file=sys.stderr)
    return {"procsv": n / elapsed, "procsv_ok": float(ok), "n": n, "waited": waited, "dropped": float(dropped),
            "tb": n_base / base_elapsed,
            "tb_ok": float(base_ok), "n_tb": n_base}


# ----------------------------------------------------------------------------- (c)
def ten_values_step(model: Any, optimizer: Any, loss_fn: Any) -> Callable[[Any, Any], dict[str, Any]]:
    """(c)'s training step of the digits model, returning the ten values it logs (also
    ``bench_graph_ring.py``'s): loss, accuracy, two of the logits, four gradient norms, the global
    norm and the learning rate."""
    import tensorflow as tf

    def metrics_of(x: Any, y: Any) -> dict[str, Any]:
        with tf.GradientTape() as tape:
            logits = model(x, training=True)
            loss = loss_fn(y, logits)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        acc = tf.reduce_mean(tf.cast(tf.equal(tf.argmax(logits, axis=1), y), tf.float32))
        norms = [tf.norm(g) for g in grads]  # 4 gradient norms
        return {"loss": loss, "accuracy": acc, "logits/mean": tf.reduce_mean(logits),
                "logits/max": tf.reduce_max(logits), "grad/norm0": norms[0], "grad/norm1": norms[1],
                "grad/norm2": norms[2], "grad/norm3": norms[3], "grad/global": tf.linalg.global_norm(grads),
                "lr": tf.constant(1e-3)}

    return metrics_of


def step_overhead(tmp: str, blocks: int, block_steps: int) -> dict[str, float]:
    import tensorflow as tf

    import procsv
    from procsv.examples.digits import batch_indices, build_model, load_data

    x_train, y_train, _, _ = load_data(0)
    model, optimizer, loss_fn = build_model()

    metrics_of = ten_values_step(model, optimizer, loss_fn)

    @tf.function  # type: ignore[untyped-decorator]  # TensorFlow ships no type information
    def train_step(x: tf.Tensor, y: tf.Tensor) -> dict[str, tf.Tensor]:
        return metrics_of(x, y)

    @tf.function  # type: ignore[untyped-decorator]  # TensorFlow ships no type information
    def train_step_logging(x: tf.Tensor, y: tf.Tensor) -> dict[str, tf.Tensor]:  # the same, logging in the graph
        metrics = metrics_of(x, y)
        sv.log_scalars({f"graph/{k}": v for k, v in metrics.items()}, step=optimizer.iterations)
        return metrics

    sink = tf.Variable(tf.zeros([10]), trainable=False)  # the floor's state (no procsv)

    @tf.function  # type: ignore[untyped-decorator]  # TensorFlow ships no type information
    def train_step_floor(x: tf.Tensor, y: tf.Tensor) -> dict[str, tf.Tensor]:  # the floor of in-graph logging
        metrics = metrics_of(x, y)
        sink.assign(tf.stack(list(metrics.values())))
        return metrics

    sv = procsv.Supervisor(logdir=os.path.join(tmp, "c"), checkpoint=None, save_summaries_secs=1)
    # five kinds of block: "log" (sv.log_scalars), "off" (nothing), "read" (the floor: the same
    # ten values read with Tensor.numpy() and thrown away, which any logger of eager values must at
    # least do), "graph" (the same ten logged inside the tf.function: written by the graph),
    # "floor" (the same ten stacked and assigned to a variable inside it, without procsv)
    per: dict[str, list[float]] = {"log": [], "off": [], "read": [], "graph": [], "floor": []}
    graph_steps = 0
    rings = sv._summaries.buffer.graph  # the process's rings: an earlier run of (c) in this process wrote into them too
    rows_before = sum(ring.read for ring in rings._rings.values())
    inside = [0.0]  # time spent in procsv's summary calls during the logging blocks
    with sv.managed_session() as sess:
        settle()
        step = 0

        def block(kind: str) -> float:
            nonlocal step, graph_steps
            t0 = time.perf_counter()
            for _ in range(block_steps):
                step += 1
                idx = batch_indices(0, step, len(x_train), 64)
                if kind == "graph":
                    sess.run(train_step_logging, x_train[idx], y_train[idx])
                    graph_steps += 1
                    continue
                if kind == "floor":
                    sess.run(train_step_floor, x_train[idx], y_train[idx])
                    continue
                metrics = sess.run(train_step, x_train[idx], y_train[idx])
                if kind == "log":
                    t1 = time.perf_counter()
                    sv.log_scalars(metrics)
                    inside[0] += time.perf_counter() - t1
                elif kind == "read":
                    for value in metrics.values():
                        value.numpy()
            sender = sv._summaries.sender  # made at the first boundary after a log
            if sender is not None:  # this block's own logging is handed off in its time
                if kind == "graph":
                    sv._summaries.buffer.collect_graph(force=True)
                sender.at_boundary(step, urgent=True)
            return (time.perf_counter() - t0) / block_steps

        for kind in per:  # trace and warm up
            block(kind)
        sv.log_scalars(sess.run(train_step, x_train[:64], y_train[:64]))  # creates the sender
        wrap_timer(sv._summaries.sender, "at_boundary", inside)
        inside[0] = 0.0
        for k in range(blocks):
            for kind in (("log", "off", "read", "graph", "floor") if k % 2 else ("floor", "graph", "read", "off", "log")):
                per[kind].append(block(kind))  # drift cancels in pairs
        sv._summaries.buffer.collect_graph(force=True)
        graph_rows = sum(ring.read for ring in rings._rings.values()) - rows_before
    on, off = statistics.median(per["log"]), statistics.median(per["off"])
    pairs = [a / b - 1 for a, b in zip(per["log"], per["off"])]
    floor = [a / b - 1 for a, b in zip(per["read"], per["off"])]
    above = [(a - r) / b for a, r, b in zip(per["log"], per["read"], per["off"])]  # logging beyond the bare reads
    graph = [a / b - 1 for a, b in zip(per["graph"], per["off"])]
    graph_floor = [a / b - 1 for a, b in zip(per["floor"], per["off"])]
    # at_boundary runs in the other blocks too (it has nothing to do there but costs its fast path)
    direct = inside[0] / (blocks * block_steps) / off
    return {"on": on, "off": off, "overhead": statistics.median(pairs), "unpaired": on / off - 1,
            "floor": statistics.median(floor), "above_floor": statistics.median(above), "direct": direct, "dropped": float(sv.summaries_dropped),
            "graph": statistics.median(graph), "graph_floor": statistics.median(graph_floor), "graph_ok": float(graph_rows == graph_steps and not sv.summaries_dropped)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="smaller sizes (a smoke run, noisier numbers)")
    p.add_argument("--repeats", type=int, default=3, help="runs of (a), (b) and (c) (>= 3 for quoted figures)")
    args = p.parse_args()
    runs: list[tuple[dict[str, float], dict[str, Any], dict[str, float]]] = []
    tmp = tempfile.mkdtemp(prefix="bench-summary-")
    try:
        for _ in range(max(1, args.repeats)):
            own = tempfile.mkdtemp(dir=tmp)  # each run its own logdirs and event files
            runs.append((cost_per_scalar(own, steps=2000 if args.quick else 20000),
                         throughput(own, steps=5000 if args.quick else 50000),
                         step_overhead(own, blocks=2 if args.quick else 12, block_steps=1000)))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    med = statistics.median
    spread = span

    cost = [a["procsv_tensor"] / a["tf_tensor"] for a, _, _ in runs]
    cost_float = [a["procsv_float"] / a["tf_float"] for a, _, _ in runs]
    rate = [b["procsv"] for _, b, _ in runs]
    rate_tb = [b["tb"] for _, b, _ in runs]
    overhead = [c["overhead"] for _, _, c in runs]
    unpaired = [c["unpaired"] for _, _, c in runs]
    direct = [c["direct"] for _, _, c in runs]
    floor = [c["floor"] for _, _, c in runs]
    above = [c["above_floor"] for _, _, c in runs]
    graph = [c["graph"] for _, _, c in runs]
    graph_floor = [c["graph_floor"] for _, _, c in runs]
    verified_b = all(b["procsv_ok"] and b["tb_ok"] for _, b, _ in runs)
    verified = verified_b and all(c["graph_ok"] for _, _, c in runs)
    a0 = {k: med([a[k] for a, _, _ in runs]) for k in runs[0][0]}
    c0 = {k: med([c[k] for _, _, c in runs]) for k in ("on", "off")}
    checks = "; ".join(f"{int(b['n']):,}/{int(b['n_tb']):,} read back, {int(b['dropped'])} dropped, waited "
                       f"{b['waited']:.2f} s" for _, b, _ in runs)
    rows = [
        ("(a) cost per scalar, eager tensor", f"{a0['procsv_tensor'] * 1e6:.2f} us", f"{a0['tf_tensor'] * 1e6:.0f} us",
         f"ratio {med(cost):.4f} (spread {spread(cost, '.4f')}) (goal <= 0.02)"),
        ("(a) cost per scalar, Python float", f"{a0['procsv_float'] * 1e6:.2f} us", f"{a0['tf_float'] * 1e6:.0f} us",
         f"ratio {med(cost_float):.4f} (spread {spread(cost_float, '.4f')})"),
        ("(b) end-to-end scalars/s into files", f"{med(rate):,.0f}/s", f"{med(rate_tb):,.0f}/s",
         f"x{med(rate) / med(rate_tb):.1f} (spread {spread(rate, ',.0f')}/s); verified "
         f"{'yes' if verified_b else 'NO'} ({checks}) (goal >= 100,000/s)"),
        ("(c) digits step, 10 scalars/step", f"{c0['on'] * 1e3:.3f} ms", f"{c0['off'] * 1e3:.3f} ms (no logging)",
         f"overhead {med(overhead) * 100:+.2f}% (spread {spread([o * 100 for o in overhead], '+.2f')}%; unpaired "
         f"medians {med(unpaired) * 100:+.2f}%; time inside procsv calls {med(direct) * 100:.2f}% of a step) "
         f"(goal <= 2%)"),
        ("(c) floor: the 10 values' .numpy()", f"{med(floor) * 100:+.2f}%", "",
         f"the step-time cost of only reading the same values (spread {spread([f * 100 for f in floor], '+.2f')}%); "
         f"procsv's logging beyond it {med(above) * 100:+.2f}% (spread {spread([a * 100 for a in above], '+.2f')}%)"),
        ("(c) the 10 logged inside tf.function", f"{med(graph) * 100:+.2f}%", "",
         f"written by the graph, read at the hand-off (spread {spread([g * 100 for g in graph], '+.2f')}%; every "
         f"row collected: {'yes' if all(c['graph_ok'] for _, _, c in runs) else 'NO'}) (goal <= 2%)"),
        ("(c) floor: stack + assign in the graph", f"{med(graph_floor) * 100:+.2f}%", "",
         f"the same ten stacked into one tensor and assigned to a variable, no procsv: the least an "
         f"in-graph logger adds (spread {spread([g * 100 for g in graph_floor], '+.2f')}%)"),
    ]
    print(f"medians of {len(runs)} runs")
    print(f"{'measurement':<38}{'procsv':>14}{'baseline':>24}   result")
    print(f"{'':<38}{'':>14}{'(TF / TensorBoard)':>24}")
    for name, ours, base, result in rows:
        print(f"{name:<38}{ours:>14}{base:>24}   {result}")
    print(f"cost_ratio={med(cost):.4f} throughput_per_s={med(rate):.0f} step_overhead={med(overhead):.4f} "
          f"step_overhead_min={min(overhead):.4f} step_overhead_max={max(overhead):.4f} read_floor={med(floor):.4f} "
          f"above_floor={med(above):.4f} graph_overhead={med(graph):.4f} graph_floor={med(graph_floor):.4f} "
          f"repeats={len(runs)} "
          f"verified={int(verified)}")
    return 0 if verified else 1


if __name__ == "__main__":
    sys.exit(main())
