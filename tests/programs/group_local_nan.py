"""A MultiWorkerMirroredStrategy custom loop as users write it, whose watched loss is each member's
own (``experimental_local_results``: no collective for a logged number), so that a NaN in one
member's loss is seen by that member alone: its gradients are finite (the NaN is a term without a
gradient, as a masked input's would be), the weights stay finite and the other members' losses too.

    --nan-at N      at step N, worker 1's watched loss is NaN (repeatable)
    --in-batch      --nan-at puts the NaN in worker 1's batch instead: its gradient all-reduces into
                    every member's weights, and the other members' losses are NaN from the next step on
                    (the ordinary way a NaN reaches a data-parallel group)
    --loss-nan-at N at step N, worker 1's watched loss alone is NaN, as --nan-at without --in-batch, whatever
                    --in-batch says (repeatable): one run holds both kinds
    --spike-at N    at step N, worker 1's batch has its targets scaled so that the group's loss jumps ~50x
                    (repeatable); with it, the loss returned is the group's (``strategy.reduce(SUM, ...)``, as users
                    write it: the chief judges its loss for spikes, and a spike in any member's batch is in it) and
                    the Supervisor's spike rule judges from 20 losses on (window 20, z 6: the default 100 would judge
                    nothing before step 100; a window of this run's first fast fall would pass no 50x jump); the
                    weights are those of the same run without it
    --skip-at N     step N applies nothing on every member (repeatable): the plain run that never applied it
    --steps N       train to step N
    --exit-at N     worker 1 exits with code 5 at step N, once in the logdir (no NaN, no report: a
                    program's own exit code, not a rollback)
    --save-steps N  the chief also checkpoints every N steps (default: none, save_model_secs=600 only),
                    and its steps take PACE s more until each of them is committed, as on a machine
                    whose disk keeps up: the tests' premise that a checkpoint committed before a worker
                    found a NaN holds on a loaded machine too (there, a commit landed 40 steps late,
                    after the group's rollback). A commit moves on at step boundaries only, so the
                    chief keeps stepping, slower, rather than waiting inside a step
    --exit-attempt A  --exit-at and --chief-dies-at apply only in the group's attempt A (PROCSV_ATTEMPT; default: any)
    --chief-dies-at N the chief ends at step N at once (os._exit(5): no checkpoint of its own on the way out), once;
                      N@A: in the group's attempt A only, whatever --exit-attempt says (repeatable: a run with
                      several deaths, each once)
    --max-to-keep N   the Supervisor's retention (default 5, the Supervisor's own)
    --compute-at N    the chief computes for --compute-secs S at step N of the group's first attempt, before the
                      step's collectives (an evaluation inside the loop): worker 1 waits for it there
    --compute-every M ... and every M steps after it, in every attempt
    --step-delay S    each member sleeps S after each step
    --deadlock-at N   worker 1 deadlocks at step N of the group's first attempt, in its own Python (a lock it
                      holds, taken again) before the step's collectives: its peer waits for it inside TensorFlow
    --workers-no-services  the workers prepare their session with ``start_standard_services=False`` (TF's
                    Supervisor runs its standard services on the chief alone: a TF1 program often says so)
    --times FILE    the chief appends "<step> <wall time>" to FILE after each step's run (a restarted group's
                    replay too; a skipped step writes nothing): scripts/bench_spike.py reads the course back
    --tail-secs T   worker 1 spends T s more inside the session once its loop ran to --steps (its program's own
                    wind-down: an input pipeline's teardown, a local eval): its session ends, and it checks the
                    losses it kept since its last check, T s after the chief's

The batch of step n is a function of n and the member's rank alone.
"""

import argparse
import os
import re
import threading
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import procsv  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--nan-at", type=int, action="append", default=[])
p.add_argument("--loss-nan-at", type=int, action="append", default=[])
p.add_argument("--skip-at", type=int, action="append", default=[])
p.add_argument("--spike-at", type=int, action="append", default=[])
p.add_argument("--steps", type=int, default=120)
p.add_argument("--exit-at", type=int, default=None)
p.add_argument("--save-steps", type=int, default=None)
p.add_argument("--exit-attempt", type=int, default=None)
p.add_argument("--chief-dies-at", action="append", default=[])
p.add_argument("--max-to-keep", type=int, default=5)
p.add_argument("--in-batch", action="store_true")
p.add_argument("--tail-secs", type=float, default=0.0)
p.add_argument("--deadlock-at", type=int, default=None)
p.add_argument("--compute-at", type=int, default=None)
p.add_argument("--compute-secs", type=float, default=0.0)
p.add_argument("--compute-every", type=int, default=0)
p.add_argument("--step-delay", type=float, default=0.0)
p.add_argument("--times", default=None)
p.add_argument("--workers-no-services", action="store_true")
args = p.parse_args()
SPIKE_SCALE = 1.4
PACE = 0.25  # seconds more per step of the chief while its newest checkpoint is not committed

keras.utils.set_random_seed(0)
tf.config.experimental.enable_op_determinism()
strategy = tf.distribute.MultiWorkerMirroredStrategy()
rank = procsv.cluster.rank()
times = open(args.times, "a", buffering=1) if args.times and rank == 0 else None  # (line-buffered)
with strategy.scope():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)])
    optimizer = keras.optimizers.SGD(0.05, momentum=0.9)
    optimizer.build(model.trainable_variables)
sv = procsv.Supervisor(checkpoint=tf.train.Checkpoint(model=model, optimizer=optimizer), save_model_secs=600,
                       save_checkpoint_steps=args.save_steps, max_to_keep=args.max_to_keep,
                       spike_thresholds=procsv.SpikeThresholds(window=20, min_history=20, z=6.0) if args.spike_at else None)


@tf.function
def train(x, y, term):  # type: ignore[no-untyped-def]
    def replica(x, y):  # type: ignore[no-untyped-def]
        with tf.GradientTape() as tape:
            loss = tf.nn.compute_average_loss(tf.square(model(x, training=True) - y)[:, 0], global_batch_size=16)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    per_replica = strategy.run(replica, args=(x, y))
    if args.spike_at:  # the group's loss, judged by the chief
        return {"loss": strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None) + term}
    local = strategy.experimental_local_results(per_replica)[0]
    return {"loss": local + term}  # the member's own loss, watched; ``term``: no gradient flows through it


def committed_step():  # type: ignore[no-untyped-def]
    path = tf.train.latest_checkpoint(sv.logdir) if sv.logdir else None
    found = re.search(r"-(\d+)$", path or "")
    return int(found.group(1)) if found else -1


def one_step():  # type: ignore[no-untyped-def]
    s = sv.step
    last_save = s // args.save_steps * args.save_steps if rank == 0 and args.save_steps else 0
    if last_save and committed_step() < last_save:
        time.sleep(PACE)  # its commit moves on at the step boundaries: steps, slower until it lands
    marker = os.path.join(sv.logdir or ".", "exited-at")
    attempt_ok = args.exit_attempt is None or os.environ.get("PROCSV_ATTEMPT") == str(args.exit_attempt)
    for point in args.chief_dies_at if rank == 0 else ():
        at, _, attempt = point.partition("@")
        died = f"{marker}-{point}" if attempt else marker  # (each death once)
        if s == int(at) and (os.environ.get("PROCSV_ATTEMPT") == attempt if attempt else attempt_ok) \
                and not os.path.exists(died):
            open(died, "w").close()
            os._exit(5)
    if rank == 1 and s == args.exit_at and attempt_ok and not os.path.exists(marker):
        open(marker, "w").close()
        raise SystemExit(5)
    again = args.compute_every and args.compute_at is not None and s > args.compute_at and \
        (s - args.compute_at) % args.compute_every == 0
    if rank == 0 and (again or (s == args.compute_at and os.environ.get("PROCSV_ATTEMPT") == "1")):
        print(f"group_local_nan: the chief computes at step {s} for {args.compute_secs:g} s", flush=True)
        until, x = time.monotonic() + args.compute_secs, 0
        while time.monotonic() < until:
            x = (x * 31 + 7) % 1000003
    if rank == 1 and s == args.deadlock_at and os.environ.get("PROCSV_ATTEMPT") == "1":
        print(f"group_local_nan: worker 1 deadlocks at step {s} at {time.time():.3f}", flush=True)
        stuck = threading.Lock()
        stuck.acquire()
        stuck.acquire()  # never returns
    if s in args.skip_at:
        return None
    xs = np.sin(np.arange(32, dtype=np.float32) * 0.37 + s * 1.3 + rank * 0.7).reshape(8, 4).astype(np.float32)
    ys = xs.sum(axis=1, keepdims=True) * 0.5 + 0.1
    if rank == 1 and s in args.spike_at:
        ys = ys * np.float32(SPIKE_SCALE)  # its squared error, and the group's loss, jump ~50x
    poisoned = rank == 1 and s in args.nan_at
    if poisoned and args.in_batch:
        xs = xs.copy()
        xs[0, 0] = np.nan  # the loss, its gradient and (all-reduced) every member's update turn NaN
    in_loss = (poisoned and not args.in_batch) or (rank == 1 and s in args.loss_nan_at)
    term = np.float32(np.nan) if in_loss else np.float32(0.0)
    out = train(xs, ys, tf.constant(term))
    if times is not None:
        times.write(f"{s} {time.time():.6f}\n")
    return out


with sv.managed_session(start_standard_services=rank == 0 or not args.workers_no_services) as sess:
    while not sv.should_stop() and sv.step < args.steps:
        sess.run(one_step)
        if args.step_delay:
            time.sleep(args.step_delay)
    if rank == 1 and args.tail_secs and sv.step >= args.steps:
        time.sleep(args.tail_secs)  # a worker's own end-of-loop work, inside the session
print(f"group_local_nan: ended at step {sv.step}", flush=True)
