"""What a checkpoint costs a running training loop: procsv's checkpoint service vs a synchronous save.

Runs in one process (plus the two procsv services it starts, as a plain ``python train.py``
would): ``.venv/bin/python scripts/bench_checkpoint.py [--rounds N] [--sizes-mb 100,1024]``.

For each state size (float32 model variables plus two optimizer slots each, like Adam), with a
compute-bound training loop running (a tanh(x @ W) chain plus a fused Adam update of every
variable, in one ``tf.function``), on the same state, it measures windows of a fixed number of
steps, interleaved, ``--rounds`` times:

* ``ref``: the steps with no checkpoint;
* ``baseline``: the same steps with ``tf.train.CheckpointManager.save()`` + fsync of its files,
  in the loop, after the first step;
* ``procsv``: the same steps with a procsv checkpoint triggered at the first step boundary
  (``Supervisor`` in the loop, the checkpoint service persisting meanwhile).

and reports medians of

* **lost**: window time minus the ``ref`` window time of the same round: blocking plus every
  slowdown the checkpoint causes while it persists (the window is long enough to cover the
  commit; the script checks that);
* **blocked**: the longest the loop's call stopped (procsv: the snapshot at the step boundary;
  baseline: the whole save + fsync);
* **commit latency**: trigger to durable and visible (procsv: snapshot start to its manifest --
  the commit point -- appearing; baseline: save + fsync);
* **peak extra memory** as a multiple of the state size (procsv: the shared snapshot memory plus
  the peak growth of trainer and service during the window; baseline: the peak growth of the
  process during the save). Page cache is not counted for either.

The ratios are procsv / baseline, measured within this one run: the ratio of the medians over the
rounds (at least 5 at the largest size, 9 at the smaller), with the spread of the per-round ratios
printed under the table. The last line is
``lost_ratio_100MB=<x> lost_ratio_1GB=<x> blocked_ratio_1GB=<x> commit_latency_ratio_1GB=<x>
peak_extra_mem_ratio=<x>`` (the memory ratio at the largest size).
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import psutil  # noqa: E402

N_PARAMS = 6  # variables per role (params, m, v)
MATMULS = 6  # tanh(x @ W) layers per step: the compute-bound part


@dataclass
class Sample:
    lost: float
    blocked: float
    latency: float
    mem: float


@dataclass
class Results:
    size_bytes: int
    step_secs: float = 0.0
    steps: tuple[int, int] = (0, 0)
    base: list[Sample] = field(default_factory=list)
    ours: list[Sample] = field(default_factory=list)

    def med(self, which: str, attr: str) -> float:
        return statistics.median(getattr(s, attr) for s in getattr(self, which))

    def spread(self, attr: str) -> tuple[float, float]:
        """Min and max over the rounds of the per-round ratio procsv / baseline."""
        ratios = [o_v / b_v for o_v, b_v in ((getattr(o, attr), getattr(b, attr)) for o, b in zip(self.ours, self.base))
                  if b_v > 0]
        return (min(ratios), max(ratios)) if ratios else (float("nan"), float("nan"))


# ------------------------------------------------------------------------------------ memory
def _status_kb(pid: int, key: str) -> int:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def _reset_peak(pid: int) -> None:
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as fh:
            fh.write("5")  # resets VmHWM to the current RSS
    except OSError:
        pass


class PeakWatch:
    """Peak RSS growth of some processes over a window (VmHWM after a reset)."""

    def __init__(self, pids: list[int]) -> None:
        self.pids = pids
        self.start: dict[int, int] = {}

    def __enter__(self) -> "PeakWatch":
        for pid in self.pids:
            _reset_peak(pid)
            self.start[pid] = _status_kb(pid, "VmRSS")
        return self

    def __exit__(self, *exc: Any) -> None:
        pass

    def growth_bytes(self) -> int:
        return sum(max(0, _status_kb(pid, "VmHWM") - self.start[pid]) for pid in self.pids) * 1024


# ------------------------------------------------------------------------------------ the loop
class Model:
    def __init__(self, size_bytes: int) -> None:
        import tensorflow as tf

        per = size_bytes // (3 * N_PARAMS) // 4
        self.params = [tf.Variable(tf.random.normal([per], seed=i) * 0.01, name=f"p{i}") for i in range(N_PARAMS)]
        self.m = [tf.Variable(tf.zeros([per]), name=f"m{i}") for i in range(N_PARAMS)]
        self.v = [tf.Variable(tf.zeros([per]), name=f"v{i}") for i in range(N_PARAMS)]
        self.grads = [tf.constant(np.full([per], 1e-3, np.float32)) for _ in range(N_PARAMS)]
        self.w = tf.constant(np.random.default_rng(0).normal(0, 0.03, (1024, 1024)).astype(np.float32))
        self.x = tf.constant(np.random.default_rng(1).normal(0, 1, (512, 1024)).astype(np.float32))
        self.size_bytes = 3 * N_PARAMS * per * 4
        self.step = tf.function(self._step)

    def _step(self) -> Any:
        import tensorflow as tf

        y = self.x
        for _ in range(MATMULS):
            y = tf.tanh(y @ self.w)
        for p, m, v, g in zip(self.params, self.m, self.v, self.grads):
            tf.raw_ops.ResourceApplyAdam(var=p.handle, m=m.handle, v=v.handle, beta1_power=0.9, beta2_power=0.999,
                                         lr=1e-4, beta1=0.9, beta2=0.999, epsilon=1e-7, grad=g)
        return tf.reduce_mean(y)


def run_steps(sess: Any, model: Model, n: int, at_first: Optional[Callable[[], None]] = None) -> float:
    t0 = time.perf_counter()
    for i in range(n):
        sess.run(model.step)
        if i == 0 and at_first is not None:
            at_first()
    return time.perf_counter() - t0


class ManifestWatch(threading.Thread):
    """Notes when a checkpoint's manifest (procsv's commit point) appears."""

    def __init__(self, path: str) -> None:
        super().__init__(daemon=True)
        self.path = path
        self.seen_at: Optional[float] = None
        self.stop = threading.Event()
        self.start()

    def run(self) -> None:
        while not self.stop.is_set():
            if os.path.exists(self.path):
                self.seen_at = time.perf_counter()
                return
            time.sleep(0.002)


# ------------------------------------------------------------------------------------ one size
def bench_size(size_bytes: int, rounds: int, workdir: str) -> Results:
    import tensorflow as tf

    import procsv
    from procsv.ipc.messages import SaveReason

    model = Model(size_bytes)
    res = Results(model.size_bytes)
    logdir = os.path.join(workdir, f"procsv-{size_bytes >> 20}MB")
    base_dir = os.path.join(workdir, f"baseline-{size_bytes >> 20}MB")
    base_ckpt = tf.train.Checkpoint(params=model.params, m=model.m, v=model.v)
    manager = tf.train.CheckpointManager(base_ckpt, base_dir, max_to_keep=1)
    sv = procsv.Supervisor(logdir=logdir, checkpoint={"params": model.params, "m": model.m, "v": model.v},
                           save_model_secs=None, save_summaries_secs=None, max_to_keep=1, stop_grace_secs=120)
    with sv.managed_session() as sess:
        agent = sv._keeper.agent  # the trainer-side checkpoint agent: the bench triggers saves through it
        assert agent is not None
        service = [p.pid for p in psutil.Process().children() if "procsv.services.checkpoint" in " ".join(p.cmdline())]
        run_steps(sess, model, 3)
        step_secs = statistics.median(run_steps(sess, model, 1) for _ in range(5))
        res.step_secs = step_secs

        def baseline_save(box: dict[str, float]) -> None:
            t0 = time.perf_counter()
            path = manager.save()
            for name in glob.glob(path + ".*"):
                fd = os.open(name, os.O_RDONLY)
                os.fsync(fd)
                os.close(fd)
            box["secs"] = time.perf_counter() - t0

        def procsv_save(box: dict[str, float]) -> None:
            agent.request(SaveReason.PERIODIC)  # a reason the service accepts ("bench" was refused as malformed)
            box["requested_step"] = sv.step  # snapshotted at the start of the next run: the state of this step

        # warm-up: one of each (first saves pay one-time costs: file creation, arena first touch, tracing)
        latencies = []
        for _ in range(2):
            box: dict[str, float] = {}
            baseline_save(box)
            box = {}
            procsv_save(box)
            t0 = time.perf_counter()
            run_steps(sess, model, 1)
            wait_committed(sess, model, agent, int(box["requested_step"]), 120)
            latencies.append(time.perf_counter() - t0)
        box = {}
        baseline_save(box)
        base_secs = box["secs"]
        # each window spans its checkpoint and then some (steps after the commit, where retention
        # deletes the old files): the baseline's blocking save, procsv's snapshot-to-commit time
        base_steps = max(6, int((base_secs + 1.0) / step_secs) + 3)
        ours_steps = max(6, int((1.5 * min(latencies) + 0.5) / step_secs) + 3)
        res.steps = (base_steps, ours_steps)
        for r in range(rounds):
            box = {}
            with PeakWatch([os.getpid()]) as pw:
                ref1 = run_steps(sess, model, base_steps)
                t_base = run_steps(sess, model, base_steps, at_first=lambda: baseline_save(box))
                ref2 = run_steps(sess, model, base_steps)
            base_ref = (ref1 + ref2) / 2
            res.base.append(Sample(t_base - base_ref, box["secs"], box["secs"], pw.growth_bytes() / res.size_bytes))
            box = {}
            ref1 = run_steps(sess, model, ours_steps)
            target = sv.step  # the state of this step is snapshotted at the start of the next run
            watch = ManifestWatch(os.path.join(logdir, ".procsv", "checkpoints", f"model.ckpt-{target}.json"))
            with PeakWatch([os.getpid()] + service) as pw:
                procsv_save(box)
                started = time.perf_counter()  # the first run call begins with the snapshot
                t_ours = run_steps(sess, model, ours_steps)
                growth = pw.growth_bytes()
            snap = agent.last_snapshot_secs
            wait_committed(sess, model, agent, target, 120)
            ref2 = run_steps(sess, model, ours_steps)
            watch.join(10)
            if watch.seen_at is None:
                raise SystemExit(f"the procsv checkpoint of step {target} never committed")
            latency = watch.seen_at - started
            inside = watch.seen_at <= started + t_ours
            arena = agent.store.arena.size if agent.store.arena is not None else 0
            ours_ref = (ref1 + ref2) / 2
            res.ours.append(Sample(t_ours - ours_ref, snap, latency, (arena + growth) / res.size_bytes))
            print(f"  {res.size_bytes / 2**20:5.0f} MiB round {r + 1}: baseline lost {res.base[-1].lost:+.3f} s "
                  f"(save {res.base[-1].blocked:.3f} s), procsv lost {res.ours[-1].lost:+.3f} s "
                  f"(snapshot {snap * 1000:.1f} ms, commit {latency:.3f} s{'' if inside else ', AFTER its window'})",
                  flush=True)
    shutil.rmtree(logdir, ignore_errors=True)
    shutil.rmtree(base_dir, ignore_errors=True)
    return res


def wait_committed(sess: Any, model: Model, agent: Any, step: int, timeout: float) -> None:
    """Keep stepping until the trainer has heard that ``step`` committed (results arrive at boundaries)."""
    deadline = time.monotonic() + timeout
    while agent.last_committed < step:
        if time.monotonic() > deadline:
            raise SystemExit(f"checkpoint of step {step} did not commit within {timeout} s")
        sess.run(model.step)


# ------------------------------------------------------------------------------------ report
def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5, help="rounds at the largest size (smaller sizes: more)")
    p.add_argument("--sizes-mb", default="100,1024", help="state sizes in MiB (default 100,1024)")
    p.add_argument("--workdir", default=None, help="where checkpoints go (default: a new temp dir)")
    args = p.parse_args()
    sizes = [int(float(s) * 2**20) for s in args.sizes_mb.split(",")]
    workdir = args.workdir or tempfile.mkdtemp(prefix="bench-checkpoint-")
    os.makedirs(workdir, exist_ok=True)
    t0 = time.monotonic()
    results = []
    try:
        for size in sizes:
            rounds = args.rounds if size == max(sizes) else 2 * args.rounds - 1
            print(f"state {size / 2**20:.0f} MiB: {rounds} rounds", flush=True)
            results.append(bench_size(size, rounds, workdir))
    finally:
        if not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    print()
    print(f"{'state':>9} {'steps':>7} {'step s':>7} | {'lost s':>15} {'ratio':>6} | {'blocked s':>15} {'ratio':>6} | "
          f"{'commit s':>15} {'ratio':>6} | {'peak mem x':>11}")
    print(f"{'':>9} {'b/p':>7} {'':>7} | {'base':>7} {'procsv':>7} {'':>6} | {'base':>7} {'procsv':>7} {'':>6} | "
          f"{'base':>7} {'procsv':>7} {'':>6} | {'base':>5} {'procsv':>5}")
    ratios: dict[int, dict[str, float]] = {}
    for r in results:
        q = {k: (r.med("base", k), r.med("ours", k)) for k in ("lost", "blocked", "latency", "mem")}
        ratios[r.size_bytes] = {k: q[k][1] / q[k][0] if q[k][0] > 0 else float("inf") for k in q}
        ratios[r.size_bytes]["mem"] = q["mem"][1]
        print(f"{r.size_bytes / 2**20:6.0f}MiB {r.steps[0]:3d}/{r.steps[1]:<3d} {r.step_secs:7.3f} | "
              f"{q['lost'][0]:7.3f} {q['lost'][1]:7.3f} {ratios[r.size_bytes]['lost']:6.3f} | "
              f"{q['blocked'][0]:7.3f} {q['blocked'][1]:7.4f} {ratios[r.size_bytes]['blocked']:6.3f} | "
              f"{q['latency'][0]:7.3f} {q['latency'][1]:7.3f} {ratios[r.size_bytes]['latency']:6.3f} | "
              f"{q['mem'][0]:5.2f} {q['mem'][1]:5.2f}")
    print(f"(medians of {len(results[0].base)} rounds at {results[0].size_bytes / 2**20:.0f} MiB, {len(results[-1].base)} at "
          f"{results[-1].size_bytes / 2**20:.0f} MiB; {time.monotonic() - t0:.0f} s in all)")
    print("spread of the per-round ratios (min-max): " + "; ".join(
        f"{r.size_bytes / 2**20:.0f} MiB lost {r.spread('lost')[0]:.3f}-{r.spread('lost')[1]:.3f}, "
        f"commit {r.spread('latency')[0]:.3f}-{r.spread('latency')[1]:.3f}" for r in results))
    small, large = results[0].size_bytes, results[-1].size_bytes
    print(f"lost_ratio_100MB={ratios[small]['lost']:.3f} lost_ratio_1GB={ratios[large]['lost']:.3f} "
          f"blocked_ratio_1GB={ratios[large]['blocked']:.4f} commit_latency_ratio_1GB={ratios[large]['latency']:.3f} "
          f"peak_extra_mem_ratio={ratios[large]['mem']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
