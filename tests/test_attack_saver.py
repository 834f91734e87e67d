"""Attack on 525fd70 (``sv.saver.save`` to a path of the program's own): in eager mode, a relative
``save_path`` (``FLAGS.save_path = "ckpt/model"``, run from the program's folder) writes the checkpoint,
but the state file beside it names it relative to the working directory instead of its own folder, so
``tf.train.latest_checkpoint`` of that folder finds nothing. TF's ``Saver.save`` (in eager mode too) names
it relative to the folder it writes the state file in."""

from __future__ import annotations

import os

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("fresh_train_api")]


def test_an_eager_save_to_a_relative_path_of_its_own_is_found_by_latest_checkpoint(logdir, tmp_path, monkeypatch):
    import tensorflow as tf

    import procsv

    for side in ("tf", "procsv"):
        os.makedirs(tmp_path / side / "ckpt")
    monkeypatch.chdir(tmp_path / "tf")
    v = tf.Variable(3.0)
    theirs = tf.compat.v1.train.Saver([v]).save(None, "ckpt/model", global_step=3)  # TF's Saver, eager
    assert theirs == "ckpt/model-3" and tf.train.latest_checkpoint("ckpt") == "ckpt/model-3"

    monkeypatch.chdir(tmp_path / "procsv")
    w = tf.Variable(0.0)
    sv = procsv.Supervisor(logdir=logdir, checkpoint={"w": w}, save_model_secs=None)
    with sv.managed_session() as sess:
        for _ in range(3):
            sess.run(lambda: w.assign_add(1.0))
        ours = sv.saver.save(sess, "ckpt/model", global_step=sv.global_step)
    assert ours == theirs
    assert tf.train.latest_checkpoint("ckpt") == "ckpt/model-3"  # was None: the state file says "ckpt/model-3"
    assert open("ckpt/checkpoint").read() == open(tmp_path / "tf" / "ckpt" / "checkpoint").read()
