"""A graph session's callable road (:mod:`procsv.trainer.graph.fastrun`): every run a program can
make gives what a plain ``tf.compat.v1.Session`` gives, through the callable where it applies and
through ``Session.run`` elsewhere.

In this process, no services (``Supervisor(logdir=None)``): two copies of one graph built from the
same seed, one in procsv's managed session and one in a plain ``Session``, get the same runs in the
same order; each pair of results must be identical (types, dtypes, shapes, values, bit for bit) or
raise the same exception with the same message.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import numpy as np
import pytest
import tensorflow as tf


class Model:
    def __init__(self) -> None:
        tf.compat.v1.set_random_seed(0)
        self.x = tf.compat.v1.placeholder(tf.float32, [None, 4], name="x")
        self.y = tf.compat.v1.placeholder(tf.int64, [None], name="y")
        self.w = tf.compat.v1.get_variable("w", [4, 3])
        self.logits = tf.matmul(self.x, self.w, name="logits")
        self.loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=self.y, logits=self.logits),
                                   name="loss")
        self.global_step = tf.compat.v1.train.get_or_create_global_step()
        self.train_op = tf.compat.v1.train.AdamOptimizer(0.1).minimize(self.loss, global_step=self.global_step)
        self.checked = tf.debugging.check_numerics(tf.reduce_sum(self.x), "x holds a NaN", name="checked")
        self.rows = tf.compat.v1.data.make_one_shot_iterator(tf.data.Dataset.range(2)).get_next(name="rows")
        self.name = tf.constant("a name", name="text")
        self.init_op = tf.compat.v1.global_variables_initializer()


@contextlib.contextmanager
def _session(who: str) -> Iterator[tuple[Model, Any, Any]]:
    """A fresh copy of :class:`Model`'s graph, initialized, in procsv's managed session (``who`` is
    ``"procsv"``: with its Supervisor, without a logdir) or in a plain ``Session`` (no Supervisor)."""
    import procsv

    with tf.Graph().as_default() as graph:
        m = Model()
        if who == "procsv":
            sv = procsv.Supervisor(logdir=None, graph=graph, init_op=m.init_op)
            with sv.managed_session() as sess:
                yield m, sess, sv
        else:
            with tf.compat.v1.Session(graph=graph) as sess:
                sess.run(m.init_op)
                yield m, sess, None


def _same(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(p, q) for p, q in zip(a, b))
    if isinstance(a, (np.ndarray, np.generic)):
        return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b, equal_nan=True)
    return bool(a == b)


def _outcome(run: Callable[[], Any]) -> tuple[str, Any]:
    try:
        return "value", run()
    except Exception as e:  # noqa: BLE001 (the exception is the result compared)
        return type(e).__name__, str(e)


def test_every_kind_of_run_gives_what_a_plain_session_gives_and_eligible_runs_take_the_callable():
    """Runs through the callable (a list, a tuple, one tensor, one op; exact dtypes and fitting
    shapes), runs it hands to ``Session.run`` (a float64 or a Python list fed, a variable or a
    name fetched, a repeated fetch, options with run metadata), and errors (a shape ``Session.run``
    refuses, an op's failure, a placeholder not fed, an iterator's end, a closed session): the
    same values and exceptions as a plain session's. The callable really ran the first kind
    (plans with a callable; the step counted by the Supervisor matches the graph's)."""
    from procsv.trainer.graph.fastrun import FastRun

    rng = np.random.default_rng(0)
    bx = rng.normal(size=(8, 4)).astype(np.float32)
    by = rng.integers(0, 3, 8)
    nan_x = bx.copy()
    nan_x[0, 0] = np.nan

    def runs(m: Model) -> list[tuple[Any, Any, dict[str, Any]]]:
        feed = {m.x: bx, m.y: by}
        return [
            ([m.train_op, m.loss], feed, {}),
            ([m.train_op, m.loss], {m.x: bx[:5], m.y: by[:5]}, {}),  # another batch size: the static shape allows it
            ((m.loss, m.logits), feed, {}),
            (m.loss, feed, {}),
            (m.train_op, feed, {}),
            ([m.logits], {m.x: bx}, {}),
            ([m.train_op, m.loss], {m.x: bx.astype(np.float64), m.y: by}, {}),  # converted by Session.run
            ([m.train_op, m.loss], {m.x: bx.tolist(), m.y: by.tolist()}, {}),
            ([m.train_op, m.loss], {m.x: bx[:, :3], m.y: by}, {}),  # ValueError: the shape does not fit
            ([m.w, m.global_step], None, {}),  # variables: their values
            ("loss:0", feed, {}),
            ([m.loss, m.loss], feed, {}),
            ([m.train_op, m.loss], feed, {"options": tf.compat.v1.RunOptions(trace_level=3),
                                          "run_metadata": tf.compat.v1.RunMetadata()}),
            (m.checked, {m.x: bx}, {}),
            (m.checked, {m.x: nan_x}, {}),  # the op fails: InvalidArgumentError
            (m.loss, {m.x: bx}, {}),  # y not fed
            (m.rows, None, {}), (m.rows, None, {}), (m.rows, None, {}),  # the third: OutOfRangeError
            (m.name, None, {}),
            ([m.train_op, m.loss], feed, {}),
        ]

    results: dict[str, list[tuple[str, Any]]] = {}
    for who in ("procsv", "plain"):
        with _session(who) as (m, sess, sv):
            planned = runs(m)
            out = [_outcome(lambda: sess.run(f, d, **kw)) for f, d, kw in planned]
            out.append(("step", int(sess.run(m.global_step))))
            if sv is not None:
                fast = [p for p in sess._plans.values() if isinstance(p.fast, FastRun)]
                assert len(fast) >= 5, "the list, tuple, tensor, op and one-feed runs have callables"
                assert sv._state.step == out[-1][1] == 7
                meta = planned[12][2]["run_metadata"]
                assert meta.step_stats.dev_stats, "options and run_metadata reached Session.run"
            raw = sess.raw if sv is not None else sess
        out.append(_outcome(lambda: raw.run(m.loss, {m.x: bx, m.y: by})))  # closed
        results[who] = out
    kinds = [k for k, _ in results["plain"]]
    assert kinds.count("InvalidArgumentError") == 2 and "ValueError" in kinds and "OutOfRangeError" in kinds
    assert kinds[-1] == "RuntimeError"
    for i, (ours, theirs) in enumerate(zip(results["procsv"], results["plain"])):
        assert ours[0] == theirs[0] and _same(ours[1], theirs[1]), (i, ours, theirs)


def test_the_callable_road_can_be_turned_off(monkeypatch):
    """``PROCSV_GRAPH_FAST_RUN=0``: no plan gets a callable; the runs are Session.run's."""
    monkeypatch.setenv("PROCSV_GRAPH_FAST_RUN", "0")
    with _session("procsv") as (m, sess, _):
        sess.run([m.train_op, m.loss], {m.x: np.zeros((2, 4), np.float32), m.y: np.zeros(2, np.int64)})
        assert sess._plans and all(p.fast is None for p in sess._plans.values())


def test_a_callable_from_make_callable_makes_steps_and_returns_what_tfs_returns():
    """A program that trains through ``sess.make_callable([train_op, loss], [x, y])`` (TF's way to
    cut ``Session.run``'s Python) makes steps the Supervisor counts, with TF's values (compared with
    a plain session's callable, bit for bit); the no-feed and ``accept_options`` forms too, and a
    bad ``feed_list`` is refused when the callable is made, as TF refuses it."""
    rng = np.random.default_rng(1)
    batches = [(rng.normal(size=(8, 4)).astype(np.float32), rng.integers(0, 3, 8)) for _ in range(5)]
    results = {}
    for who in ("procsv", "plain"):
        with _session(who) as (m, sess, sv):
            with pytest.raises(TypeError, match="feed_list"):
                sess.make_callable(m.loss, m.x)
            train = sess.make_callable([m.train_op, m.loss], [m.x, m.y])
            out = [train(bx, by) for bx, by in batches]
            step_op = sess.make_callable(m.train_op, [m.x, m.y])
            out.append(step_op(*batches[0]))
            read = sess.make_callable(m.w)
            traced = sess.make_callable(m.w, accept_options=True)
            out += [read(), traced(run_metadata=tf.compat.v1.RunMetadata())]
            if sv is not None:
                assert sv._state.step == 6, "each call of the callables that train is a step"
            out.append(int(sess.run(m.global_step)))
        results[who] = out
    assert _same(results["procsv"], results["plain"])
    assert results["plain"][-1] == 6
