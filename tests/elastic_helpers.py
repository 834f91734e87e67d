"""Test support for ``procsv.examples.elastic_digits`` (no test here): its sample logs read back, the
exactly-once check, and the plain reference run (no procsv) segment by segment.

A sample log record (one JSON line, one file per process): ``attempt``, ``step``, ``world``, ``rank``,
``batch``, ``position`` (the step's first global position), ``first`` (the rank's), ``samples``.
"""

from __future__ import annotations

import glob
import json
import os
from typing import Any, Optional, Sequence

import numpy as np
from conftest import REPO, quiet_env
from pyfork import Running, start_python

Record = dict[str, Any]
TARGET = "procsv.examples.elastic_digits"


def read_records(sample_log_dir: str) -> list[Record]:
    """Every record of every member's file in ``sample_log_dir``."""
    records: list[Record] = []
    for path in sorted(glob.glob(os.path.join(sample_log_dir, "*.jsonl"))):
        with open(path) as fh:
            records += [json.loads(line) for line in fh if line.strip()]
    return records


def effective_steps(sample_log_dir: str) -> dict[int, list[Record]]:
    """For each step, the records of the latest attempt that ran it, sorted by rank: a restart runs
    again the steps after its restore, and the latest run of a step is the one the final state holds."""
    by_step: dict[int, list[Record]] = {}
    for rec in read_records(sample_log_dir):
        by_step.setdefault(int(rec["step"]), []).append(rec)
    out: dict[int, list[Record]] = {}
    for step, recs in sorted(by_step.items()):
        latest = max(int(r["attempt"]) for r in recs)
        out[step] = sorted((r for r in recs if int(r["attempt"]) == latest), key=lambda r: int(r["rank"]))
    return out


def assert_exactly_once(steps: dict[int, list[Record]], n_samples: int, epochs_complete: int) -> None:
    """Every rank ``0..W-1`` logged each step once (one world per step), the steps are 1..S with no
    gap, their positions run on from 0 with no gap or overlap (step by step and rank by rank), and each
    of the first ``epochs_complete`` epochs holds every sample id ``0..n_samples-1`` exactly once."""
    assert steps, "no step logged"
    assert sorted(steps) == list(range(1, max(steps) + 1)), \
        f"steps missing: {sorted(set(range(1, max(steps) + 1)) - set(steps))}"
    position = 0
    ids: list[int] = []
    for step in sorted(steps):
        recs = steps[step]
        worlds = {int(r["world"]) for r in recs}
        assert len(worlds) == 1, f"step {step}: members of different worlds {sorted(worlds)}"
        world = worlds.pop()
        ranks = [int(r["rank"]) for r in recs]
        assert ranks == list(range(world)), f"step {step} (world {world}): ranks logged {ranks}"
        for r in recs:
            assert int(r["position"]) == position, \
                f"step {step}: starts at position {r['position']}, the previous step ended at {position}"
            assert int(r["first"]) == position + int(r["rank"]) * int(r["batch"]) and \
                len(r["samples"]) == int(r["batch"]), f"step {step} rank {r['rank']}: its slice is not its share"
        for r in recs:
            ids += [int(i) for i in r["samples"]]
        position += sum(int(r["batch"]) for r in recs)
    assert len(ids) >= epochs_complete * n_samples, \
        f"{len(ids)} samples consumed, fewer than {epochs_complete} epochs of {n_samples}"
    for epoch in range(epochs_complete):
        seen = np.bincount(ids[epoch * n_samples:(epoch + 1) * n_samples], minlength=n_samples)
        assert seen.shape == (n_samples,) and (seen == 1).all(), \
            f"epoch {epoch}: {int((seen == 0).sum())} samples never seen, {int((seen > 1).sum())} seen more than once"


def schedule(steps: dict[int, list[Record]]) -> list[tuple[int, int, int]]:
    """The runs of equal world: ``[(first_step, last_step, world), ...]`` in step order."""
    runs: list[tuple[int, int, int]] = []
    for step in sorted(steps):
        world = int(steps[step][0]["world"])
        if runs and runs[-1][2] == world and runs[-1][1] == step - 1:
            runs[-1] = (runs[-1][0], step, world)
        else:
            runs.append((step, step, world))
    return runs


def free_ports(n: int) -> list[int]:
    from procsv.common import spawn

    return list(spawn.free_ports(n, "127.0.0.1"))


def start_segment(world: int, last_step: int, out_prefix: str, from_prefix: Optional[str],
                  extra_args: Sequence[str] = ()) -> list[Running]:
    """Start the ``world`` tasks of one plain segment (a hand-made ``TF_CONFIG`` on free ports of
    127.0.0.1) training from ``from_prefix`` (or step 0) to ``last_step``; the chief writes ``out_prefix``.
    Each is a fork of the fork server (``pyfork.start_python``: TensorFlow imported once, not in each task)."""
    from procsv.cluster import make_tf_config

    addresses = [f"127.0.0.1:{p}" for p in free_ports(world)]
    argv = ["-m", TARGET, "--plain", "--plain-to", str(last_step), "--plain-save", out_prefix,
            *(["--plain-from", from_prefix] if from_prefix else []), *extra_args]
    return [start_python(argv, cwd=REPO, env=quiet_env(TF_CONFIG=make_tf_config(addresses, r))) for r in range(world)]


def finish_segment(runs: list[Running], timeout: float = 120) -> None:
    """Wait for a segment's tasks; fail (killing any left) unless each exits 0."""
    try:
        for run in runs:
            done = run.result(timeout)
            assert done.returncode == 0, f"plain task exited {done.returncode}\n{done.stdout}\n{done.stderr}"
    finally:
        for run in runs:
            run.kill()


def reference_weights(plan: list[tuple[int, int, int]], tmpdir: str, extra_args: Sequence[str] = ()
                      ) -> dict[str, np.ndarray]:
    """Run the plain reference segment by segment (``world`` processes for each ``(first, last,
    world)``, each segment restoring the previous one's checkpoint); the final checkpoint's weights."""
    prev: Optional[str] = None
    for first, last, world in plan:
        out = os.path.join(tmpdir, f"plain-{first}-{last}-w{world}")
        finish_segment(start_segment(world, last, out, prev, extra_args))
        prev = out
    assert prev is not None, "an empty schedule"
    return checkpoint_weights(prev)


def checkpoint_weights(prefix: str) -> dict[str, np.ndarray]:
    """Every variable of the checkpoint at ``prefix`` (plain TF), but save_counter."""
    import tensorflow as tf

    reader = tf.train.load_checkpoint(prefix)
    return {k: reader.get_tensor(k) for k in sorted(reader.get_variable_to_shape_map())
            if "VARIABLE_VALUE" in k and not k.startswith("save_counter")}


def procsv_weights(logdir: str) -> dict[str, np.ndarray]:
    """The final weights of a procsv run: its newest checkpoint's (``conftest.final_weights``)."""
    import tensorflow as tf

    return checkpoint_weights(tf.train.latest_checkpoint(logdir))


def weights_equal(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return sorted(a) == sorted(b) and all(np.array_equal(a[k], b[k]) for k in a)
