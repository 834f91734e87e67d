"""A tiny training module whose state turns non-finite at given steps (issue 41).

    --nan-at N            the input of step N is NaN (repeatable): its loss, gradient, weights and
                          momentum turn NaN (with --how weights only the weights, the loss stays finite)
    --transient-nan-at N  transient faults, finite when retried (repeatable, in order): the input of the
                          first N is NaN the first time this process computes it; each next one's, the
                          first time it is computed after a rollback (a step not past the one before)
                          that followed the fault before it
    --skip-at N           step N does nothing (repeatable): the plain run that never applied step N
    --how H               return: the step returns its loss tensor; dict: returns {"loss": ..., "n": 1};
                          log: logs it with sv.log_scalar("loss", ...) and returns nothing;
                          weights: returns nothing, and sets the weights to NaN at --nan-at
    --steps N             train to step N
    --save-steps K        a checkpoint every K steps
    --policy P            Supervisor(on_nonfinite=P) (default: not given)
    --step-delay S        seconds each step sleeps (default 0.02: the checkpoint service keeps up)
    --input I             step: the input is computed from the step; iterator: it is the next element
                          of a tf.data iterator the checkpoint tracks (element k, taken at step k + 1, is
                          NaN for k + 1 in --nan-at; --skip-at takes and discards the element)
    --wait-checkpoint K   the first step past K waits (at most 120 s) until the checkpoint of step K is
                          committed (so that a slow first commit cannot hold every later one back;
                          repeatable, for each K in turn)
    --exit-at K           at step K, exit with --exit-code (default 5), once in the logdir: the
                          program's own exit code (a marker file keeps a restarted attempt going)
    --logdir DIR          for a plain `python nan_train.py` run
    --final-checkpoint P  for a plain run without --logdir: at the end, write the checkpoint's state and the step
                          (``global_step``, as procsv's) with TF's own ``tf.train.Checkpoint`` to the prefix P, named
                          P's folder's newest (``tf.train.latest_checkpoint``); no procsv service is started (with
                          --input iterator, a run with --logdir started a checkpoint service that loaded TensorFlow
                          for the iterator's state: about 2.4 s of CPU)

The input of step s is a function of s alone (1 + (s % 7) / 10), so a run is reproducible.
"""

import argparse
import os
import time
import types

import tensorflow as tf

import procsv

p = argparse.ArgumentParser()
p.add_argument("--nan-at", type=int, action="append", default=[])
p.add_argument("--transient-nan-at", type=int, action="append", default=[])
p.add_argument("--skip-at", type=int, action="append", default=[])
p.add_argument("--how", choices=["return", "dict", "log", "weights"], default="return")
p.add_argument("--steps", type=int, default=60)
p.add_argument("--save-steps", type=int, default=10)
p.add_argument("--policy", default=None)
p.add_argument("--step-delay", type=float, default=0.02)
p.add_argument("--input", choices=["step", "iterator"], default="step")
p.add_argument("--wait-checkpoint", type=int, action="append", default=[])
p.add_argument("--exit-at", type=int, default=None)
p.add_argument("--exit-code", type=int, default=5)
p.add_argument("--logdir", default=None)
p.add_argument("--final-checkpoint", default=None)
args = p.parse_args()

w = tf.Variable(tf.ones([4]), name="w")
m = tf.Variable(tf.zeros([4]), trainable=False, name="momentum")
low = tf.Variable(tf.fill([4], float("inf")), trainable=False, name="running_min")  # legitimately inf
state = {"w": w, "m": m, "low": low}
if args.input == "iterator":
    poisoned_at = tf.constant(args.nan_at + [-1], dtype=tf.int64)

    def element(k):
        x = tf.fill([4], 1.0 + tf.cast(k % 7, tf.float32) / 10)
        poisoned = tf.reduce_any(tf.equal(poisoned_at, k + 1))  # element k is taken at step k + 1
        return tf.where(poisoned, tf.fill([4], float("nan")), x)

    it = iter(tf.data.Dataset.range(1_000_000).map(element))
    state["input"] = it
sv = procsv.Supervisor(logdir=args.logdir, checkpoint=state, save_model_secs=600,
                       save_checkpoint_steps=args.save_steps, on_nonfinite=args.policy, nonfinite_ignore=("low",))


@tf.function
def train(x):
    err = w * x - 1.0
    m.assign(0.9 * m + 2.0 * err * x)
    w.assign_sub(0.01 * m)
    return tf.reduce_sum(err * err)


transient = types.SimpleNamespace(armed=True, last=None)  # --transient-nan-at: the first is due at once


def step():
    s = sv.step
    if s == args.exit_at and not os.path.exists(os.path.join(sv.layout.logdir, "exited-at")):
        open(os.path.join(sv.layout.logdir, "exited-at"), "w").close()
        raise SystemExit(args.exit_code)
    if args.wait_checkpoint and s > args.wait_checkpoint[0]:
        want = os.path.join(sv.layout.logdir, f"model.ckpt-{args.wait_checkpoint.pop(0)}.index")
        deadline = time.monotonic() + 120
        while not os.path.exists(want) and time.monotonic() < deadline:
            time.sleep(0.05)
    if s in args.skip_at:
        if args.input == "iterator":
            next(it)  # the plain run that never applied step s: its element is taken all the same
        return None
    if transient.last is not None and s <= transient.last:
        transient.armed = True  # a rollback: the next fault is due
    transient.last = s
    fault = transient.armed and args.transient_nan_at and s == args.transient_nan_at[0]
    if fault:
        args.transient_nan_at.pop(0)  # a retry of step s computes it finite
        transient.armed = False
    poisoned = s in args.nan_at or fault
    if args.input == "iterator":
        x = next(it)
    else:
        x = tf.fill([4], float("nan") if poisoned and args.how != "weights" else 1.0 + (s % 7) / 10)
    loss = train(x)
    time.sleep(args.step_delay)
    if args.how == "weights" and poisoned:
        w.assign(tf.fill([4], float("nan")))
    if args.how == "weights":
        return None  # no loss to watch: only the snapshot's check can see the NaN weights
    if args.how == "return":
        return loss
    if args.how == "dict":
        return {"loss": loss, "n": 1}
    sv.log_scalar("loss", loss)
    return None


with sv.managed_session() as sess:
    while not sv.should_stop() and sv.step < args.steps:
        sess.run(step)
if args.final_checkpoint:  # what procsv's final checkpoint holds: the state and the step (its global_step)
    final = tf.train.Checkpoint(**state, global_step=tf.Variable(sv.step, dtype=tf.int64))
    final.save_counter  # (created, as in procsv's checkpoint: the same keys)
    tf.compat.v1.train.update_checkpoint_state(os.path.dirname(args.final_checkpoint),
                                               final.write(args.final_checkpoint))
print(f"nan_train: ended at step {sv.step}", flush=True)
