"""A TF1 graph program's own ``tf.compat.v1.train.Saver`` sets retention, as TF's Saver would apply it.

Runs the Supervisor (and a MonitoredTrainingSession) in the test process, with its own checkpoint
service: a passed Saver's ``max_to_keep`` and ``keep_checkpoint_every_n_hours`` are what the
checkpoint service's retention keeps (before: they were ignored, procsv's default of 5 applied).
"""

from __future__ import annotations

import json
import os

import pytest

from conftest import committed_steps

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("fresh_train_api")]


def _model(tf):
    gs = tf.compat.v1.train.get_or_create_global_step()
    w = tf.compat.v1.get_variable("w", initializer=1.0)
    return gs, tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(w * w, global_step=gs)


@pytest.mark.parametrize("max_to_keep, hours, kept", [
    (2, 10000.0, [7, 8]),  # the newest two
    (1, 1e-9, list(range(1, 9))),  # every older one is n hours after the last kept: all are kept
    (None, 10000.0, list(range(1, 9))),  # TF: None keeps every checkpoint
])
def test_a_passed_savers_max_to_keep_and_keep_checkpoint_every_n_hours_are_the_retention(logdir, max_to_keep,
                                                                                          hours, kept):
    import tensorflow as tf

    import procsv

    with tf.Graph().as_default():
        gs, train = _model(tf)
        saver = tf.compat.v1.train.Saver(max_to_keep=max_to_keep, keep_checkpoint_every_n_hours=hours)
        sv = procsv.Supervisor(logdir=logdir, saver=saver, summary_op=None, save_model_secs=None)
        assert (sv.max_to_keep, sv.keep_checkpoint_every_n_hours) == (max_to_keep or 0, hours)
        with sv.managed_session() as sess:
            for _ in range(8):
                sess.run(train)
                sv.saver.save(sess, sv.save_path, global_step=gs)
    assert committed_steps(logdir) == kept


def test_a_scaffolds_saver_sets_the_retention_of_a_monitored_training_session(logdir):
    """``Scaffold(saver=Saver(max_to_keep=2))``: the checkpoint service's retention is that Saver's."""
    import tensorflow as tf

    from procsv import train

    with tf.Graph().as_default():
        gs, train_op = _model(tf)
        scaffold = train.Scaffold(saver=tf.compat.v1.train.Saver(max_to_keep=2))
        with train.MonitoredTrainingSession(checkpoint_dir=logdir, scaffold=scaffold, save_checkpoint_steps=1,
                                            save_checkpoint_secs=None, save_summaries_steps=None) as sess:
            for _ in range(8):
                sess.run(train_op)
    with open(os.path.join(logdir, ".procsv", "checkpoint_settings.json")) as fh:
        settings = json.load(fh)  # the retention the checkpoint service applied (its saves coalesce: not every step commits)
    assert (settings["max_to_keep"], settings["keep_checkpoint_every_n_hours"]) == (2, 10000.0)
    assert committed_steps(logdir)[-1] == 8 and len(committed_steps(logdir)) <= 2
