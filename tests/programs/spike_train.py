"""A tiny custom training loop whose loss spikes at given steps (issue 68's loss spikes).

    --spike-at N          the batch of step N is scaled by --scale (inputs and targets): its loss jumps
                          about scale**2 times (repeatable)
    --scale S             the spike's scale (default 7: the loss jumps ~50x)
    --transient-at N      as --spike-at, the first time this process runs step N only (a fault of the
                          machine: a replay of step N computes it right)
    --skip-at N           step N does nothing (repeatable): the plain run that never applied step N
    --steps N             train to step N
    --save-steps K        a checkpoint every K steps
    --on-spike P          Supervisor(on_spike=P) (default: not given)
    --window W, --min-history H
                          the spike rule's window and minimum history (procsv.SpikeThresholds)
    --step-delay S        seconds each step sleeps (default 0.01)
    --monitored           run the loop as a procsv.train MonitoredTrainingSession (eager; StopAtStepHook at
                          --steps, its step function's returned loss watched): --on-spike through
                          PROCSV_ON_SPIKE then (it takes no on_spike argument), the rule's defaults
    --logdir DIR          for a plain `python spike_train.py` run
    --times FILE          append "<step> <wall time>" to FILE after each step's run (replays too; a
                          skipped step writes nothing): scripts/bench_spike.py reads the course back

The batch of step s is a function of s alone (32 examples of 4 features and a noisy linear target,
drawn from a NumPy generator seeded with s), so a run is reproducible; its loss is noisy from batch
to batch (the target's noise keeps it from falling to 0), as a real loop's is. A linear model
trained with SGD and momentum.
"""

import argparse
import time

import numpy as np
import tensorflow as tf

import procsv

p = argparse.ArgumentParser()
p.add_argument("--spike-at", type=int, action="append", default=[])
p.add_argument("--scale", type=float, default=7.0)
p.add_argument("--transient-at", type=int, action="append", default=[])
p.add_argument("--skip-at", type=int, action="append", default=[])
p.add_argument("--steps", type=int, default=90)
p.add_argument("--save-steps", type=int, default=10)
p.add_argument("--on-spike", default=None)
p.add_argument("--window", type=int, default=40)
p.add_argument("--min-history", type=int, default=30)
p.add_argument("--step-delay", type=float, default=0.01)
p.add_argument("--monitored", action="store_true")
p.add_argument("--logdir", default=None)
p.add_argument("--times", default=None)
args = p.parse_args()
times = open(args.times, "a", buffering=1) if args.times else None  # (line-buffered: a kill loses no whole line)

TRUE_W = np.array([0.5, -1.0, 2.0, 0.25], dtype=np.float32)
w = tf.Variable(tf.zeros([4]), name="w")
m = tf.Variable(tf.zeros([4]), trainable=False, name="momentum")
if not args.monitored:
    sv = procsv.Supervisor(logdir=args.logdir, checkpoint={"w": w, "m": m}, save_model_secs=600,
                           save_checkpoint_steps=args.save_steps, on_spike=args.on_spike,
                           spike_thresholds=procsv.SpikeThresholds(window=args.window, min_history=args.min_history))


ran: set[int] = set()  # the steps this process ran (--transient-at)


def batch(s: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(s)
    x = rng.normal(size=(32, 4)).astype(np.float32)
    y = (x @ TRUE_W + rng.normal(scale=0.5, size=32)).astype(np.float32)
    if s in args.spike_at or (s in args.transient_at and s not in ran):
        x, y = x * args.scale, y * args.scale
    ran.add(s)
    return x, y


@tf.function
def train(x, y):
    err = tf.linalg.matvec(x, w) - y
    loss = tf.reduce_mean(err * err)
    grad = 2.0 * tf.linalg.matvec(x, err, transpose_a=True) / 32.0
    m.assign(0.9 * m + grad)
    w.assign_sub(0.005 * m)
    return loss


def step():
    s = int(procsv.train.get_global_step().numpy()) + 1 if args.monitored else sv.step
    if s in args.skip_at:
        return None
    loss = train(*batch(s))
    if times is not None:
        times.write(f"{s} {time.time():.6f}\n")
    time.sleep(args.step_delay)
    return loss


if args.monitored:
    with procsv.train.MonitoredTrainingSession(
            checkpoint_dir=args.logdir, checkpoint={"w": w, "m": m}, save_checkpoint_steps=args.save_steps,
            hooks=[procsv.train.StopAtStepHook(last_step=args.steps)], log_step_count_steps=None) as mon:
        while not mon.should_stop():
            mon.run(step)
    print(f"spike_train: ended at step {int(procsv.train.get_global_step().numpy())}", flush=True)
else:
    with sv.managed_session() as sess:
        while not sv.should_stop() and sv.step < args.steps:
            sess.run(step)
    print(f"spike_train: ended at step {sv.step}", flush=True)
