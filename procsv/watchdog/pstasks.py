"""Starting the tasks of ``procsv launch --ps N --workers M`` (TF1 between-graph replication, and
with ``--coordinator`` TF2 ``ParameterServerStrategy``).

Runs in the watchdog, called by the executor (:meth:`procsv.watchdog.executor.Executor.spawn`).
:class:`PsCluster` owns the cluster's addresses: free ports on 127.0.0.1 (over several hosts,
``--nnodes K``: node 0's address for the parameter servers and node 0's workers, and for another
host's workers the addresses its agent offered, :func:`procsv.watchdog.rules.tasks.task_node`
placing each worker), chosen once at the first start and kept for the run, so that a task restarted alone serves (a parameter server) or dials
(a worker) the same addresses as before. The first trainer start starts every task: the N
parameter servers (slots ``ps0`` ...: :mod:`procsv.ps_server`), the workers 1 .. M-1 (slots
``worker1`` ...) and the chief (worker 0, slot ``trainer``), every one forked from the pre-warmed
trainer when it is ready (a parameter server so serves again in a fraction of a second instead of
the seconds a fresh process takes to import TensorFlow, which its workers wait for), else fresh;
every later start is one task's (:mod:`procsv.watchdog.rules.tasks` decides which). A worker of
another host is started by that host's agent (:meth:`RemoteMembers.start_task`), with its whole
``TF_CONFIG``.

With ``--coordinator`` the M workers are servers as the parameter servers are (slots ``worker0`` ..
``worker<M-1>``, role ``server``, :mod:`procsv.ps_server` too; each server's first start forked when the pre-warmed
trainer is ready, its restarts fresh) and the trainer slot runs TARGET once,
as TensorFlow's ``chief`` task (the coordinator), with its own address in the cluster:
``TF_CONFIG`` ``{"cluster": {"chief": [...], "worker": [...], "ps": [...]}, "task": {"type":
"chief", "index": 0}}``, what ``TFConfigClusterResolver`` reads. The coordinator is told it is a
lone trainer (``PROCSV_NPROC`` 1, no ``PROCSV_PS``): its Supervisor checkpoints as any eager one.
"""

from __future__ import annotations

from typing import Optional, Protocol, Sequence

from procsv.cluster import make_ps_tf_config, make_pss_tf_config
from procsv.common.env import NPROC, PS as PS_ENV, RANK
from procsv.common.layout import Layout
from procsv.common.mutex import RobustMutex
from procsv.common.spawn import free_ports
from procsv.watchdog.multihost.remote import RemoteMembers
from procsv.watchdog.prewarm import PendingFork
from procsv.watchdog.rules.group import rank_of, worker_slot
from procsv.watchdog.rules.state import PS, SERVER, TRAINER, WORKER, RunView
from procsv.watchdog.rules.tasks import ps_slot, task_node

HOST = "127.0.0.1"
PS_SERVER = "procsv.ps_server"  # the zygote runs this module in the child it forks for a parameter server
PS_FORK_RANK = 1000  # parameter server i's fork is answered under this + i (the workers' under their task)
SERVER_FORK_RANK = 1500  # with --coordinator, worker server i's under this + i (the coordinator's under 0)


class Starter(Protocol):
    """What starting a task needs of the executor."""

    view: RunView
    layout: Layout
    remote: Optional[RemoteMembers]

    def _env(self, role: str, attempt: int) -> dict[str, str]: ...

    def fork(self, pending: PendingFork, target: str, args: Sequence[str]) -> bool: ...

    def _spawn_member(self, slot: str, role: str, attempt: int, rank: int, extra: dict[str, str]) -> None: ...

    def _fresh(self, slot: str, role: str, attempt: int, env: dict[str, str], log_path: str,
               mutex: Optional[RobustMutex]) -> None: ...


class PsCluster:
    """The addresses of the parameter servers and the workers (and with ``coordinator`` the chief's),
    and the start of one task."""

    def __init__(self, ps: int, workers: int, coordinator: bool = False, nnodes: int = 1, host: str = HOST) -> None:
        ports = free_ports(ps + workers + (1 if coordinator else 0), host)
        self.ps = [f"{host}:{p}" for p in ports[:ps]]
        self.workers = [f"{host}:{p}" for p in ports[ps:ps + workers]]  # another host's: set at the first start
        self.chief = [f"{host}:{p}" for p in ports[ps + workers:]]  # --coordinator: the coordinator's address
        self.coordinator = coordinator
        self.nnodes = nnodes

    def _place(self, view: RunView) -> None:
        """At the first start (every host joined: rule 3 waits for them), each other host's workers
        take addresses its agent offered on its own host."""
        for rank in range(len(self.workers)):
            node = task_node(worker_slot(rank), len(self.workers), self.nnodes)
            if node:
                self.workers[rank] = view.nodes[node].addresses[rank]

    def _tf_config(self, task_type: str, index: int) -> str:
        if self.coordinator:
            return make_pss_tf_config(self.chief, self.workers, self.ps, task_type, index)
        return make_ps_tf_config(self.ps, self.workers, task_type, index)

    def _server(self, ex: Starter, slot: str, role: str, attempt: int) -> None:
        """A parameter server, or with ``--coordinator`` a worker: :mod:`procsv.ps_server`. In TF1 mode
        a parameter server is forked from the pre-warmed trainer when it is ready (the
        executor's poll_fork adds it when the zygote answers): every worker waits for it. With
        ``--coordinator`` every server's first start is forked too, and its restarts start fresh (a forked parameter
        server was tried there: the restarted coordinator did not step again within 180 s in
        ``tests/test_ps_strategy.py``; a forked worker server came back before the coordinator had stepped without
        it)."""
        env = ex._env(slot, attempt)
        job, index = ("ps", int(slot[len(PS):])) if role == PS else ("worker", rank_of(slot))
        env["TF_CONFIG"] = self._tf_config(job, index)
        log = ex.layout.attempt_log(slot, attempt)
        rank = PS_FORK_RANK + index if role == PS else SERVER_FORK_RANK + index
        if (not self.coordinator and role == PS) or (self.coordinator and attempt == 1):
            if ex.fork(PendingFork(slot, attempt, env, log, None, role, rank), PS_SERVER, []):
                return  # (a zygote that is not ready, or failed: fresh)
        ex._fresh(slot, role, attempt, env, log, None)

    def start(self, ex: Starter, slot: str, role: str) -> None:
        """Start the next attempt of ``slot``; the first start of the chief starts every task."""
        prev = ex.view.children.get(slot)
        attempt = prev.attempt + 1 if prev else 1
        if role in (PS, SERVER):
            return self._server(ex, slot, role, attempt)
        if role == TRAINER and prev is None:  # the run's first start: every task
            if self.nnodes > 1:
                self._place(ex.view)
            for i in range(len(self.ps)):
                self.start(ex, ps_slot(i), PS)
            for rank in range(0 if self.coordinator else 1, len(self.workers)):
                self.start(ex, worker_slot(rank), SERVER if self.coordinator else WORKER)
        if self.coordinator:  # TARGET once, as the chief: a lone trainer to procsv
            extra = {NPROC: "1", RANK: "0", "TF_CONFIG": self._tf_config("chief", 0)}
            return ex._spawn_member(slot, TRAINER, attempt, 0, extra)
        rank = rank_of(slot)
        extra = {NPROC: str(len(self.workers)), RANK: str(rank), PS_ENV: str(len(self.ps)),
                 "TF_CONFIG": self._tf_config("worker", rank)}
        node = task_node(slot, len(self.workers), self.nnodes)
        if node and ex.remote is not None:  # another host's worker: its agent starts it
            return ex.remote.start_task(node, slot, attempt, rank, extra)
        ex._spawn_member(slot, TRAINER if rank == 0 else WORKER, attempt, rank, extra)
