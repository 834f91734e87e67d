#!/usr/bin/env python3
"""Benchmark: what a poisoned batch costs a run under ``procsv launch --on-nonfinite rollback`` (issue 41).

The digits example (``procsv.examples.digits``) with a NaN in the input of the steps ``--poison``
(its ``--nan-at-steps`` flag): the step's loss, gradients and Adam update turn NaN; procsv finds
the loss non-finite at its next bulk check, restores the newest finite state in place, replays to
the step before, retries the step once, finds it NaN again, restores again, replays, and skips it.

(a) Recovery, ``--repeats`` launches (each with every poisoned step; each step sleeps ``--step-delay``
    besides its work, 2 ms: a digits step alone takes about 0.5 ms, less than a checkpoint takes to
    commit, and a NaN found only by the final checkpoint's check is not rolled back): for each poisoned step,
    **detection to the first good step after the skip** (the ``nonfinite_detected`` event's time in
    ``logs/lifecycle.jsonl`` to the wall time of the loss the example logs at the step after the
    skipped one, read back with TensorBoard's ``EventAccumulator``; one machine, one wall clock),
    the **steps replayed** per rollback (the poisoned step - 1 - the restored step; two rollbacks
    per skipped step: the retry's and the skip's) and where the restore read from (``source``:
    ``memory`` or ``disk``). Correctness: each launch exits 0, skips exactly the poisoned steps
    (``skipped_steps`` in ``logs/report.json``) and ends with final weights (every variable of
    the model and the optimizer in the final checkpoint) **bit-equal** to a plain run of the
    example that never applied those steps (``--skip-steps``): ``exact=1``.
(a') The same at load: the same launches with two CPU-bound processes (``python -c 'while 1: pass'``)
    started beside each and killed after it (the machine this is measured on has two cores): goal
    detection to the first good step <= 0.5 s, exact=1 (issue 52: under load the snapshots lag the
    poisoned step, and a rollback must still skip exactly it). ``--no-load`` leaves it out.
(b) The cost of detection in a run with no NaN: the same plain run of the example with detection
    on (the default) and off (``PROCSV_NONFINITE_CHECK=0``), interleaved, ``--repeats`` of each;
    the step time is the wall time between the losses logged at steps ``--warmup`` and the last,
    per step.
    ``detect_overhead`` = median(on) / median(off) - 1 of the steady step time (the median of the
    times between two logged losses, 10 steps apart: what keeping each step's loss costs; a burst
    of another process's work on a busy machine does not move it), goal <= 0.01; the table also
    shows it over the whole span (every snapshot and its bulk check included, and every burst).

(c) Keras ``fit``'s memory under rollback: a fit of ``--keras-batches`` batches of 1.5 MiB each (65,536
    rows of 4 floats, a function of the batch's index), ``save_freq=False`` (no commit before fit's end:
    the case where kept batches pile up), the input of batch ``--keras-nan-at`` NaN, under ``procsv launch``
    with ``procsv.keras.BackupAndRestore(replay_memory_bytes=--keras-cap-mib)``, beside the same plain
    ``fit`` (no procsv, that batch left out: never applied, nor counted as an iteration),
    interleaved, ``--repeats`` of each: the **peak RSS** of the training process (VmRSS after every batch),
    and its growth after the first batch; goal: rollback's peak <= the plain fit's + the cap; exact=1 when every rollback run exits 0, skips
    exactly that batch and ends with weights (and iteration count) bit-equal to the plain fit's.
    ``--no-keras`` leaves it out.

Figures are medians over the repeats, with the spread (min..max) in the table. Prints the tables,
then one line:
``nonfinite_recovery_s=<x> replayed_steps=<x> detect_overhead=<x> exact=<0|1> skipped_steps=<a,b>
nonfinite_recovery_load_s=<x> keras_peak_mib=<x> keras_plain_peak_mib=<x> keras_cap_mib=<x>``
and exits 1 if a correctness check failed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

# oneDNN off, as in every benchmark and test here: with it on, this TensorFlow's fused MatMul+BiasAdd+Relu
# maps the poisoned NaN to 0 in the forward pass (the loss stays finite) while the gradient still turns
# the weights NaN: then only a snapshot's scan finds them, the bad step is not known, and the run stops
# with exit code 4 instead of rolling back (measured here: exit 4 at the first snapshot after the NaN)
ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", TF_ENABLE_ONEDNN_OPTS="0", PYTHONUNBUFFERED="1")
os.environ.update(TF_CPP_MIN_LOG_LEVEL="3", TF_ENABLE_ONEDNN_OPTS="0")  # this process reads checkpoints and events
EXAMPLE = "procsv.examples.digits"
KERAS_ROWS = 65536  # rows of 4 float32 a batch: 1 MiB of input, 1.5 MiB with its targets and sample weights


class BenchError(Exception):
    pass


def events(logdir: str) -> list[dict[str, Any]]:
    with open(os.path.join(logdir, "logs", "lifecycle.jsonl")) as fh:
        return [json.loads(line) for line in fh if line.strip()]


def losses(logdir: str) -> dict[int, float]:
    """Global step -> wall time of the loss the example logged there (after TensorBoard's purge of
    the steps a rollback undid: the value that stands)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(logdir, size_guidance={"scalars": 0})
    acc.Reload()
    return {e.step: e.wall_time for e in acc.Scalars("loss")}


def final_weights(logdir: str, steps: int) -> dict[str, bytes]:
    import tensorflow as tf

    reader = tf.train.load_checkpoint(os.path.join(logdir, f"model.ckpt-{steps}"))
    return {k: reader.get_tensor(k).tobytes() for k in reader.get_variable_to_shape_map()
            if k.endswith("VARIABLE_VALUE") and not k.startswith("save_counter")}


def example_args(args: argparse.Namespace, steps: int, log_every: int) -> list[str]:
    return ["--steps", str(steps), "--save-checkpoint-steps", str(args.interval), "--save-model-secs", "600",
            "--log-every-steps", str(log_every), "--print-every-steps", str(steps)]


def poisoned_launch(args: argparse.Namespace, logdir: str) -> dict[str, Any]:
    poison = ",".join(map(str, args.poison))
    cmd = [sys.executable, "-m", "procsv", "launch", EXAMPLE, "--logdir", logdir, "--quiet", "--",
           *example_args(args, args.steps, 1), "--nan-at-steps", poison, "--step-delay", str(args.step_delay)]
    done = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=600)
    if done.returncode != 0:
        raise BenchError(f"the poisoned launch exited {done.returncode}: {done.stderr[-2000:]}")
    ev = events(logdir)
    logged = losses(logdir)
    out: dict[str, Any] = {"recovery": [], "replayed": [], "sources": set()}
    for p in args.poison:
        detected = next((e for e in ev if e["event"] == "nonfinite_detected" and e["step"] == p), None)
        skipped = next((e for e in ev if e["event"] == "step_skipped" and e["step"] == p), None)
        back = [e for e in ev if e["event"] == "rolled_back" and e["step"] == p]
        if detected is None or skipped is None or len(back) != 2 or p + 1 not in logged:
            raise BenchError(f"step {p}: detected {detected}, rolled back {back}, skipped {skipped}, "
                             f"loss at {p + 1} logged: {p + 1 in logged}")
        out["recovery"].append(logged[p + 1] - detected["time"])
        out["replayed"] += [p - 1 - e["restored_step"] for e in back]
        out["sources"] |= {e["source"] for e in back}
    with open(os.path.join(logdir, "logs", "report.json")) as fh:
        out["skipped_steps"] = json.load(fh).get("skipped_steps")
    out["weights"] = final_weights(logdir, args.steps)
    return out


def plain_run(args: argparse.Namespace, logdir: str, steps: int, log_every: int, extra: list[str],
              env: dict[str, str]) -> None:
    cmd = [sys.executable, "-m", EXAMPLE, "--logdir", logdir, *example_args(args, steps, log_every), *extra]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    if done.returncode != 0:
        raise BenchError(f"{' '.join(cmd[2:])} exited {done.returncode}: {done.stderr[-2000:]}")


def step_time(logdir: str, warmup: int) -> tuple[float, float]:
    """Seconds per step from step ``warmup`` on: over the whole span (every snapshot, check and
    hiccup of a busy machine included), and the median over the spans between two logged losses
    (the steady step, which a burst of another process's work does not move)."""
    logged = sorted((s, t) for s, t in losses(logdir).items() if s >= warmup)
    (s0, t0), (s1, t1) = logged[0], logged[-1]
    each = [(tb - ta) / (sb - sa) for (sa, ta), (sb, tb) in zip(logged, logged[1:])]
    return (t1 - t0) / (s1 - s0), statistics.median(each)


def spread(values: list[float], fmt: str = "{:.3f}") -> str:
    return f"{fmt.format(statistics.median(values))} ({fmt.format(min(values))}..{fmt.format(max(values))})"


def keras_child(args: argparse.Namespace) -> int:
    """(c)'s training program: one Keras fit (see the module docstring), its peak RSS and weights written."""
    import keras
    import numpy as np
    import tensorflow as tf

    keras.utils.set_random_seed(0)
    bad = tf.constant([args.keras_nan_at], dtype=tf.int64)

    def batch(i: Any) -> Any:
        x = tf.reshape(tf.sin(tf.cast(i * KERAS_ROWS * 4 + tf.range(KERAS_ROWS * 4, dtype=tf.int64), tf.float32)
                              * 0.37), [KERAS_ROWS, 4])
        y = tf.reduce_sum(x, axis=1, keepdims=True) * 0.5 + 0.1
        hit = tf.reduce_any(tf.equal(bad, i))
        return tf.where(hit, tf.fill([KERAS_ROWS, 4], float("nan")), x), y, tf.ones([KERAS_ROWS])

    data = tf.data.Dataset.range(args.keras_batches)
    if args.plain:  # the fit that never applies the batch: it is left out (nor counted as an iteration)
        data = data.filter(lambda i: tf.logical_not(tf.reduce_any(tf.equal(bad, i))))
    data = data.map(batch)
    steps = args.keras_batches - (1 if args.plain else 0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="tanh"), keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(0.05), "mse")
    peak = [0.0, 0.0]  # after the first batch, the peak after any

    class Rss(keras.callbacks.Callback):  # type: ignore[misc]
        def on_train_batch_end(self, b: int, logs: Any = None) -> None:
            with open("/proc/self/status") as fh:
                now = next(int(line.split()[1]) for line in fh if line.startswith("VmRSS:")) / 1024
            peak[0] = peak[0] or now
            peak[1] = max(peak[1], now)

    callbacks: list[Any] = [Rss()]
    if not args.plain:
        import procsv.keras

        callbacks.append(procsv.keras.BackupAndRestore(save_freq=False,
                                                       replay_memory_bytes=int(args.keras_cap_mib * 2**20)))
    model.fit(data, epochs=1, steps_per_epoch=steps, callbacks=callbacks, verbose=0)
    np.savez(os.path.join(args.keras_child, "weights.npz"), *model.get_weights(),
             np.asarray(model.optimizer.iterations.numpy()))
    with open(os.path.join(args.keras_child, "rss.json"), "w") as fh:
        json.dump({"first_mib": peak[0], "peak_mib": peak[1]}, fh)
    return 0


def keras_run(args: argparse.Namespace, folder: str, plain: bool) -> dict[str, Any]:
    """One run of (c): its peak RSS (MiB), its weights' bytes, what it skipped (rollback's)."""
    os.makedirs(folder)
    flags = ["--keras-child", folder, "--keras-batches", str(args.keras_batches), "--keras-nan-at",
             str(args.keras_nan_at), "--keras-cap-mib", str(args.keras_cap_mib)]
    cmd = [sys.executable, os.path.abspath(__file__), *flags, "--plain"] if plain else [
        sys.executable, "-m", "procsv", "launch", os.path.abspath(__file__), "--logdir", os.path.join(folder, "run"),
        "--quiet", "--", *flags]
    done = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=900)
    if done.returncode != 0:
        raise BenchError(f"the Keras {'plain' if plain else 'rollback'} fit exited {done.returncode}: "
                         f"{done.stderr[-2000:]}")
    import numpy as np

    with open(os.path.join(folder, "rss.json")) as fh:
        rss = json.load(fh)
    with np.load(os.path.join(folder, "weights.npz")) as data:
        weights = [data[f"arr_{i}"].tobytes() for i in range(len(data.files))]
    skipped = None
    if not plain:
        with open(os.path.join(folder, "run", "logs", "report.json")) as fh:
            skipped = json.load(fh).get("skipped_steps")
    return {"peak": float(rss["peak_mib"]), "growth": float(rss["peak_mib"]) - float(rss["first_mib"]),
            "weights": weights, "skipped": skipped}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=500, help="steps of each poisoned launch")
    p.add_argument("--step-delay", type=float, default=0.002,
                   help="(a): seconds each step sleeps besides its work (default 0.002: a digits step is 0.5 ms, "
                        "less than a commit; a NaN found only at the final checkpoint is not rolled back)")
    p.add_argument("--poison", type=int, nargs="+", default=[110, 230], help="the steps whose input holds a NaN")
    p.add_argument("--interval", type=int, default=50, help="a checkpoint every N steps (--save-checkpoint-steps)")
    p.add_argument("--overhead-steps", type=int, default=4000, help="steps of each run of (b)")
    p.add_argument("--warmup", type=int, default=200, help="(b): step time measured from this step on")
    p.add_argument("--no-load", action="store_true", help="leave out (a'), the poisoned launches at load")
    p.add_argument("--no-keras", action="store_true", help="leave out (c), Keras fit's memory")
    p.add_argument("--keras-batches", type=int, default=160, help="(c): batches of the fit (1.5 MiB each)")
    p.add_argument("--keras-nan-at", type=int, default=120, help="(c): the batch whose input is NaN (from 0)")
    p.add_argument("--keras-cap-mib", type=float, default=256.0,
                   help="(c): replay_memory_bytes, in MiB (default 256: above the fit's 240 MiB of batches, so "
                        "none is left out of the replay and the skip is exact; below what comes between two "
                        "in-memory snapshots, a NaN is handled by the inexact fallback and exact=0)")
    p.add_argument("--keras-child", help=argparse.SUPPRESS)
    p.add_argument("--plain", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.keras_child:
        return keras_child(args)
    if args.repeats < 1 or any(not 1 < s < args.steps for s in args.poison):
        p.error("--repeats must be >= 1 and every --poison step within 2..--steps-1")
    args.poison = sorted(set(args.poison))
    ok = True
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench_nonfinite_") as tmp:
        plain = os.path.join(tmp, "plain")
        plain_run(args, plain, args.steps, 10, ["--skip-steps", ",".join(map(str, args.poison))], ENV)  # no delay: same result
        baseline = final_weights(plain, args.steps)
        rows: dict[str, list[dict[str, Any]]] = {"quiet": [], "load": []}
        exact = {"quiet": True, "load": True}
        for row in ("quiet",) if args.no_load else ("quiet", "load"):
            for r in range(args.repeats):
                busy = [subprocess.Popen([sys.executable, "-c", "while 1: pass"]) for _ in range(2 if row == "load" else 0)]
                try:
                    run = poisoned_launch(args, os.path.join(tmp, f"poisoned-{row}{r}"))
                finally:
                    for proc in busy:
                        proc.kill()
                        proc.wait()
                if run["skipped_steps"] != args.poison:
                    print(f"bench_nonfinite: run {r} ({row}) skipped {run['skipped_steps']}, not {args.poison}",
                          file=sys.stderr)
                    exact[row] = False
                if run["weights"].keys() != baseline.keys() or any(run["weights"][k] != baseline[k] for k in baseline):
                    print(f"bench_nonfinite: run {r}'s ({row}) final weights differ from the plain run that skips "
                          f"{args.poison}", file=sys.stderr)
                    exact[row] = False
                rows[row].append(run)
        keras_rows: dict[bool, list[dict[str, Any]]] = {True: [], False: []}  # plain?: runs
        for r in range(0 if args.no_keras else args.repeats):
            for plain_fit in (True, False):  # interleaved
                keras_rows[plain_fit].append(keras_run(args, os.path.join(tmp, f"keras-{int(plain_fit)}-{r}"),
                                                       plain_fit))
        keras_exact = True
        for run in keras_rows[False]:
            if run["skipped"] != [args.keras_nan_at + 1]:  # global steps count from 1
                print(f"bench_nonfinite: a Keras rollback run skipped {run['skipped']}, not "
                      f"[{args.keras_nan_at + 1}]", file=sys.stderr)
                keras_exact = False
            if run["weights"] != keras_rows[True][0]["weights"]:
                print("bench_nonfinite: a Keras rollback run's final weights differ from the plain fit's",
                      file=sys.stderr)
                keras_exact = False
        exact["keras"] = keras_exact
        ok = all(exact.values())
        runs = rows["quiet"]
        times: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
        for r in range(args.repeats):
            for on in (True, False):
                logdir = os.path.join(tmp, f"overhead-{'on' if on else 'off'}{r}")
                plain_run(args, logdir, args.overhead_steps, 10, [],
                          ENV if on else dict(ENV, PROCSV_NONFINITE_CHECK="0"))
                times[on].append(step_time(logdir, args.warmup))
    recovery = [statistics.median(run["recovery"]) for run in runs]
    recovery_load = [statistics.median(run["recovery"]) for run in rows["load"]]
    replayed = [float(statistics.median(run["replayed"])) for run in runs]
    sources = sorted(set().union(*(run["sources"] for run in runs)))
    span = {m: [t[0] * 1000 for t in times[m]] for m in times}
    steady = {m: [t[1] * 1000 for t in times[m]] for m in times}
    overhead = statistics.median(steady[True]) / statistics.median(steady[False]) - 1
    overhead_span = statistics.median(span[True]) / statistics.median(span[False]) - 1
    print(f"{'(a) a poisoned step, rolled back and skipped':<46} {'median (spread over runs)':>28}")
    print(f"{'detection -> first good step after the skip (s)':<46} {spread(recovery):>28}")
    print(f"{'steps replayed per rollback (two per skip)':<46} {spread(replayed, '{:.1f}'):>28}")
    print(f"{'restored from':<46} {', '.join(sources):>28}")
    print(f"{'exact (bit-equal to the plain run)':<46} {int(exact['quiet']):>28}")
    if recovery_load:
        print(f"{'at load (two CPU-bound processes beside it):':<46}")
        print(f"{'detection -> first good step after the skip (s)':<46} {spread(recovery_load):>28}")
        replayed_load = [float(statistics.median(run["replayed"])) for run in rows["load"]]
        print(f"{'steps replayed per rollback (two per skip)':<46} {spread(replayed_load, '{:.1f}'):>28}")
        print(f"{'restored from':<46} {', '.join(sorted(set().union(*(r['sources'] for r in rows['load'])))):>28}")
        print(f"{'exact (bit-equal to the plain run)':<46} {int(exact['load']):>28}")
    print(f"(digits, {args.steps} steps of {args.step_delay * 1000:g} ms more each, NaN input at steps {args.poison}, "
          f"a checkpoint every {args.interval} steps; {args.repeats} launches)")
    if keras_rows[False]:
        peaks = {m: [run["peak"] for run in keras_rows[m]] for m in keras_rows}
        print(f"\n{'(c) Keras fit, peak RSS of the trainer (MiB)':<46} {'median (spread over runs)':>28}")
        print(f"{'plain fit (no procsv)':<46} {spread(peaks[True], '{:.1f}'):>28}")
        print(f"{'under rollback (a NaN batch, skipped)':<46} {spread(peaks[False], '{:.1f}'):>28}")
        print(f"{'  minus plain fit':<46} {statistics.median(peaks[False]) - statistics.median(peaks[True]):>28.1f}")
        growth = {m: [run["growth"] for run in keras_rows[m]] for m in keras_rows}
        print(f"{'growth after the first batch, plain fit':<46} {spread(growth[True], '{:.1f}'):>28}")
        print(f"{'growth after the first batch, under rollback':<46} {spread(growth[False], '{:.1f}'):>28}")
        print(f"{'  goal: at most the cap (replay_memory_bytes)':<46} {args.keras_cap_mib:>28.1f}")
        print(f"{'exact (bit-equal to the plain fit)':<46} {int(exact['keras']):>28}")
        print(f"({args.keras_batches} batches of 1.5 MiB, save_freq=False, NaN input at batch {args.keras_nan_at}; "
              f"{args.repeats} runs of each, interleaved)")
    print(f"\n{'(b) ms per step, no NaN':<46} {'steady (spread)':>24} {'whole span (spread)':>24}")
    print(f"{'detection on':<46} {spread(steady[True], '{:.4f}'):>24} {spread(span[True], '{:.4f}'):>24}")
    print(f"{'detection off (PROCSV_NONFINITE_CHECK=0)':<46} {spread(steady[False], '{:.4f}'):>24} "
          f"{spread(span[False], '{:.4f}'):>24}")
    print(f"{'overhead':<46} {overhead:>24.2%} {overhead_span:>24.2%}")
    print(f"({args.overhead_steps} steps from step {args.warmup}, interleaved; {time.monotonic() - began:.0f} s in all)")
    print(f"nonfinite_recovery_s={statistics.median(recovery):.3f} replayed_steps={statistics.median(replayed):.1f} "
          f"detect_overhead={overhead:.4f} exact={int(ok)} skipped_steps={','.join(map(str, args.poison))}"
          + (f" nonfinite_recovery_load_s={statistics.median(recovery_load):.3f}" if recovery_load else "")
          + (f" keras_peak_mib={statistics.median(r['peak'] for r in keras_rows[False]):.1f}"
             f" keras_plain_peak_mib={statistics.median(r['peak'] for r in keras_rows[True]):.1f}"
             f" keras_cap_mib={args.keras_cap_mib:g}" if keras_rows[False] else ""))
    return 0 if ok else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BenchError as exc:
        print(f"bench_nonfinite: {exc}", file=sys.stderr)
        sys.exit(1)
