"""Issue 43: ``procsv launch --ps N --workers M --coordinator``, TF2 ``ParameterServerStrategy``.

Real ``tf.distribute.Server`` processes (one parameter server, two workers) that procsv starts, the
example ``procsv.examples.ps_strategy`` as the coordinator (task ``chief/0``), real gRPC. Its step
``s`` is a function of ``s`` alone, scheduled on a worker and joined, so the variables a checkpoint
at step ``s`` holds are :func:`procsv.examples.ps_strategy.replay`'s, whichever worker ran it.
"""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest

from conftest import finish, launch

pytestmark = pytest.mark.slow

TARGET = "procsv.examples.ps_strategy"
OPTS = ("--ps", "1", "--workers", "2", "--coordinator")


def log_of(logdir: str, name: str) -> str:
    try:
        with open(os.path.join(logdir, "logs", name)) as fh:
            return fh.read()
    except FileNotFoundError:
        return ""


def restored(path: str) -> dict[str, np.ndarray]:
    """The model's variables in the checkpoint at ``path``, read back with ``tf.train.Checkpoint.restore``."""
    import tensorflow as tf

    from procsv.examples.ps_strategy import build

    m = build(tf)
    tf.train.Checkpoint(model=m).restore(path).expect_partial().assert_existing_objects_matched()
    return {"w": m.w.numpy(), "b": m.b.numpy()}


def test_the_coordinator_trains_to_the_end_and_its_checkpoint_holds_the_trained_variables(short_tmp: str) -> None:
    import tensorflow as tf

    from procsv.examples.ps_strategy import replay

    logdir = os.path.join(short_tmp, "run")
    proc = launch(logdir, "--steps", "40", "--save-model-secs", "60", target=TARGET, opts=OPTS)
    try:
        code, out, err = finish(proc, 300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            finish(proc, 120)
    assert code == 0, err[-3000:]
    chief = log_of(logdir, "trainer.1.log")
    assert "variables on /job:ps/replica:0/task:0" in chief, chief[-2000:]  # the strategy put them on the ps
    for task in ("worker0", "worker1", "ps0"):  # the servers procsv started, each its job's task
        assert f"procsv ps: task {task} serving at grpc://127.0.0.1:" in log_of(logdir, f"{task}.1.log")
    latest = tf.train.latest_checkpoint(logdir)
    assert latest == os.path.join(logdir, "model.ckpt-40")  # the final checkpoint, through the service
    got, want = restored(latest), replay(40)
    np.testing.assert_allclose(got["w"], want["w"], rtol=0, atol=1e-6)
    np.testing.assert_allclose(got["b"], want["b"], rtol=0, atol=1e-6)
    assert not np.allclose(got["w"], replay(39)["w"], rtol=0, atol=1e-6)  # the comparison tells a step apart
