"""This trainer's place in its group: ``procsv launch --nproc N`` runs N trainers, task 0 the chief.

Runs in the trainer (the user's program reads it). The launch gives every trainer of a group its
own ``TF_CONFIG`` (the cluster's addresses on free ports procsv chose, and this trainer's task),
which ``tf.distribute.MultiWorkerMirroredStrategy`` reads by itself; these functions say the same
for a program that needs its task without parsing ``TF_CONFIG`` (the launch's record of this trainer's
place, read at each call through :func:`procsv.common.bootstrap.read_place`; ``TF_CONFIG`` itself is
TensorFlow's own variable, read here as TensorFlow reads it). Without ``--nproc`` (or in plain
``python train.py``) there is one trainer: rank 0 of 1, the chief. An elastic group (``--nnodes M
--min-nodes K``) restarts on the hosts it has whenever one leaves or comes back: :func:`size` and
:func:`rank` are then this attempt's (``docs/elastic.md`` says what a program must do to stay correct).

``procsv launch --ps N --workers M`` (TF1 between-graph replication, ``docs/parameter-servers.md``)
gives every worker task a ``TF_CONFIG`` with a ``ps`` and a ``worker`` job: :func:`cluster_spec` is
it as a ``tf.train.ClusterSpec`` (for ``tf.compat.v1.train.replica_device_setter``) and
:func:`server_target` this worker's own in-process ``tf.distribute.Server``'s target (the ``master``
string of the Supervisor page's replicas example), started once per process.

``procsv launch --ps N --workers M --coordinator`` (TF2 ``ParameterServerStrategy``) runs TARGET
once, as task ``chief/0`` of a cluster with a ``chief``, a ``worker`` and a ``ps`` job
(:func:`make_pss_tf_config`): ``tf.distribute.cluster_resolver.TFConfigClusterResolver()`` reads it
unchanged. To procsv that chief is a lone trainer (:func:`rank` 0 of :func:`nproc` 1).
"""

from __future__ import annotations

import json
import os
import threading
from typing import Any, Optional

from procsv.common.bootstrap import read_place


def rank() -> int:
    """This trainer's task index in the group (0: the chief, which saves and writes summaries)."""
    return read_place().rank


def nproc() -> int:
    """How many trainers the group has (1 without ``--nproc``)."""
    return read_place().nproc


def size() -> int:
    """The group's size now (:func:`nproc`): with ``--min-nodes`` (an elastic group, ``docs/elastic.md``) it
    changes from one attempt to the next as hosts leave and come back, never within a process."""
    return nproc()


def hosts() -> int:
    """How many hosts the group runs on now (``--nnodes``; fewer while an elastic group trains on without
    some); 1 on one host."""
    return read_place().hosts


def is_chief() -> bool:
    """Whether this trainer is the group's chief: what ``Supervisor(is_chief=...)`` defaults to."""
    return rank() == 0


def tf_config() -> dict[str, Any]:
    """The parsed ``TF_CONFIG`` the launch gave this trainer (``{}`` when it gave none)."""
    raw = os.environ.get("TF_CONFIG", "")
    try:
        parsed = json.loads(raw) if raw else {}
    except json.JSONDecodeError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def make_tf_config(addresses: list[str], index: int) -> str:
    """The ``TF_CONFIG`` of task ``index`` of a worker cluster at ``addresses`` (task 0 the chief)."""
    return json.dumps({"cluster": {"worker": list(addresses)}, "task": {"type": "worker", "index": index}})


def ps_tasks() -> int:
    """How many parameter-server tasks the launch runs (``--ps N``; 0 without)."""
    return read_place().ps


def make_ps_tf_config(ps: list[str], workers: list[str], task_type: str, index: int) -> str:
    """The ``TF_CONFIG`` of task ``index`` of ``task_type`` (``ps`` or ``worker``) in a
    parameter-server cluster (worker 0 is the chief, as in the Supervisor page's example)."""
    return json.dumps({"cluster": {"ps": list(ps), "worker": list(workers)},
                       "task": {"type": task_type, "index": index}})


def make_pss_tf_config(chief: list[str], workers: list[str], ps: list[str], task_type: str, index: int) -> str:
    """The ``TF_CONFIG`` of task ``index`` of ``task_type`` (``chief``, ``worker`` or ``ps``) in a
    ``ParameterServerStrategy`` cluster: TensorFlow's convention, the coordinator is ``chief``."""
    return json.dumps({"cluster": {"chief": list(chief), "worker": list(workers), "ps": list(ps)},
                       "task": {"type": task_type, "index": index}})


def cluster_spec() -> Any:
    """The launch's cluster as a ``tf.train.ClusterSpec`` (from ``TF_CONFIG``). Raises ``RuntimeError``
    when the launch gave no ``TF_CONFIG`` (not under ``procsv launch --ps/--nproc``)."""
    import tensorflow as tf

    cluster = tf_config().get("cluster")
    if not isinstance(cluster, dict) or not cluster:
        raise RuntimeError("no cluster in TF_CONFIG: launch with procsv launch --ps N --workers M")
    return tf.train.ClusterSpec(cluster)


_server: Optional[Any] = None
_server_lock = threading.Lock()


def server_target() -> str:
    """This task's own in-process ``tf.distribute.Server``'s target (``grpc://host:port``), the
    ``master`` string for ``managed_session(...)``; the server is started at the first call and
    kept for the life of the process. ``""`` (an in-process session) without a cluster in
    ``TF_CONFIG``, so the program also runs alone."""
    global _server
    cfg = tf_config()
    task = cfg.get("task")
    if not isinstance(cfg.get("cluster"), dict) or not isinstance(task, dict):
        return ""
    with _server_lock:
        if _server is None:
            import tensorflow as tf

            _server = tf.distribute.Server(cluster_spec(), job_name=str(task.get("type", "worker")),
                                           task_index=int(task.get("index", 0)), start=True)
        return str(_server.target)


__all__ = ["rank", "nproc", "size", "hosts", "is_chief", "tf_config", "make_tf_config", "ps_tasks", "make_ps_tf_config",
           "make_pss_tf_config", "cluster_spec", "server_target"]
