"""A parameter-server task of ``procsv launch --ps N --workers M``: one ``tf.distribute.Server``.

Runs in its own process (role ``ps``, slots ``ps0`` ... ``ps<N-1>``), started by the watchdog's
executor and supervised like every other child; the program writes no parameter-server code. It
reads its task from ``TF_CONFIG`` (``{"task": {"type": "ps", "index": i}}``), starts the server on
the port procsv chose and serves until SIGTERM or SIGINT, then exits 0. Its variables live only in
this process: when it dies they are lost, and the chief restores the newest checkpoint into the
restarted one (``docs/parameter-servers.md``).
"""

from __future__ import annotations

import os
import signal
import sys

from procsv import cluster


def main() -> int:
    cfg = cluster.tf_config()
    task = cfg.get("task")
    if not isinstance(task, dict) or task.get("type") != "ps" or not isinstance(cfg.get("cluster"), dict):
        print(f"procsv ps: TF_CONFIG names no ps task ({cfg!r}); a parameter server is started by "
              "procsv launch --ps N --workers M", file=sys.stderr, flush=True)
        return 2
    stop = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop)  # waited for below, before TensorFlow's threads start
    import tensorflow as tf

    index = int(task.get("index", 0))
    server = tf.distribute.Server(cluster.cluster_spec(), job_name="ps", task_index=index, start=True)
    print(f"procsv ps: task ps{index} serving at {server.target}", flush=True)
    signum = signal.sigwait(stop)
    print(f"procsv ps: task ps{index} stopping ({signal.Signals(signum).name})", flush=True)
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # not the interpreter's exit: the server's threads never end on their own
