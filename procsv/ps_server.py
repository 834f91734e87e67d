"""A server task of ``procsv launch --ps N --workers M``: one ``tf.distribute.Server``.

Runs in its own process, started by the watchdog's executor and supervised like every other child;
the program writes no server code. A parameter server (role ``ps``, slots ``ps0`` ...
``ps<N-1>``), and with ``--coordinator`` (TF2 ``ParameterServerStrategy``) each worker too (role
``server``, slots ``worker0`` ... ``worker<M-1>``): the job name is ``TF_CONFIG``'s task type
(``{"task": {"type": "ps", "index": i}}`` or ``"worker"``). It starts the server on the port procsv
chose and serves until SIGTERM or SIGINT from the process that started it, then exits 0. A parameter
server's variables live only in
this process: when it dies they are lost, and the chief restores the newest checkpoint into the
restarted one (``docs/parameter-servers.md``). A worker server holds no state of the model.

A stop is its supervisor's to give (:mod:`procsv.common.stopfrom`, as in the services and the
zygote): the stop signals are blocked from the start and read with their senders, and only the
process that started the task (``PROCSV_SUPERVISOR_PID``: the watchdog or a node agent, also when
the zygote forked the task) or anyone once that is gone stops it. A job-wide SIGTERM (Slurm's
``scancel``, systemd's ``KillMode=control-group``) would otherwise end the parameter servers first,
and the chief's emergency checkpoint, which reads their variables, would block in gRPC until the
grace ran out; the watchdog stops the servers last, once the chief committed.
"""

from __future__ import annotations

import gc
import os
import select
import signal
import sys
from typing import Optional

from procsv import cluster
from procsv.common import bootstrap, stopfrom

JOBS = ("ps", "worker")


def main() -> int:
    cfg = cluster.tf_config()
    task = cfg.get("task")
    if not isinstance(task, dict) or task.get("type") not in JOBS or not isinstance(cfg.get("cluster"), dict):
        print(f"procsv ps: TF_CONFIG names no ps or worker task ({cfg!r}); a server task is started by "
              "procsv launch --ps N --workers M", file=sys.stderr, flush=True)
        return 2
    stopfrom.block()  # read below with their senders; before TensorFlow's threads start (they inherit the mask)
    config = bootstrap.read_config()  # once: whose stops it obeys, whom it tells it is up
    authority = supervisor(config)
    # the import with the cyclic collector off, as the zygote's (procsv.zygote.__main__): its objects outlive
    # it, and the collector visiting them again and again was a tenth to a fifth of the import's CPU, in each
    # server started fresh (a --coordinator job's restarted ones; any one while the pre-warmed trainer is not ready)
    gc.disable()
    try:
        import tensorflow as tf
    finally:
        gc.enable()

    job, index = str(task["type"]), int(task.get("index", 0))
    server = tf.distribute.Server(cluster.cluster_spec(), job_name=job, task_index=index, start=True)
    print(f"procsv ps: task {job}{index} serving at {server.target}", flush=True)
    _hello(job, index, bootstrap.ChildContext.from_config(config))
    name = wait_for_stop(authority, f"procsv ps: task {job}{index}")
    print(f"procsv ps: task {job}{index} stopping ({name})", flush=True)
    return 0


def supervisor(config: bootstrap.ChildConfig) -> stopfrom.Authority:
    """The process whose stop signals this task obeys: the one that started it (``PROCSV_SUPERVISOR_PID``;
    without it, the parent), there while this process's parent at its start is (a task the zygote forked
    is the watchdog's child by then: the zygote double-forks, and this runs after the re-parenting)."""
    parent = os.getppid()
    told = config.supervisor_pid if config.supervisor_pid is not None else config.parent_pid
    pid = told if told is not None else parent
    return stopfrom.Authority(pid, "the watchdog", lambda: os.getppid() == parent)


def wait_for_stop(authority: stopfrom.Authority, who: str) -> str:
    """Block until a stop signal ``authority`` obeys arrives (one from anyone else is logged and left to
    it); the signal's name. Where the senders cannot be read (no signalfd), the first stop signal."""
    sfd = stopfrom.SignalFd.open()
    if sfd is None:
        return signal.Signals(signal.sigwait(set(stopfrom.STOP_SIGNALS))).name
    while True:
        select.select([sfd], [], [])
        for sig in sfd.read():
            if authority.obeys(sig):
                return sig.name
            print(authority.left_line(who, sig), flush=True)


def _hello(job: str, index: int, ctx: Optional[bootstrap.ChildContext]) -> None:
    """Tell the watchdog the server is up (its ``status`` entry turns ``running``); best effort."""
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
