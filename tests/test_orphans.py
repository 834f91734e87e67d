"""The sweep for left-behind processes: finding this process's children cheaply, and killing adopted ones.

Real processes. The subreaper part runs in a child Python process, so that the test process
itself never becomes a subreaper (orphans of other tests would be re-parented to it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

from procsv.common.orphans import child_pids


def test_child_pids_lists_exactly_the_children_of_every_thread():
    procs = [subprocess.Popen(["sleep", "30"])]
    from_thread: list[subprocess.Popen[bytes]] = []
    t = threading.Thread(target=lambda: from_thread.append(subprocess.Popen(["sleep", "30"])))
    t.start()
    t.join()
    procs += from_thread
    # join returns before the thread's task has left the kernel: until then its child moves to a live thread
    # between child_pids()'s reads (listed by neither: seen once at load); a sweep's next read finds it
    gone = time.monotonic() + 10
    while os.path.exists(f"/proc/self/task/{t.native_id}") and time.monotonic() < gone:
        time.sleep(0.01)
    try:
        pids = child_pids()
        assert pids is not None  # this kernel offers /proc/self/task/*/children
        mine = {p.pid for p in procs}
        assert mine <= set(pids)  # (the test runner may have children of its own)
        assert len(pids) == len(set(pids))
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert not {p.pid for p in procs} & set(child_pids() or [])


SUBREAPER = r"""
import json, os, subprocess, sys, time
from procsv.common.orphans import Orphans, child_pids
sweeper = Orphans()
assert sweeper.enabled
known = subprocess.Popen(["sleep", "30"])
# a child that starts a grandchild in a session of its own and exits: the grandchild is adopted
out = subprocess.run(["sh", "-c", "setsid sleep 30 > /dev/null 2>&1 & echo $!"], capture_output=True, text=True)
orphan = int(out.stdout)
try:
    deadline = time.monotonic() + 10
    while orphan not in (child_pids() or []) and time.monotonic() < deadline:
        time.sleep(0.01)
    adopted = orphan in (child_pids() or [])
    killed = sweeper.sweep_and_reap({known.pid}, 5.0)
    alive = os.path.exists(f"/proc/{orphan}")
    known_alive = known.poll() is None
finally:  # nothing outlives this script, whatever failed
    known.kill()
    known.wait()
    try:
        os.kill(orphan, 9)
    except ProcessLookupError:
        pass
print(json.dumps({"adopted": adopted, "killed": killed, "orphan": orphan, "alive": alive, "known_alive": known_alive}))
"""


def test_an_adopted_orphan_is_found_killed_and_reaped_and_a_known_child_is_left_alone():
    done = subprocess.run([sys.executable, "-c", SUBREAPER], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    res = json.loads(done.stdout.strip().splitlines()[-1])
    assert res["adopted"], res
    assert res["killed"] == [res["orphan"]] and not res["alive"], res
    assert res["known_alive"], res
