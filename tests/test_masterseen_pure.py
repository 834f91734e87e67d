"""When a node agent gives up on a silent master (:mod:`procsv.watchdog.multihost.masterseen`), driven with a
fake clock; the status file is real, read in a real logdir thread. The real partitions are in
``test_hosts_elastic3.py``."""

from __future__ import annotations

import json
import os

from conftest import wait_for
from procsv.common.layout import Layout
from procsv.watchdog.diskjobs import DiskJobs
from procsv.watchdog.multihost.masterseen import MasterSeen

REJOIN, NODE = 2.0, 3.0  # --rejoin-timeout, node 0's --node-timeout


def write_status(layout: Layout, stamp: float) -> None:
    os.makedirs(os.path.dirname(layout.status), exist_ok=True)
    with open(layout.status, "w") as fh:
        json.dump({"updated_at": stamp}, fh)


def settle(seen: MasterSeen, now: float) -> bool:
    """Ask at ``now`` until the read in flight (if any) is done, then once more: its answer then."""
    seen.gone(now, 0.0, NODE)
    read = seen._read
    if read is not None:
        wait_for(lambda: read.done, 10, what="the status file's read")
    return seen.gone(now, 0.0, NODE)


def test_without_min_nodes_the_agent_gives_up_past_the_rejoin_timeout_whatever_the_status_file_says(tmp_path):
    layout, disk = Layout(str(tmp_path)), DiskJobs("t")
    write_status(layout, 1.0)
    seen = MasterSeen(layout, disk, REJOIN, elastic=False)
    assert not seen.gone(REJOIN, 0.0, NODE)
    assert seen.gone(REJOIN + 0.1, 0.0, NODE)
    disk.close()


def test_an_elastic_jobs_agent_waits_while_the_master_writes_its_status_and_gives_up_once_it_stops(tmp_path):
    layout, disk = Layout(str(tmp_path)), DiskJobs("t")
    write_status(layout, 1.0)
    seen = MasterSeen(layout, disk, REJOIN, elastic=True)
    assert not seen.gone(REJOIN, 0.0, NODE)  # not silent long enough: no read
    assert seen._read is None
    now = REJOIN + 0.1
    assert not settle(seen, now)  # the first read counts as seen
    for _ in range(20):  # a partition of 60 s: the master writes on
        now += NODE
        write_status(layout, now)
        assert not settle(seen, now), now
    last = now  # the master is gone: its status file stays
    while now - last <= REJOIN + 2 * NODE:
        assert not settle(seen, now), now
        now += NODE
    assert settle(seen, now)
    disk.close()


def test_an_unreadable_status_file_is_no_sign_of_a_live_master(tmp_path):
    layout, disk = Layout(str(tmp_path / "absent")), DiskJobs("t")
    seen = MasterSeen(layout, disk, REJOIN, elastic=True)
    assert not settle(seen, REJOIN + 0.1)  # the last word heard counts until the reads say more
    assert settle(seen, REJOIN + 2 * NODE + 0.1 + REJOIN)
    disk.close()
