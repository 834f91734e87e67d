"""A TF1 graph program under procsv.Supervisor whose loss turns NaN at given steps (issue 41).

    --nan-at N      the batch of step N is NaN (repeatable): its loss, weights and momentum turn NaN
    --skip-at N     step N trains nothing, only advances the global step (repeatable): the plain run
                    that never applied step N
    --steps N       train until the global step is N
    --logdir DIR    for a plain `python nan_graph.py` run
    --final-checkpoint P  for a plain run without --logdir: at the end, save the variables with TF's own
                    ``tf.compat.v1.train.Saver`` to P-<global step> (P's folder's newest); no procsv service is started

Each run fetches [train_op, loss] (the loss tensor is named "loss": procsv watches it) with the
batch of the step it makes, read from the global step before the run, so the input is a function
of the step and a rollback's restored global step replays the same batches. Checkpoints every 10 steps.
"""

import argparse
import os
import time

import tensorflow as tf

import procsv

p = argparse.ArgumentParser()
p.add_argument("--nan-at", type=int, action="append", default=[])
p.add_argument("--skip-at", type=int, action="append", default=[])
p.add_argument("--steps", type=int, default=40)
p.add_argument("--logdir", default=None)
p.add_argument("--final-checkpoint", default=None)
args = p.parse_args()

tf.compat.v1.disable_eager_execution()
graph = tf.Graph()
with graph.as_default():
    gs = tf.compat.v1.train.get_or_create_global_step()
    x = tf.compat.v1.placeholder(tf.float32, [4], name="x")
    w = tf.compat.v1.get_variable("w", initializer=tf.ones([4]))
    err = w * x - 1.0
    loss = tf.reduce_sum(err * err, name="loss")
    train_op = tf.compat.v1.train.MomentumOptimizer(0.01, 0.9).minimize(loss, global_step=gs)
    skip_op = tf.compat.v1.assign_add(gs, 1)
    final = tf.compat.v1.train.Saver() if args.final_checkpoint else None
    sv = procsv.Supervisor(logdir=args.logdir, summary_op=None, save_model_secs=600, save_checkpoint_steps=10)
    with sv.managed_session() as sess:
        while not sv.should_stop():
            s = int(sess.run(gs)) + 1  # the step the next run makes
            if s > args.steps:
                break
            if s in args.skip_at:
                sess.run(skip_op)
                continue
            batch = [float("nan")] * 4 if s in args.nan_at else [1.0 + (s % 7) / 10] * 4
            sess.run([train_op, loss], feed_dict={x: batch})
            time.sleep(0.03)
        if final is not None:  # what procsv's final checkpoint holds, by TF's own Saver
            os.makedirs(os.path.dirname(args.final_checkpoint), exist_ok=True)
            final.save(sess, args.final_checkpoint, global_step=gs)
print(f"nan_graph: done at step {s - 1}", flush=True)
