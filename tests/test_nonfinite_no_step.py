"""``--on-nonfinite rollback`` in a program without a global step (a TF1 graph with none, an eager
``Supervisor(global_step=None)``): its one checkpoint is TF's unnumbered ``model.ckpt``, rewritten in
place at each save; the rollback restores it at the step its manifest holds, sets the count of steps
kept in Python back to it, replays, retries and skips the bad step as for a numbered run.

Plain Python runs in this process (no launch): each costs about 1.5 CPU-s beside the TensorFlow import."""

from __future__ import annotations

import json
import os
import re
import time
from typing import Optional

import numpy as np
import pytest
import tensorflow as tf

STEPS, NAN_AT = 40, 25
PACE = 0.03  # seconds after each step: each snapshot (every 10 steps) is committed before the next is due ...
# ... and longer after the steps before the NaN's: the trainer hands the snapshot of step 20 to the service at its
# step boundaries, and at load 6-8 five boundaries 30 ms apart were not enough for its commit (quick-tier runs
# beside three others: the rollback restored step 0, the newest committed, and the test took it for a failure)
PACE_BEFORE_NAN = 0.5


def _batch(s: int) -> list[float]:
    return [float("nan")] * 4 if s == NAN_AT else [1.0 + (s % 7) / 10] * 4


def _graph_run(logdir: Optional[str]) -> tuple[bytes, bytes, int]:
    """A TF1 graph without a global step, its loss named "loss" (watched), momentum SGD: under
    ``procsv.Supervisor`` with ``logdir``, the batch of step 25 NaN; with None, a plain session loop
    that never applies step 25. Returns w, its momentum slot and the steps made."""
    with tf.Graph().as_default():
        x = tf.compat.v1.placeholder(tf.float32, [4])
        w = tf.compat.v1.get_variable("w", initializer=tf.ones([4]))
        err = w * x - 1.0
        loss = tf.reduce_sum(err * err, name="loss")
        opt = tf.compat.v1.train.MomentumOptimizer(0.01, 0.9)
        train = opt.minimize(loss)
        slot = opt.get_slot(w, "momentum")
        if logdir is None:
            with tf.compat.v1.Session() as sess:
                sess.run(tf.compat.v1.global_variables_initializer())
                for s in range(1, STEPS + 1):
                    if s != NAN_AT:
                        sess.run(train, {x: _batch(s)})
                got = sess.run([w, slot])
            return got[0].tobytes(), got[1].tobytes(), STEPS
        import procsv

        sv = procsv.Supervisor(logdir=logdir, global_step=None, summary_op=None, save_model_secs=600,
                               save_checkpoint_steps=10)
        with sv.managed_session() as sess:
            while sv.step < STEPS and not sv.should_stop():
                sess.run([train, loss], {x: _batch(sv.step + 1)})
                time.sleep(PACE_BEFORE_NAN if 20 <= sv.step < NAN_AT else PACE)
        # (every run of a session without a global step is a step: the values are the final checkpoint's)
        reader = tf.train.load_checkpoint(os.path.join(logdir, "model.ckpt"))
        assert int(sv._global_step.numpy()) == sv.step  # the count kept in Python: set back by the restore
        return reader.get_tensor("w").tobytes(), reader.get_tensor(slot.op.name).tobytes(), sv.step


def _eager_run(logdir: Optional[str]) -> tuple[bytes, bytes, int]:
    """The same model in eager mode (momentum kept in a variable of its own): under
    ``Supervisor(global_step=None)`` with ``logdir``, else a plain loop that never applies step 25."""
    w, m = tf.Variable(tf.ones([4])), tf.Variable(tf.zeros([4]))

    def step(batch: list[float]) -> tf.Tensor:
        xv = tf.constant(batch)
        with tf.GradientTape() as tape:
            err = w * xv - 1.0
            loss = tf.reduce_sum(err * err)
        m.assign(0.9 * m + tape.gradient(loss, w))
        w.assign_sub(0.01 * m)
        return loss

    if logdir is None:
        for s in range(1, STEPS + 1):
            if s != NAN_AT:
                step(_batch(s))
        return w.numpy().tobytes(), m.numpy().tobytes(), STEPS
    import procsv

    sv = procsv.Supervisor(logdir=logdir, checkpoint={"w": w, "m": m}, global_step=None, save_summaries_secs=None,
                           save_model_secs=600, save_checkpoint_steps=10)
    with sv.managed_session() as sess:
        while sv.step < STEPS and not sv.should_stop():
            batch = _batch(sv.step + 1)
            sess.run(lambda: step(batch))
            time.sleep(PACE_BEFORE_NAN if 20 <= sv.step < NAN_AT else PACE)
    assert int(sv._global_step.numpy()) == sv.step  # the count kept in Python: set back by the restore
    return w.numpy().tobytes(), m.numpy().tobytes(), sv.step


def _manifest_step(logdir: str) -> int:
    with open(os.path.join(logdir, ".procsv", "checkpoints", "model.ckpt.json")) as fh:
        return int(json.load(fh)["step"])


@pytest.mark.parametrize("mode", ["graph", "eager"])
def test_a_nan_without_a_global_step_is_rolled_back_from_the_unnumbered_checkpoint_bit_equal_to_skipping_it(
        mode, tmp_path, capfd, monkeypatch):
    # before: the restore from disk read model.ckpt-20, which a run without a global step never
    # writes (its checkpoint is model.ckpt, rewritten in place): NotFoundError, the trainer died
    # with a traceback. Now model.ckpt is restored at the step its manifest holds (20, or later where
    # a snapshot lagged), the count of steps is set back to it, step 25 is retried once then skipped:
    # bit-equal to never applying it
    from procsv.trainer.checkpoint import memory_restore

    # eager: the in-memory tier would serve the rollback; the disk tier is the one under test
    monkeypatch.setattr(memory_restore, "newest_before", lambda copies, arena, before: None)
    run = _graph_run if mode == "graph" else _eager_run
    logdir = str(tmp_path / "run")
    w, slot, step = run(logdir)
    said = "".join(capfd.readouterr())
    restored = [int(s) for s in re.findall(r"restored step (\d+) from model\.ckpt,", said)]
    assert restored and all(10 <= s < NAN_AT for s in restored), said[-3000:]  # (20, or a lagging snapshot's)
    assert "skipped step 25" in said, said[-3000:]
    assert "Traceback" not in said, said[-3000:]
    assert step == STEPS and _manifest_step(logdir) == STEPS
    plain = run(None)
    assert np.isfinite(np.frombuffer(w, np.float32)).all()
    assert (w, slot) == plain[:2]  # bit-equal: w and its momentum


def test_reading_a_checkpoint_rewritten_in_place_reads_again_until_no_rewrite_met_it(tmp_path):
    # pure (files only, a fake clock): the rollback's read of model.ckpt is of one committed state,
    # never half of a rewrite (its files renamed over before its manifest, the commit point)
    from procsv.common.crc32c import file_checksum
    from procsv.common.errors import CorruptCheckpoint
    from procsv.common.layout import Layout, write_json
    from procsv.common.manifests import Manifest, manifest_path, pending_path, read_in_place

    layout = Layout(str(tmp_path / "run"))
    layout.create()
    data = os.path.join(layout.logdir, "model.ckpt.index")

    def commit(step: int) -> Manifest:
        with open(data, "w") as fh:
            fh.write(f"state of step {step}")
        m = Manifest(step, "model.ckpt", {"model.ckpt.index": {"size": os.path.getsize(data),
                                                               "crc32c": file_checksum(data)}}, float(step), "steps")
        write_json(manifest_path(layout, "model.ckpt"), m.to_json())
        return m

    now = [0.0]

    def sleep(secs: float) -> None:
        now[0] += secs

    def read_in(read):  # type: ignore[no-untyped-def]
        return read_in_place(layout, "model.ckpt", read, wait_secs=1.0, clock=lambda: now[0], sleep=sleep)

    assert read_in(lambda m: None) is None  # nothing committed
    commit(20)
    seen: list[int] = []

    def rewritten_once(m: Manifest) -> None:  # the service commits step 30 while step 20 is read
        seen.append(m.step)
        if m.step == 20:
            commit(30)

    assert read_in(rewritten_once).step == 30 and seen == [20, 30]
    with open(pending_path(layout, "model.ckpt"), "w") as fh:  # a rewrite in progress: not read meanwhile
        fh.write("{}")
    seen.clear()
    with pytest.raises(CorruptCheckpoint, match="rewritten in place"):
        read_in(lambda m: seen.append(m.step))
    assert seen == []
    os.unlink(pending_path(layout, "model.ckpt"))
    with open(data, "a") as fh:  # damaged, nothing rewriting it: corrupt, not read
        fh.write("!")
    with pytest.raises(CorruptCheckpoint, match="bytes"):
        read_in(lambda m: seen.append(m.step))
    assert seen == []
