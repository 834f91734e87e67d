"""A TF1 program that starts its own ``tf.train.Server`` before its Supervisor, as TensorFlow's
mnist_replica does (between-graph replication: each task serves on the port its cluster names), and
runs its session on that server's target (tests/test_standby_own_server.py).

    --port P --steps N --step-delay S --logdir DIR
    --at-exit FILE   an atexit handler, registered before the server, appends "atexit <pid>" to FILE
    --ballast-mb M   M MiB held once the server is up, as a real trainer's weights and buffers are: its teardown
                     after a SIGKILL, which releases the port last, takes ~0.1 s per GiB
"""

import argparse
import time

import tensorflow as tf

import procsv

p = argparse.ArgumentParser()
p.add_argument("--port", type=int, required=True)
p.add_argument("--steps", type=int, default=200)
p.add_argument("--step-delay", type=float, default=0.02)
p.add_argument("--logdir", default=None)
p.add_argument("--at-exit", default=None)
p.add_argument("--ballast-mb", type=int, default=0)
args = p.parse_args()

if args.at_exit:  # the program's end: a hot standby that ends before its promotion never runs it
    import atexit
    import os

    def note() -> None:
        with open(args.at_exit, "a") as fh:
            fh.write(f"atexit {os.getpid()}\n")

    atexit.register(note)

tf.compat.v1.disable_eager_execution()
cluster = tf.train.ClusterSpec({"worker": [f"localhost:{args.port}"]})
server = tf.distribute.Server(cluster, job_name="worker", task_index=0)  # the port only one process may hold
ballast = bytearray(b"\1") * (args.ballast_mb << 20)  # (every page written: the kernel frees each at the end)
with tf.Graph().as_default():
    w = tf.compat.v1.Variable(0.0, name="w")
    gs = tf.compat.v1.train.get_or_create_global_step()
    train = tf.group(w.assign_add(1.0), gs.assign_add(1))
    sv = procsv.Supervisor(logdir=args.logdir, is_chief=True, save_model_secs=1)
    with sv.managed_session(server.target) as sess:
        while not sv.should_stop() and sess.run(gs) < args.steps:
            sess.run(train)
            time.sleep(args.step_delay)
        print(f"own_server: finished at step {sess.run(gs)}", flush=True)
