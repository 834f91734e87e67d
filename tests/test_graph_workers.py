"""A TF1 graph program's non-chief (``Supervisor(is_chief=False)``) outside ``procsv launch --ps``.

As TF's ``SessionManager.wait_for_session``: a worker whose session is on a server (where the chief's
variables may live) waits until ``ready_op`` reports the model ready and never runs ``init_op`` or
restores over the chief's variables; a worker whose variables are its own (no target) restores the
chief's newest checkpoint, waiting for one; either wait ends at ``max_wait_secs`` with TF's
``DeadlineExceededError``.
"""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from conftest import PROGRAMS, committed_steps, quiet_env, run_python, wait_for
from pyfork import popen_python

pytestmark = pytest.mark.slow  # starts TensorFlow processes: not in the quick tier

PROGRAM = os.path.join(PROGRAMS, "graph_shared_worker.py")


def _model(tf):
    gs = tf.compat.v1.train.get_or_create_global_step()
    w = tf.compat.v1.get_variable("w", initializer=1.0)
    return gs, tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(w * w, global_step=gs)


def test_a_worker_on_the_chiefs_server_joins_at_the_chiefs_step_and_never_reinitializes_it(tmp_path):
    """Two processes: the chief trains 4 steps in a session on its own ``tf.distribute.Server``;
    a worker process (``is_chief=False``) opens a session on that server. The worker starts at the
    chief's step 4 (the variables the chief initialized, not ``init_op``'s), its step makes 5, and
    the chief, still in its session, sees 5 (before: the worker re-ran ``init_op``, the chief's step
    went from 4 back to 0)."""
    folder = str(tmp_path)
    chief = popen_python([PROGRAM, "chief", folder], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=quiet_env())
    try:
        wait_for(lambda: os.path.exists(os.path.join(folder, "chief-at-4")) or chief.poll() is not None, 180,
                 what="the chief's fourth step")
        assert chief.poll() is None, chief.communicate()[1][-3000:]
        worker = run_python([PROGRAM, "worker", folder, "60"], env=quiet_env(), timeout=240)
        assert worker.returncode == 0, worker.stderr[-3000:]
        assert "worker starts at step 4" in worker.stdout, worker.stdout
        assert "worker ends at step 5" in worker.stdout, worker.stdout
        out, err = chief.communicate(timeout=240)
    finally:
        if chief.poll() is None:
            chief.kill()
            chief.communicate()
    assert chief.returncode == 0, err[-3000:]
    assert "chief sees step 5" in out, out
    assert committed_steps(os.path.join(folder, "worker")) == []  # a worker saves nothing


def test_a_worker_on_a_server_nobody_initialized_waits_max_wait_secs_then_raises_deadline_exceeded(tmp_path):
    """No ``--ps``: a worker's session on a server whose variables no chief initialized waits for
    ``ready_op`` and raises TF's ``DeadlineExceededError`` once ``max_wait_secs`` passed (before: it
    ran ``init_op`` and trained on at once; ``max_wait_secs`` bounded nothing). The variables stay
    uninitialized: the worker ran no ``init_op``."""
    import tensorflow as tf

    import procsv

    server = tf.distribute.Server.create_local_server()
    with tf.Graph().as_default():
        gs, train = _model(tf)
        sv = procsv.Supervisor(logdir=str(tmp_path / "worker"), is_chief=False, summary_op=None,
                               recovery_wait_secs=0.2)
        t0 = time.monotonic()
        with pytest.raises(tf.errors.DeadlineExceededError, match="Session was not ready after waiting 2 secs"):
            sv.prepare_or_wait_for_session(server.target, max_wait_secs=2)
        waited = time.monotonic() - t0
        sv._release()
        assert 2 <= waited < 30
    with tf.Graph().as_default(), tf.compat.v1.Session(server.target) as plain:
        _model(tf)
        assert plain.run(tf.compat.v1.report_uninitialized_variables()).size > 0


def test_a_worker_with_its_own_variables_waits_for_the_chiefs_checkpoint_never_running_init_op(tmp_path):
    """No target (the worker's variables are its own): with no checkpoint of the chief's in the
    logdir, the worker waits for one and raises ``DeadlineExceededError`` after ``max_wait_secs``
    (before: it ran ``init_op`` and trained from scratch). With the chief's checkpoint it restores
    it (step 3, the chief's weights)."""
    import tensorflow as tf

    import procsv

    logdir = str(tmp_path / "run")
    with tf.Graph().as_default():
        _model(tf)
        sv = procsv.Supervisor(logdir=logdir, is_chief=False, summary_op=None, recovery_wait_secs=0.2)
        t0 = time.monotonic()
        with pytest.raises(tf.errors.DeadlineExceededError, match="max_wait_secs=1"):
            sv.prepare_or_wait_for_session(max_wait_secs=1)
        assert 1 <= time.monotonic() - t0 < 30
        sv._release()
    with tf.Graph().as_default():
        gs, train = _model(tf)
        sv = procsv.Supervisor(logdir=logdir, summary_op=None)
        with sv.managed_session() as sess:
            for _ in range(3):
                sess.run(train)
            sv.request_stop()
    # the chief's standard services' checkpoint of its initialized step (TF's checkpoint thread saves once
    # as it starts), then its final one
    assert committed_steps(logdir) == [0, 3]
    with tf.Graph().as_default():
        gs, train = _model(tf)
        sv = procsv.Supervisor(logdir=logdir, is_chief=False, summary_op=None)
        sess = sv.prepare_or_wait_for_session(max_wait_secs=1)
        assert int(sess.run(gs)) == 3
        sv.stop()
    assert committed_steps(logdir) == [0, 3]  # the worker restored step 3 and saved nothing
