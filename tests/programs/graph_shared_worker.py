"""A TF1 graph chief and a worker that share the chief's variables on the chief's server, outside ``--ps``.

``python graph_shared_worker.py chief DIR``: starts an in-process ``tf.distribute.Server``, writes
its target to ``DIR/target``, trains 4 steps under ``procsv.Supervisor(is_chief=True)`` in a session
on that server, writes ``DIR/chief-at-4``, waits (bounded) for ``DIR/worker-done``, then prints the
global step it sees and stops. ``python graph_shared_worker.py worker DIR [MAX_WAIT]``: the same
graph under ``procsv.Supervisor(is_chief=False)``, a session on the target in ``DIR/target``
(``prepare_or_wait_for_session(max_wait_secs=MAX_WAIT)``), prints the global step it starts at,
runs one step, prints the step after it and writes ``DIR/worker-done``. The lines are
``chief sees step N``, ``worker starts at step N``, ``worker ends at step N``.
"""

from __future__ import annotations

import os
import sys
import time

import tensorflow as tf

tf.compat.v1.disable_eager_execution()

import procsv  # noqa: E402


def _model() -> tuple[object, object]:
    gs = tf.compat.v1.train.get_or_create_global_step()
    w = tf.compat.v1.get_variable("w", initializer=1.0)
    return gs, tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(w * w, global_step=gs)


def _touch(path: str, text: str = "") -> None:
    with open(path + ".tmp", "w") as fh:
        fh.write(text)
    os.rename(path + ".tmp", path)


def chief(folder: str) -> None:
    server = tf.distribute.Server.create_local_server()
    gs, train = _model()
    sv = procsv.Supervisor(logdir=os.path.join(folder, "chief"), summary_op=None)
    with sv.managed_session(server.target) as sess:
        for _ in range(4):
            sess.run(train)
        _touch(os.path.join(folder, "target"), server.target)
        _touch(os.path.join(folder, "chief-at-4"))
        deadline = time.monotonic() + 240
        while not os.path.exists(os.path.join(folder, "worker-done")) and time.monotonic() < deadline:
            time.sleep(0.05)
        print(f"chief sees step {int(sess.run(gs))}", flush=True)
        sv.request_stop()


def worker(folder: str, max_wait: float) -> None:
    with open(os.path.join(folder, "target")) as fh:
        target = fh.read()
    gs, train = _model()
    sv = procsv.Supervisor(logdir=os.path.join(folder, "worker"), summary_op=None, is_chief=False)
    sess = sv.prepare_or_wait_for_session(target, max_wait_secs=max_wait)
    print(f"worker starts at step {int(sess.run(gs))}", flush=True)
    sess.run(train)
    print(f"worker ends at step {int(sess.run(gs))}", flush=True)
    sv.stop()
    _touch(os.path.join(folder, "worker-done"))


if __name__ == "__main__":
    if sys.argv[1] == "chief":
        chief(sys.argv[2])
    else:
        worker(sys.argv[2], float(sys.argv[3]) if len(sys.argv) > 3 else 7200)
