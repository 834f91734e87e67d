#!/usr/bin/env python3
"""Benchmark: Keras ``fit`` with procsv's BackupAndRestore against Keras's own, and against none.

The same model and data in every run (an MLP with two 1024-unit layers on 8,192 synthetic examples,
128 batches an epoch, a seeded ``tf.data`` shuffle reshuffled every epoch, op determinism on):

(a) the time overhead of each callback over plain ``fit``: plain ``fit`` with no callback, ``fit``
    with ``keras.callbacks.BackupAndRestore(save_freq=N)`` and ``fit`` with
    ``procsv.keras.BackupAndRestore(save_freq=N)`` under ``procsv launch`` run at the same time and
    take turns (``lockstep.py``): each runs ``--turn-batches`` batches (16, about 0.13 s) while the
    other two wait (their training processes on a FIFO; procsv's watchdog and services stopped
    with SIGSTOP, so that their work lands in procsv's turns), for ``--rounds`` rounds in a
    rotating order. procsv's trainer timers read a clock that stands still while it waits, so its
    in-memory snapshots and progress reports come as often per second of training as in a run of
    its own. This machine's speed drifts by
    5-15 % from one second to the next, so separate runs, even interleaved, could not resolve 2 %;
    turns of a tenth of a second see the same machine. The overhead is the callback's total time
    over its turns against plain fit's, minus 1; its spread within a series is shown by quarters,
    and the figure is the median over ``--repeats`` series of freshly started processes. The
    first ``--warmup-rounds`` turns (tracing) are not measured, and procsv's standby is prepared
    before the measured turns begin (with every trainer waiting), as it is in the first seconds of
    a real run. In (a) the input pipeline has tf.data's autotuning off, in all three alike: its
    thread stalled the first batch of an epoch that followed an idle wait for up to 2.56 s.
    Beside it: procsv's in-loop cost (the time the training loop spent inside procsv's step
    boundary, measured around each batch in the trainer itself) and the CPU its other processes
    used per second of its turns (watchdog, services, standby, zygote: on 2 cores where training
    keeps both busy, that CPU costs training about as much time).
    And the same in CPU: each turn also reports the CPU seconds its training process used
    (``time.process_time``, every thread); procsv's CPU is its trainer's plus its other processes'
    over its turns. ``cpu_overhead`` = that CPU per batch over plain fit's, minus 1. On a machine
    shared with other work the wall figure measures the CPU share the scheduler gives each
    contender as much as its work: measured at a load average of 20-27 on 2 cores, procsv's trainer
    used the same CPU per batch as plain fit (8.42 ms against 8.37) while its turns took 27 % less
    wall time, in every series. The CPU figures are the cost; the wall figures are shown beside them.
(b) resumed correctness after 3 SIGKILLs at random moments (after the first save), for both
    callbacks (Keras's is relaunched by this script after each kill, procsv's by its watchdog):
    whether the final weights equal those of the uninterrupted plain fit bit for bit; how many
    batches the final weights were trained on twice (+) or not at all (-): their optimizer's update
    count minus an uninterrupted fit's; and the work redone: the updates applied over all the run's
    attempts (each attempt counts its own, in a file that survives the SIGKILL) minus an
    uninterrupted fit's. A Keras backup left corrupt by a kill (keras#20463) is counted; that run
    then starts over from scratch, as its user would have to.

Prints a table, then one line:
``fit_overhead=<x> in_loop_overhead=<x> overhead_ratio_vs_keras=<x> cpu_overhead=<x> cpu_overhead_ratio_vs_keras=<x>
exact_procsv=<0|1> exact_keras=<0|1> repeated_batches_keras=<n>``
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
from typing import Any, Callable, Optional

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
    if args.turns:  # (a): tf.data's autotuning thread stalled the first batch of an epoch that followed
        # an idle wait for up to 2.56 s (its optimization period), in every contender alike
        options = tf.data.Options()
        options.autotune.enabled = False
        ds = ds.with_options(options)
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
    turns: Any = None
    if args.child == "procsv":
        import procsv.keras

        # in (a) procsv's timers read the time trained, not the time spent waiting for turns
        procsv_cb = procsv.keras.BackupAndRestore(
            save_freq=args.save_freq, clock=lambda: turns.clock() if turns is not None else time.monotonic())
        callbacks.append(procsv_cb)
    if args.turns:  # (a): take turns with the other contenders (lockstep.py), K batches a turn
        sys.path.insert(0, os.path.dirname(HERE))
        from lockstep import Turns

        class TakeTurns(keras.callbacks.Callback):  # type: ignore[misc]
            def on_train_begin(self, logs: Any = None) -> None:  # after procsv's: its wrapper is timed
                # here, not before fit: a hot standby runs the program up to procsv's on_train_begin
                nonlocal turns
                turns = Turns(args.dir, args.turns,
                              extra=(lambda: procsv_cb.loop_secs) if procsv_cb is not None else float)
                inner = model.train_function

                def train_function(iterator: Any) -> Any:
                    if not turns.block():
                        model.stop_training = True  # this batch still runs; fit ends after it
                    return inner(iterator)

                model.train_function = train_function

        callbacks.append(TakeTurns())
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
def child_cmd(mode: str, folder: str, epochs: int, save_freq: int, count: bool = False, turns: int = 0) -> list[str]:
    flags = ["--child", mode, "--dir", folder, "--epochs", str(epochs), "--save-freq", str(save_freq)]
    flags += ["--count"] if count else []
    flags += ["--turns", str(turns)] if turns else []
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


MODES = ("plain", "keras", "procsv")


def procsv_background(p: Any) -> bool:
    """The processes of procsv's launch that work while its trainer waits for its turn: the
    watchdog (the launch itself) and the two services. Not the trainer, the standby or the
    zygote: they are idle then, and stopping a TensorFlow process wakes each of its dozens of
    threads twice (to stop, to go on), a cost no real run has."""
    try:
        cmd = p.cmdline()
    except Exception:
        return False
    return "launch" in cmd or any(c.startswith("procsv.services.") for c in cmd)


def lockstep_series(root: str, args: argparse.Namespace) -> dict[str, Any]:
    """(a), one repeat: the three contenders started at once and run in turns (``lockstep.py``)."""
    sys.path.insert(0, os.path.dirname(HERE))
    from lockstep import Contender, quiesce

    contenders = []
    for mode in MODES:
        folder = tempfile.mkdtemp(prefix=f"{mode}-turns-", dir=root)
        contenders.append(Contender(mode, folder, child_cmd(mode, folder, 100000, args.save_freq,
                                                            turns=args.turn_batches), ENV, REPO,
                                    background=procsv_background if mode == "procsv" else lambda p: False))
    secs: dict[str, list[float]] = {m: [] for m in MODES}
    cpu: dict[str, list[float]] = {m: [] for m in MODES}  # the training process's CPU seconds, each turn
    loop = 0.0
    try:
        for c in contenders:
            c.connect(timeout=600)
        procsv = contenders[MODES.index("procsv")]
        trainer = procsv.pid
        bg0 = 0.0
        for r in range(args.warmup_rounds + args.rounds):
            if r in (0, args.warmup_rounds):
                # before any turn: the services import TF; after the warm-up turns (the step function
                # traced): procsv prepares its standby after the first step. Let all that finish with
                # no turn running, or it would be charged to procsv's turns only (the rest are stopped).
                for c in contenders:
                    c.resume()
                quiesce(contenders)
                for c in contenders:
                    c.pause()
                bg0 = procsv.cpu_secs(exclude=(trainer,))  # CPU of procsv's watchdog, services, standby
            for c in contenders[r % 3:] + contenders[:r % 3]:
                t, extra, used = c.turn()
                if r >= args.warmup_rounds:
                    secs[c.name].append(t)
                    cpu[c.name].append(used)
                    loop += extra if c.name == "procsv" else 0.0
        background = procsv.cpu_secs(exclude=(trainer,)) - bg0
        codes = {c.name: c.finish(timeout=600) for c in contenders}
    except BaseException:
        for c in contenders:
            c.kill()
        raise
    if any(codes.values()):
        raise SystemExit(f"bench_keras: a contender did not end cleanly: {codes}\n" +
                         "\n".join(f"{c.name}: {c.tail()}" for c in contenders if codes[c.name]))
    total = {m: sum(v) for m, v in secs.items()}
    # CPU: the training process's own, plus (procsv) its watchdog's, services' and standby's over its turns
    cpu_total = {m: sum(v) + (background if m == "procsv" else 0.0) for m, v in cpu.items()}
    quarters = [slice(q * args.rounds // 4, (q + 1) * args.rounds // 4) for q in range(4)]
    return {"over": {m: total[m] / total["plain"] - 1 for m in ("keras", "procsv")},
            "cpu_over": {m: cpu_total[m] / cpu_total["plain"] - 1 for m in ("keras", "procsv")},
            "cpu_ms_per_batch": {m: cpu_total[m] / (len(cpu[m]) * args.turn_batches) * 1000 for m in MODES},
            "quarters": {m: [sum(secs[m][q]) / sum(secs["plain"][q]) - 1 for q in quarters] for m in ("keras", "procsv")},
            "epoch": {m: total[m] / len(secs[m]) * (EXAMPLES // BATCH) / args.turn_batches for m in MODES},
            "in_loop": loop / total["procsv"],
            "background_ms_per_s": background / total["procsv"] * 1000,
            "secs": secs}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--child", choices=MODES)
    p.add_argument("--dir")
    p.add_argument("--epochs", type=int, default=4, help="epochs of the uninterrupted and killed fits (default 4)")
    p.add_argument("--save-freq", type=int, default=100, help="N: save every N batches (default 100)")
    p.add_argument("--repeats", type=int, default=3, help="lockstep series for (a) (default 3)")
    p.add_argument("--rounds", type=int, default=240, help="measured turns of each contender a series (default 240)")
    p.add_argument("--warmup-rounds", type=int, default=16, help="turns not measured first (default 16: 2 epochs)")
    p.add_argument("--turn-batches", type=int, default=16, help="K: batches a turn (default 16)")
    p.add_argument("--kills", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--count", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--turns", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(args)

    root = tempfile.mkdtemp(prefix="bench-keras-")
    try:
        series = []
        for rep in range(args.repeats):
            res = lockstep_series(root, args)
            series.append(res)
            print(f"  series {rep + 1}: procsv {res['over']['procsv'] * 100:+.2f}% (quarters " +
                  " ".join(f"{q * 100:+.1f}" for q in res["quarters"]["procsv"]) +
                  f"), keras {res['over']['keras'] * 100:+.2f}% (quarters " +
                  " ".join(f"{q * 100:+.1f}" for q in res["quarters"]["keras"]) +
                  f"), in-loop {res['in_loop'] * 100:.2f}%, background {res['background_ms_per_s']:.1f} ms/s; "
                  f"CPU: procsv {res['cpu_over']['procsv'] * 100:+.2f}%, keras {res['cpu_over']['keras'] * 100:+.2f}%",
                  flush=True)

        def med(get: Callable[[dict[str, Any]], float]) -> float:
            return float(statistics.median(get(r) for r in series))

        def spread(get: Callable[[dict[str, Any]], float], scale: float = 100.0, fmt: str = "+.2f") -> str:
            vals = [get(r) * scale for r in series]
            return f"{min(vals):{fmt}}..{max(vals):{fmt}}"

        def at(key: str, mode: str) -> Callable[[dict[str, Any]], float]:
            return lambda r: float(r[key][mode])

        over = {m: med(at("over", m)) for m in ("keras", "procsv")}
        in_loop = med(lambda r: r["in_loop"])
        ratio = over["procsv"] / over["keras"] if over["keras"] > 0 else float("nan")
        cpu_over = {m: med(at("cpu_over", m)) for m in ("keras", "procsv")}
        cpu_ratio = cpu_over["procsv"] / cpu_over["keras"] if cpu_over["keras"] > 0 else float("nan")

        first = {m: run_once(m, root, args.epochs, args.save_freq) for m in MODES}  # uninterrupted fits
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
        print(f"{'':30s} {'plain fit':>14s} {'keras B&R':>14s} {'procsv B&R':>14s}")
        print(f"{'epoch time, in turns (ms)':30s} " + " ".join(
            f"{med(at('epoch', m)) * 1000:14.1f}" for m in MODES))
        print(f"{'  spread over series':30s} " + " ".join(
            f"{spread(at('epoch', m), 1000.0, '.0f'):>14s}" for m in MODES))
        print(f"{'overhead over plain fit':30s} {'':>14s} {over['keras'] * 100:13.2f}% {over['procsv'] * 100:13.2f}%")
        print(f"{'  spread over series':30s} {'':>14s} " + " ".join(
            f"{spread(at('over', m)):>14s}" for m in ("keras", "procsv")))
        print(f"{'CPU per batch (ms)':30s} " + " ".join(
            f"{med(at('cpu_ms_per_batch', m)):14.2f}" for m in MODES))
        print(f"{'CPU overhead over plain fit':30s} {'':>14s} {cpu_over['keras'] * 100:13.2f}% "
              f"{cpu_over['procsv'] * 100:13.2f}%")
        print(f"{'  spread over series':30s} {'':>14s} " + " ".join(
            f"{spread(at('cpu_over', m)):>14s}" for m in ("keras", "procsv")))
        print(f"{'procsv in-loop cost':30s} {'':>14s} {'':>14s} {in_loop * 100:13.2f}%  "
              f"({spread(lambda r: r['in_loop'], fmt='.2f')}%: step boundaries + snapshots)")
        print(f"{'procsv background CPU':30s} {'':>14s} {'':>14s} "
              f"{med(lambda r: r['background_ms_per_s']):10.1f} ms/s  (watchdog, services, standby, zygote: "
              f"{spread(lambda r: r['background_ms_per_s'], 1.0, '.1f')} ms per second of procsv's turns)")
        print(f"{'uninterrupted = plain fit':30s} {'':>14s} {str(same['keras']):>14s} {str(same['procsv']):>14s}")
        print(f"{'SIGKILLs done':30s} {'':>14s} {killed['keras']['kills']:14d} {killed['procsv']['kills']:14d}")
        print(f"{'resumed = uninterrupted':30s} {'':>14s} {str(exact['keras']):>14s} {str(exact['procsv']):>14s}")
        print(f"{'batches twice in the weights':30s} {'':>14s} {repeated['keras']:14d} {repeated['procsv']:14d}")
        print(f"{'updates redone (lost work)':30s} {'':>14s} {redone['keras']:14d} {redone['procsv']:14d}")
        print(f"{'backup corrupted by a kill':30s} {'':>14s} {killed['keras']['corrupt']:14d} "
              f"{killed['procsv']['corrupt']:14d}")
        print(f"(save_freq={args.save_freq} batches, {EXAMPLES // BATCH} batches an epoch; (a): {args.repeats} series "
              f"of {args.rounds} turns of {args.turn_batches} batches per contender; (b): {args.epochs} epochs)")
        print(f"fit_overhead={over['procsv']:.4f} in_loop_overhead={in_loop:.4f} "
              f"overhead_ratio_vs_keras={ratio:.3f} cpu_overhead={cpu_over['procsv']:.4f} "
              f"cpu_overhead_ratio_vs_keras={cpu_ratio:.3f} exact_procsv={int(exact['procsv'])} "
              f"exact_keras={int(exact['keras'])} repeated_batches_keras={repeated['keras']}")
        ok = exact["procsv"] and repeated["procsv"] == 0 and same["procsv"] and killed["procsv"]["kills"] == args.kills \
            and killed["procsv"]["iterations"] == batches
        return 0 if ok else 1
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
