#!/usr/bin/env python3
"""A group over two "hosts" losing the second one whole: where it restores from, and the steps re-done.

Root only. ``procsv launch --nnodes 2`` of the digits example (``--strategy multiworker``; worker1 on a
second "host": a network namespace on a veth bridge under its node agent, as ``bench_group.py --hosts``);
at a step past ``--kill-at`` the whole second host is SIGKILLed (its agent and its member), node 0 finds it
lost (``--node-timeout 4``), a new agent is launched there, and the restarted group's ``restored`` (or
``initialized``) record says where it restored from (``source``: ``peer``, ``memory``, ``disk``; none:
step 0) and which step (the newest whole: a periodic disk save, every ``--save-model-secs``, newer than the
newest peer copy is restored instead; the table counts each source). Steps re-done: the chief's last printed
step before the restart minus that step.
Beside it the wall time per step from step 200 to the kill (the chief's log read as it grows): what the tier
and its replication cost the group's step, as far as a shared machine resolves it.

Each run is made twice, interleaved: with the group's in-memory tier over hosts (K = 50, the default) and
with ``PROCSV_GROUP_SNAPSHOT_STEPS=0`` (no in-memory copies: what a job over hosts had before issue 54's
point 2: the newest disk checkpoint, every ``--save-model-secs``). Prints each run, then the medians of
``--repeats`` (spread min-max) and the load average, and one line
``hostloss_redone_tier=<n> hostloss_redone_off=<n> hostloss_source_tier=<s> hostloss_source_off=<s>``.
Exits 1 if a run does not restart its group.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import time
from collections import Counter
from typing import Any, Optional

from bench_alone import run_alone  # scripts/: on sys.path
from bench_group import NET, NS, BenchError, events, launch, leftovers, second_host, stop, wait

PACE_FROM = 200  # the wall time per step is taken from this step to the kill (the group's, as the chief prints it)
EXAMPLE = ["--strategy", "multiworker", "--step-delay", "0.005", "--print-every-steps", "1", "--steps", "100000"]


def printed(logdir: str, log: str) -> list[int]:
    try:
        with open(os.path.join(logdir, "logs", f"{log}.log")) as fh:
            return [int(m.group(1)) for m in re.finditer(r"^digits: step (\d+) ", fh.read(), re.M)]
    except FileNotFoundError:
        return []


def host_pids() -> list[int]:
    out = subprocess.run(["ip", "netns", "pids", NS], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def restart_record(logdir: str) -> Optional[dict[str, Any]]:
    """The second ``restored``/``initialized`` record (the restarted group's chief)."""
    starts = [e for e in events(logdir) if e["event"] in ("restored", "initialized")]
    return starts[1] if len(starts) > 1 else None


def host_loss(logdir: str, k: int, kill_at: int, save_secs: float) -> dict[str, Any]:
    """One run: the second host SIGKILLed past ``kill_at``; its restart's source, step and steps re-done."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONUNBUFFERED="1", PROCSV_GROUP_SNAPSHOT_STEPS=str(k))
    example = [*EXAMPLE, "--save-model-secs", str(save_secs)]
    group = ("--nnodes", "2", "--master-addr", f"{NET}.1:{random.randint(30000, 60000)}", "--node-timeout", "4",
             "--group-grace-secs", "0")
    os.makedirs(logdir)
    master = launch(logdir, [], example, group, env=env)
    agent = launch(logdir, [], example, (*group, "--node-rank", "1"), ("ip", "netns", "exec", NS), ".agent", env=env)
    again: Optional[subprocess.Popen[bytes]] = None
    try:
        wait(lambda: (printed(logdir, "trainer.1") or [0])[-1] >= PACE_FROM, 300, f"step {PACE_FROM}")
        t0, s0 = time.monotonic(), printed(logdir, "trainer.1")[-1]
        wait(lambda: (printed(logdir, "trainer.1") or [0])[-1] >= kill_at, 300, f"step {kill_at}")
        pace = (time.monotonic() - t0) / max(1, printed(logdir, "trainer.1")[-1] - s0)
        for pid in host_pids():
            os.kill(pid, signal.SIGKILL)
        agent.wait(30)
        wait(lambda: any(e["event"] == "node_lost" for e in events(logdir)), 60, "the host found lost")
        again = launch(logdir, [], example, (*group, "--node-rank", "1"), ("ip", "netns", "exec", NS), ".agent2",
                       env=env)
        record = wait(lambda: restart_record(logdir), 180, "the restarted group's restore")
    finally:
        stop(master)
        for proc in (agent, again):
            if proc is not None:
                stop(proc, 30)
    last = max(printed(logdir, "trainer.1"))
    return {"source": record.get("source") or "none", "step": record["step"], "last": last,
            "redone": last - record["step"], "pace": pace, "left": leftovers(logdir)}


def measure(root: str, repeats: int, rng: random.Random, kill_at: int = 600,
            save_secs: float = 5.0) -> dict[int, list[dict[str, Any]]]:
    """``repeats`` host losses with the tier (K = 50) and without (K = 0), interleaved, on a second host
    made for them; raises :class:`BenchError` if a run does not restart its group."""
    runs: dict[int, list[dict[str, Any]]] = {50: [], 0: []}
    with second_host():
        for r in range(repeats):
            at = kill_at + rng.randint(0, 49)
            for k in ((50, 0) if r % 2 == 0 else (0, 50)):
                run = host_loss(os.path.join(root, f"k{k}r{r}"), k, at, save_secs)
                runs[k].append(run)
                print(f"host loss, K={k}, repeat {r + 1}: killed past step {at}, last step {run['last']}, restored "
                      f"{run['step']} from {run['source']}: {run['redone']} steps re-done; "
                      f"{run['pace'] * 1000:.2f} ms per step before", flush=True)
    return runs


def report(runs: dict[int, list[dict[str, Any]]]) -> str:
    """Print the table of :func:`measure`'s runs; return its ``hostloss_*`` figures (one line's part)."""
    def redone(k: int) -> str:
        v = [x["redone"] for x in runs[k]]
        return f"{statistics.median(v):.0f} ({min(v)}-{max(v)})"

    def source(k: int) -> str:
        return str(Counter(x["source"] for x in runs[k]).most_common(1)[0][0])

    def sources(k: int) -> str:  # a periodic disk save newer than the newest peer copy is restored instead
        return " ".join(f"{s} {n}/{len(runs[k])}" for s, n in Counter(x["source"] for x in runs[k]).most_common())

    print(f"{'after a whole host-1 loss':<34}{'tier (K=50)':>18}{'no tier (K=0)':>18}")
    print(f"{'restore source (runs)':<34}{sources(50):>18}{sources(0):>18}")
    print(f"{'steps re-done, median (min-max)':<34}{redone(50):>18}{redone(0):>18}")
    pace = {k: [x["pace"] * 1000 for x in runs[k]] for k in runs}
    print(f"{'ms per step before the loss':<34}{statistics.median(pace[50]):>18.2f}{statistics.median(pace[0]):>18.2f}"
          f"   (tier's cost {statistics.median(pace[50]) / statistics.median(pace[0]) - 1:+.3f}; wall time "
          "through the chief's log, at whatever load the host has)")
    return (f"hostloss_redone_tier={statistics.median(x['redone'] for x in runs[50]):.0f} "
            f"hostloss_redone_off={statistics.median(x['redone'] for x in runs[0]):.0f} "
            f"hostloss_source_tier={source(50)} hostloss_source_off={source(0)}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--kill-at", type=int, default=600, help="the host is killed at a random step past this one")
    p.add_argument("--save-model-secs", type=float, default=5.0)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    if os.geteuid() != 0:
        print("bench_group_hosts: needs root (ip netns)", file=sys.stderr)
        return 1
    return run_alone("bench_group_hosts", lambda root: measure(root, args.repeats, random.Random(args.seed),
                                                              args.kill_at, args.save_model_secs), report)


if __name__ == "__main__":
    sys.exit(main())
