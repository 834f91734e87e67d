"""A server task of ``procsv launch --ps N --workers M``: one ``tf.distribute.Server``.

Runs in its own process, started by the watchdog's executor and supervised like every other child;
the program writes no server code. A parameter server (role ``ps``, slots ``ps0`` ...
``ps<N-1>``), and with ``--coordinator`` (TF2 ``ParameterServerStrategy``) each worker too (role
``server``, slots ``worker0`` ... ``worker<M-1>``): the job name is ``TF_CONFIG``'s task type
(``{"task": {"type": "ps", "index": i}}`` or ``"worker"``). It starts the server on the port procsv
chose and serves until SIGTERM or SIGINT, then exits 0. A parameter server's variables live only in
this process: when it dies they are lost, and the chief restores the newest checkpoint into the
restarted one (``docs/parameter-servers.md``). A worker server holds no state of the model.
"""

from __future__ import annotations

import os
import signal
import sys

from procsv import cluster

JOBS = ("ps", "worker")


def main() -> int:
    cfg = cluster.tf_config()
    task = cfg.get("task")
    if not isinstance(task, dict) or task.get("type") not in JOBS or not isinstance(cfg.get("cluster"), dict):
        print(f"procsv ps: TF_CONFIG names no ps or worker task ({cfg!r}); a server task is started by "
              "procsv launch --ps N --workers M", file=sys.stderr, flush=True)
        return 2
    stop = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop)  # waited for below, before TensorFlow's threads start
    import tensorflow as tf

    job, index = str(task["type"]), int(task.get("index", 0))
    server = tf.distribute.Server(cluster.cluster_spec(), job_name=job, task_index=index, start=True)
    print(f"procsv ps: task {job}{index} serving at {server.target}", flush=True)
    _hello(job, index)
    signum = signal.sigwait(stop)
    print(f"procsv ps: task {job}{index} stopping ({signal.Signals(signum).name})", flush=True)
    return 0


def _hello(job: str, index: int) -> None:
    """Tell the watchdog the server is up (its ``status`` entry turns ``running``); best effort."""
    from procsv.common.bootstrap import ChildContext

    ctx = ChildContext.from_env()
    if ctx is None or not ctx.supervised:
        return
    import zmq

    from procsv.ipc.messages import Hello, Role
    from procsv.ipc.transport import make_socket, send

    zctx = zmq.Context()
    sock = make_socket(zctx, zmq.PUSH, linger_ms=1000)
    sock.connect(ctx.endpoints.watchdog)
    send(sock, Hello(Role.PS if job == "ps" else Role.SERVER, os.getpid(), ctx.attempt, slot=f"{job}{index}"))
    sock.close()  # (lingers up to 1 s to deliver it)
    zctx.term()


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # not the interpreter's exit: the server's threads never end on their own
