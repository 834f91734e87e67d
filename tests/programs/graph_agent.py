"""A TF1 graph program's state handed to the checkpoint agent by hand (no Supervisor), for
tests/test_graph_checkpoint.py, which imports its model and helpers and runs it as a program.

As a program (``python graph_agent.py LOGDIR RUNTIME OUT [resource|ref] [hold|restore]``) it plays a trainer in
TF1 graph mode (eager execution disabled for the whole process; with ``ref``, every TF2 behaviour
disabled, so that ``get_variable`` makes TF1's reference variables) against the checkpoint service the test started:
restores or initializes, trains 3 steps, commits them to disk, trains to step 7, takes an
in-memory snapshot of step 7, waits until the service holds it, writes every variable's value at
step 7 to OUT (``.npz``), prints ``HELD 7`` and waits to be killed. With ``restore`` it only
restores (the agent's restore at start), writes every variable's value to OUT and exits.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass
class Model:
    graph: Any
    train_op: Any
    x: Any
    y: Any
    global_step: Any


def build(graph: Any, w1_shape: tuple[int, int] = (4, 8), extra: bool = False) -> Model:
    """A 4-8-3 MLP from ``get_variable``/``matmul``, a MomentumOptimizer step, the global step and a
    string variable (it travels as a frame, not through the shared memory)."""
    import tensorflow as tf

    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 4], name="x")
        y = tf.compat.v1.placeholder(tf.int32, [None], name="y")
        init = tf.compat.v1.glorot_uniform_initializer(seed=1)
        w1 = tf.compat.v1.get_variable("w1", list(w1_shape), initializer=init)
        b1 = tf.compat.v1.get_variable("b1", [w1_shape[1]], initializer=tf.compat.v1.zeros_initializer())
        w2 = tf.compat.v1.get_variable("w2", [w1_shape[1], 3], initializer=init)
        b2 = tf.compat.v1.get_variable("b2", [3], initializer=tf.compat.v1.zeros_initializer())
        if extra:
            tf.compat.v1.get_variable("w3", [3, 3], initializer=init)
        tf.compat.v1.get_variable("tag", initializer=tf.constant([b"graph", b"mode"]), trainable=False)  # a frame
        logits = tf.matmul(tf.nn.relu(tf.matmul(x, w1) + b1), w2) + b2
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
        gs = tf.compat.v1.train.get_or_create_global_step()
        train_op = tf.compat.v1.train.MomentumOptimizer(0.1, 0.9).minimize(loss, global_step=gs)
    return Model(graph, train_op, x, y, gs)


def feed(m: Model, step: int) -> dict[Any, Any]:
    """The batch of ``step``: a function of the step only."""
    rng = np.random.default_rng(step)
    return {m.x: rng.normal(size=(16, 4)).astype(np.float32), m.y: rng.integers(0, 3, size=16).astype(np.int32)}


def train(sess: Any, m: Model, steps: int) -> int:
    """Run ``steps`` training steps; return the global step after them."""
    for _ in range(steps):
        step = int(sess.run(m.global_step))
        sess.run(m.train_op, feed(m, step))
    return int(sess.run(m.global_step))


def values(sess: Any, graph: Any) -> dict[str, np.ndarray]:
    """Every global variable's value, by its graph name."""
    import tensorflow as tf

    with graph.as_default():
        variables = tf.compat.v1.global_variables()
    return dict(zip([v.op.name for v in variables], sess.run(variables)))


def agent_for(m: Model, sess: Any, logdir: str, memory_budget: float = 0.0) -> tuple[Any, Any, Any]:
    """A CheckpointAgent over ``m``'s saveable variables (what a default Saver saves), with its
    GraphCheckpoint and GraphGlobalStep."""
    import tensorflow as tf

    from procsv.common.layout import Layout
    from procsv.trainer.checkpoint.agent import CheckpointAgent
    from procsv.trainer.graph.state import GraphCheckpoint, GraphGlobalStep

    with m.graph.as_default():
        var_list = tf.compat.v1.global_variables()
    ckpt = GraphCheckpoint(var_list, lambda: sess)
    gs = GraphGlobalStep(m.global_step, lambda: sess)
    layout = Layout(logdir)
    layout.create()
    agent = CheckpointAgent(ckpt, gs, layout, basename="model.ckpt", save_model_secs=None,
                            save_checkpoint_steps=None, max_to_keep=10, keep_checkpoint_every_n_hours=None,
                            memory_budget=memory_budget)
    return agent, ckpt, gs


def _save(out: str, sess: Any, graph: Any) -> None:
    np.savez(out, **{k.replace("/", "|"): v for k, v in values(sess, graph).items()})


def main(logdir: str, runtime: str, out: str, kind: str = "resource", mode: str = "hold") -> None:
    import tensorflow as tf

    from procsv.ipc.messages import SaveReason
    from procsv.ipc.transport import Endpoints
    from procsv.trainer.channels import TrainerChannels

    if kind == "ref":
        tf.compat.v1.disable_v2_behavior()
    else:
        tf.compat.v1.disable_eager_execution()
    m = build(tf.compat.v1.get_default_graph())
    if (type(m.global_step).__name__ == "RefVariable") != (kind == "ref"):
        sys.exit(f"{kind} variables asked for, {type(m.global_step).__name__} made")
    with m.graph.as_default():
        init = tf.compat.v1.global_variables_initializer()
    sess = tf.compat.v1.Session(graph=m.graph)
    agent, _, gs = agent_for(m, sess, logdir, memory_budget=0.01)
    if mode == "restore":
        agent.restore_or_init(lambda: sys.exit("nothing to restore"))
        _save(out, sess, m.graph)
        print(f"RESTORED {int(gs.numpy())} {agent.restored_from}", flush=True)
        return
    ch = TrainerChannels(Endpoints(runtime), supervised=False)
    agent.restore_or_init(lambda: sess.run(init))
    step = train(sess, m, 3)
    gs.observe(step)
    result = agent.final(ch, step, SaveReason.FINAL, grace_secs=120)
    if result is None or not result.ok:
        sys.exit(f"the checkpoint of step {step} did not commit: {result}")
    step = train(sess, m, 4)
    gs.observe(step)
    arena = agent.store.arena
    while arena is not None and arena.populating():
        time.sleep(0.01)
    if not agent.memory_snapshot(ch, step):
        sys.exit("the in-memory snapshot was not handed to the service")
    _save(out, sess, m.graph)
    deadline = time.monotonic() + 120
    while agent.store.slots.held != step:
        if time.monotonic() > deadline:
            sys.exit(f"the service never said it holds the snapshot of step {step}")
        agent.poll(ch, step, ch.clock())
        time.sleep(0.01)
    print(f"HELD {step}", flush=True)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main(*sys.argv[1:6])
