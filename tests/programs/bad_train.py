"""A tiny training module that misbehaves in the ways a user's program does (tests/test_bad_input.py).

    --steps N             total steps (default 100)
    --step-delay S        sleep per step
    --save-steps N        checkpoint every N steps
    --units U             size of the one weight vector (a changed size: a checkpoint of another model)
    --no-checkpoint       Supervisor(checkpoint=None)
    --ignore-sigterm      ignore SIGTERM once training runs (the watchdog must SIGKILL after its grace)
    --nan                 log loss = NaN and +inf / -inf at every step (besides a finite scalar)
    --big-image           log a 100 MB image at step 2 (refused at the call), then go on
    --spawn-child FILE    start a plain child process (no setsid) that sleeps; write its pid to FILE
"""

import argparse
import os
import signal
import subprocess
import sys
import time

import numpy as np
import tensorflow as tf

import procsv

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=100)
p.add_argument("--step-delay", type=float, default=0.01)
p.add_argument("--save-steps", type=int, default=None)
p.add_argument("--units", type=int, default=4)
p.add_argument("--no-checkpoint", action="store_true")
p.add_argument("--ignore-sigterm", action="store_true")
p.add_argument("--nan", action="store_true")
p.add_argument("--big-image", action="store_true")
p.add_argument("--spawn-child", default=None, metavar="FILE")
args = p.parse_args()

weights = tf.Variable(tf.zeros([args.units]), name="weights")
if args.spawn_child:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    with open(args.spawn_child + ".tmp", "w") as fh:
        fh.write(f"{child.pid}\n")
    os.replace(args.spawn_child + ".tmp", args.spawn_child)
sv = procsv.Supervisor(checkpoint=None if args.no_checkpoint else {"weights": weights}, save_model_secs=None,
                       save_checkpoint_steps=args.save_steps, save_summaries_secs=None)


def step():
    weights.assign_add(tf.ones([args.units]))
    time.sleep(args.step_delay)


with sv.managed_session() as sess:
    print(f"bad: starts at step {sv.step}", flush=True)
    if args.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print("bad: ignoring SIGTERM from now on", flush=True)
    while not sv.should_stop() and sv.step < args.steps:
        sess.run(step)
        sv.log_scalar("ok", float(sv.step))
        if args.nan:
            sv.log_scalars({"loss": float("nan"), "up": float("inf"), "down": float("-inf")})
        if args.big_image and sv.step == 2:
            try:
                sv.log_image("huge", np.zeros([1, 5000, 5000, 4], dtype=np.uint8))
            except ValueError as exc:
                print(f"bad: log_image refused: {exc}", flush=True)
print(f"bad: done at step {sv.step}", flush=True)
