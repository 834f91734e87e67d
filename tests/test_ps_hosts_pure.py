"""Issue 43, pure: ``--ps N --workers M --nnodes K``, the tasks placed over the hosts.

No process runs: where each task runs (:func:`procsv.watchdog.rules.tasks.task_node`), the cluster's
start with a fake executor and a fake remote (:class:`procsv.watchdog.pstasks.PsCluster`: another
host's worker is asked of its agent, with the address that agent offered), rule 14 holding the
restart of a task whose host is lost, and the argument checks. The real launch over two hosts is
``test_ps_hosts.py``.
"""

from __future__ import annotations

import json

import pytest

from procsv.common.errors import UsageError
from procsv.launch_args import check_coordinator
from procsv.watchdog.config import check_ps
from procsv.watchdog.pstasks import PsCluster
from procsv.watchdog.rules.actions import Spawn
from procsv.watchdog.rules.decide import Limits, decide
from procsv.watchdog.rules.failures import Failure
from procsv.watchdog.rules.state import PS, TRAINER, WORKER, ChildView, NodeView, RunView
from procsv.watchdog.rules.tasks import due_starts, task_node

from test_ps_strategy_pure import FakeStarter, Logs


def test_the_parameter_servers_and_the_chief_run_on_node_0_and_the_workers_are_spread_in_blocks() -> None:
    assert [task_node(f"worker{r}", 2, 2) for r in range(2)] == [0, 1]
    assert [task_node(f"worker{r}", 4, 2) for r in range(4)] == [0, 0, 1, 1]
    assert [task_node(f"worker{r}", 5, 3) for r in range(5)] == [0, 0, 1, 1, 2]
    assert task_node(TRAINER, 4, 2) == 0 and task_node("ps0", 4, 2) == 0 and task_node("ps3", 4, 2) == 0
    assert [task_node(f"worker{r}", 3, 1) for r in range(3)] == [0, 0, 0]


class FakeRemote:
    def __init__(self) -> None:
        self.asked: list[tuple[int, str, int, int, dict[str, str]]] = []

    def start_task(self, node: int, slot: str, attempt: int, rank: int, env: dict[str, str]) -> None:
        self.asked.append((node, slot, attempt, rank, env))


def test_another_hosts_worker_is_asked_of_its_agent_on_the_address_it_offered_and_keeps_it() -> None:
    ex = FakeStarter()
    ex.view = RunView(launch_start=0.0, tasks_alone=True)
    ex.view.nodes[1] = NodeView(1, "10.0.0.2", addresses=["10.0.0.2:4001", "10.0.0.2:4002", "10.0.0.2:4003"])
    ex.layout = Logs()  # type: ignore[assignment]
    remote = FakeRemote()
    ex.remote = remote  # type: ignore[attr-defined]
    ex.zygote = None  # type: ignore[attr-defined]  # no pre-warmed trainer: every task starts fresh
    cluster = PsCluster(1, 3, nnodes=2, host="127.0.0.1")
    cluster.start(ex, TRAINER, TRAINER)  # type: ignore[arg-type]
    # ps0 and worker1 (node 0) here, worker2 (node 1) asked of node 1's agent, the chief last
    assert [(slot, role, how) for slot, role, how, _ in ex.started] == [
        ("ps0", PS, "fresh"), ("worker1", WORKER, "member"), (TRAINER, TRAINER, "member")]
    assert [(node, slot, attempt, rank) for node, slot, attempt, rank, _ in remote.asked] == [(1, "worker2", 1, 2)]
    cfg = json.loads(remote.asked[0][4]["TF_CONFIG"])
    assert cfg["task"] == {"type": "worker", "index": 2}
    assert cfg["cluster"]["worker"][2] == "10.0.0.2:4003"  # its own host's address
    assert all(a.startswith("127.0.0.1:") for a in cfg["cluster"]["worker"][:2] + cfg["cluster"]["ps"])
    assert all(json.loads(env["TF_CONFIG"])["cluster"] == cfg["cluster"] for _, _, _, env in ex.started)
    # restarted alone: asked of the same host, same addresses
    ex.view.nodes[1].addresses = ["10.0.0.2:5001", "10.0.0.2:5002", "10.0.0.2:5003"]  # the agent offers others
    ex.view.children["worker2"] = ChildView("worker2", WORKER, 1, 123, 0.0)
    ex.started.clear()
    cluster.start(ex, "worker2", WORKER)  # type: ignore[arg-type]
    assert ex.started == [] and [(n, s, a) for n, s, a, _, _ in remote.asked[1:]] == [(1, "worker2", 2)]
    assert json.loads(remote.asked[1][4]["TF_CONFIG"])["cluster"] == cfg["cluster"]


def test_a_task_whose_host_is_lost_is_restarted_only_once_its_host_is_back() -> None:
    limits = Limits(ps=1, nproc=2, nnodes=2)
    view = RunView(launch_start=0.0, tasks_alone=True)
    view.nodes[1] = NodeView(1, "10.0.0.2", last_beat=5.0, lost_at=20.0)
    view.task_due = {"worker1": 21.0, "ps0": 21.0}
    assert due_starts(view, 30.0, limits) == [Spawn("ps0", PS)]  # node 0's task is not held
    view.nodes[1].lost_at, view.nodes[1].last_beat = None, 31.0  # its agent is back
    assert due_starts(view, 32.0, limits) == [Spawn("ps0", PS), Spawn("worker1", WORKER)]
    assert due_starts(view, 20.0, limits) == []  # not due yet


def test_the_chiefs_restart_does_not_wait_for_a_lost_host_but_the_first_start_waits_for_every_host() -> None:
    limits = Limits(ps=1, nproc=2, nnodes=2)
    view = RunView(launch_start=0.0, tasks_alone=True)
    view.nodes[1] = NodeView(1, "10.0.0.2")  # not joined yet
    view.restart_at = 0.0
    assert [a for a in decide(view, 1.0, limits, 0.5) if isinstance(a, Spawn)] == []  # the first start waits
    view.nodes[1].last_beat = 1.0
    assert Spawn(TRAINER, TRAINER) in decide(view, 2.0, limits, 0.5)
    chief = ChildView(TRAINER, TRAINER, 1, 100, 2.0, failure=Failure(TRAINER, 1, 100, -9, 0.0, ""), settled=True)
    view.children[TRAINER], view.attempts = chief, [chief]
    view.nodes[1].lost_at, view.restart_at = 30.0, 31.0  # node 1 lost, the chief's restart due
    assert Spawn(TRAINER, TRAINER) in decide(view, 32.0, limits, 0.5)  # node 0's chief restarts without node 1


def test_ps_over_hosts_needs_a_worker_on_every_host_and_the_coordinator_stays_on_one() -> None:
    check_ps(1, 2, 1, 2, "auto")
    with pytest.raises(UsageError, match="every host runs at least one worker"):
        check_ps(1, 2, 1, 3, "auto")
    with pytest.raises(UsageError, match="--coordinator runs every task on this host"):
        check_coordinator(True, 1, 2)
    check_coordinator(True, 1, 1)
