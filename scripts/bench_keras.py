#!/usr/bin/env python3
"""Benchmark: Keras ``fit`` with procsv's BackupAndRestore against Keras's own, and against none.

The same model and data in every run (an MLP with two 1024-unit layers on 8,192 synthetic examples,
128 batches an epoch, a seeded ``tf.data`` shuffle reshuffled every epoch, op determinism on):

(a) per-epoch time, median of epochs 2..E of each run, for: plain ``fit`` with no callback;
    ``fit`` with ``keras.callbacks.BackupAndRestore(save_freq=N)``; ``fit`` with
    ``procsv.keras.BackupAndRestore(save_freq=N)`` under ``procsv launch``. The three run in turns,
    ``--rounds`` times, in a rotating order. The machine is shared and its load drifts between runs,
    so the overhead is paired: in each round, a callback's median epoch time over plain fit's in
    the same round, minus 1; the figure is the median over the rounds (with its min-max).
    Beside it, procsv's in-loop cost: the time the training loop spent inside procsv's step
    boundary (bookkeeping, messages, the snapshot copies), measured around each batch in the
    trainer itself, as a share of fit's time: not blurred by the machine's drift, but blind to the
    checkpoint service's CPU competing with training.
(b) resumed correctness after 3 SIGKILLs at random moments (after the first save), for both
    callbacks (Keras's is relaunched by this script after each kill, procsv's by its watchdog):
    whether the final weights equal those of the uninterrupted plain fit bit for bit; how many
    batches the final weights were trained on twice (+) or not at all (-): their optimizer's update
    count minus an uninterrupted fit's; and the work redone: the updates applied over all the run's
    attempts (each attempt counts its own, in a file that survives the SIGKILL) minus an
    uninterrupted fit's. A Keras backup left corrupt by a kill (keras#20463) is counted; that run
    then starts over from scratch, as its user would have to.

Prints a table, then one line:
``fit_overhead=<x> overhead_ratio_vs_keras=<x> exact_procsv=<0|1> exact_keras=<0|1> repeated_batches_keras=<n>``
and exits non-zero if procsv's resumed fit is not exact (its own correctness check).

``scripts/bench_keras.py --child MODE ...`` is the training program itself (what each run runs).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from typing import Any, Optional

HERE = os.path.abspath(__file__)
REPO = os.path.dirname(os.path.dirname(HERE))
ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONUNBUFFERED="1")
EXAMPLES, BATCH = 8192, 64


# ------------------------------------------------------------------------------------ the child
def child(args: argparse.Namespace) -> int:
    import keras
    import numpy as np
    import tensorflow as tf

    keras.utils.set_random_seed(0)
    tf.config.experimental.enable_op_determinism()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(EXAMPLES, 64)).astype(np.float32)
    y = (x[:, :10].argmax(axis=1)).astype(np.int64)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(EXAMPLES, seed=1, reshuffle_each_iteration=True)
    ds = ds.batch(BATCH)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(1024, activation="relu"),
                              keras.layers.Dense(1024, activation="relu"), keras.layers.Dense(10)])
    model.compile(optimizer=keras.optimizers.Adam(1e-4),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    times: list[float] = []

    class EpochTimer(keras.callbacks.Callback):  # type: ignore[misc]
        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            self.t0 = time.perf_counter()

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            times.append(time.perf_counter() - self.t0)

    callbacks: list[Any] = [EpochTimer()]
    procsv_cb: Any = None
    if args.child == "keras":
        callbacks.append(keras.callbacks.BackupAndRestore(backup_dir=args.dir, save_freq=args.save_freq,
                                                          delete_checkpoint=False))
    elif args.child == "procsv":
        import procsv.keras

        procsv_cb = procsv.keras.BackupAndRestore(save_freq=args.save_freq)
        callbacks.append(procsv_cb)
    if args.count:  # after the restore: the updates this attempt applies, kept through a SIGKILL

        class Count(keras.callbacks.Callback):  # type: ignore[misc]
            def on_train_begin(self, logs: Any = None) -> None:
                self.start = int(model.optimizer.iterations.numpy())
                self.fd = os.open(os.path.join(args.dir, f"updates.{os.getpid()}"), os.O_CREAT | os.O_WRONLY, 0o644)

            def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
                os.pwrite(self.fd, struct.pack("<q", int(model.optimizer.iterations.numpy()) - self.start), 0)

        callbacks.append(Count())
    model.fit(ds, epochs=args.epochs, callbacks=callbacks, verbose=0)
    if model.stop_training:
        return 0  # stopped (SIGTERM): no result
    out = {"epoch_secs": times, "iterations": int(model.optimizer.iterations.numpy()),
           "loop_secs": procsv_cb.loop_secs if procsv_cb is not None else None}
    np.savez(os.path.join(args.dir, "weights.tmp.npz"), *[np.asarray(w) for w in model.weights])
    os.replace(os.path.join(args.dir, "weights.tmp.npz"), os.path.join(args.dir, "weights.npz"))
    with open(os.path.join(args.dir, "result.json.tmp"), "w") as fh:
        json.dump(out, fh)
    os.replace(os.path.join(args.dir, "result.json.tmp"), os.path.join(args.dir, "result.json"))
    return 0


# ------------------------------------------------------------------------------------ the runs
def child_cmd(mode: str, folder: str, epochs: int, save_freq: int, count: bool = False) -> list[str]:
    flags = ["--child", mode, "--dir", folder, "--epochs", str(epochs), "--save-freq", str(save_freq)]
    flags += ["--count"] if count else []
    if mode == "procsv":
        return [sys.executable, "-m", "procsv", "launch", HERE, "--logdir", os.path.join(folder, "run"),
                "--quiet", "--", *flags]
    return [sys.executable, HERE, *flags]


def result(folder: str) -> Optional[dict[str, Any]]:
    try:
        with open(os.path.join(folder, "result.json")) as fh:
            data: dict[str, Any] = json.load(fh)
            return data
    except FileNotFoundError:
        return None


def weights(folder: str) -> list[Any]:
    import numpy as np

    with np.load(os.path.join(folder, "weights.npz")) as data:
        return [data[f"arr_{i}"] for i in range(len(data.files))]


def identical(a: list[Any], b: list[Any]) -> bool:
    return len(a) == len(b) and all(x.dtype == y.dtype and x.tobytes() == y.tobytes() for x, y in zip(a, b))


def run_once(mode: str, root: str, epochs: int, save_freq: int) -> dict[str, Any]:
    folder = tempfile.mkdtemp(prefix=f"{mode}-", dir=root)
    done = subprocess.run(child_cmd(mode, folder, epochs, save_freq), capture_output=True, text=True, env=ENV,
                          cwd=REPO, timeout=1800)
    res = result(folder)
    if done.returncode != 0 or res is None:
        raise SystemExit(f"bench_keras: the {mode} run failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    res["folder"] = folder
    return res


def saved(mode: str, folder: str) -> bool:
    if mode == "keras":
        return os.path.exists(os.path.join(folder, "training_metadata.json"))
    from procsv.common.layout import Layout

    manifests = Layout(os.path.join(folder, "run")).manifests  # one manifest per committed checkpoint
    return os.path.isdir(manifests) and any(n.endswith(".json") for n in os.listdir(manifests))


def trainer_pid(folder: str) -> Optional[int]:
    try:
        with open(os.path.join(folder, "run", ".procsv", "status.json")) as fh:
            st = json.load(fh)
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    for p in st.get("processes", []):
        if p["role"] == "trainer" and p["state"] == "running":
            return int(p["pid"])
    return None


def updates_applied(folder: str) -> int:
    """Optimizer updates applied over every attempt of a run (each attempt's count file)."""
    total = 0
    for name in os.listdir(folder):
        if name.startswith("updates."):
            with open(os.path.join(folder, name), "rb") as fh:
                data = fh.read(8)
            total += struct.unpack("<q", data)[0] if len(data) == 8 else 0
    return total


def clear_keras_backup(folder: str) -> None:
    for name in os.listdir(folder):
        if name.endswith(".h5") or name.endswith(".json") and name != "result.json" or name.endswith(".bkp"):
            os.remove(os.path.join(folder, name))


def killed_run(mode: str, root: str, epochs: int, save_freq: int, kills: int, rng: random.Random) -> dict[str, Any]:
    """A run SIGKILLed ``kills`` times at random moments after its first save, then finished.

    Keras's run is started again by this script after each kill, as its user would; a backup the
    kill left corrupt (keras#20463) makes that start fail: it is counted, the backup is deleted,
    and the run starts over from scratch (what is left to a user)."""
    folder = tempfile.mkdtemp(prefix=f"{mode}-killed-", dir=root)
    cmd = child_cmd(mode, folder, epochs, save_freq, count=True)
    done, last, corrupt = 0, None, 0

    def start() -> subprocess.Popen[str]:
        return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=ENV,
                                cwd=REPO, start_new_session=True)

    def start_over() -> subprocess.Popen[str]:  # Keras could not resume (a corrupt backup): from scratch
        nonlocal corrupt
        corrupt += 1
        clear_keras_backup(folder)
        return start()

    proc = start()
    while True:
        deadline = time.monotonic() + 600
        while not saved(mode, folder) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if mode == "keras" and proc.poll() not in (None, 0):
            proc = start_over()
            continue
        if done >= kills or proc.poll() is not None:
            break
        time.sleep(rng.uniform(0.2, 1.0))  # a run of 4 short epochs must take all the kills before it ends
        if mode == "keras":
            if proc.poll() is not None:
                continue
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            proc = start()
        else:
            pid = trainer_pid(folder)
            while pid in (None, last) and proc.poll() is None:  # the restarted trainer, not the one killed
                time.sleep(0.05)
                pid = trainer_pid(folder)
            if pid is None or proc.poll() is not None:
                continue
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                continue
            last = pid
        done += 1
    _, err = proc.communicate(timeout=1800)
    while mode == "keras" and proc.returncode != 0 and corrupt <= kills:  # the start after the last kill, too
        proc = start_over()
        _, err = proc.communicate(timeout=1800)
    res = result(folder)
    if proc.returncode != 0 or res is None:
        raise SystemExit(f"bench_keras: the killed {mode} run failed (exit {proc.returncode}):\n{err[-3000:]}")
    res["folder"], res["kills"], res["corrupt"], res["updates"] = folder, done, corrupt, updates_applied(folder)
    return res


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--child", choices=("plain", "keras", "procsv"))
    p.add_argument("--dir")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--save-freq", type=int, default=100, help="N: save every N batches (default 100)")
    p.add_argument("--rounds", type=int, default=5, help="runs of each mode for (a) (default 5)")
    p.add_argument("--kills", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--count", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(args)

    root = tempfile.mkdtemp(prefix="bench-keras-")
    try:
        modes = ["plain", "keras", "procsv"]
        epoch_secs: dict[str, list[float]] = {m: [] for m in modes}
        first: dict[str, dict[str, Any]] = {}
        in_loop: list[float] = []
        for r in range(args.rounds):
            for mode in modes[r % 3:] + modes[:r % 3]:
                res = run_once(mode, root, args.epochs, args.save_freq)
                epoch_secs[mode].append(statistics.median(res["epoch_secs"][1:]))
                if mode == "procsv":  # time inside procsv's step boundary, measured in the loop itself
                    in_loop.append(res["loop_secs"] / sum(res["epoch_secs"]))
                first.setdefault(mode, res)
                print(f"  round {r + 1} {mode:7s} median epoch {epoch_secs[mode][-1] * 1000:8.1f} ms", flush=True)
        med = {m: statistics.median(v) for m, v in epoch_secs.items()}
        paired = {m: [a / b - 1 for a, b in zip(epoch_secs[m], epoch_secs["plain"])] for m in ("keras", "procsv")}
        over = {m: statistics.median(v) for m, v in paired.items()}
        ratio = over["procsv"] / over["keras"] if over["keras"] > 0 else float("nan")
        reference = weights(first["plain"]["folder"])
        batches = args.epochs * (EXAMPLES // BATCH)
        same = {m: identical(weights(first[m]["folder"]), reference) for m in ("keras", "procsv")}

        rng = random.Random(args.seed)
        killed = {m: killed_run(m, root, args.epochs, args.save_freq, args.kills, rng) for m in ("keras", "procsv")}
        exact = {m: identical(weights(killed[m]["folder"]), reference) for m in killed}
        # in the final weights, batches applied twice (or skipped, if negative): its optimizer's update
        # count beyond an uninterrupted fit's; work redone: updates over all attempts beyond it
        repeated = {m: killed[m]["iterations"] - batches for m in killed}
        redone = {m: killed[m]["updates"] - batches for m in killed}

        print()
        print(f"{'':28s} {'plain fit':>12s} {'keras B&R':>12s} {'procsv B&R':>12s}")
        print(f"{'median epoch (ms)':28s} {med['plain'] * 1000:12.1f} {med['keras'] * 1000:12.1f} "
              f"{med['procsv'] * 1000:12.1f}")
        print(f"{'  spread (min-max ms)':28s} " + " ".join(
            f"{min(epoch_secs[m]) * 1000:5.0f}-{max(epoch_secs[m]) * 1000:<6.0f}" for m in modes))
        print(f"{'overhead over plain fit':28s} {'':>12s} {over['keras'] * 100:11.2f}% {over['procsv'] * 100:11.2f}%")
        print(f"{'  per-round min..max':28s} {'':>12s} " + " ".join(
            f"{min(paired[m]) * 100:+5.1f}..{max(paired[m]) * 100:+.1f}%" for m in ("keras", "procsv")))
        print(f"{'procsv in-loop cost':28s} {'':>12s} {'':>12s} {statistics.median(in_loop) * 100:11.2f}%  "
              f"({min(in_loop) * 100:.2f}..{max(in_loop) * 100:.2f}%: step boundaries + snapshots, of fit's time)")
        print(f"{'uninterrupted = plain fit':28s} {'':>12s} {str(same['keras']):>12s} {str(same['procsv']):>12s}")
        print(f"{'SIGKILLs done':28s} {'':>12s} {killed['keras']['kills']:12d} {killed['procsv']['kills']:12d}")
        print(f"{'resumed = uninterrupted':28s} {'':>12s} {str(exact['keras']):>12s} {str(exact['procsv']):>12s}")
        print(f"{'batches twice in the weights':28s} {'':>12s} {repeated['keras']:12d} {repeated['procsv']:12d}")
        print(f"{'updates redone (lost work)':28s} {'':>12s} {redone['keras']:12d} {redone['procsv']:12d}")
        print(f"{'backup corrupted by a kill':28s} {'':>12s} {killed['keras']['corrupt']:12d} "
              f"{killed['procsv']['corrupt']:12d}")
        print(f"(save_freq={args.save_freq} batches, {EXAMPLES // BATCH} batches an epoch, {args.epochs} epochs, "
              f"{args.rounds} rounds)")
        print(f"fit_overhead={over['procsv']:.4f} in_loop_overhead={statistics.median(in_loop):.4f} "
              f"overhead_ratio_vs_keras={ratio:.3f} exact_procsv={int(exact['procsv'])} "
              f"exact_keras={int(exact['keras'])} repeated_batches_keras={repeated['keras']}")
        ok = exact["procsv"] and repeated["procsv"] == 0 and same["procsv"] and killed["procsv"]["kills"] == args.kills \
            and killed["procsv"]["iterations"] == batches
        return 0 if ok else 1
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
