"""The event file of a graph Supervisor holds what TensorFlow's holds, in TF's order (issue 50, point 1).

In-process tests: each builds its graph in ``with tf.Graph().as_default()`` (the Supervisor's summary
service is a child process of the test, and writes the file). The same program runs with TF's own
``tf.compat.v1.train.Supervisor`` and with procsv's, and each event file is read back with
``tf.compat.v1.train.summary_iterator``: file_version, the GraphDef, the MetaGraphDef the Supervisor
built when it was made, the summaries, ``SessionLog`` STOP; a ``SessionLog`` START only where TF writes
one or where a restore makes steps repeat (the purge procsv's restarts rely on).
"""

from __future__ import annotations

import glob
import os
from typing import Any

import pytest

pytestmark = pytest.mark.usefixtures("fresh_train_api")


def _events(logdir: str) -> list[Any]:
    import tensorflow as tf

    paths = sorted(glob.glob(os.path.join(logdir, "events.out.tfevents.*")))
    assert len(paths) == 1, paths
    return list(tf.compat.v1.train.summary_iterator(paths[0]))


def _kinds(events: list[Any]) -> list[str]:
    out = []
    for ev in events:
        kind = ev.WhichOneof("what")
        out.append(f"session_log:{ev.session_log.status}" if kind == "session_log" else str(kind))
    return out


def _chief_writes(supervisor_class: Any, logdir: str) -> tuple[list[Any], Any, Any]:
    """TF's testChiefCanWriteEvents as a program: a summary computed, the session closed, then stop()."""
    import tensorflow as tf
    from tensorflow.python.framework import meta_graph

    with tf.Graph().as_default():
        tf.compat.v1.summary.scalar("c1", tf.constant(1))
        tf.compat.v1.summary.scalar("c2", tf.constant(2))
        summ = tf.compat.v1.summary.merge_all()
        sv = supervisor_class(is_chief=True, logdir=logdir, summary_op=None)
        made = meta_graph.create_meta_graph_def()
        sess = sv.prepare_or_wait_for_session("")
        sv.summary_computed(sess, sess.run(summ))
        sess.close()
        sv.stop()
        graph = sess.graph.as_graph_def(add_shapes=True)
    return _events(logdir), made, graph


def test_the_chiefs_event_file_holds_graph_meta_graph_summary_and_stop_in_tensorflows_order(tmp_path):
    import tensorflow as tf
    from tensorflow.core.util import event_pb2

    from procsv import train

    theirs, _, _ = _chief_writes(tf.compat.v1.train.Supervisor, str(tmp_path / "tf"))
    ours, made, graph = _chief_writes(train.Supervisor, str(tmp_path / "procsv"))
    stop = f"session_log:{event_pb2.SessionLog.STOP}"
    assert _kinds(theirs) == ["file_version", "graph_def", "meta_graph_def", "summary", stop]
    assert _kinds(ours) == _kinds(theirs)
    got_graph = tf.compat.v1.GraphDef.FromString(ours[1].graph_def)
    assert got_graph == graph
    got_meta = tf.compat.v1.MetaGraphDef.FromString(ours[2].meta_graph_def)
    assert got_meta == made  # the MetaGraphDef of the Supervisor's construction, as TF's
    assert got_meta.graph_def == graph
    assert [(v.tag, v.simple_value) for v in ours[3].summary.value] == [("c1", 1.0), ("c2", 2.0)]


def _two_sessions(logdir: str) -> None:
    """Two processes' worth of sessions on one logdir, in one process: a fresh one and one that restores."""
    import tensorflow as tf

    from procsv import train

    for _ in range(2):
        with tf.Graph().as_default():
            gs = tf.compat.v1.train.get_or_create_global_step()
            step = tf.compat.v1.assign_add(gs, 1)
            tf.compat.v1.summary.scalar("s", tf.constant(1.0))
            summ = tf.compat.v1.summary.merge_all()
            sv = train.Supervisor(logdir=logdir, summary_op=None, save_model_secs=600)
            with sv.managed_session(start_standard_services=False) as sess:
                sess.run(step)
                sv.summary_computed(sess, sess.run(summ))


@pytest.mark.slow
def test_a_fresh_session_writes_no_session_start_and_a_restored_one_still_purges_what_it_repeats(tmp_path):
    from tensorflow.core.util import event_pb2

    logdir = str(tmp_path / "run")
    _two_sessions(logdir)
    files = sorted(glob.glob(os.path.join(logdir, "events.out.tfevents.*")))
    assert len(files) == 2, files  # one summary service per session (a plain python run)
    import tensorflow as tf

    start = f"session_log:{event_pb2.SessionLog.START}"
    stop = f"session_log:{event_pb2.SessionLog.STOP}"
    fresh = list(tf.compat.v1.train.summary_iterator(files[0]))
    restored = list(tf.compat.v1.train.summary_iterator(files[1]))
    checkpoint = f"session_log:{event_pb2.SessionLog.CHECKPOINT}"  # procsv's final checkpoint at the stop
    # fresh, start_standard_services=False: TF writes no START, and nothing logged before could be purged
    assert [k for k in _kinds(fresh) if k != checkpoint] == ["file_version", "graph_def", "meta_graph_def",
                                                               "summary", stop]
    # restored at step 1: the START at the next step makes TensorBoard drop what the restored run repeats
    kinds = _kinds(restored)
    assert kinds[:3] == ["file_version", "graph_def", "meta_graph_def"] and start in kinds
    first_start = restored[kinds.index(start)]
    assert first_start.step == 2 and kinds.index(start) < kinds.index("summary")


@pytest.mark.slow
def test_a_summary_writer_kept_open_across_sessions_gets_both_sessions_in_one_event_file_as_tensorflows(tmp_path):
    import tensorflow as tf
    from tensorflow.core.util import event_pb2

    from procsv import train

    def sessions(supervisor_class: Any, logdir: str) -> None:
        with tf.Graph().as_default():
            tf.compat.v1.summary.scalar("c1", tf.constant(1))
            summ = tf.compat.v1.summary.merge_all()
            sv = supervisor_class(logdir=logdir)
            for close in (False, False, True):  # TF's testManagedSessionKeepSummaryWriter, then one that closes
                with sv.managed_session("", close_summary_writer=close, start_standard_services=False) as sess:
                    sv.summary_computed(sess, sess.run(summ))

    theirs, ours = str(tmp_path / "tf"), str(tmp_path / "procsv")
    sessions(tf.compat.v1.train.Supervisor, theirs)
    sessions(train.Supervisor, ours)
    stop = f"session_log:{event_pb2.SessionLog.STOP}"
    expected = ["file_version", "graph_def", "meta_graph_def", "summary", "summary", "summary", stop]
    assert _kinds(_events(theirs)) == expected
    assert _kinds(_events(ours)) == expected  # one file: the stops that kept the writer kept its service
    # the stop that closed the writer released the services and the logdir: another Supervisor starts its own
    with tf.Graph().as_default():
        sv = train.Supervisor(logdir=ours)
        with sv.managed_session(start_standard_services=False):
            pass
    assert len(glob.glob(os.path.join(ours, "events.out.tfevents.*"))) == 2
