#!/usr/bin/env python3
"""What a group member of another host pays at its step boundary to hand its peer copy to node 0.

A member of host 1..M-1 (``PROCSV_GROUP_REMOTE``) sends every K-th step's in-memory snapshot to
node 0's checkpoint service over TCP and CURVE, every tensor a frame
(:mod:`procsv.trainer.checkpoint.peer_copy`). This measures that hand-off alone, at 1, 16 and
64 MiB of state, beside the same loop with no hand-off: a loop of CPU-bound steps (a numpy matrix
product of about ``--step-ms``) that every ``--every`` steps (K, the group tier's default 50)
hands the state's slot over, as the member's ``MemoryTier`` does, to a ROUTER with a CURVE server
key in another process (node 0's stand-in: it copies every frame out, as ``copy_out`` does, and
acknowledges). Three slots rotate; a snapshot is skipped while the last is unacknowledged or no
slot is free (as the tier's ``ready``). Modes:

``off``       no hand-off (the loop alone);
``inline``    every tensor copied into a fresh ``bytes`` at the boundary, then sent (before this change);
``prealloc``  every tensor copied into one buffer preallocated per slot, then sent uncopied;
``zerocopy``  tracked, uncopied frames over the slot itself; the slot stays spoken for until the
              trackers say ZeroMQ let go (this change).

Prints each run's wall time, CPU time (the whole process: ZeroMQ's I/O thread, which encrypts, too)
and time spent in the hand-off at the boundary, per step; then per size and mode the medians of
``--repeats`` (spread min-max), the costs against ``off`` (on / off - 1) and the boundary's share of
a step (the step path's cost: the figure that resolves on a shared machine), the load average beside,
and one line ``peer_boundary_share_<mode>_<n>mib=<x> ...``.
``python scripts/bench_peer_copy.py --repeats 3``.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import time
from typing import Any

import numpy as np
import zmq

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from procsv.ipc.messages import TensorSpec  # noqa: E402
from procsv.trainer.checkpoint import peer_copy  # noqa: E402
from results_table import median_spread  # noqa: E402

TENSORS = 8  # the state is this many equal tensors
MODES = ("off", "inline", "prealloc", "zerocopy")


def node0(endpoint: Any, secret: bytes, public: bytes) -> None:
    """The receiver: copies every frame out of the message (as node 0's copy_out), acknowledges."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.curve_server = True
    sock.curve_secretkey, sock.curve_publickey = secret, public
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    endpoint.send(port)
    while True:
        frames = sock.recv_multipart(copy=False)
        if frames[1].bytes == b"stop":
            break
        copied = [bytes(f) for f in frames[2:]]
        sock.send_multipart([frames[0].bytes, frames[1].bytes])
        del copied
    sock.close(0)
    ctx.term()


N = 64  # the step's matrices are N x N


def calibrate(step_ms: float) -> int:
    """How many products make a step of about ``step_ms`` (the fewest of 20 tries' rates: the least
    descheduled); the same for every run, so that the runs differ only in the hand-off."""
    a = np.random.default_rng(0).random((N, N))
    best = float("inf")
    for _ in range(20):
        t0 = time.perf_counter()
        for _ in range(100):
            a = a @ a / N
        best = min(best, (time.perf_counter() - t0) / 100)
    return max(1, int(step_ms / 1000 / best))


def run(size: int, mode: str, steps: int, every: int, reps: int) -> tuple[float, float, float, int]:
    """Of one loop (``reps`` products a step): mean wall seconds per step, CPU seconds per step (the
    whole process: ZeroMQ's I/O thread, which encrypts the frames, too), seconds per step spent in
    the hand-off at the boundary (the step path's share), and the snapshots handed over."""
    n = N
    a = np.random.default_rng(0).random((n, n))
    slot_size = size
    memory = np.random.default_rng(1).integers(0, 255, 3 * slot_size, dtype=np.uint8)
    per = slot_size // TENSORS
    prealloc = [np.empty(slot_size, np.uint8) for _ in range(3)]
    public, secret = zmq.curve_keypair()
    parent, child = mp.Pipe()
    proc = mp.Process(target=node0, args=(child, secret, public), daemon=True)
    proc.start()
    port = parent.recv()
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.sndhwm = 4
    cpub, csec = zmq.curve_keypair()
    sock.curve_secretkey, sock.curve_publickey, sock.curve_serverkey = csec, cpub, public
    sock.connect(f"tcp://127.0.0.1:{port}")
    sends = peer_copy.Sends()
    sending: set[int] = set()
    unacked = False
    held, handed = -1, 0
    boundary = 0.0
    start, cpu = time.perf_counter(), time.process_time()
    for step in range(1, steps + 1):
        for _ in range(reps):
            a = a @ a / n
        if mode == "off" or step % every:
            continue
        while sock.get(zmq.EVENTS) & zmq.POLLIN:
            sock.recv_multipart()
            unacked = False
        sending -= set(sends.done())
        free = [s for s in range(3) if s not in sending and s != held]
        if unacked or not free:
            continue
        slot = free[0]
        t0 = time.perf_counter()
        base = slot * slot_size
        specs = [TensorSpec(f"t{i}", "uint8", [per], None, base + i * per) for i in range(TENSORS)]
        if mode == "zerocopy":
            _, frames = peer_copy.frames(specs, [], memory)
        elif mode == "prealloc":
            np.copyto(prealloc[slot], memory[base:base + slot_size])
            frames = [prealloc[slot][i * per:(i + 1) * per] for i in range(TENSORS)]
        else:
            frames = [bytes(memory[s.offset:s.offset + per]) for s in specs]
        sock.send_multipart([b"save", *frames], copy=False)
        if mode == "zerocopy":
            sends.started(slot, frames)
            sending.add(slot)
        boundary += time.perf_counter() - t0
        held, unacked, handed = slot, True, handed + 1  # (held: the newest, as the tier's rule keeps it)
    secs, cpu = (time.perf_counter() - start) / steps, (time.process_time() - cpu) / steps
    sock.send_multipart([b"stop"])
    proc.join(30)
    sock.close(0)
    ctx.term()
    return secs, cpu, boundary / steps, handed


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--every", type=int, default=50)
    p.add_argument("--step-ms", type=float, default=5.0)
    p.add_argument("--mib", default="1,16,64")
    args = p.parse_args()
    load = [os.getloadavg()[0]]
    sizes = [int(x) for x in args.mib.split(",")]
    reps = calibrate(args.step_ms)
    out: dict[tuple[int, str, str], list[float]] = {}
    for r in range(args.repeats):
        for mib in sizes:
            for mode in (MODES if r % 2 == 0 else MODES[::-1]):
                secs, cpu, boundary, handed = run(mib << 20, mode, args.steps, args.every, reps)
                for k, v in (("wall", secs), ("cpu", cpu), ("boundary", boundary)):
                    out.setdefault((mib, mode, k), []).append(v)
                print(f"repeat {r + 1}, {mib} MiB, {mode}: {secs * 1000:.3f} ms per step, {cpu * 1000:.3f} ms of CPU, "
                      f"{boundary * 1000:.4f} ms at the boundary; {handed} handed over", flush=True)
    load.append(os.getloadavg()[0])
    med = statistics.median
    for mib in sizes:
        for mode in MODES:
            def ms(k: str) -> str:
                return median_spread([x * 1000 for x in out[(mib, mode, k)]], ".3f")

            def cost(k: str) -> list[float]:
                return [on / o - 1 for on, o in zip(out[(mib, mode, k)], out[(mib, "off", k)])]

            share = [b / w for b, w in zip(out[(mib, mode, "boundary")], out[(mib, "off", "wall")])]
            print(f"{mib:3d} MiB {mode:9s}: wall {ms('wall')} ms/step (cost {median_spread(cost('wall'), '+.4f', ' to ')}), "
                  f"CPU {ms('cpu')} ms/step (cost {median_spread(cost('cpu'), '+.4f', ' to ')}), "
                  f"boundary {median_spread([x * 1000 for x in out[(mib, mode, 'boundary')]], '.4f')} ms/step "
                  f"({median_spread(share, '.4f', ' to ')} of a step)")
    print(f"load average {load[0]:.1f} -> {load[1]:.1f}")
    print(" ".join(f"peer_boundary_share_{mode}_{mib}mib="
                   f"{med(b / w for b, w in zip(out[(mib, mode, 'boundary')], out[(mib, 'off', 'wall')])):.4f}"
                   for mib in sizes for mode in MODES[1:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
