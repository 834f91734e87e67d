"""A TF1 graph program's checkpoints (issue 40): ``GraphCheckpoint`` and ``GraphGlobalStep``
through the same paths as eager checkpoints.

The graph work runs in a ``tf.Graph().as_default()`` block with a ``tf.compat.v1.Session`` (this
process stays eager for the other tests), or, for the in-memory tier, in a child program with
eager execution disabled (tests/programs/graph_agent.py). Snapshots go through a real
CheckpointAgent to a real checkpoint service (a child process): the shared snapshot memory, the
asynchronous atomic checksummed commit with its manifest; the checkpoints are read back with
``tf.train.latest_checkpoint`` and a plain ``tf.compat.v1.train.Saver`` in a fresh graph, and
restored through the restore at start's verification.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import time
from typing import Any, Iterator

import numpy as np
import pytest

from conftest import committed_steps, quiet_env, run_python, wait_for
from pyfork import popen_python
from procsv.common import spawn
from procsv.common.errors import MismatchedCheckpoint
from procsv.common.layout import Layout
from procsv.ipc.messages import SaveReason
from procsv.ipc.transport import Endpoints
from procsv.trainer.channels import TrainerChannels
from procsv.trainer.checkpoint import restore_at_start
from procsv.trainer.checkpoint.restore import ReadRetry
from procsv.trainer.checkpoint.snapshot import GRAPH_KEY, take

PROGRAM = os.path.join(os.path.dirname(__file__), "programs", "graph_agent.py")
_spec = importlib.util.spec_from_file_location("graph_agent", PROGRAM)
assert _spec is not None and _spec.loader is not None
prog = importlib.util.module_from_spec(_spec)
sys.modules["graph_agent"] = prog  # (its dataclass looks its module up)
_spec.loader.exec_module(prog)


class Service:
    """The real checkpoint service as a child process, and this process's channels to it."""

    def __init__(self, logdir: str, runtime: str) -> None:
        self.logdir = logdir
        self.log_path = os.path.join(logdir, "logs", "checkpoint.1.log")
        os.makedirs(runtime, exist_ok=True)
        Layout(logdir).create()
        env = spawn.child_env(role="checkpoint", attempt=1, logdir=logdir, runtime_dir=runtime, supervised=False)
        self.proc = spawn.spawn(spawn.service_argv("checkpoint"), env, self.log_path)
        self.ch = TrainerChannels(Endpoints(runtime), supervised=False)

    def log(self) -> str:
        try:
            with open(self.log_path) as fh:
                return fh.read()
        except FileNotFoundError:
            return ""

    def close(self) -> None:
        self.ch.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _commit(agent: Any, svc: Service, gs: Any, step: int) -> None:
    gs.observe(step)
    result = agent.final(svc.ch, step, SaveReason.FINAL, grace_secs=120)
    assert result is not None and result.ok, svc.log()


def _same(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    assert sorted(got) == sorted(want)
    for name in want:
        assert got[name].dtype == want[name].dtype, name
        assert np.array_equal(got[name], want[name]), name


def _fresh(w1_shape: tuple[int, int] = (4, 8), extra: bool = False) -> tuple[Any, Any, Any]:
    """A fresh graph with the model, a session on it and the initializer (not run)."""
    import tensorflow as tf

    m = prog.build(tf.Graph(), w1_shape, extra)
    with m.graph.as_default():
        init = tf.compat.v1.global_variables_initializer()
    return m, tf.compat.v1.Session(graph=m.graph), init


def _restore(logdir: str, w1_shape: tuple[int, int] = (4, 8), extra: bool = False, stale: int = -5
             ) -> tuple[restore_at_start.Restored, dict[str, np.ndarray], int]:
    """Restore at start, as the agent does, into a fresh graph: what it did, the values, the step.
    The global step has observed ``stale`` before (a value from runs before the restore)."""
    from procsv.trainer.graph.state import GraphCheckpoint, GraphGlobalStep
    import tensorflow as tf

    m, sess, init = _fresh(w1_shape, extra)
    try:
        with m.graph.as_default():
            ckpt = GraphCheckpoint(tf.compat.v1.global_variables(), lambda: sess)
        gs = GraphGlobalStep(m.global_step, lambda: sess)
        gs.observe(stale)  # a stale observation: the restore must set the step all the same
        done = restore_at_start.restore_or_init(ckpt, gs, Layout(logdir), lambda: sess.run(init), allow_reinit=False,
                                                read_retry=ReadRetry(total_secs=0.1), clock=time.monotonic,
                                                sleep=time.sleep)
        step = int(gs.numpy())
        assert step == int(sess.run(m.global_step))
        return done, prog.values(sess, m.graph), step
    finally:
        sess.close()


@pytest.fixture(scope="module")
def graph_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[int, dict[str, np.ndarray]]]]:
    """A logdir with two checkpoints of a graph program committed by the real service (steps 3
    and 6), and every variable's value at each."""
    import tensorflow as tf

    logdir = str(tmp_path_factory.mktemp("graph") / "run")
    runtime = tempfile_short()
    svc = Service(logdir, runtime)
    m = prog.build(tf.Graph())
    with m.graph.as_default():
        init = tf.compat.v1.global_variables_initializer()
    sess = tf.compat.v1.Session(graph=m.graph)
    at: dict[int, dict[str, np.ndarray]] = {}
    try:
        agent, _, gs = prog.agent_for(m, sess, logdir)
        assert agent.restore_or_init(lambda: sess.run(init)) == []
        assert agent.store.arena is not None  # the snapshots go through the shared memory
        for steps in (3, 3):
            step = prog.train(sess, m, steps)
            at[step] = prog.values(sess, m.graph)
            _commit(agent, svc, gs, step)
            prog.train(sess, m, 1)  # the variables move on after the snapshot
            gs.assign(step)
        yield logdir, at
    finally:
        sess.close()
        svc.close()
        shutil.rmtree(runtime, ignore_errors=True)


def tempfile_short() -> str:
    import tempfile

    return tempfile.mkdtemp(prefix="pt-", dir="/tmp")


@pytest.mark.slow
def test_a_graph_snapshot_commits_a_checkpoint_a_plain_tf1_saver_restores_bit_equal(graph_run):
    import tensorflow as tf

    logdir, at = graph_run
    assert committed_steps(logdir) == [3, 6]
    latest = tf.train.latest_checkpoint(logdir)
    assert latest is not None and latest.endswith("model.ckpt-6")
    keys = tf.train.load_checkpoint(latest).get_variable_to_shape_map()
    assert GRAPH_KEY not in keys and {"w1", "w1/Momentum", "global_step"} <= set(keys)
    assert os.path.exists(latest + ".data-00000-of-00002")  # shard 0: the tensors from the shared memory
    m, sess, _ = _fresh()
    try:
        with m.graph.as_default():
            saver = tf.compat.v1.train.Saver()
            saver.restore(sess, latest)
        got = prog.values(sess, m.graph)
    finally:
        sess.close()
    assert {"w1/Momentum", "b2/Momentum", "global_step", "tag"} <= set(got)
    assert got["tag"].tolist() == [b"graph", b"mode"]
    _same(got, at[6])
    assert int(got["global_step"]) == 6


@pytest.mark.slow
def test_restore_at_start_restores_a_graph_checkpoint_bit_equal_and_sets_the_step(graph_run):
    logdir, at = graph_run
    done, got, step = _restore(logdir)
    assert done.path is not None and done.path.endswith("model.ckpt-6") and done.corrupt == []
    assert step == 6
    _same(got, at[6])


@pytest.mark.slow
def test_a_restore_keeps_the_global_step_stored_in_the_checkpoint_whatever_its_name_says(tmp_path):
    """A committed checkpoint whose name says another step than the global step stored in it (as
    procsv named a final checkpoint by its own count before: ``model.ckpt-7`` holding 6) restores,
    through the real service's commit and the restore at start, at the stored step: the global
    step variable and procsv's step are 6 (was: 7, the name's step assigned over the stored one)."""
    import tensorflow as tf

    from procsv.trainer.graph.state import GraphCheckpoint, GraphGlobalStep

    logdir, runtime = str(tmp_path / "run"), tempfile_short()
    svc = Service(logdir, runtime)
    m = prog.build(tf.Graph())
    with m.graph.as_default():
        init = tf.compat.v1.global_variables_initializer()
    sess = tf.compat.v1.Session(graph=m.graph)
    try:
        agent, _, gs = prog.agent_for(m, sess, logdir)  # (no step_key: named by the step it is given)
        assert agent.restore_or_init(lambda: sess.run(init)) == []
        assert prog.train(sess, m, 6) == 6
        _commit(agent, svc, gs, 7)
        stored = prog.values(sess, m.graph)
    finally:
        sess.close()
        svc.close()
        shutil.rmtree(runtime, ignore_errors=True)
    assert committed_steps(logdir) == [7]
    m2, sess2, init2 = _fresh()
    try:
        with m2.graph.as_default():
            ckpt = GraphCheckpoint(tf.compat.v1.global_variables(), lambda: sess2)
        ckpt.step_key = ckpt.key_of(m2.global_step)  # what the Supervisor sets: the program's global step
        gs2 = GraphGlobalStep(m2.global_step, lambda: sess2)
        gs2.observe(-5)  # stale: read again after the restore
        done = restore_at_start.restore_or_init(ckpt, gs2, Layout(logdir), lambda: sess2.run(init2),
                                                allow_reinit=False, read_retry=ReadRetry(total_secs=0.1),
                                                clock=time.monotonic, sleep=time.sleep)
        assert done.path is not None and done.path.endswith("model.ckpt-7")
        assert int(sess2.run(m2.global_step)) == 6 and int(gs2.numpy()) == 6
        _same(prog.values(sess2, m2.graph), stored)
    finally:
        sess2.close()


@pytest.mark.slow
def test_a_corrupt_newest_graph_checkpoint_is_passed_over_for_the_one_before(graph_run, tmp_path):
    logdir, at = graph_run
    copy = str(tmp_path / "run")
    shutil.copytree(logdir, copy)
    data = os.path.join(copy, "model.ckpt-6.data-00000-of-00002")
    with open(data, "r+b") as fh:
        byte = fh.read(1)
        fh.seek(0)
        fh.write(bytes([byte[0] ^ 0xFF]))
    done, got, step = _restore(copy)
    assert done.path is not None and done.path.endswith("model.ckpt-3")
    assert done.corrupt == ["model.ckpt-6"]
    assert step == 3
    _same(got, at[3])


@pytest.mark.slow
@pytest.mark.parametrize("w1_shape,extra,named", [((4, 5), False, "'w1'"), ((4, 8), True, "'w3'")])
def test_a_graph_checkpoint_that_does_not_match_the_program_raises_naming_the_variable(graph_run, w1_shape, extra,
                                                                                      named):
    logdir, _ = graph_run
    with pytest.raises(MismatchedCheckpoint, match=named):
        _restore(logdir, w1_shape, extra)


@pytest.mark.slow
@pytest.mark.parametrize("with_step", [True, False])
def test_a_tf1_savers_logdir_is_restored_at_the_step_in_its_global_step_key(tmp_path, with_step):
    import tensorflow as tf

    logdir = str(tmp_path / "tf1")
    os.makedirs(logdir)
    m, sess, init = _fresh()
    try:
        sess.run(init)
        prog.train(sess, m, 5)
        want = prog.values(sess, m.graph)
        with m.graph.as_default():
            var_list = tf.compat.v1.global_variables()
            if not with_step:
                var_list = [v for v in var_list if v.op.name != "global_step"]
            saver = tf.compat.v1.train.Saver(var_list)
            # named 123 (TF1 numbers its files as the program says): the step is the one stored inside
            path = saver.save(sess, os.path.join(logdir, "model.ckpt"), global_step=123)
    finally:
        sess.close()
    assert path.endswith("model.ckpt-123") and not os.path.exists(os.path.join(logdir, ".procsv", "manifests"))
    if not with_step:
        with pytest.raises(MismatchedCheckpoint, match="cannot tell which step"):
            _restore(logdir)
        return
    done, got, step = _restore(logdir)
    assert done.path == path
    assert step == 5
    _same(got, want)


@pytest.mark.slow
def test_a_tf1_checkpoint_with_a_step_key_but_no_global_step_resumes_at_it_leaving_the_variable_out(tmp_path):
    import tensorflow as tf

    logdir = str(tmp_path / "tf1")
    os.makedirs(logdir)
    m, sess, init = _fresh()
    try:
        sess.run(init)
        prog.train(sess, m, 4)
        want = prog.values(sess, m.graph)
        with m.graph.as_default():
            var_list = {v.op.name: v for v in tf.compat.v1.global_variables() if v.op.name != "global_step"}
            var_list["step"] = m.global_step
            saver = tf.compat.v1.train.Saver(var_list)
            path = saver.save(sess, os.path.join(logdir, "model.ckpt"), global_step=1)
    finally:
        sess.close()
    # observed 4 already: only the variable, never restored from this file, tells the step is not set
    done, got, step = _restore(logdir, stale=4)
    assert done.path == path and step == 4
    _same(got, want)


class CountingSession:
    """A session that counts its runs."""

    def __init__(self, sess: Any) -> None:
        self.sess = sess
        self.runs = 0

    def run(self, *args: Any, **kwargs: Any) -> Any:
        self.runs += 1
        return self.sess.run(*args, **kwargs)


@pytest.mark.slow
def test_snapshots_restores_and_assignments_do_not_grow_the_graph_and_take_one_run_each(graph_run):
    from procsv.trainer.graph.state import GraphCheckpoint, GraphGlobalStep
    import tensorflow as tf

    logdir, at = graph_run
    m, sess, init = _fresh()
    counting = CountingSession(sess)
    try:
        with m.graph.as_default():
            ckpt = GraphCheckpoint(tf.compat.v1.global_variables(), lambda: counting)
        gs = GraphGlobalStep(m.global_step, lambda: sess)
        before = len(m.graph.get_operations())
        m.graph.finalize()  # an op added from here on raises
        sess.run(init)
        for i in range(3):
            counting.runs = 0
            snap = take(ckpt, lambda n: None)
            assert counting.runs == 1
            assert GRAPH_KEY not in [s.key for s in snap.specs] and len(snap.frames) == len(ckpt.keys())
            ckpt.restore(os.path.join(logdir, "model.ckpt-6")).assert_existing_objects_matched()
            assert counting.runs == 2
            _same(prog.values(sess, m.graph), at[6])
            gs.assign(10 + i)
            gs.assign_add(2)
            gs.forget()
            assert int(gs.numpy()) == 12 + i == int(sess.run(gs.tensor))
            prog.train(sess, m, 1)
        assert len(m.graph.get_operations()) == before
    finally:
        sess.close()


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["resource", "ref"])
def test_a_graph_programs_in_memory_snapshot_is_persisted_when_it_dies_and_restores_bit_equal(tmp_path, kind):
    """In a program with eager execution disabled; with ``ref``, with TF1's reference variables
    (``disable_v2_behavior``), which a snapshot reads and a restore assigns as well: the restore
    runs here, and in such a program again."""
    logdir = str(tmp_path / "run")
    runtime = tempfile_short()
    out = str(tmp_path / "at7.npz")
    svc = Service(logdir, runtime)
    proc = popen_python([PROGRAM, logdir, runtime, out, kind], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                        env=quiet_env(), start_new_session=True)
    try:
        assert proc.stdout is not None
        lines = []  # until it says the service holds step 7, or it ends (it gives up within its own deadlines)
        while not lines or lines[-1] not in ("", "HELD 7\n"):
            lines.append(proc.stdout.readline())
        assert lines[-1] == "HELD 7\n", (lines, proc.stderr.read() if proc.poll() is not None else "", svc.log())
        assert committed_steps(logdir) == [3]
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        wait_for(lambda: committed_steps(logdir) == [3, 7], 60, what=f"the held snapshot to commit\n{svc.log()}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        svc.close()
        shutil.rmtree(runtime, ignore_errors=True)
    want = _load(out)
    done, got, step = _restore(logdir)
    assert done.path is not None and done.path.endswith("model.ckpt-7")
    assert step == 7
    _same(got, want)
    again = str(tmp_path / "restored.npz")
    proc = run_python([PROGRAM, logdir, "-", again, kind, "restore"], env=quiet_env(), timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert f"RESTORED 7 {done.path}" in proc.stdout
    _same(_load(again), want)


def _load(path: str) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=True) as npz:  # (the string variable: written by our own child)
        return {k.replace("|", "/"): npz[k] for k in npz.files}
