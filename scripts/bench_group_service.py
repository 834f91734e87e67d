#!/usr/bin/env python3
"""A group over two "hosts" losing node 0's checkpoint service: where the next restart restores from.

Root only. ``procsv launch --nnodes 2`` of the digits example as ``bench_group_hosts.py`` runs it
(worker1 on a second "host", a network namespace). Past a random step beyond ``--kill-at`` node 0's
checkpoint service is SIGKILLed (the watchdog restarts it); once the new service took node 1's
holder's copies back (its log says so) worker1 is SIGKILLed, and the restarted group's ``restored``
record says where it restored from (``source``) and which step. Steps re-done: the chief's last
printed step before the restart minus that step. Beside it: the seconds from the SIGKILL of the
service to the new service's line that node 1's holder handed its copies back (polled every 20 ms).
``--no-handback`` (for code without node 1's replica): worker1 is SIGKILLed once the new service runs.
Prints each run, then the medians of ``--repeats`` (spread min-max) and the load average, and one
line ``servicekill_redone=<n> servicekill_source=<s> servicekill_handback_s=<x>``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections import Counter
from typing import Any, Optional

import bench_group  # scripts/: on sys.path
from bench_group import BenchError, launch, leftovers, second_host, stop, wait
from bench_group_hosts import EXAMPLE, printed, restart_record

# a namespace and bridge of its own (bench_group_hosts.py's may be in use by another run on the machine)
bench_group.NS, bench_group.BRIDGE, bench_group.VETH, bench_group.NET = "pvbench6", "pvbench6br", "pvbench6v", "10.79.6"
NS, NET = bench_group.NS, bench_group.NET


def role_pid(logdir: str, role: str) -> Optional[int]:
    """The pid ``status.json`` names for ``role`` (None: not yet)."""
    try:
        with open(os.path.join(logdir, ".procsv", "status.json")) as fh:
            status = json.load(fh)
    except (OSError, ValueError):
        return None
    return next((int(p["pid"]) for p in status.get("processes", []) if p.get("role") == role and p.get("pid")), None)


def handed_back(logdir: str) -> bool:
    path = os.path.join(logdir, "logs", "checkpoint.2.log")
    try:
        with open(path) as fh:
            return "node 1's holder handed back" in fh.read()
    except FileNotFoundError:
        return False


def service_loss(logdir: str, kill_at: int, handback: bool = True) -> dict[str, Any]:
    """One run: node 0's checkpoint service SIGKILLed past ``kill_at``, then worker1 (once the new
    service took node 1's copies back; ``handback`` False: once the new service runs, as before
    issue 54's node-1 replica, where nothing is handed back)."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONUNBUFFERED="1")
    example = [*EXAMPLE, "--save-model-secs", "1000"]
    group = ("--nnodes", "2", "--master-addr", f"{NET}.1:{random.randint(30000, 60000)}", "--node-timeout", "4",
             "--group-grace-secs", "0")
    os.makedirs(logdir)
    master = launch(logdir, [], example, group, env=env)
    agent = launch(logdir, [], example, (*group, "--node-rank", "1"), ("ip", "netns", "exec", NS), ".agent", env=env)
    try:
        wait(lambda: (printed(logdir, "trainer.1") or [0])[-1] >= kill_at, 300, f"step {kill_at}")
        old = wait(lambda: role_pid(logdir, "checkpoint"), 30, "the checkpoint service's pid")
        os.kill(old, signal.SIGKILL)
        t0 = time.monotonic()
        wait(lambda: role_pid(logdir, "checkpoint") not in (None, old) or None, 60, "a new checkpoint service")
        if handback:
            wait(lambda: handed_back(logdir) or None, 60, "node 1's holder to hand its copies back")
        back = time.monotonic() - t0
        os.kill(wait(lambda: role_pid(logdir, "worker1"), 30, "worker1's pid"), signal.SIGKILL)
        record = wait(lambda: restart_record(logdir), 180, "the restarted group's restore")
    finally:
        stop(master)
        stop(agent, 30)
    before = [s for s in printed(logdir, "trainer.1")]
    leftovers(logdir)
    return {"source": record.get("source") or "none", "step": record["step"], "last": max(before),
            "redone": max(before) - record["step"], "handback": back}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--kill-at", type=int, default=600, help="the service is killed at a random step past this one")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-handback", action="store_true",
                   help="kill worker1 once the new service runs (code without node 1's replica: nothing comes back)")
    args = p.parse_args()
    if os.geteuid() != 0:
        print("bench_group_service: needs root (ip netns)", file=sys.stderr)
        return 1
    rng = random.Random(args.seed)
    root = tempfile.mkdtemp(prefix="bench_group_service.")
    load = [os.getloadavg()[0]]
    runs = []
    try:
        with second_host():
            for r in range(args.repeats):
                at = args.kill_at + rng.randint(0, 49)
                run = service_loss(os.path.join(root, f"r{r}"), at, not args.no_handback)
                runs.append(run)
                print(f"service loss, repeat {r + 1}: killed past step {at}, {'copies back' if not args.no_handback else 'new service'} in {run['handback']:.2f} s, "
                      f"last step {run['last']}, restored {run['step']} from {run['source']}: "
                      f"{run['redone']} steps re-done", flush=True)
    except BenchError as exc:
        print(f"bench_group_service: {exc}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(root, ignore_errors=True)
        load.append(os.getloadavg()[0])
    redone = [x["redone"] for x in runs]
    back = [x["handback"] for x in runs]
    source = Counter(x["source"] for x in runs).most_common(1)[0][0]
    print(f"steps re-done, median (min-max): {statistics.median(redone):.0f} ({min(redone)}-{max(redone)}); "
          f"restore source (most runs): {source}; copies back after the service's SIGKILL: "
          f"{statistics.median(back):.2f} s ({min(back):.2f}-{max(back):.2f})")
    print(f"load average (1 min): at the start {load[0]:.1f}, at the end {load[-1]:.1f}")
    print(f"servicekill_redone={statistics.median(redone):.0f} servicekill_source={source} "
          f"servicekill_handback_s={statistics.median(back):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
