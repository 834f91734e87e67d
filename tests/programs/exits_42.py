"""A training module that exits with 42 itself, as a program that borrowed the "restart me" code
would (no stop signal reached it): ``--how sys`` trains to ``--steps``, commits its final
checkpoint, then calls ``sys.exit(42)``; ``--how os`` calls ``os._exit(42)`` inside a step (no
checkpoint of that step). procsv must count either as a failure, not as a preemption."""

import argparse
import os
import sys

import tensorflow as tf

import procsv

p = argparse.ArgumentParser()
p.add_argument("--how", choices=["sys", "os"], required=True)
p.add_argument("--steps", type=int, default=5)
args = p.parse_args()

weights = tf.Variable(tf.zeros([4]))
sv = procsv.Supervisor(checkpoint={"weights": weights}, save_model_secs=600)


def step():
    weights.assign_add(tf.ones([4]))
    if args.how == "os" and sv.step == args.steps:
        print(f"exits_42: os._exit(42) in step {sv.step}", flush=True)
        os._exit(42)


with sv.managed_session() as sess:
    while not sv.should_stop() and sv.step < args.steps:
        sess.run(step)
print(f"exits_42: sys.exit(42) at step {sv.step}", flush=True)
sys.exit(42)
