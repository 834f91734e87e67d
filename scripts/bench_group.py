#!/usr/bin/env python3
"""Benchmark (issue #13, the part that exists today): how soon a waiting worker notices the chief's commit.

A worker replica started before the chief's first checkpoint waits in
``Supervisor.prepare_or_wait_for_session(wait_for_checkpoint=True)``
(:func:`procsv.trainer.replica.wait_for_committed`). For each trial a fresh logdir, a waiting
worker (a thread of this script) and a real chief (the digits example, plain ``python``, its own
services) that commits a checkpoint at step 50 and ends. Latency = the moment the worker returns
minus the moment the commit's manifest was written (its mtime; same clock). procsv (filesystem
events) side by side with TF1's way (a poll every ``recovery_wait_secs`` = ``--poll`` s, 30 s in TF),
the trials of the two interleaved.

The group figures of issue #13 (group MTTR, steps lost on preemption, stall detection) need
``procsv launch --nproc N``, which does not exist yet.

Prints a table, then one line: ``wait_notice_ms=<x> poll_notice_ms=<x> ratio=<x>``; exits non-zero
if a worker never woke, woke before the commit, or the first commit is not the chief's step 50
(its own correctness checks).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONUNBUFFERED="1")


def trial(root: str, events: bool, poll: float) -> float:
    from procsv.common.layout import Layout
    from procsv.common.manifests import list_committed
    from procsv.trainer.replica import wait_for_committed

    logdir = tempfile.mkdtemp(prefix="run-", dir=root)
    layout = Layout(logdir)
    woke: dict[str, float] = {}

    def worker() -> None:
        wait_for_committed(layout, max_wait_secs=600, poll_secs=poll, events=events)
        woke["at"] = time.time()

    thread = threading.Thread(target=worker)
    thread.start()
    chief = subprocess.Popen([sys.executable, "-m", "procsv.examples.digits", "--logdir", logdir, "--steps", "50",
                              "--save-checkpoint-steps", "50", "--save-model-secs", "1000"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=ENV, cwd=REPO)
    try:
        thread.join(timeout=600)
        chief.communicate(timeout=600)  # it commits step 50 and ends: the commit stays the only one
    finally:
        chief.kill()
        chief.communicate()
    if "at" not in woke:
        raise SystemExit("bench_group: the waiting worker never woke")
    first = list_committed(layout)[0]
    if first.step != 50:
        raise SystemExit(f"bench_group: the first commit is step {first.step}, not 50")
    committed_at = os.stat(os.path.join(layout.manifests, first.prefix + ".json")).st_mtime
    if woke["at"] < committed_at:
        raise SystemExit("bench_group: the worker woke before the commit")
    return woke["at"] - committed_at


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=5, help="trials of each way (default 5)")
    p.add_argument("--poll", type=float, default=30.0, help="the baseline's poll period, TF1's recovery_wait_secs")
    args = p.parse_args()
    root = tempfile.mkdtemp(prefix="bench-group-")
    try:
        got: dict[str, list[float]] = {"events": [], "poll": []}
        for i in range(args.trials):
            for way in (("events", "poll") if i % 2 == 0 else ("poll", "events")):
                got[way].append(trial(root, way == "events", args.poll))
                print(f"  trial {i + 1} {way:6s} noticed after {got[way][-1] * 1000:9.1f} ms", flush=True)
        med = {k: statistics.median(v) for k, v in got.items()}
        print()
        print(f"{'':34s} {'procsv (events)':>16s} {'TF1 poll ' + format(args.poll, 'g') + ' s':>16s}")
        print(f"{'commit -> worker notices, median':34s} {med['events'] * 1000:13.1f} ms {med['poll'] * 1000:13.1f} ms")
        print(f"{'  min..max':34s} " + " ".join(f"{min(got[k]) * 1000:7.1f}..{max(got[k]) * 1000:<7.1f}"
                                               for k in ("events", "poll")))
        print(f"({args.trials} trials each, interleaved)")
        print(f"wait_notice_ms={med['events'] * 1000:.1f} poll_notice_ms={med['poll'] * 1000:.1f} "
              f"ratio={med['events'] / med['poll']:.6f}")
        return 0
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
