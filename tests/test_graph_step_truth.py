"""Graph mode: a checkpoint is named by the global step stored in it, and a restore never moves it.

Runs a TF1 graph program under ``procsv launch`` (a real watchdog, trainer and checkpoint
service) whose global step is also advanced by a thread other than the session's
(``tests/programs/tf1_step_truth.py``), then reads the checkpoints back with TensorFlow's own
reader, and launches it again on the same logdir to see where the restored session starts.
"""

from __future__ import annotations

import os

import pytest

from conftest import PROGRAMS, finish, launch

pytestmark = pytest.mark.slow  # starts TensorFlow processes: not in the quick tier

PROGRAM = os.path.join(PROGRAMS, "tf1_step_truth.py")


def _starts_ends(stdout_log: str) -> tuple[list[int], list[int]]:
    with open(stdout_log) as fh:
        lines = fh.read().splitlines()
    return ([int(x.split()[1]) for x in lines if x.startswith("start ")],
            [int(x.split()[1]) for x in lines if x.startswith("end ")])


def test_the_final_checkpoint_is_named_by_the_stored_global_step_and_a_restore_keeps_it(short_tmp):
    """A thread advances the global step once after the session thread's last step: the final
    checkpoint holds 31 and is named ``model.ckpt-31`` (was: ``model.ckpt-30``, procsv's count);
    every committed checkpoint's name is the global step stored in it; the second launch's session
    starts at 31, the stored value (was: 30, the name's step assigned over it), and ends at 62."""
    import tensorflow as tf

    logdir = os.path.join(short_tmp, "run")
    starts, ends = [], []
    for attempt in (1, 2):
        code, out, err = finish(launch(logdir, "--steps", "30", target=PROGRAM), 300)
        assert code == 0, err[-3000:]
        names = sorted(n[:-len(".index")] for n in os.listdir(logdir) if n.startswith("model.ckpt-")
                       and n.endswith(".index"))
        assert names, os.listdir(logdir)
        for name in names:
            stored = int(tf.train.load_checkpoint(os.path.join(logdir, name)).get_tensor("global_step"))
            assert name == f"model.ckpt-{stored}", (name, stored)
        assert tf.train.latest_checkpoint(logdir) == os.path.join(logdir, f"model.ckpt-{31 * attempt}")
        s, e = _starts_ends(os.path.join(logdir, "logs", "trainer.1.log"))  # (each launch's trainer is its attempt 1)
        starts += s
        ends += e
    assert starts == [0, 31] and ends == [31, 62], (starts, ends)
