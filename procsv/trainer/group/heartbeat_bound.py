"""TensorFlow's coordination service in a group: its heartbeat bound long enough for a suspension.

Runs in the trainer (and each member of a group's auditors), once, before the program: :func:`configure`.
``MultiWorkerMirroredStrategy`` starts TensorFlow's coordination service in the chief and an agent in
every member; the service marks a member whose heartbeats stopped for its ``heartbeat_timeout_in_ms``
(TensorFlow's default: 10 s, on each process's raw monotonic clock) unhealthy and aborts every
collective of the group. A suspension of the job (Slurm's ``scontrol suspend``, SIGSTOP to every
process; ``scontrol resume``, SIGCONT) stops every member's heartbeats with everything else, and at
the resume the service finds them all stale: measured, digits ``--nproc 2`` stopped whole for 15 s,
worker1 died at the resume with "UnavailableError: ... The following tasks are unhealthy (stopped
sending heartbeats)" and the whole group restarted.

procsv finds a member's death (its own notice, at once), a hang (the watchdog's bounds, on its watched
clock, without the suspension) and a lost host (``--node-timeout``) itself, so the coordination service
is configured here, before the program's strategy does it, with the strategy's own settings
(``collective_all_reduce_strategy``: a standalone service, its leader and the coordinated jobs from the
cluster in ``TF_CONFIG``) and a heartbeat bound of :data:`HEARTBEAT_TIMEOUT_SECS`. The strategy keeps a
service already configured (it configures one only while ``context().coordination_service`` is None).
Nothing is done outside a ``--nproc`` group, in a ``--ps`` cluster (another strategy, other jobs), or
without a ``TF_CONFIG`` naming a cluster.
"""

from __future__ import annotations

from typing import Any

from procsv.common.bootstrap import Place

HEARTBEAT_TIMEOUT_SECS = 7 * 24 * 3600  # a week: a suspension shorter than this is no member's death
COORDINATED_JOBS = ("chief", "worker")  # (the strategy's own list)


def configure(place: Place) -> bool:
    """Configure the coordination service of a ``--nproc`` group's member with a heartbeat bound of
    :data:`HEARTBEAT_TIMEOUT_SECS`, as its strategy would otherwise (the cluster: TensorFlow's own reading of
    ``TF_CONFIG``, as the strategy's resolver reads it); True if it did."""
    if place.nproc <= 1 or place.ps:
        return False
    from tensorflow.python.distribute.cluster_resolver import TFConfigClusterResolver
    from tensorflow.python.distribute.collective_all_reduce_strategy import coordination_config_pb2  # (its own)
    from tensorflow.python.distribute import multi_worker_util
    from tensorflow.python.eager import context

    try:
        spec = TFConfigClusterResolver().cluster_spec()
    except (ValueError, TypeError):
        return False  # (a TF_CONFIG TensorFlow cannot read: left to the strategy, which says so)
    ctx: Any = context.context()
    if ctx.coordination_service is not None or not any(job in spec.jobs for job in COORDINATED_JOBS):
        return False
    jobs = [coordination_config_pb2.CoordinatedJob(name=job, num_tasks=spec.num_tasks(job))
            for job in COORDINATED_JOBS if job in spec.jobs]
    ctx.configure_coordination_service(service_type="standalone",
                                       service_leader=multi_worker_util.coordination_leader(spec),
                                       coordinated_jobs=jobs, heartbeat_timeout_in_ms=HEARTBEAT_TIMEOUT_SECS * 1000)
    return True
