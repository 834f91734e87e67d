"""TensorBoard shows every step once when a finished run is launched again into its logdir: one that
restores nothing (its checkpoints were deleted), even where TF's Supervisor writes no ``SessionLog
START`` (``start_standard_services=False``): the earlier event files hold the steps the new run logs
again, so its session writes the START that makes TensorBoard discard them (procsv.common.eventsteps);
and one that restores the last step and runs none, whose START must not purge that step's points.

The launches are real ``procsv launch`` runs of tests/programs/graph_summary_steps.py; the logdir is
read back with TensorBoard's own ``EventAccumulator``. The reader of event steps is also tested on
event files TensorFlow writes, and on one whose last record is torn.
"""

from __future__ import annotations

import glob
import os
import shutil

import pytest

from conftest import PROGRAMS, finish, launch
from procsv.common.eventsteps import event_step, logged_at_or_after


def _scalars(logdir: str, tag: str) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing import event_accumulator

    acc = event_accumulator.EventAccumulator(logdir)
    acc.Reload()
    return [(e.step, round(e.value, 6)) for e in acc.Scalars(tag)]


def _run(logdir: str, steps: int) -> None:
    code, _, err = finish(launch(logdir, logdir, str(steps), target=os.path.join(PROGRAMS, "graph_summary_steps.py"),
                                 opts=("--standby", "fork")))  # no restart: no hot standby
    assert code == 0, err


@pytest.mark.slow
def test_a_relaunch_that_restores_nothing_purges_the_steps_the_earlier_event_files_hold(logdir):
    _run(logdir, 6)
    first = _scalars(logdir, "loss")
    assert [s for s, _ in first] == [1, 2, 3, 4, 5, 6]
    for path in glob.glob(os.path.join(logdir, "model.ckpt*")) + glob.glob(os.path.join(logdir, "checkpoint")):
        os.remove(path)
    shutil.rmtree(os.path.join(logdir, ".procsv", "checkpoints"))
    _run(logdir, 3)  # starts again at step 0 and logs steps 1..3 again
    assert len(glob.glob(os.path.join(logdir, "events.out.tfevents.*"))) == 2
    assert _scalars(logdir, "loss") == first[:3]  # each step once, none going back (was 1..6 then 1..3)


def test_the_steps_of_tensorflows_event_files_are_read_and_a_torn_last_record_ends_the_reading(tmp_path):
    import tensorflow as tf

    logdir = str(tmp_path)
    with tf.Graph().as_default(), tf.compat.v1.summary.FileWriter(logdir) as writer:
        for step in (0, 5, 300, 2**40):
            writer.add_summary(tf.compat.v1.Summary(value=[tf.compat.v1.Summary.Value(tag="x", simple_value=1.0)]), step)
    assert logged_at_or_after(logdir, 2**40) and not logged_at_or_after(logdir, 2**40 + 1)
    (path,) = glob.glob(os.path.join(logdir, "events.out.tfevents.*"))
    with open(path, "rb+") as fh:  # cut the last record (step 2**40) in its middle: a killed writer's
        fh.truncate(os.path.getsize(path) - 3)
    assert logged_at_or_after(logdir, 300) and not logged_at_or_after(logdir, 301)
    assert event_step(tf.compat.v1.Event(wall_time=1.5, step=-3).SerializeToString()) == -3
    assert event_step(tf.compat.v1.Event(wall_time=1.5).SerializeToString()) == 0
    assert not logged_at_or_after(str(tmp_path / "missing"), 0)


@pytest.mark.slow
def test_a_relaunch_of_a_finished_run_that_runs_no_step_keeps_the_last_steps_points(logdir):
    _run(logdir, 6)
    first = _scalars(logdir, "loss")
    _run(logdir, 6)  # restores step 6 and has nothing to do: its START must not purge step 6
    assert _scalars(logdir, "loss") == first
    _run(logdir, 8)
    got = _scalars(logdir, "loss")
    assert [s for s, _ in got] == [1, 2, 3, 4, 5, 6, 7, 8] and got[:6] == first  # (was: step 6 lost)
