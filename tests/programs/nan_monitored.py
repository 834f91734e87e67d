"""A procsv.train program (eager MonitoredTrainingSession) whose loss turns NaN at given steps (issue 41).

    --nan-at N      the input of step N is NaN (repeatable): its loss, weights and momentum turn NaN
    --skip-at N     step N does nothing (repeatable): the plain run that never applied step N
    --steps N       StopAtStepHook(last_step=N)
    --logdir DIR    the checkpoint_dir of a plain `python nan_monitored.py` run
    --final-checkpoint P  for a plain run without --logdir: at the end, write the checkpoint's state and the
                    global step with TF's own ``tf.train.Checkpoint`` to the prefix P, named P's folder's newest
                    (``tf.train.latest_checkpoint``); no procsv service is started

The loss is watched by a NanTensorHook on a variable the step assigns (the step returns nothing).
The input of step s is a function of s alone, so a run is reproducible. Checkpoints every 10 steps.
"""

import argparse
import os
import time

import tensorflow as tf

from procsv import train

p = argparse.ArgumentParser()
p.add_argument("--nan-at", type=int, action="append", default=[])
p.add_argument("--skip-at", type=int, action="append", default=[])
p.add_argument("--steps", type=int, default=40)
p.add_argument("--logdir", default=None)
p.add_argument("--final-checkpoint", default=None)
args = p.parse_args()

w = tf.Variable(tf.ones([4]), name="w")
m = tf.Variable(tf.zeros([4]), trainable=False, name="momentum")
loss = tf.Variable(0.0, trainable=False, name="loss")


@tf.function
def train_step(x):
    err = w * x - 1.0
    m.assign(0.9 * m + 2.0 * err * x)
    w.assign_sub(0.01 * m)
    loss.assign(tf.reduce_sum(err * err))


def step():
    s = int(train.get_global_step().numpy()) + 1  # the step this run completes
    if s in args.skip_at:
        return
    train_step(tf.fill([4], float("nan") if s in args.nan_at else 1.0 + (s % 7) / 10))
    time.sleep(0.03)


hooks = [train.StopAtStepHook(last_step=args.steps), train.NanTensorHook(loss)]
with train.MonitoredTrainingSession(checkpoint_dir=args.logdir, checkpoint={"w": w, "m": m}, hooks=hooks,
                                    save_checkpoint_steps=10, log_step_count_steps=None) as sess:
    while not sess.should_stop():
        sess.run(step)
if args.final_checkpoint:  # what procsv's final checkpoint holds: the state and the global step
    final = tf.train.Checkpoint(w=w, m=m, global_step=train.get_global_step())
    final.save_counter  # (created, as in procsv's checkpoint: the same keys)
    tf.compat.v1.train.update_checkpoint_state(os.path.dirname(args.final_checkpoint),
                                               final.write(args.final_checkpoint))
print(f"nan_monitored: done at step {int(train.get_global_step().numpy())}", flush=True)
