"""The pure part of a graph session's per-run cost (issue 40): the plans of fetch structures
(:mod:`procsv.trainer.graph.runplan`), with graph tensors built in a ``tf.Graph`` of this process
and plain values (no session runs, no process starts)."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from procsv.trainer.graph.runplan import keep_losses, make_plan, plan_key
from procsv.trainer.nonfinite.losses import LossWatch


def test_a_plan_is_keyed_by_the_identities_of_its_fetches_and_fed_keys_and_judges_host_losses():
    """A new list (or tuple) and feed dict of the same tensors find the same plan, whatever the fed
    values; another order, other fetches or feeds, a dict of fetches (no key: made anew each
    call) do not. Only flat structures of graph elements are held (and so cached): a nested list
    is walked instead. The watched fetches are found by name (``model/loss`` for the tag ``loss``;
    a single fetch is -1). A finite host loss is judged on the spot and nothing is kept; a NaN
    or an inf is handed to the LossWatch at its step, and the first bad step stays."""
    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [], name="x")
        a = tf.identity(x, name="a")
        loss = tf.identity(a, name="model/loss")
    assert plan_key([a, loss], {x: 1.0}) == plan_key([a, loss], {x: 2.0})
    assert plan_key([a, loss], None) == plan_key([a, loss], {})
    assert plan_key((a, loss), {x: 1.0}) == plan_key([a, loss], {x: 1.0})  # (the kind of container changes nothing of the plan)
    assert len({plan_key([a, loss], None), plan_key([loss, a], None), plan_key([a], {x: 1.0}),
                plan_key([a, loss], {x: 1.0}), plan_key(loss, None), plan_key([loss], None)}) == 6
    assert plan_key({"a": a}, None) is None

    losses = LossWatch(("loss",))
    flat = make_plan([a, loss], {x: 1.0}, ("read", 1), losses, plan_key([a, loss], {x: 1.0}))
    assert (flat.read, flat.add, flat.watch, flat.losses) == ("read", 1, (1,), losses)
    assert flat.held == ([a, loss], [x])
    nested = make_plan([[a], loss], None, (None, None), losses, plan_key([[a], loss], None))
    assert nested.held is None and nested.watch is None
    assert make_plan("model/loss:0", None, (None, None), losses, plan_key("model/loss:0", None)).watch == (-1,)
    assert make_plan([a, loss], None, (None, None), LossWatch(()), plan_key([a, loss], None)).watch == ()

    keep_losses(flat, 5, [None, np.float32(1.5)])
    keep_losses(flat, 6, [None, 2.0])
    assert losses.host_bad is None and losses.pending == []
    keep_losses(flat, 7, [None, np.float32(np.nan)])
    keep_losses(flat, 8, [None, np.float64(np.inf)])
    assert losses.host_bad == 7
    single = make_plan(loss, None, (None, None), losses, plan_key(loss, None))
    keep_losses(single, 3, np.float16(np.inf))
    assert losses.host_bad == 3


def test_a_run_that_is_no_step_writes_the_state_when_it_assigns_or_trains_a_saved_variable():
    """``StepProbe.writes``: which runs that advance no global step change what a checkpoint holds
    (the graph session marks the state changed after them, and the committed step is rewritten):
    an ``assign_add`` on a variable, ``minimize()`` without ``global_step=``, not a read of it, nor a
    ``tf.compat.v1.metrics`` update (local variables, which no Saver saves)."""
    from procsv.trainer.graph.steps import StepProbe

    with tf.Graph().as_default() as graph:
        step = tf.compat.v1.train.get_or_create_global_step()
        v = tf.compat.v1.get_variable("v", initializer=1.0)
        inc = v.assign_add(1.0)
        train = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(v * v)
        mean, update = tf.compat.v1.metrics.mean(v)
        probe = StepProbe(graph, step, False)
        assert probe.plan(train, None) is None and probe.plan(inc, None) is None  # no step: nothing writes it
        assert probe.writes(inc, None) and probe.writes(train, None) and probe.writes([v, inc], None)
        assert not probe.writes(v, None) and not probe.writes(v * 2.0, None)
        assert not probe.writes(update, None) and not probe.writes(mean, None)
        assert probe.writes({"u": update, "t": train}, None)
