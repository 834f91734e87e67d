"""A job over hosts (``--nnodes``) without launching one: what node 0 says of each member.

In-process: the status record (:func:`~procsv.watchdog.publish.statusfile.status_record`) and
``procsv status``'s view of it, built from a view the watchdog's own observations made. The real
two-host launches are in ``test_hosts.py``.
"""

from __future__ import annotations

import socket
from typing import Any

from procsv.common.layout import Layout
from procsv.ipc.messages import NodeHello, Progress
from procsv.status import render
from procsv.watchdog import observe
from procsv.watchdog.config import LaunchConfig
from procsv.watchdog.publish.statusfile import status_record
from procsv.watchdog.rules.state import TRAINER, WORKER, RunView

HOST1 = "10.0.0.2"


def group_view(nodes: int) -> RunView:
    """A running group of two: the chief on node 0 and worker1 on node ``nodes - 1`` (its agent
    joined from HOST1 when that is 1), each past its first step, as the watchdog observes them."""
    view = RunView(launch_start=0.0)
    observe.spawned(view, TRAINER, TRAINER, 1, 101, 1.0, "zygote")
    if nodes > 1:
        observe.node_hello(view, NodeHello(1, 1, HOST1, 77, [f"{HOST1}:4001"]), 1.0)
        observe.spawned(view, "worker1", WORKER, 1, 202, 1.5, "node1")
        view.children["worker1"].node = 1  # (RemoteMembers.started)
    else:
        observe.spawned(view, "worker1", WORKER, 1, 202, 1.5, "zygote")
    view.restart_at = None
    observe.heard(view, Progress(101, 40, 0.0), 3.0)
    observe.heard(view, Progress(202, 39, 0.0), 3.0, slot="worker1" if nodes > 1 else None)
    return view


def members(record: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {p["role"]: p for p in record["processes"] if p["role"] in (TRAINER, "worker1")}


def test_each_member_of_a_group_over_two_hosts_has_its_rank_node_and_host_as_on_one_host(tmp_path) -> None:
    """``--nproc 1 --nnodes 2`` is a group of two as ``--nproc 2`` is. Before: its status record
    had no ``group`` and its members no ``rank``, ``node``, ``host`` or ``step``."""
    layout = Layout(str(tmp_path / "run"))
    here = socket.gethostname()
    one_host = status_record(group_view(1), LaunchConfig("t", [], layout.logdir, nproc=2), layout, 4.0, 4.0, 0.0,
                             None, on_disk=False)
    two_hosts = status_record(group_view(2), LaunchConfig("t", [], layout.logdir, nproc=1, nnodes=2), layout, 4.0,
                              4.0, 0.0, None, on_disk=False)
    where = {role: (p.get("rank"), p.get("node"), p.get("host"), p.get("step"))
             for role, p in members(two_hosts).items()}
    assert where == {TRAINER: (0, 0, here, 40), "worker1": (1, 1, HOST1, 39)}
    assert two_hosts["group"] == {"nproc": 1, "nnodes": 2, "state": "running", "ps": 0}
    assert one_host["group"] == {"nproc": 2, "nnodes": 1, "state": "running", "ps": 0}
    assert {role: (p["rank"], p["node"], p["host"]) for role, p in members(one_host).items()} == {
        TRAINER: (0, 0, here), "worker1": (1, 0, here)}
    assert [sorted(p) for p in members(two_hosts).values()] == [sorted(p) for p in members(one_host).values()]
    text = render(two_hosts, layout.logdir)
    assert "  trainer group of 2 (1 on each of 2 hosts): running" in text.splitlines()
    worker_line = next(line for line in text.splitlines() if line.lstrip().startswith("worker1"))
    assert worker_line.endswith(f"rank 1 on node 1 ({HOST1}), step 39"), worker_line
    assert f"rank 0 on node 0 ({here}), step 40" in text
    assert "  trainer group of 2: running" in render(one_host, layout.logdir).splitlines()
    alone = status_record(group_view(1), LaunchConfig("t", [], layout.logdir), layout, 4.0, 4.0, 0.0, None,
                          on_disk=False)
    assert alone["group"] is None and "rank" not in members(alone)[TRAINER]  # one trainer: no group
