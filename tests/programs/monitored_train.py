"""A tiny procsv.train program for launch tests: MonitoredTrainingSession + StopAtStepHook.

    --num-steps N / --last-step N   the StopAtStepHook
    --step-delay S                  sleep per step
    --save-steps N                  checkpoint every N steps
    --nan-at-step N                 the loss becomes NaN from this global step on (NanTensorHook)
"""

import argparse
import time

import tensorflow as tf

from procsv import train

p = argparse.ArgumentParser()
p.add_argument("--num-steps", type=int, default=None)
p.add_argument("--last-step", type=int, default=None)
p.add_argument("--step-delay", type=float, default=0.01)
p.add_argument("--save-steps", type=int, default=20)
p.add_argument("--nan-at-step", type=int, default=0)
args = p.parse_args()

weights = tf.Variable(tf.zeros([4]))


loss = tf.Variable(1.0)


def step():
    weights.assign_add(tf.ones([4]))
    if args.nan_at_step and int(train.get_global_step().numpy()) >= args.nan_at_step:
        loss.assign(float("nan"))
    time.sleep(args.step_delay)


hook = train.StopAtStepHook(num_steps=args.num_steps, last_step=args.last_step)
hooks = [hook, train.NanTensorHook(loss)] if args.nan_at_step else [hook]
with train.MonitoredTrainingSession(checkpoint={"weights": weights}, hooks=hooks,
                                    save_checkpoint_steps=args.save_steps, log_step_count_steps=None) as sess:
    print(f"monitored_train: starts at step {int(train.get_global_step().numpy())}, stops at {hook.last_step}",
          flush=True)
    while not sess.should_stop():
        sess.run(step)
print(f"monitored_train: done at step {int(train.get_global_step().numpy())}, weights {weights.numpy()[0]:g}",
      flush=True)
