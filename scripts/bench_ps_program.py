"""The train program of ``scripts/bench_ps.py``: the replicas example's graph, each completed step recorded.

Runs as every worker task of the benchmark's parameter-server cluster: under ``procsv launch
scripts/bench_ps_program.py --ps 2 --workers 3`` (``procsv.Supervisor``, ``procsv.cluster``), or,
with ``--plain``, as TensorFlow's own ``tf.compat.v1.train.Supervisor`` on a
``tf.distribute.Server`` built from ``TF_CONFIG`` (what the benchmark's plain restart loop runs).
The graph is :mod:`procsv.examples.seeds_tf1.model`'s (variables on the parameter servers through
``replica_device_setter``, ``--step-delay`` seconds of sleep in each train op). After each step it
appends ``<wall time> <pid> <global step>`` to ``<--record-dir>/w<task>.steps`` (a line per step,
flushed), which the benchmark reads for its MTTRs, throughput and steps lost.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any, Optional, Sequence


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description="the benchmark's worker program")
    p.add_argument("--steps", type=int, default=10 ** 9)
    p.add_argument("--save-model-secs", type=float, default=2.0)
    p.add_argument("--step-delay", type=float, default=0.05)
    p.add_argument("--record-dir", required=True)
    p.add_argument("--logdir", default=None)
    p.add_argument("--plain", action="store_true", help="TensorFlow's own Supervisor (no procsv)")
    flags = p.parse_args(argv)
    import tensorflow as tf

    from procsv.examples.seeds_tf1 import model

    tf.compat.v1.disable_eager_execution()
    cfg = json.loads(os.environ["TF_CONFIG"])
    index = int(cfg["task"]["index"])
    cluster = tf.train.ClusterSpec(cfg["cluster"])
    if flags.plain:
        server: Any = tf.distribute.Server(cluster, job_name="worker", task_index=index, start=True)
        master, supervisor = server.target, tf.compat.v1.train.Supervisor
    else:
        import procsv
        import procsv.cluster

        master, supervisor = procsv.cluster.server_target(), procsv.Supervisor
    logdir = flags.logdir or os.environ.get("PROCSV_LOGDIR")
    record = open(os.path.join(flags.record_dir, f"w{index}.steps"), "a", buffering=1)
    with tf.Graph().as_default():
        with tf.compat.v1.device(tf.compat.v1.train.replica_device_setter(cluster=cluster)):
            m = model.build(flags.step_delay)
        sv = supervisor(logdir=logdir, is_chief=index == 0, save_model_secs=flags.save_model_secs)
        with sv.managed_session(master) as sess:
            pid = os.getpid()
            while not sv.should_stop():
                sess.run(m.train_op)
                step = sess.run(m.global_step)
                record.write(f"{time.time():.4f} {pid} {step}\n")
                if step >= flags.steps:
                    break
    return 0


if __name__ == "__main__":
    sys.exit(main())
