#!/usr/bin/env python3
"""What a pre-warmed group would bring (issue 54 point 3), measured with plain processes before building it.

Three ways to bring a two-task MultiWorkerMirroredStrategy group back after a SIGKILL of its worker1, on
one host, the digits example's model and step (``procsv.examples.digits``), ``tf.train.CheckpointManager``
checkpoints every 40 steps; each timed from the kill to the new group's first synchronized step:

- ``cold``: kill the chief too, start a new pair (python + TF import, the strategy on new ports, the
  model, the step traced at its first call), restore, step (what a restart without a zygote does);
- ``warm``: a standby pair started beforehand on its own ports: TF imported, its strategy up, its
  model built and its step traced, then waiting (``sigwait``) for SIGUSR1; at the kill the chief is
  killed and both standbys are woken: they restore and step;
- ``warm+step``: as ``warm``, and the standbys also ran the step once on their own (collectives with each
  other: instantiation, kernels, the collective group's first all-reduce) before waiting; the restore
  puts back every variable the step changed (model and optimizer), so the first step after it is a
  normal one.

``procsv launch --nproc 2`` today sits between ``cold`` and ``warm``: it forks from a zygote (TF imported),
then starts the strategy, traces, restores and steps (``scripts/bench_group.py`` breaks it down).
``--repeats`` kills per way (default 3); prints each way's kill -> first step (median, spread) and the
woken standby's own parts (wake -> restored -> first step).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Callable, Optional, TypeVar

from procsv.common.spawn import free_ports
from results_table import median_spread  # scripts/ is this script's folder, first on sys.path

ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONUNBUFFERED="1")
T = TypeVar("T")
MODES = ("cold", "warm", "warm+step")

MEMBER = r'''
import os, signal, sys, time
ckdir, rank, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
if mode != "active":
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR1])  # before TF's threads: only sigwait takes it
import tensorflow as tf
from procsv.examples.digits import batch_indices, build_model, load_data, multiworker_step
strategy = tf.distribute.MultiWorkerMirroredStrategy()  # TF_CONFIG set by the benchmark
with strategy.scope():
    model, optimizer, _ = build_model()
train_step = multiworker_step(strategy, model, optimizer, 64)
x, y, _, _ = load_data(0)
idx = batch_indices(0, 1, len(x), 64)[rank::2]
if mode != "active":
    train_step.get_concrete_function(x[idx], y[idx])  # traced
    if mode == "warm+step":
        float(train_step(x[idx], y[idx])["loss"])  # instantiated, kernels made, the collectives' first run
    print("ready", time.time(), flush=True)
    signal.sigwait([signal.SIGUSR1])
    print("woken", time.time(), flush=True)
ckpt = tf.train.Checkpoint(model=model, optimizer=optimizer)
manager = tf.train.CheckpointManager(ckpt, ckdir if rank == 0 else os.path.join(ckdir, "w%d" % rank), 3)
if tf.train.latest_checkpoint(ckdir):
    ckpt.restore(tf.train.latest_checkpoint(ckdir))
step = start = int(optimizer.iterations.numpy())
print("restored", time.time(), step, flush=True)
while True:
    idx = batch_indices(0, step + 1, len(x), 64)[rank::2]
    float(train_step(x[idx], y[idx])["loss"])  # a collective step: both tasks took it
    step += 1
    if step == start + 1 or step % 20 == 0:
        print("first_step" if step == start + 1 else "step", time.time(), step, flush=True)
    time.sleep(0.005)
    if step % 40 == 0:
        manager.save(checkpoint_number=step)
'''


class BenchError(Exception):
    """A wait timed out or a member ended early."""


def wait(cond: Callable[[], Optional[T]], timeout: float, what: str) -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(0.005)
    raise BenchError(f"timed out waiting for {what}")


class Pair:
    """Two member processes of one group on fresh ports; their output lines read back."""

    def __init__(self, root: str, name: str, mode: str) -> None:
        self.outs = [os.path.join(root, f"{name}.{r}") for r in range(2)]
        ports = free_ports(2)
        self.procs = []
        for rank in range(2):
            tf_config = {"cluster": {"worker": [f"localhost:{p}" for p in ports]},
                         "task": {"type": "worker", "index": rank}}
            with open(self.outs[rank], "wb") as out:
                self.procs.append(subprocess.Popen(
                    [sys.executable, os.path.join(root, "member.py"), os.path.join(root, "ck"), str(rank), mode],
                    stdout=out, stderr=subprocess.STDOUT, start_new_session=True, cwd=root,
                    env=dict(ENV, TF_CONFIG=json.dumps(tf_config))))

    def lines(self, rank: int = 0) -> dict[str, list[float]]:
        if any(p.poll() is not None for p in self.procs):
            raise BenchError(f"a member ended (see {self.outs})")
        with open(self.outs[rank]) as fh:
            return {p[0]: [float(v) for v in p[1:]] for p in (ln.split() for ln in fh.read().split("\n")[:-1])
                    if p and p[0] in ("ready", "woken", "restored", "first_step", "step")}

    def kill(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
        for p in self.procs:
            p.wait()


def trial(root: str, k: int, mode: str, active: Pair) -> tuple[Pair, dict[str, float]]:
    """Kill ``active``'s worker1 once it trained 100 steps past its first; bring a pair back by ``mode``."""
    standby = Pair(root, f"{mode}{k}", mode) if mode != "cold" else None
    first = wait(lambda: active.lines().get("first_step"), 300, "the active pair's first step")
    wait(lambda: active.lines().get("step", [0, 0])[1] >= first[1] + 100, 300, "training before the kill")
    if standby is not None:
        wait(lambda: all("ready" in standby.lines(r) for r in (0, 1)), 300, "the standby pair ready")
    t_kill = time.time()
    os.kill(active.procs[1].pid, signal.SIGKILL)
    active.kill()  # the survivor stopped (a supervisor: SIGTERM, then SIGKILL)
    if standby is None:
        nxt = Pair(root, f"cold{k}", "active")
    else:
        for p in standby.procs:
            p.send_signal(signal.SIGUSR1)
        nxt = standby
    got = wait(lambda: nxt.lines() if "first_step" in nxt.lines() else None, 300, "the new pair's first step")
    if got["restored"][1] <= 0:
        raise BenchError(f"{mode} pair {k} restored no checkpoint")
    row = {"mttr": got["first_step"][0] - t_kill}
    if "woken" in got:
        row.update(restore=got["restored"][0] - got["woken"][0], first=got["first_step"][0] - got["restored"][0])
    return nxt, row


def measure(root: str, repeats: int, modes: tuple[str, ...] = MODES) -> dict[str, list[dict[str, float]]]:
    """``repeats`` kills per way of ``modes``, interleaved (the machine's load falls on every way alike),
    in the folder ``root`` (created); each way's rows. Raises :class:`BenchError`."""
    os.makedirs(root, exist_ok=True)
    with open(os.path.join(root, "member.py"), "w") as fh:
        fh.write(MEMBER)
    rows: dict[str, list[dict[str, float]]] = {m: [] for m in modes}
    active = Pair(root, "first", "active")
    try:
        for k in range(repeats):
            for mode in rows:
                active, row = trial(root, k, mode, active)
                rows[mode].append(row)
                print(f"{mode} {k + 1}: kill -> first step {row['mttr']:.3f} s", flush=True)
    finally:
        active.kill()
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    root = tempfile.mkdtemp(prefix="bgp-", dir="/tmp")
    load = os.getloadavg()[0]
    try:
        rows = measure(root, args.repeats)
    except BenchError as e:
        print(f"bench_group_prewarm: FAILED: {e} ({root})", file=sys.stderr)
        return 1
    print(f"\n{args.repeats} kill(s) per way; median (min-max), s; load average {load:.2f} -> "
          f"{os.getloadavg()[0]:.2f} ({os.cpu_count()} CPUs)")
    for mode, rs in rows.items():
        parts = "".join(f"  {key} {median_spread([r[key] for r in rs], '.3f')}" for key in ("restore", "first")
                        if key in rs[0])
        print(f"{mode:<10} kill -> first step {median_spread([r['mttr'] for r in rs], '.3f')}{parts}")
    print(" ".join(f"{m.replace('+', '_')}_mttr_s={statistics.median(r['mttr'] for r in rs):.3f}"
                   for m, rs in rows.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
