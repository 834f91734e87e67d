"""TF2 ``ParameterServerStrategy`` under procsv: the coordinator of ``procsv launch --ps N --workers M --coordinator``.

Runs in the trainer process as the chief (task ``chief/0`` of its ``TF_CONFIG``), started by
``procsv launch procsv.examples.ps_strategy --ps 1 --workers 2 --coordinator --logdir DIR -- --steps
N``. procsv starts the parameter servers and the workers (each a plain ``tf.distribute.Server``);
this program is the only one that runs TARGET's code: ``TFConfigClusterResolver`` reads the
cluster, ``ParameterServerStrategy`` puts the variables on the parameter servers, and every step
``ClusterCoordinator.schedule`` dispatches the per-step function to a worker and ``join()`` waits
for it. The step's input is a function of the step alone (a seeded random batch), so which worker
runs it changes nothing: the variables after step ``s`` are :func:`replay`'s (but for a step a
killed worker's rescheduled closure applied twice: ``docs/parameter-servers.md``).

The model (a ``tf.Module``: a linear regression to a fixed target ``y = x . W_TRUE + B_TRUE``) and
the plain SGD update are written out so that the same steps can be replayed in one process
(:func:`replay`). ``procsv.Supervisor(checkpoint=tf.train.Checkpoint(model=...))`` checkpoints it
like any eager program: a snapshot reads the variables from the parameter servers (a remote read),
the checkpoint service commits them, and a restarted coordinator restores the newest checkpoint
into the parameter servers before it dispatches again.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any, Optional, Sequence

FEATURES = 4
BATCH = 16
LR = 0.002  # slow on purpose: the variables after step s differ visibly from those after s - 1 or s + 1
W_TRUE = (0.5, -1.0, 2.0, 0.25)
B_TRUE = 0.75


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="procsv.examples.ps_strategy", description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=500, help="total global steps (default 500)")
    p.add_argument("--save-model-secs", type=float, default=10.0, help="checkpoint every N seconds (default 10)")
    p.add_argument("--step-delay", type=float, default=0.0, help="sleep this long per step (a slower model)")
    p.add_argument("--print-every-steps", type=int, default=100)
    p.add_argument("--logdir", default=None, help="only when run without `procsv launch`")
    return p.parse_args(argv)


def build(tf: Any) -> Any:
    """The model: a ``tf.Module`` holding ``w`` (FEATURES x 1) and ``b`` (1), zeros at the start."""
    m = tf.Module(name="linear")
    m.w = tf.Variable(tf.zeros([FEATURES, 1]), name="w")
    m.b = tf.Variable(tf.zeros([1]), name="b")
    return m


def step_function(tf: Any, m: Any) -> Any:
    """The per-step function a worker runs: step ``s``'s batch (seeded by ``s``), one SGD update."""
    w_true = tf.constant([[v] for v in W_TRUE])

    @tf.function  # type: ignore[untyped-decorator]  # TensorFlow ships no type information
    def per_step(s: Any) -> Any:
        x = tf.random.stateless_normal([BATCH, FEATURES], seed=tf.stack([s, tf.constant(7, tf.int64)]))
        y = tf.matmul(x, w_true) + B_TRUE
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(tf.matmul(x, m.w) + m.b - y))
        gw, gb = tape.gradient(loss, [m.w, m.b])
        m.w.assign_sub(LR * gw)
        m.b.assign_sub(LR * gb)
        return loss

    return per_step


def replay_path(steps: int) -> list[dict[str, Any]]:
    """The variables after each of the steps ``0 .. steps`` (index ``s``: after step ``s``; 0: the
    zeros), computed in this process (no cluster)."""
    import tensorflow as tf

    m = build(tf)
    per_step = step_function(tf, m)
    path = [{"w": m.w.numpy(), "b": m.b.numpy()}]
    for s in range(1, steps + 1):
        per_step(tf.constant(s, tf.int64))
        path.append({"w": m.w.numpy(), "b": m.b.numpy()})
    return path


def replay(steps: int) -> dict[str, Any]:
    """The variables after ``steps`` steps, computed in this process (no cluster): what the run's
    checkpoint at that step must hold (unless a step was applied twice: ``docs/parameter-servers.md``)."""
    return replay_path(steps)[-1]


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    import procsv

    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()  # the TF_CONFIG procsv set
    strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
    with strategy.scope():
        m = build(tf)  # its variables live on the parameter servers
    per_step = step_function(tf, m)

    sv = procsv.Supervisor(logdir=args.logdir, checkpoint=tf.train.Checkpoint(model=m),
                           save_model_secs=args.save_model_secs)

    def one_step() -> Any:
        """Step ``sv.step``: scheduled on a worker (another one if it fails), then joined."""
        loss = coordinator.schedule(per_step, args=(tf.constant(sv.step, tf.int64),))
        coordinator.join()
        return {"loss": loss.fetch()}

    with sv.managed_session() as sess:
        start = sv.step
        print(f"ps_strategy: coordinator at step {start}, variables on {m.w.device}", flush=True)
        while not sv.should_stop() and sv.step < args.steps:
            out = sess.run(one_step)
            if args.step_delay:
                time.sleep(args.step_delay)
            if sv.step % args.print_every_steps == 0 or sv.step == args.steps:
                print(f"ps_strategy: step {sv.step} loss {float(out['loss']):.6f}", flush=True)
    print(f"ps_strategy: coordinator ends at step {sv.step} (this process ran {sv.step - start})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
