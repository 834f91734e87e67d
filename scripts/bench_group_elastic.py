#!/usr/bin/env python3
"""An elastic group over two "hosts" (``--nnodes 2 --min-nodes 1``, issue 55): the time to train on without
a lost host, and to take it back.

Root only. ``procsv launch --nnodes 2 --nproc 1 --min-nodes 1 --rejoin-timeout R --node-timeout T`` of the
digits example (``--strategy multiworker --save-model-secs 1``; node 1 a second "host": a network namespace on
a veth bridge under its node agent, as ``bench_group.py --hosts``). Per run:

1. shrink: after the group's first commit every process of the second host is SIGKILLed; node 0 finds it lost
   (``node_lost``, T s after its last beat) and restarts the group on node 0 alone at once (the ``membership``
   record with nodes [0]; before issue 70, R s later). Measured from ``node_lost`` (before, the end of the
   rejoin timeout, ``node_lost`` + R) to
   the smaller group's ``first_step``, split into respawn (-> the new chief's ``spawned``), restore (->
   ``restored``/``initialized``: its TF start-up, build and the read of the state, the record's ``secs``, shown
   apart) and first step (issue 55's goal: <= 1 s + restore); and from ``node_lost``.
2. take back: once the smaller group stepped, a new agent is launched on the second host; measured from its
   ``node_joined`` to the first step of the group of two again, split into waiting for the checkpoint boundary
   (-> the ``restarting`` record with error ``regroup``) and the regroup's MTTR (-> that first step); and the
   steps re-done at the regroup: the ended attempt's last step (its chief's ``trained`` record) minus the next
   attempt's restored step.
3. baseline, its runs interleaved with these: without ``--min-nodes`` (the only path before issue 55) the same
   host SIGKILLed and its agent launched again at once (within the rejoin timeout): ``node_lost`` -> the
   group's (of two again) first step. The table gives shrink / baseline (and node_lost -> first step / baseline).
   Its runs have ``--rejoin-timeout 30``: an agent refused while node 0 has not found its dead predecessor lost
   yet (up to T s) gives up when it has heard nothing for its own ``--rejoin-timeout`` (2 s), though it says it
   asks again for 2 T s; the timeout does not enter the baseline's figure (the group restarts once the host is
   back).

Every run must end with exit 0 on node 0 and on the agent, its final checkpoint at ``--steps``, and no process
left (else exit 1). Prints each run, a table (medians of ``--repeats``, spread min-max) with the load average,
and one line ``elastic_shrink_s=<x> elastic_shrink_restore_s=<x> elastic_takeback_s=<x>
elastic_regroup_mttr_s=<x> elastic_redone=<n> rejoin_baseline_s=<x>``. ``bench_group.py --hosts`` runs it
beside its own (``measure`` and ``report``). ``PROCSV_BENCH_HOST=N`` gives the second host names of its own.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from typing import Any, Optional

from bench_alone import run_alone  # scripts/: on sys.path
from bench_group import (EXAMPLE, NET, NS, BenchError, chief_first_step, events, find, launch, leftovers,
                         second_host, stop, wait)
from procsv.common.layout import Layout
from procsv.common.manifests import list_committed
from results_table import median_spread

# the figures of a run: (key, row of the table); the baseline's own is "baseline"
SHRINK = (("shrink", "shrink: node_lost -> first step, s"), ("respawn", "  respawn: -> new chief spawned"),
          ("restore", "  restore: -> restored"), ("read", "    of it reading the state (its secs)"),
          ("first", "  first step"),
          ("lost_first", "shrink: node_lost -> first step, s"))
BASELINE_REJOIN = 30.0  # the baseline's --rejoin-timeout (see above)
TAKEBACK = (("takeback", "take back: node_joined -> first step of 2, s"),
            ("boundary", "  wait for the checkpoint boundary"), ("regroup", "  regroup MTTR: regroup -> first step"),
            ("redone", "steps re-done at the regroup"))


def host_pids() -> list[int]:
    out = subprocess.run(["ip", "netns", "pids", NS], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def kill_host() -> None:
    """SIGKILL every process of the second host (its agent and its member)."""
    for pid in host_pids():
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def membership(logdir: str, nodes: list[int]) -> Optional[dict[str, Any]]:
    return find(events(logdir), "membership", nodes=nodes)


def start_record(ev: list[dict[str, Any]], pid: int) -> Optional[dict[str, Any]]:
    """The ``restored`` (or ``initialized``) record of the trainer ``pid``."""
    return find(ev, "restored", pid=pid) or find(ev, "initialized", pid=pid)


def final_step(logdir: str) -> Optional[int]:
    committed = list_committed(Layout(logdir))
    return int(committed[-1].step) if committed else None


def one_run(logdir: str, elastic: bool, steps: int, rejoin: float, node_timeout: float) -> dict[str, Any]:
    """One run: the second host SIGKILLed after the first commit. ``elastic``: ``--min-nodes 1``, a new agent
    launched once the smaller group stepped; else (the baseline) a new agent launched at once."""
    example = [*EXAMPLE, "--steps", str(steps), "--save-model-secs", "1"]
    group = ("--nproc", "1", "--nnodes", "2", "--master-addr", f"{NET}.1:{random.randint(30000, 60000)}",
             "--rejoin-timeout", f"{rejoin if elastic else BASELINE_REJOIN:g}", "--node-timeout", f"{node_timeout:g}",
             "--group-grace-secs", "0")
    os.makedirs(logdir)
    master = launch(logdir, ["--min-nodes", "1"] if elastic else [], example, group)
    agent = launch(logdir, [], example, (*group, "--node-rank", "1"), ("ip", "netns", "exec", NS), ".agent")
    again: Optional[subprocess.Popen[bytes]] = None
    out: dict[str, Any] = {}
    try:
        wait(lambda: chief_first_step(logdir, 1), 300, "the group's first step")
        wait(lambda: find(events(logdir), "checkpoint_committed"), 120, "the group's first commit")
        t_kill = time.time()
        kill_host()
        agent.wait(30)
        if not elastic:
            again = launch(logdir, [], example, (*group, "--node-rank", "1"), ("ip", "netns", "exec", NS), ".agent2")
            gone = wait(lambda: find(events(logdir), "node_lost", after=t_kill), 60, "the host found lost")
            nxt = wait(lambda: find(events(logdir), "first_step", after=gone["time"]), 180,
                       "the group's first step after the loss")
            out["baseline"] = nxt["time"] - gone["time"]
        else:
            small = wait(lambda: membership(logdir, [0]), 120, "the group restarted without node 1")
            a = small["attempt"]
            first = wait(lambda: chief_first_step(logdir, a), 180, "the smaller group's first step")
            ev = events(logdir)
            lost = find(ev, "node_lost", after=t_kill)
            spawned = find(ev, "spawned", role="trainer", attempt=a)
            started = start_record(ev, first["pid"])
            if lost is None or spawned is None or started is None:
                raise BenchError(f"{logdir}: the shrink's records (node_lost, spawned, restored) missing")
            out_at = lost["time"]  # (the group no longer waits out --rejoin-timeout: issue 70)
            out.update(shrink=first["time"] - out_at, respawn=spawned["time"] - out_at,
                       restore=started["time"] - spawned["time"], first=first["time"] - started["time"],
                       lost_first=first["time"] - lost["time"], read=float(started.get("secs") or 0.0))
            t_again = time.time()
            again = launch(logdir, [], example, (*group, "--node-rank", "1"), ("ip", "netns", "exec", NS), ".agent2")
            big = wait(lambda: membership(logdir, [0, 1]), 180, "node 1 taken back")
            b = big["attempt"]
            back = wait(lambda: chief_first_step(logdir, b), 180, "the group of two's first step again")
            ev = events(logdir)
            joined = find(ev, "node_joined", after=t_again, node=1)
            regroup = find(ev, "restarting", attempt=b, error="regroup")
            trained = find(ev, "trained", role="trainer", attempt=b - 1)
            restarted = start_record(ev, back["pid"])
            if joined is None or regroup is None or trained is None or restarted is None:
                raise BenchError(f"{logdir}: the take-back's records (node_joined, restarting regroup, trained, "
                                 "restored) missing")
            out.update(takeback=back["time"] - joined["time"], boundary=regroup["time"] - joined["time"],
                       regroup=back["time"] - regroup["time"], redone=trained["step"] - restarted["step"])
        master.wait(600)  # it trains on to --steps and ends by itself
    finally:
        code = stop(master)
        acode = stop(again, 30) if again is not None else None
        stop(agent, 5)
    final = final_step(logdir)
    out.update(code=code, agent_code=acode, final=final, ok=code == 0 and acode == 0 and final == steps,
               left=leftovers(logdir))
    if not out["ok"]:
        print(f"bench_group_elastic: {logdir}: exit {code}, the agent's {acode}, final checkpoint {final} "
              f"(want 0, 0, {steps})", file=sys.stderr)
    return out


def measure(root: str, repeats: int, steps: int = 3000, rejoin: float = 2.0,
            node_timeout: float = 3.0) -> dict[str, list[dict[str, Any]]]:
    """``repeats`` elastic runs and as many baseline runs, interleaved, on a second host made for them;
    raises :class:`BenchError` if a run does not get as far as the measure needs."""
    runs: dict[str, list[dict[str, Any]]] = {"elastic": [], "baseline": []}
    with second_host():
        for r in range(repeats):
            for elastic in ((True, False) if r % 2 == 0 else (False, True)):
                kind = "elastic" if elastic else "baseline"
                run = one_run(os.path.join(root, f"{kind}{r}"), elastic, steps, rejoin, node_timeout)
                runs[kind].append(run)
                figures = ", ".join(f"{k} {run[k]:.3f}" if k != "redone" else f"{k} {run[k]}"
                                    for k, _ in (*SHRINK, *TAKEBACK, ("baseline", "")) if k in run)
                print(f"elastic bench, {kind}, repeat {r + 1}: {figures}; exit {run['code']}/{run['agent_code']}, "
                      f"final {run['final']}, left {run['left']}; load {os.getloadavg()[0]:.1f}", flush=True)
    return runs


def failures(runs: dict[str, list[dict[str, Any]]]) -> list[str]:
    """What the runs' own checks found wrong (each run: exit 0 on both hosts, final checkpoint, no leftover)."""
    return [f"{kind} run {i + 1}: exit {x['code']}, the agent's {x['agent_code']}, final checkpoint {x['final']}"
            + (f", {x['left']} process(es) left" if x["left"] else "")
            for kind, rs in runs.items() for i, x in enumerate(rs) if not x["ok"] or x["left"]]


def report(runs: dict[str, list[dict[str, Any]]]) -> str:
    """Print the table of :func:`measure`'s runs; return its ``elastic_*`` figures (one line's part)."""
    med = statistics.median
    el, base = runs["elastic"], runs["baseline"]
    print(f"\n{len(el)} repeat(s); median (min-max)")
    print(f"{'host 1 SIGKILLed (--min-nodes 1)':<46}{'elastic':>22}{'baseline*':>22}   goal")
    for key, name in (*SHRINK, *TAKEBACK):
        fmt = ".0f" if key == "redone" else ".3f"
        cell = median_spread([x[key] for x in el], fmt)
        other = median_spread([x["baseline"] for x in base], ".3f") if key == "lost_first" else ""
        goal = "<= 1 s + restore" if key == "shrink" else ""
        print(f"{name:<46}{cell:>22}{other:>22}   {goal}")
    for key, name in (("shrink", "ratio shrink / baseline"),
                      ("lost_first", "ratio node_lost -> first step / baseline")):
        print(f"{name:<46}{med(x[key] for x in el) / med(x['baseline'] for x in base):>22.3f}")
    print("* baseline: no --min-nodes, the same host SIGKILLed and its agent launched again at once: node_lost -> "
          "the group's (of two) first step")
    return (f"elastic_shrink_s={med(x['shrink'] for x in el):.3f} "
            f"elastic_shrink_restore_s={med(x['restore'] for x in el):.3f} "
            f"elastic_takeback_s={med(x['takeback'] for x in el):.3f} "
            f"elastic_regroup_mttr_s={med(x['regroup'] for x in el):.3f} "
            f"elastic_redone={med(x['redone'] for x in el):.0f} "
            f"rejoin_baseline_s={med(x['baseline'] for x in base):.3f}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--rejoin-timeout", type=float, default=2.0)
    p.add_argument("--node-timeout", type=float, default=3.0)
    args = p.parse_args()
    if os.geteuid() != 0:
        print("bench_group_elastic: needs root (ip netns)", file=sys.stderr)
        return 1
    bad: list[str] = []

    def measured(root: str) -> dict[str, list[dict[str, Any]]]:
        runs = measure(root, args.repeats, args.steps, args.rejoin_timeout, args.node_timeout)
        bad.extend(failures(runs))
        return runs

    code = run_alone("bench_group_elastic", measured, report)
    for f in bad:
        print(f"bench_group_elastic: FAILED: {f}", file=sys.stderr)
    return code or (1 if bad else 0)


if __name__ == "__main__":
    sys.exit(main())
