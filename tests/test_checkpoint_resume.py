"""Complete state: a resumed run takes exactly the batches an uninterrupted one takes (tf.data iterator)."""

from __future__ import annotations

import os

import pytest

from conftest import PROGRAMS, committed_steps, quiet_env, run_python

pytestmark = pytest.mark.slow

PROGRAM = os.path.join(PROGRAMS, "iterator_train.py")


def _run(logdir: str, steps: int) -> list[str]:
    out = run_python([PROGRAM, "--logdir", logdir, "--steps", str(steps)], env=quiet_env(), timeout=180)
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


@pytest.fixture(scope="module")
def straight() -> list[str]:
    """What an uninterrupted run of 23 steps prints, computed in-process with plain TensorFlow: the
    program's dataset (op seed 7) in a graph of its own, whose seed, like the program's, is unset,
    so no seed another test set in this process reaches it."""
    import tensorflow as tf

    with tf.Graph().as_default():
        ds = tf.data.Dataset.range(10_000).shuffle(64, seed=7, reshuffle_each_iteration=True).repeat().batch(3)
        batch = tf.compat.v1.data.make_one_shot_iterator(ds).get_next()
        with tf.compat.v1.Session() as sess:
            batches = [sess.run(batch).tolist() for _ in range(23)]
    lines = [f"step {i} batch {values}" for i, values in enumerate(batches, 1)]
    return lines + [f"total {sum(map(sum, batches))} last {' '.join(map(str, batches[-1]))}"]


def test_a_resumed_run_continues_the_tf_data_iterator_exactly(straight, logdir):
    first = _run(logdir, 11)
    saved = committed_steps(logdir)
    # every 5 steps (a trigger while one is in flight waits for it: at most one in flight), and the end
    assert saved[0] == 5 and saved[-1] == 11 and set(saved) <= {5, 6, 7, 8, 9, 10, 11}
    resumed = _run(logdir, 23)
    assert "procsv: restored step 11 from model.ckpt-11" in resumed
    batches = lambda lines: [l for l in lines if l.startswith("step ")]  # noqa: E731
    assert batches(first) == batches(straight)[:11]
    assert batches(resumed) == batches(straight)[11:]  # same shuffle buffer, same position
    assert resumed[-1] == straight[-1] and resumed[-1].startswith("total ")  # the counter and the string too
    assert committed_steps(logdir)[-1] == 23
