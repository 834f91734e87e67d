"""Graph mode, the rest of TF's Supervisor: ``graph.pbtxt`` in the logdir, ``master`` and ``config``
reaching the session, ``local_init_run_options``, and a graph program without a logdir.

Every graph program runs in its own process (``tests/programs/tf1_cases.py`` and ``tf1_train.py``):
eager execution is never disabled in the pytest process (the ``'local'`` master's test builds its
graphs in ``tf.Graph().as_default()`` blocks in this process). Where TensorFlow's own Supervisor can run
the same case, the test runs it too and compares (``--tf``).
"""

from __future__ import annotations

import os

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from conftest import PROGRAMS, REPO, case_results, quiet_env, run_python

CASES = os.path.join(PROGRAMS, "tf1_cases.py")
TRAIN = os.path.join(PROGRAMS, "tf1_train.py")


# Each side's cases run one after another in one process (one TensorFlow import a side, see
# tf1_cases.py), each in its own graph with BASE/<case> as its logdir; the process runs in an empty
# folder of its own (no_logdir: nothing is written where it runs). Made once per test session.
OURS = ["no_logdir", "graph_file", "master_config", "local_init_run_options"]
THEIRS = ["no_logdir", "master_config", "local_init_run_options"]


def _run_cases(folder: str) -> None:
    for side, names, extra in (("ours", OURS, []), ("tf", THEIRS, ["--tf"])):
        cwd = os.path.join(folder, f"cwd-{side}")
        os.makedirs(cwd)
        done = run_python([CASES, ",".join(names), os.path.join(folder, side), *extra], env=quiet_env(), cwd=cwd,
                          timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        with open(os.path.join(folder, f"{side}.stdout"), "w") as fh:
            fh.write(done.stdout)


@pytest.fixture(scope="module")
def cases(shared_result) -> tuple[str, dict[str, dict[str, dict]]]:  # type: ignore[no-untyped-def]
    """The folder of ``_run_cases`` and each side's results: side ("ours", "tf") -> case -> result."""
    folder = shared_result("graph-leftovers-cases", _run_cases)
    found = case_results(folder, (("ours", list(OURS)), ("tf", list(THEIRS))))
    return folder, found


def _graph_def(path: str):  # type: ignore[no-untyped-def]
    """``path`` parsed as a text GraphDef (in this process: parsing needs no graph mode)."""
    import tensorflow as tf
    from google.protobuf import text_format

    with open(path) as fh:
        return text_format.Parse(fh.read(), tf.compat.v1.GraphDef())


@pytest.mark.slow
def test_the_chief_writes_graph_pbtxt_and_a_graph_event_when_the_session_starts_and_a_worker_none(tmp_path, cases):
    """As TF's Supervisor (``_write_graph`` after ``prepare_session``, chief only): the chief's
    logdir holds ``graph.pbtxt`` once the session is ready, a text GraphDef with the program's ops
    and their shapes; a worker (``is_chief=False``) writes none. The MLP program's file holds its
    variables, its matmuls and its optimizer, as TF's own Supervisor's file does; its event file
    holds the same GraphDef (TensorBoard's graph view, read with EventAccumulator), as TF's does."""
    folder, found = cases
    assert found["ours"]["graph_file"] == {"chief": True, "worker": False}
    assert not os.path.exists(os.path.join(folder, "ours", "graph_file", "worker", "graph.pbtxt"))
    for who, extra in (("ours", []), ("tf", ["--tf", "--no-summary-op"])):
        done = run_python([TRAIN, "--logdir", str(tmp_path / who), "--steps", "3", *extra], env=quiet_env(), cwd=REPO,
                          timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
    ours = _graph_def(str(tmp_path / "ours" / "graph.pbtxt"))
    theirs = _graph_def(str(tmp_path / "tf" / "graph.pbtxt"))
    names = {node.name for node in ours.node}
    assert {"x", "y", "w1", "b1", "w2", "b2", "global_step"} <= names
    assert "MatMul" in {node.op for node in ours.node}
    assert any(node.op.endswith("ApplyMomentum") for node in ours.node)
    mine = {node.name: node for node in ours.node}
    assert {node.name for node in theirs.node} <= names  # TF's graph; procsv's may add its own ops
    # add_shapes=True, as TF: the same nodes carry their output shapes
    assert [n.name for n in theirs.node if "_output_shapes" in n.attr] == \
        [n.name for n in theirs.node if "_output_shapes" in mine[n.name].attr]
    assert "_output_shapes" in mine["w1"].attr
    assert not [n for n in os.listdir(tmp_path / "ours") if n.startswith("graph.pbtxt") and n != "graph.pbtxt"]
    # the GraphDef in the event file too (TF's summary_writer.add_graph), through the summary service
    events = {}
    for who in ("ours", "tf"):
        acc = EventAccumulator(str(tmp_path / who))
        acc.Reload()
        assert acc.Tags()["graph"], who
        events[who] = acc.Graph()
    assert {node.name for node in events["ours"].node} == names
    assert {node.name for node in events["tf"].node} <= names


@pytest.mark.slow
def test_master_and_config_make_the_session_as_tf_on_a_local_server(cases):
    """``managed_session(master, config)`` and ``prepare_or_wait_for_session(master=, config=)``
    make the ``tf.compat.v1.Session`` with that target and ConfigProto: the session's ``sess_str``
    is a local ``tf.distribute.Server``'s target, its config the one passed, and the program trains
    on it; the same as TF's own Supervisor."""
    ours, theirs = cases[1]["ours"]["master_config"], cases[1]["tf"]["master_config"]
    for how in ("managed", "prepare"):
        seen = ours[how]
        assert seen["target"].startswith("grpc://localhost:")
        assert seen["sess_str"] == seen["raw_target"] == seen["target"]
        assert (seen["intra_op"], seen["soft"], seen["step"]) == (1, True, 3)
        tf_seen = theirs[how]
        assert tf_seen["sess_str"] == tf_seen["raw_target"] == tf_seen["target"]
        targets = ("target", "sess_str", "raw_target")  # each run's own server
        assert {k: v for k, v in seen.items() if k not in targets} == \
            {k: v for k, v in tf_seen.items() if k not in targets}


@pytest.mark.slow
def test_local_init_run_options_reach_the_run_of_local_init_op_as_tf(cases):
    """A ``local_init_op`` that blocks (a dequeue of an empty queue) with
    ``local_init_run_options=RunOptions(timeout_in_ms=1)``: the session's start fails with TF's
    DeadlineExceededError, as TF's own Supervisor's (without the options it would block)."""
    assert cases[1]["ours"]["local_init_run_options"] == {"error": "DeadlineExceededError"}
    assert cases[1]["tf"]["local_init_run_options"] == {"error": "DeadlineExceededError"}


@pytest.mark.slow
def test_a_graph_program_without_a_logdir_trains_and_writes_nothing(cases):
    """``Supervisor(logdir=None)`` in a graph program, with summaries and saves asked for every
    10ms: it trains as TF's own Supervisor does (same values, ``save_path`` None, no summary
    writer, ``sv.summary_op`` still TF's ``merge_all`` op, which nothing runs), and nothing is
    written where it runs."""
    folder, found = cases
    ours, theirs = found["ours"]["no_logdir"], found["tf"]["no_logdir"]
    assert ours == theirs
    assert ours == {"v": 6.0, "step": 5, "save_path": None, "no_summary_writer": True, "summary_op": "MergeSummary",
                    "cwd_files": []}
    assert os.listdir(os.path.join(folder, "cwd-ours")) == []


def test_master_local_is_a_session_through_an_in_process_rpc_master():
    """The Supervisor page: "Specifying 'local' requests a session that uses the RPC-based Master
    interface" (see ``tf.distribute.Server.create_local_server``). ``managed_session('local')`` in a
    graph program makes its session on an in-process local server (a ``grpc://localhost:`` target,
    one server for the process) and trains there; TensorFlow 2.21's own ``Session('local')`` has no
    session factory for that target (``NotFoundError``), which is why procsv makes the server."""
    import tensorflow as tf

    import procsv

    targets = []
    for run in range(2):
        with tf.Graph().as_default() as graph:
            gs = tf.compat.v1.train.get_or_create_global_step()
            v = tf.compat.v1.get_variable("v", initializer=1.0)
            train = tf.group(v.assign_add(1.0), gs.assign_add(1))
            if run == 0:
                with pytest.raises(tf.errors.NotFoundError, match="No session factory"):
                    tf.compat.v1.Session("local")
            sv = procsv.Supervisor(logdir=None, graph=graph)  # (no services: the session is what is tested)
            with sv.managed_session("local") as sess:
                for _ in range(3):
                    sess.run(train)
                assert (sess.run(v), sess.run(gs)) == (4.0, 3)
                targets.append(sess.raw.sess_str)
    assert targets[0].startswith(b"grpc://localhost:") and targets[1] == targets[0]
