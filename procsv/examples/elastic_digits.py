"""The digits model trained by a group whose size may change between restarts, each sample exactly once.

Run in the trainer processes of ``procsv launch procsv.examples.elastic_digits --nproc N
[--nnodes M --min-nodes K] --logdir DIR -- --steps S``, or with ``--plain`` as one task of a plain
``MultiWorkerMirroredStrategy`` run (no procsv at all: the reference a procsv run is compared to).

The group's size ``W`` (:func:`procsv.cluster.nproc`) and this process's rank ``r``
(:func:`procsv.cluster.rank`) are read once, at start: they change only across a restart, which
starts new processes. The input is sharded by a **global sample position** kept in the checkpoint,
never by a per-rank iterator: the int64 variable ``position`` counts the samples the group has
consumed (the same on every member). A step takes the positions ``[p, p + W*b)``, rank ``r`` the slice
``[p + r*b, p + (r+1)*b)``; position ``k`` is sample ``perm(k // N)[k % N]`` with
``perm(e) = np.random.default_rng([seed, e]).permutation(N)``; then ``p += W*b``. Whatever the group's
size at each step, the positions run on without a gap or an overlap, so every epoch holds each
sample exactly once; a restart restores ``position`` with the weights, and the steps it runs again
take the same samples as the first time.

``--batch-size b`` keeps the per-replica batch (the global batch ``W*b`` follows the group's size);
``--keep-global-batch G`` keeps the global batch instead (``b = G // W``; a ``G`` that ``W`` does not
divide is refused). The loss is averaged over the step's global batch either way.

``--sample-log DIR``: as each step starts, every member appends one JSON line to its own file
``DIR/samples-r<rank>-p<pid>.jsonl`` (flushed at once; a step's latest attempt is the run of it the
final state holds, as a step an attempt did not complete is run again by the next): ``attempt`` (the group's attempt,
``PROCSV_ATTEMPT``; 0 in a plain run), ``step``, ``world``, ``rank``, ``batch``, ``position`` (the
step's first global position), ``first`` (this rank's first position) and ``samples`` (its ids).
``tests/elastic_helpers.py`` reads these logs back.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import sys
import tempfile
import time
from typing import IO, Any, Optional, Sequence

import numpy as np

from procsv.examples.digits import build_model, load_data, multiworker_step


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="procsv.examples.elastic_digits", description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=2000, help="total global steps (default 2000)")
    p.add_argument("--batch-size", type=int, default=32, help="per-replica batch, kept whatever the group's size")
    p.add_argument("--keep-global-batch", type=int, default=None, metavar="G",
                   help="keep the global batch G instead: per-replica batch G // W (W must divide G)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--save-model-secs", type=float, default=10.0, help="checkpoint every N seconds (default 10)")
    p.add_argument("--save-checkpoint-steps", type=int, default=None, help="also checkpoint every N steps")
    p.add_argument("--save-summaries-secs", type=float, default=5.0, help="periodic summaries (default 5)")
    p.add_argument("--step-delay", type=float, default=0.0, help="sleep this long per step (simulates a slower model)")
    p.add_argument("--print-every-steps", type=int, default=250)
    p.add_argument("--sample-log", default=None, metavar="DIR",
                   help="append each step's samples to DIR/samples-r<rank>-p<pid>.jsonl (off by default)")
    p.add_argument("--logdir", default=None, help="only when run without `procsv launch`")
    p.add_argument("--plain", action="store_true",
                   help="no procsv: a plain MultiWorkerMirroredStrategy task (the TF_CONFIG given) from "
                        "--plain-from to --plain-to, saved at --plain-save (the reference run)")
    p.add_argument("--plain-from", default=None, metavar="PREFIX", help="--plain: restore this checkpoint first")
    p.add_argument("--plain-to", type=int, default=None, metavar="S", help="--plain: train to global step S")
    p.add_argument("--plain-save", default=None, metavar="PREFIX", help="--plain: the chief writes step S here")
    args = p.parse_args(argv)
    if args.plain and (args.plain_to is None or args.plain_save is None):
        p.error("--plain needs --plain-to S and --plain-save PREFIX")
    return args


def per_replica_batch(args: argparse.Namespace, world: int) -> int:
    """This group's per-replica batch: ``--batch-size``, or ``G // W`` under ``--keep-global-batch G``.
    Raises ``ValueError`` (one line) when ``W`` does not divide ``G``."""
    g = args.keep_global_batch
    if g is None:
        return int(args.batch_size)
    if g < world or g % world:
        raise ValueError(f"--keep-global-batch {g} cannot be kept by a group of {world}: "
                         f"it must be a multiple of the group's size")
    return int(g // world)


def refuse_or_batch(args: argparse.Namespace, world: int) -> Optional[int]:
    """:func:`per_replica_batch`, or None after saying in one line on stderr why the group cannot keep it."""
    try:
        return per_replica_batch(args, world)
    except ValueError as e:
        print(f"elastic_digits: {e}", file=sys.stderr)
        return None


@functools.lru_cache(maxsize=4)
def _perm(seed: int, epoch: int, n: int) -> np.ndarray:
    return np.random.default_rng([seed, epoch]).permutation(n)


def sample_ids(seed: int, n: int, first: int, count: int) -> np.ndarray:
    """The sample ids of the global positions ``[first, first + count)``: position ``k`` is
    ``perm(k // n)[k % n]`` with ``perm(e) = np.random.default_rng([seed, e]).permutation(n)``."""
    pos = np.arange(first, first + count, dtype=np.int64)
    out = np.empty(count, dtype=np.int64)
    for epoch in np.unique(pos // n):
        at = pos // n == epoch
        out[at] = _perm(seed, int(epoch), n)[pos[at] % n]
    return out


class SampleLog:
    """One member's sample log: a JSON line per step, flushed at once (``None`` folder: off). The file
    is opened at the first line (a hot standby that is never promoted leaves none)."""

    def __init__(self, folder: Optional[str], rank: int, attempt: int) -> None:
        self._fh: Optional[IO[str]] = None
        self.folder, self.rank, self.attempt = folder, rank, attempt

    def write(self, step: int, world: int, batch: int, position: int, samples: np.ndarray) -> None:
        if not self.folder:
            return
        if self._fh is None:
            os.makedirs(self.folder, exist_ok=True)
            self._fh = open(os.path.join(self.folder, f"samples-r{self.rank}-p{os.getpid()}.jsonl"), "a")
        rec = {"attempt": self.attempt, "step": step, "world": world, "rank": self.rank, "batch": batch,
               "position": position, "first": position + self.rank * batch, "samples": [int(i) for i in samples]}
        self._fh.write(json.dumps(rec) + "\n")
        self._fh.flush()

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()


class Trainer:
    """The model, its optimizer, ``position`` and the step for a group of ``world`` (built once per
    process: the group's size and this rank do not change within one)."""

    def __init__(self, args: argparse.Namespace, rank: int, world: int, batch: int, attempt: int) -> None:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        import keras
        import tensorflow as tf

        tf.random.set_seed(args.seed)
        keras.utils.set_random_seed(args.seed)
        tf.config.experimental.enable_op_determinism()
        self.args, self.rank, self.world = args, rank, world
        self.batch = batch
        self.x, self.y, self.x_test, self.y_test = load_data(args.seed)
        self.strategy = tf.distribute.MultiWorkerMirroredStrategy()  # reads TF_CONFIG (procsv's or the plain run's)
        with self.strategy.scope():
            self.model, self.optimizer, _ = build_model()
        if self.strategy.num_replicas_in_sync != world:  # the slices below are one replica's per process
            raise RuntimeError(f"{self.strategy.num_replicas_in_sync} replicas in a group of {world} processes: "
                               "this example runs one replica per process (hide the other devices)")
        # global, the same on every member: each advances it by the same W*b after every step
        self.position = tf.Variable(0, dtype=tf.int64, trainable=False, name="position")
        self.train_step = multiworker_step(self.strategy, self.model, self.optimizer, world * self.batch)
        self.log = SampleLog(args.sample_log, rank, attempt)

    def state(self, **extra: Any) -> Any:
        import tensorflow as tf

        return tf.train.Checkpoint(model=self.model, optimizer=self.optimizer, position=self.position, **extra)

    def warm_up_batch(self) -> tuple[np.ndarray, np.ndarray]:
        return self.x[:self.batch], self.y[:self.batch]

    def step(self, step: int) -> Any:
        """Global step ``step``: this rank's slice of the positions ``[p, p + W*b)``, then ``p += W*b``."""
        p = int(self.position.numpy())
        ids = sample_ids(self.args.seed, len(self.x), p + self.rank * self.batch, self.batch)
        # logged as the step starts, not once it is done: a member killed between the end of the step's
        # collective (its peers completed the step, and may commit it) and its own line would leave the
        # step without its share; a line whose step the group never completed is run again by a later attempt
        self.log.write(step, self.world, self.batch, p, ids)
        out = self.train_step(self.x[ids], self.y[ids])
        self.position.assign_add(self.world * self.batch)
        return out

    def test_accuracy(self) -> float:
        logits = self.model(self.x_test, training=False)
        return float(np.mean(np.argmax(logits.numpy(), axis=1) == self.y_test))


def run_plain(args: argparse.Namespace) -> int:
    """The reference: a plain ``MultiWorkerMirroredStrategy`` task (``TF_CONFIG`` given by hand), from
    ``--plain-from``'s step (or 0) to ``--plain-to``; the chief writes ``--plain-save``."""
    cfg = json.loads(os.environ.get("TF_CONFIG") or "{}")
    world = len(cfg.get("cluster", {}).get("worker", [])) or 1
    rank = int(cfg.get("task", {}).get("index", 0))
    batch = refuse_or_batch(args, world)
    if batch is None:
        return 2
    import tensorflow as tf

    t = Trainer(args, rank, world, batch, attempt=0)
    global_step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
    ckpt = t.state(global_step=global_step)
    if args.plain_from:
        # written by ckpt.write (no save_counter, which restore() creates): every other object is matched
        ckpt.restore(args.plain_from).expect_partial()
        if int(global_step.numpy()) != int(tf.train.load_variable(args.plain_from, "global_step/.ATTRIBUTES/VARIABLE_VALUE")):
            raise RuntimeError(f"{args.plain_from}: global_step not restored")
    while int(global_step.numpy()) < args.plain_to:
        t.step(int(global_step.numpy()) + 1)
        global_step.assign_add(1)
    # every task writes (a variable's read may be collective); only the chief's copy is kept
    target = args.plain_save if rank == 0 else tempfile.mkdtemp(prefix="elastic-plain-")
    ckpt.write(target if rank == 0 else os.path.join(target, "ckpt"))
    if rank != 0:
        shutil.rmtree(target, ignore_errors=True)
    t.log.close()
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    if args.plain:
        return run_plain(args)
    import procsv
    from procsv.common import env

    rank, world = procsv.cluster.rank(), procsv.cluster.nproc()  # fixed for this process's life
    batch = refuse_or_batch(args, world)
    if batch is None:
        return 2
    t = Trainer(args, rank, world, batch, attempt=int(os.environ.get(env.ATTEMPT, "1") or 1))
    print(f"elastic_digits: rank {rank} of {world}, per-replica batch {t.batch}, global batch "
          f"{world * t.batch}", flush=True)
    sv = procsv.Supervisor(
        logdir=args.logdir, checkpoint=t.state(), save_model_secs=args.save_model_secs,
        save_checkpoint_steps=args.save_checkpoint_steps, save_summaries_secs=args.save_summaries_secs,
        summary_fn=lambda: {"test_accuracy": t.test_accuracy()})
    sv.warm_up(t.train_step, *t.warm_up_batch())
    t0 = time.monotonic()
    with sv.managed_session() as sess:
        start = sv.step
        while not sv.should_stop() and sv.step < args.steps:
            out = sess.run(lambda: t.step(sv.step))  # inside it, sv.step is the step being run
            if args.step_delay:
                time.sleep(args.step_delay)
            if sv.step % args.print_every_steps == 0 or sv.step == args.steps:
                print(f"elastic_digits: step {sv.step} position {int(t.position.numpy())} "
                      f"loss {float(out['loss']):.4f}", flush=True)
    t.log.close()
    if sv.step >= args.steps:
        print(f"elastic_digits: finished {args.steps} steps (this process ran {sv.step - start} of them in "
              f"{time.monotonic() - t0:.1f} s); test accuracy {t.test_accuracy():.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
