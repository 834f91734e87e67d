"""A program whose data stream drops its connection after a fixed number of batches.

Its input is read from a stream that serves ``--batches-per-connection`` batches per connection, then
resets it (a server-side quota, a load balancer's idle timeout counted in requests): every attempt
fails with the same ``ConnectionResetError`` at the same line after the same number of steps. The
program indexes its data by the global step and stops at ``--steps``, and checkpoints every
``--save-steps``: each attempt trains further, and the run ends after a few restarts
(tests/test_attack_restart.py)."""

import argparse
import time

import tensorflow as tf

import procsv

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=100)
p.add_argument("--save-steps", type=int, default=10)
p.add_argument("--batches-per-connection", type=int, default=20)
p.add_argument("--step-delay", type=float, default=0.01)
args = p.parse_args()


class Stream:
    """One connection to the data service."""

    def __init__(self) -> None:
        self.served = 0

    def batch(self, step: int) -> tf.Tensor:
        if self.served == args.batches_per_connection:
            raise ConnectionResetError(104, "Connection reset by peer")
        self.served += 1
        return tf.fill([4], float(step % 7))


w = tf.Variable(tf.zeros([4]))
sv = procsv.Supervisor(checkpoint={"w": w}, save_checkpoint_steps=args.save_steps)
stream = Stream()
with sv.managed_session() as sess:
    print(f"stream_drops: starts at step {sv.step}", flush=True)
    while not sv.should_stop() and sv.step < args.steps:
        x = stream.batch(sv.step)
        sess.run(lambda: w.assign_add(x))
        time.sleep(args.step_delay)
print(f"stream_drops: done at step {sv.step}", flush=True)
