"""The Supervisor page's "Use for multiple replicas", as a TF1 graph program under procsv.

The seed::

    # Choose a task as the chief. This could be based on server_def.task_index,
    # or job_def.tasks. It's entirely up to the end user.
    # But there can be only one *chief*.
    is_chief = (server_def.task_index == 0)
    server = tf.distribute.Server(server_def)

    with tf.Graph().as_default():
      ...add operations to the graph...
      # Create a Supervisor that uses log directory on a shared file system.
      # Indicate if you are the 'chief'
      sv = Supervisor(logdir='/shared_directory/...', is_chief=is_chief)
      # Get a Session in a TensorFlow server on the cluster.
      with sv.managed_session(server.target) as sess:
        # Use the session to train the graph.
        while not sv.should_stop():
          sess.run(<my_train_op>)

Run: ``procsv launch procsv.examples.seeds_tf1.replicas --ps 1 --workers 2 --logdir DIR -- --steps
1000``. procsv starts the parameter server (the program has no parameter-server code) and runs this
program as each worker, worker 0 the chief, each with its ``TF_CONFIG``: the seed's ``server_def``
is :func:`procsv.cluster.cluster_spec` and this task's index, and ``server.target`` is
:func:`procsv.cluster.server_target` (this worker's own ``tf.distribute.Server``, started once). The
graph is :mod:`.model`'s, its variables placed on the parameter servers by
``tf.compat.v1.train.replica_device_setter`` (what "...add operations to the graph..." means in a
cluster); the loop also ends at ``--steps``. Alone (plain ``python``, no ``TF_CONFIG``) it is the
single program, its own chief, as the seed page's NOTE says.
"""

from __future__ import annotations

import sys
from typing import Optional, Sequence

import tensorflow as tf

import procsv.cluster
from procsv import Supervisor
from procsv.examples.seeds_tf1 import model


def main(argv: Optional[Sequence[str]] = None) -> int:
    tf.compat.v1.disable_eager_execution()
    FLAGS = model.flags(__doc__, argv)
    # Choose a task as the chief: worker 0, as the seed's server_def.task_index == 0.
    is_chief = procsv.cluster.is_chief()
    master = procsv.cluster.server_target()  # server = tf.distribute.Server(server_def); server.target
    with tf.Graph().as_default():
        cluster = procsv.cluster.cluster_spec() if master else None
        with tf.compat.v1.device(tf.compat.v1.train.replica_device_setter(cluster=cluster)):
            m = model.build(FLAGS.step_delay)  # ...add operations to the graph...
        # A Supervisor on the shared logdir; only the chief initializes, checkpoints and recovers.
        sv = Supervisor(logdir=FLAGS.logdir, is_chief=is_chief, save_model_secs=FLAGS.save_model_secs)
        # Get a Session in a TensorFlow server on the cluster.
        with sv.managed_session(master) as sess:
            # Use the session to train the graph.
            while not sv.should_stop() and sess.run(m.global_step) < FLAGS.steps:
                sess.run(m.train_op)
            print(f"replicas: task {procsv.cluster.rank()} finished at step {sess.run(m.global_step)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
