"""A TF1 graph program that trains from threads (TF1's ``coord.join(threads)`` pattern): the main
thread starts two training threads on the managed session and waits in ``coord.join``; each thread
runs ``train_op`` until the global step reaches ``STEPS`` (a short pause per run, as a slow input
would make), then requests the stop. ``python graph_threads.py STEPS`` under ``procsv launch``;
prints ``final global step N`` after the join."""

from __future__ import annotations

import sys
import threading
import time

import tensorflow as tf

tf.compat.v1.disable_eager_execution()

import procsv  # noqa: E402

steps = int(sys.argv[1])
gs = tf.compat.v1.train.get_or_create_global_step()
w = tf.compat.v1.get_variable("w", initializer=1.0)
train_op = tf.compat.v1.train.GradientDescentOptimizer(0.01).minimize(w * w, global_step=gs)
sv = procsv.Supervisor(summary_op=None)


def train(sess: object, coord: object) -> None:
    with coord.stop_on_exception():  # type: ignore[attr-defined]
        while not coord.should_stop():  # type: ignore[attr-defined]
            _, step = sess.run([train_op, gs])  # type: ignore[attr-defined]
            if step >= steps:
                coord.request_stop()  # type: ignore[attr-defined]
            time.sleep(0.01)


with sv.managed_session() as sess:
    coord = sv.coord
    threads = [threading.Thread(target=train, args=(sess, coord)) for _ in range(2)]
    for t in threads:
        t.start()
    coord.join(threads)
    print(f"final global step {int(sess.run(gs))}", flush=True)
