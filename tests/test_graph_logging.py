"""Scalars logged inside a ``tf.function``: written by the graph into rings, read at the hand-off.

Real TensorFlow throughout; the end-to-end test runs a real Supervisor (its summary service is a
real process) and reads the event files back with TensorBoard's ``EventAccumulator``.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
import pytest
import tensorflow as tf
from tensorboard.backend.event_processing import event_accumulator as ea

import procsv
from procsv.trainer.summaries import SummaryBuffer
from procsv.trainer.summaries.graph_rings import CAPACITY, INCOMPLETE_GRACE, GraphRings


@pytest.mark.slow
def test_a_supervisor_writes_every_call_of_a_traced_function_to_tensorboard(logdir):
    v = tf.Variable(0.0)
    it = tf.Variable(0, dtype=tf.int64)
    sv = procsv.Supervisor(logdir=logdir, checkpoint=tf.train.Checkpoint(v=v, it=it), save_model_secs=0)

    @tf.function
    def step(x: tf.Tensor) -> tf.Tensor:
        v.assign_add(x)
        it.assign_add(1)
        sv.log_scalars({"a": v, "twice": v * 2.0, "count": tf.cast(it, tf.int32)}, step=it)
        sv.log_scalar("one", 1.0, step=it)  # a Python number inside the graph: written at every call too
        sv.summary_computed(None, {"computed": v}, global_step=it)  # TF's form, a mapping of scalars
        return v

    @tf.function
    def no_step() -> None:
        sv.summary_computed(None, {"computed": v})  # the step of the trace would be frozen in the graph

    with sv.managed_session() as sess:
        for _ in range(600):
            sess.run(step, tf.constant(0.5))
        with pytest.raises(TypeError, match="needs step="):
            no_step()
    assert sv.summaries_dropped == 0
    acc = ea.EventAccumulator(logdir, size_guidance={ea.SCALARS: 0})
    acc.Reload()
    for tag, per_step in (("a", 0.5), ("twice", 1.0), ("count", 1.0), ("one", None), ("computed", 0.5)):
        events = acc.Scalars(tag)
        assert [e.step for e in events] == list(range(1, 601)), tag
        expected = [1.0] * 600 if per_step is None else [per_step * k for k in range(1, 601)]
        assert [e.value for e in events] == expected, tag


def test_the_rings_hold_every_call_until_they_are_read_once():
    rings = GraphRings()
    it = tf.Variable(0, dtype=tf.int64)

    @tf.function
    def f(x: tf.Tensor) -> None:
        it.assign_add(1)
        rings.log({"x": x, "sq": x * x}, step=it)

    for k in range(5):
        f(tf.constant(float(k)))
    out = rings.drain()
    assert out.tags == ["x", "sq"] * 5 and out.steps == [s for s in range(1, 6) for _ in (0, 1)]
    assert out.values == [float(v) for k in range(5) for v in (k, k * k)] and out.lost == 0
    assert rings.drain().steps == []  # read once


def test_a_retrace_writes_into_the_same_ring_in_call_order():
    rings = GraphRings()

    @tf.function
    def f(x: tf.Tensor, step: tf.Tensor) -> None:
        rings.log({"m": tf.reduce_mean(tf.cast(x, tf.float32))}, step=step)

    f(tf.constant([1.0, 3.0]), tf.constant(1, tf.int64))
    f(tf.constant([[5]]), tf.constant(2, tf.int64))  # another signature: traced again
    f(tf.constant([2.0, 4.0]), tf.constant(3, tf.int64))
    assert f.experimental_get_tracing_count() >= 2  # (TF may trace a third time, with relaxed shapes)
    out = rings.drain()
    assert (out.steps, out.values) == ([1, 2, 3], [2.0, 5.0, 3.0])


@pytest.mark.slow
def test_rows_beyond_the_capacity_between_two_reads_are_counted_as_lost_and_the_newest_kept():
    rings = GraphRings()
    it = tf.Variable(0, dtype=tf.int64)

    @tf.function
    def f() -> None:
        it.assign_add(1)
        rings.log({"s": tf.cast(it, tf.float32)}, step=it)

    for _ in range(CAPACITY + 10):
        f()
    out = rings.drain()
    assert out.lost == 10
    assert out.steps == list(range(11, CAPACITY + 11))
    assert out.values == [float(s) for s in range(11, CAPACITY + 11)]


@pytest.mark.slow
def test_the_buffer_collects_the_rings_rows_and_counts_the_lost_as_dropped():
    buf = SummaryBuffer(graph=GraphRings())
    it = tf.Variable(0, dtype=tf.int64)

    @tf.function
    def f() -> None:
        it.assign_add(1)
        buf.graph.log({"s": tf.cast(it, tf.float32)}, step=it)

    for _ in range(CAPACITY + 3):
        f()
    buf.collect_graph(force=True)
    chunk = buf.take(limit=CAPACITY + 10)
    assert chunk.dropped == 3 and buf.dropped_total == 3
    assert chunk.scalars.steps == list(range(4, CAPACITY + 4)) and set(chunk.scalars.tags) == {"s"}


def one_ring() -> tuple[GraphRings, Any, Any]:
    """Rings holding one row (step 1) of a function logging ``{"s": step}``: (rings, the function, its ring)."""
    rings = GraphRings()

    @tf.function
    def f(step: tf.Tensor) -> None:
        rings.log({"s": tf.cast(step, tf.float32)}, step=step)

    f(tf.constant(1, tf.int64))
    (ring,) = rings._rings.values()
    return rings, f, ring


def _trace(fn) -> None:  # type: ignore[no-untyped-def]
    tf.function(fn).get_concrete_function()


@pytest.mark.parametrize("values, step, error, match", [
    ({"a": tf.constant(1.0)}, None, TypeError, "needs step="),
    ({"a": tf.constant(1.0)}, 1.5, TypeError, "step must be one integer, got a tensor of dtype float32"),
    ({"a": tf.constant(1.0)}, tf.constant([1, 2]), TypeError, "step must be one integer"),
    ({"a": tf.zeros([3])}, 1, TypeError, "'a'.*shape \\[3\\]"),
    ({"a": tf.constant("text")}, 1, TypeError, "'a'.*dtype string"),
    ({"a": tf.constant(1.0, tf.complex64)}, 1, TypeError, "'a'.*dtype complex64"),
    ({"a": object()}, 1, TypeError, "'a'.*object"),
    ({"  ": tf.constant(1.0)}, 1, ValueError, "tag must be a non-empty string"),
    ([("a", 1.0)], 1, TypeError, "mapping"),
])
def test_bad_input_inside_a_traced_function_is_a_clear_error_at_the_trace(values, step, error, match):
    rings = GraphRings()

    def fn() -> None:
        vals = {k: (tf.identity(v) if isinstance(v, tf.Tensor) else v) for k, v in values.items()} \
            if isinstance(values, dict) else values
        rings.log(vals, step=tf.identity(step) if isinstance(step, tf.Tensor) else step)

    with pytest.raises(error, match=match):
        _trace(fn)
    assert not rings  # nothing half-registered


def test_logging_inside_a_distribution_strategy_is_refused_at_the_trace():
    rings = GraphRings()
    with tf.distribute.OneDeviceStrategy("/cpu:0").scope():
        with pytest.raises(TypeError, match="tf.distribute"):
            _trace(lambda: rings.log({"a": tf.constant(1.0)}, step=1))


def test_values_of_any_real_dtype_are_written_as_float32():
    rings = GraphRings()

    @tf.function
    def f() -> None:
        rings.log({"i": tf.constant(7, tf.int64), "b": tf.constant(True), "h": tf.constant(0.5, tf.float16),
                   "d": tf.constant(1.0 / 3.0, tf.float64), "one": tf.constant([2.0])}, step=3)

    f()
    out = rings.drain()
    assert out.values == [7.0, 1.0, 0.5, float(np.float32(1.0 / 3.0)), 2.0] and out.steps == [3] * 5


@pytest.mark.slow
def test_rows_written_by_another_thread_while_the_trainer_reads_arrive_once_each_and_complete():
    rings = GraphRings()
    it = tf.Variable(0, dtype=tf.int64)

    @tf.function
    def f() -> None:
        k = it.assign_add(1)
        work = tf.reduce_sum(tf.matmul(tf.ones([64, 64]), tf.ones([64, 64]) * tf.cast(k, tf.float32)))
        rings.log({"k": tf.cast(k, tf.float32), "w": work}, step=k)  # the values take a while to compute

    f()  # traced before the race
    stop = threading.Event()

    def writer() -> None:
        while not stop.is_set():
            f()

    thread = threading.Thread(target=writer)
    thread.start()
    steps: list[int] = []
    values: list[float] = []
    lost = 0
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline:
        out = rings.drain()
        steps += out.steps
        values += out.values
        lost += out.lost
    stop.set()
    thread.join()
    out = rings.drain()
    steps, values, lost = steps + out.steps, values + out.values, lost + out.lost
    assert lost == 0
    written = int(it.numpy())
    assert steps[::2] == list(range(1, written + 1))  # every row once, in order, none half-written
    assert values[::2] == [float(k) for k in range(1, written + 1)]
    assert values[1::2] == [64.0 * 64 * 64 * k for k in range(1, written + 1)]


def test_a_row_completed_between_the_trainers_reads_is_read_whole_or_at_the_next_read():
    rings, f, ring = one_ring()
    ring.count.assign_add(1)  # another thread's call has taken index 1 and not written its row yet
    real_steps = ring.steps

    class CompletesWhenRead:  # that call completes its row while the trainer reads the rings
        def numpy(self) -> np.ndarray:
            ring.values.scatter_nd_update([[1]], [[2.0]])
            real_steps.scatter_nd_update([[1]], [2])
            ring.seq.scatter_nd_update([[1]], [1])
            return real_steps.numpy()

    ring.steps = CompletesWhenRead()
    first = rings.drain(now=0.0)
    ring.steps = real_steps
    second = rings.drain(now=0.0)
    assert (first.steps + second.steps, first.values + second.values) == ([1, 2], [1.0, 2.0])
    assert first.lost == second.lost == 0


@pytest.mark.slow
def test_more_rows_than_the_ring_holds_written_during_one_read_are_all_counted_lost_once():
    rings, f, ring = one_ring()
    real_values = ring.values

    class FloodWhenRead:  # another thread writes CAPACITY + 5 rows while the trainer reads
        def numpy(self) -> np.ndarray:
            for step in range(2, CAPACITY + 7):
                f(tf.constant(step, tf.int64))
            return real_values.numpy()

    ring.values = FloodWhenRead()
    first = rings.drain(now=0.0)
    ring.values = real_values
    second = rings.drain(now=0.0)
    # row 1 (step 1) and rows 2..6 (steps 2..6) were overwritten; the last CAPACITY rows come next
    assert first.steps == [] and first.lost == 6
    assert second.steps == list(range(7, CAPACITY + 7)) and second.lost == 0


def test_a_row_begun_and_never_completed_holds_the_read_back_for_a_grace_then_counts_as_lost():
    rings, f, ring = one_ring()
    ring.count.assign_add(1)  # a row whose function failed between taking the index and writing it
    f(tf.constant(3, tf.int64))
    out = rings.drain(now=100.0)
    assert (out.steps, out.lost) == ([1], 0)  # row 2 may still be on its way: the read stops there
    assert rings.drain(now=100.0 + INCOMPLETE_GRACE / 2).steps == []
    out = rings.drain(now=100.0 + INCOMPLETE_GRACE)
    assert (out.steps, out.lost) == ([3], 1)


@pytest.mark.slow
def test_a_function_traced_under_one_supervisor_logs_under_the_next_one(logdir):
    """TF's retry loop makes a new Supervisor per attempt; the function keeps writing into the
    process's rings, which every Supervisor reads."""
    it = tf.Variable(0, dtype=tf.int64)
    holder: dict[str, procsv.Supervisor] = {}

    @tf.function
    def step() -> None:
        it.assign_add(1)
        holder["sv"].log_scalars({"retry/in_graph": tf.cast(it, tf.float32)}, step=it)

    traces = []
    for _ in range(2):
        # (a final checkpoint of step 50 restored by the next: its session starts at 51, as the retry's
        # loop does; save_model_secs=0 now asks for no checkpoint at all, as TF's: it would start at 0)
        sv = holder["sv"] = procsv.Supervisor(logdir=logdir, checkpoint=tf.train.Checkpoint(it=it))
        with sv.managed_session() as sess:
            for _ in range(50):
                sess.run(step)
        assert sv.summaries_dropped == 0
        traces.append(step.experimental_get_tracing_count())
    acc = ea.EventAccumulator(logdir, size_guidance={ea.SCALARS: 0})
    acc.Reload()
    assert [e.step for e in acc.Scalars("retry/in_graph")] == list(range(1, 101))
    assert traces[0] == traces[1]  # not traced again under the second Supervisor: its graph writes where it was traced


def test_rows_still_in_the_rings_hold_back_an_in_memory_snapshot_of_their_step(logdir):
    """What decides whether a waiting in-memory snapshot may go to the checkpoint service reads the
    rings first: a restart from that snapshot must not skip the rows only this process holds."""
    it = tf.Variable(0, dtype=tf.int64)
    sv = procsv.Supervisor(logdir=logdir, checkpoint=tf.train.Checkpoint(it=it), save_model_secs=0)

    @tf.function
    def step() -> None:
        it.assign_add(1)
        sv.log_scalars({"held": tf.cast(it, tf.float32)}, step=it)

    with sv.managed_session() as sess:
        for _ in range(5):
            sess.run(step)
        deadline = time.monotonic() + 20
        while sv._summaries.unwritten_from() is not None and time.monotonic() < deadline:
            sv._summaries.flush(force=False, urgent=True)  # hand off, and read the service's acks
            time.sleep(0.01)
        assert sv._summaries.unwritten_from() is None  # steps 1-5 are written
        step()  # called directly: no step boundary, so rows 6 and 7 wait in the ring, read by nobody
        step()
        assert sv._summaries.unwritten_from() == 6
