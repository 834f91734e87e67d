"""What a process keeps after its sessions end: a program that opens many sessions in one process
(``for epoch ...: with sv.managed_session()``, a Supervisor per phase) must not grow with their number.

In-process tests (graph mode, in ``with tf.Graph().as_default()``; the Supervisor's services run as
child processes of the test). Each session's checkpoint agent maps a snapshot arena (a memfd of the
state's size, ``procsv-snapshot`` in ``/proc/self/fd``): let go when the session's Supervisor stops.
"""

from __future__ import annotations

import os

import pytest


def _arenas() -> int:
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            n += "procsv-snapshot" in os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # (the listing's own fd, closed since)
            pass
    return n


@pytest.mark.slow
def test_the_snapshot_memory_of_each_session_is_let_go_at_its_stop(logdir):
    import tensorflow as tf

    import procsv

    before = _arenas()
    inside, after = [], []
    with tf.Graph().as_default():
        gs = tf.compat.v1.train.get_or_create_global_step()
        w = tf.compat.v1.get_variable("w", shape=[256, 256])
        train = tf.group(w.assign_add(tf.ones_like(w)), gs.assign_add(1))
        sv = procsv.Supervisor(logdir=logdir, summary_op=None, save_model_secs=0.05)
        for _ in range(4):  # one Supervisor, a session per epoch
            with sv.managed_session() as sess:
                for _ in range(3):
                    sess.run(train)
                inside.append(_arenas() - before)
            after.append(_arenas() - before)
        assert int(tf.train.load_variable(tf.train.latest_checkpoint(logdir), "global_step")) == 12
    for i in range(3):  # a Supervisor per phase
        with tf.Graph().as_default():
            gs = tf.compat.v1.train.get_or_create_global_step()
            train = gs.assign_add(1)
            sv = procsv.Supervisor(logdir=f"{logdir}-{i}", summary_op=None)
            with sv.managed_session() as sess:
                sess.run(train)
            after.append(_arenas() - before)
    assert len(set(inside)) == 1 and after == [0] * 7, (inside, after)  # as many in each session, none after


def test_what_procsv_builds_in_a_graph_lets_the_graph_go():
    """The ops procsv adds to a TF1 graph (built once per graph, reused by a second Supervisor on it)
    do not keep the graph alive once the program drops it (a WeakKeyDictionary whose values held
    the graph's own ops kept every graph for the life of the process)."""
    import gc
    import weakref

    import tensorflow as tf

    from procsv.trainer.graph.built import once_per_graph

    graph = tf.Graph()
    with graph.as_default():
        v = tf.compat.v1.get_variable("v", initializer=1.0)
        first = once_per_graph(graph, ("read", v.name), lambda: v.read_value())
    assert once_per_graph(graph, ("read", v.name), lambda: None) is first  # built once
    gone = weakref.ref(graph)
    del graph, v, first
    gc.collect()
    assert gone() is None


@pytest.mark.slow
def test_a_supervisor_the_program_drops_after_its_stop_is_let_go_and_its_steps_still_count_at_exit(tmp_path):
    """A program that makes a Supervisor per phase (each in its own graph) and drops it: the registry
    the trainer's bootstrap reads at exit (``procsv.trainer.outcome``) held every Supervisor's bound
    method, so every Supervisor and its graph stayed alive for the life of the process (review50b:
    17 graphs alive after 15 sessions). Now it holds them weakly and keeps each one's outcome as read
    at its stop: the graphs go, and the steps of the dropped Supervisors still count."""
    import gc
    import weakref

    import tensorflow as tf

    import procsv
    from procsv.trainer import outcome

    before = outcome.collect().steps_completed
    graphs, supervisors = [], []
    for i in range(3):
        with tf.Graph().as_default() as graph:
            gs = tf.compat.v1.train.get_or_create_global_step()
            train = gs.assign_add(1)
            sv = procsv.Supervisor(logdir=str(tmp_path / f"phase{i}"), summary_op=None, save_model_secs=0)
            with sv.managed_session() as sess:
                for _ in range(i + 1):
                    sess.run(train)
            sv.stop()
        graphs.append(weakref.ref(graph))
        supervisors.append(weakref.ref(sv))
        del graph, gs, train, sv, sess
    gc.collect()
    assert [s() for s in supervisors] == [None] * 3
    assert [g() for g in graphs] == [None] * 3
    assert outcome.collect().steps_completed - before == 1 + 2 + 3
