"""Graph mode: the checkpoint and the summary TF's Supervisor takes as its standard services start, its
periodic summaries while the global step stands still, and the one checkpoint ``model.ckpt`` of a graph
without a global step, rewritten atomically.

The programs run in their own processes (``tests/programs/tf1_start.py``, with ``--tf`` for
TensorFlow's own Supervisor, which each comparison runs too); the rewrite's crash safety is shown by
killing a real process (``tests/programs/rewrite_commit.py``, the service's store) with SIGKILL at
each step of a rewrite and recovering as the service does at its start.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from conftest import PROGRAMS, REPO, quiet_env, run_python
from procsv.common.layout import Layout
from procsv.common.manifests import list_committed, verify
from procsv.services.checkpoint.store import CheckpointStore

START = os.path.join(PROGRAMS, "tf1_start.py")
REWRITE = os.path.join(PROGRAMS, "rewrite_commit.py")


def _start(case: str, logdir: str, tf_own: bool) -> dict:
    done = run_python([START, case, logdir] + (["--tf"] if tf_own else []), env=quiet_env(), cwd=REPO, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith("result ")]
    assert len(lines) == 1, done.stdout + done.stderr[-3000:]
    return json.loads(lines[0][len("result "):])


@pytest.mark.slow
def test_a_checkpoint_and_a_summary_as_the_standard_services_start_as_tensorflows(tmp_path):
    ours = _start("with_step", str(tmp_path / "ours"), False)
    theirs = _start("with_step", str(tmp_path / "tf"), True)
    # (TF's step counter thread also logs global_step/sec; not this test's subject)
    theirs["summaries"] = [s for s in theirs["summaries"] if s[1] != "global_step/sec"]
    assert ours == theirs
    assert ours["checkpoint"] == "model.ckpt-0" and ours["summaries"] == [[0, "v_1", 3.0]]


@pytest.mark.slow
def test_while_a_validation_runs_the_periodic_summaries_and_checkpoints_go_on_at_the_step_that_stands_still_as_tensorflows(tmp_path):
    # TensorFlow's PTB tutorial validates after each epoch's training: runs that advance no step. TF's
    # summary and step counter threads write summary_op and global_step/sec (0.0) every save_summaries_secs
    # all the same, and its checkpoint thread saves step 3 on its timer; procsv wrote one summary and no
    # global_step/sec there (its periodic work came with steps), and no checkpoint of step 3 until the stop
    # (a kill during a validation lost the epoch's training)
    for tf_own in (True, False):
        seen = _start("validation", str(tmp_path / ("tf" if tf_own else "ours")), tf_own)
        assert len(seen["cost"]) >= 3 and set(seen["cost"]) == {0.3125 ** 2}, (tf_own, seen)
        assert seen["global_step/sec"].count(0.0) >= 2, (tf_own, seen)
        assert seen["saved_during_validation"] == "model.ckpt-3", (tf_own, seen)
        # under a MonitoredTrainingSession, whose StopAtStepHook reads the global step with each run: TF's
        # CheckpointSaverHook saves step 3 on its timer during the validation; procsv's session took a run that
        # read the step and left it for no step and did nothing due (its newest checkpoint stayed step 0's)
        assert seen["monitored_saved_during_validation"] == "model.ckpt-3", (tf_own, seen)


@pytest.mark.slow
def test_a_graph_without_a_global_step_has_one_checkpoint_model_ckpt_rewritten_and_restored_as_tensorflows(tmp_path):
    ours = _start("no_step", str(tmp_path / "ours"), False)
    theirs = _start("no_step", str(tmp_path / "tf"), True)
    # (TF's second Supervisor, started in the same second, writes over the first one's event file)
    assert ours.pop("summaries_at_0") == [[0, "v_1", 1.0]]
    theirs.pop("summaries_at_0")
    assert ours == theirs
    assert ours["first"] == ours["latest"] == "model.ckpt" and ours["prefixes"] == ["model.ckpt"]
    assert ours["first_v"] == 1.0 and ours["restored_v"] == 5.0


def _commits(logdir: str, *commits: str, fault: str = "") -> subprocess.CompletedProcess[str]:
    env = quiet_env(**({"PROCSV_FAULT": fault} if fault else {}))
    return subprocess.run([sys.executable, REWRITE, logdir, *commits], capture_output=True, text=True, env=env,
                          cwd=REPO, timeout=120)


def _files(logdir: str) -> dict[str, str]:
    return {n: open(os.path.join(logdir, n)).read() for n in sorted(os.listdir(logdir)) if n.startswith("model.ckpt")}


def test_a_rewrite_replaces_the_files_of_one_prefix_and_its_manifest(tmp_path):
    logdir = str(tmp_path)
    done = _commits(logdir, "1:2", "2:1")  # two data files, then one
    assert done.returncode == 0, done.stderr
    layout = Layout(logdir)
    committed = list_committed(layout)
    assert [(m.step, m.prefix) for m in committed] == [(2, "model.ckpt")]
    verify(layout, committed[0])
    files = _files(logdir)
    assert sorted(files) == ["model.ckpt.data-00000-of-00001", "model.ckpt.index"]  # the old second shard is gone
    assert files["model.ckpt.index"] == "index of step 2\n"
    assert sorted(os.listdir(layout.manifests)) == ["model.ckpt.json"]  # no intent record, no kept files
    with open(os.path.join(logdir, "checkpoint")) as fh:
        assert fh.readline() == 'model_checkpoint_path: "model.ckpt"\n'


def test_a_rewrite_killed_after_its_manifest_leaves_no_file_of_the_previous_one_after_the_recovery(tmp_path):
    """SIGKILL right after the rewrite's commit point (two data files rewritten as one), before the
    previous files are dropped: the recovery at the service's start finishes the drop, so the logdir
    holds exactly what an uninterrupted rewrite leaves. Before, the intent record went first and the
    recovery only removed the kept folder: the old second shard stayed in the logdir for good."""
    logdir = str(tmp_path)
    clean = _commits(str(tmp_path / "clean"), "1:2", "2:1")
    assert clean.returncode == 0, clean.stderr
    done = _commits(logdir, "1:2", "2:1", fault="checkpoint:before_drop:1")
    assert done.returncode == -9, done.stderr
    notes = CheckpointStore(Layout(logdir)).recover()
    assert "finished the rewrite of model.ckpt" in notes, notes
    layout = Layout(logdir)
    (m,) = list_committed(layout)
    assert (m.step, m.prefix) == (2, "model.ckpt")
    verify(layout, m)
    assert _files(logdir) == _files(str(tmp_path / "clean"))
    assert sorted(os.listdir(layout.manifests)) == ["model.ckpt.json"]  # no intent record, no kept files


@pytest.mark.parametrize("point", ["before_rename", "after_rename"])
def test_a_rewrite_killed_before_its_manifest_leaves_the_previous_checkpoint_whole(tmp_path, point):
    logdir = str(tmp_path)
    first = _commits(str(tmp_path / "first"), "1:2")  # what the first commit alone leaves
    assert first.returncode == 0, first.stderr
    done = _commits(logdir, "1:2", "2:1", fault=f"checkpoint:{point}:2")
    assert done.returncode == -9 and done.stdout.splitlines() == ["committed 1"], done.stderr
    notes = CheckpointStore(Layout(logdir)).recover()  # what the restarted service does first
    assert "rolled back the uncommitted rewrite of model.ckpt; the previous one is whole" in notes
    layout = Layout(logdir)
    committed = list_committed(layout)
    assert [(m.step, m.prefix) for m in committed] == [(1, "model.ckpt")]
    verify(layout, committed[0])  # sizes and checksums: the files are the first commit's
    assert _files(logdir) == _files(str(tmp_path / "first"))
    assert sorted(os.listdir(layout.manifests)) == ["model.ckpt.json"]


@pytest.mark.parametrize("point", ["before_keep", "mid_keep"])
def test_a_rewrite_killed_before_its_files_are_kept_leaves_the_previous_checkpoint_whole(tmp_path, point):
    """SIGKILL after the intent record is written and before (or while) the committed files are
    hard-linked aside: the previous files were never renamed over, so the recovery must leave them
    (it unlinked every name of the record that was not kept, the previous checkpoint's own files)."""
    logdir = str(tmp_path)
    first = _commits(str(tmp_path / "first"), "1:2")
    assert first.returncode == 0, first.stderr
    done = _commits(logdir, "1:2", "2:1", fault=f"checkpoint:{point}:1")  # (reached by the rewrite only)
    assert done.returncode == -9 and done.stdout.splitlines() == ["committed 1"], done.stderr
    notes = CheckpointStore(Layout(logdir)).recover()
    assert "rolled back the uncommitted rewrite of model.ckpt; the previous one is whole" in notes
    layout = Layout(logdir)
    committed = list_committed(layout)
    assert [(m.step, m.prefix) for m in committed] == [(1, "model.ckpt")]
    verify(layout, committed[0])
    assert _files(logdir) == _files(str(tmp_path / "first"))
    assert sorted(os.listdir(layout.manifests)) == ["model.ckpt.json"]
    again = _commits(logdir, "3:1")  # and the next rewrite commits over it
    assert again.returncode == 0, again.stderr
    assert _files(logdir)["model.ckpt.index"] == "index of step 3\n"


def test_the_intent_record_of_a_rewrite_alone_leaves_the_previous_checkpoint_whole(tmp_path):
    """What a SIGKILL right after the record is written leaves (the record as the store writes it,
    nothing kept, nothing renamed): the recovery keeps the committed files."""
    logdir = str(tmp_path)
    assert _commits(logdir, "1:2").returncode == 0
    layout = Layout(logdir)
    (m,) = list_committed(layout)
    before = _files(logdir)
    with open(os.path.join(layout.manifests, "model.ckpt.pending"), "w") as fh:
        json.dump({"files": ["model.ckpt.data-00000-of-00001", "model.ckpt.index"], "replaces": m.committed_at}, fh)
    CheckpointStore(layout).recover()
    verify(layout, list_committed(layout)[0])
    assert _files(logdir) == before


def test_a_rewrite_killed_after_its_manifest_is_committed(tmp_path):
    logdir = str(tmp_path)
    done = _commits(logdir, "1:2", "2:1", fault="checkpoint:before_state_file:2")
    assert done.returncode == -9, done.stderr
    notes = CheckpointStore(Layout(logdir)).recover()
    layout = Layout(logdir)
    committed = list_committed(layout)
    assert [(m.step, m.prefix) for m in committed] == [(2, "model.ckpt")], notes
    verify(layout, committed[0])
    assert _files(logdir)["model.ckpt.index"] == "index of step 2\n"


NO_STEP_LAUNCH = os.path.join(PROGRAMS, "tf1_no_step_launch.py")


def _no_step_manifest(logdir: str) -> dict:
    try:
        with open(os.path.join(logdir, ".procsv", "checkpoints", "model.ckpt.json")) as fh:
            return json.load(fh)
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def _plain_restore(prefix: str) -> float:
    """``v`` as a plain TF1 program restores it: a ``tf.compat.v1.train.Saver`` in a fresh graph."""
    import tensorflow as tf

    with tf.Graph().as_default():
        v = tf.compat.v1.get_variable("v", initializer=-1.0)
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session() as sess:
            saver.restore(sess, prefix)
            return float(sess.run(v))


@pytest.mark.slow
def test_a_graph_without_a_global_step_sigkilled_under_launch_restores_model_ckpt_and_counts_on(tmp_path):
    """``procsv launch`` of a graph without a global step whose ``model.ckpt`` is rewritten every 0.2 s:
    the trainer SIGKILLed mid-run (once a rewrite past the start one committed) is restarted, restores
    ``model.ckpt`` (``v`` and procsv's count of the runs, which agree: one run adds 1 to ``v``) and
    counts on from there; the last ``model.ckpt`` holds ``v = 400`` at step 400, restored by a plain
    ``tf.compat.v1.train.Saver``, and it is the only checkpoint prefix in the logdir."""
    import tensorflow as tf

    from conftest import finish, launch, lifecycle, wait_for, wait_role_pid

    logdir = str(tmp_path / "run")
    proc = launch(logdir, "400", target=NO_STEP_LAUNCH)
    try:
        wait_for(lambda: proc.poll() is not None or _no_step_manifest(logdir).get("step", 0) >= 20, 120,
                 what="a rewrite of model.ckpt past step 20")
        assert proc.poll() is None, "the launch ended before its kill"
        os.kill(wait_role_pid(logdir, "trainer"), signal.SIGKILL)
    finally:
        code, out, err = finish(proc, 300)
    assert code == 0, err[-3000:]
    starts = [float(line.split("=")[-1]) for line in out.splitlines() if "start at v=" in line]
    assert len(starts) == 2 and starts[0] == 0.0 and 20 <= starts[1] < 400, out[-2000:]
    assert "finished at v=400" in out
    assert f"restored step {int(starts[1])} from model.ckpt" in out, out[-2000:]  # the count is v: one run, one step
    restored = [e for e in lifecycle(logdir) if e["event"] == "restarted"]
    assert len(restored) == 1, restored
    manifest = _no_step_manifest(logdir)
    assert manifest["step"] == 400 and manifest["prefix"] == "model.ckpt", manifest
    assert tf.train.latest_checkpoint(logdir) == os.path.join(logdir, "model.ckpt")
    assert _plain_restore(os.path.join(logdir, "model.ckpt")) == 400.0
    names = [n for n in os.listdir(logdir) if n.startswith("model.ckpt")]
    assert {n.split(".data-")[0].removesuffix(".index").removesuffix(".meta") for n in names} == {"model.ckpt"}


def test_a_newer_revision_of_a_committed_step_rewrites_model_ckpt_n_and_an_older_one_does_not(tmp_path):
    """``model.ckpt-0`` committed (revision 0), then revision 2 (a newer state of step 0), then a late
    revision 1: the files are revision 2's, the older state never overwrote them."""
    logdir = str(tmp_path)
    done = _commits(logdir, "0:2:0", "0:1:2", "0:1:1")
    assert done.returncode == 0, done.stderr
    layout = Layout(logdir)
    (m,) = list_committed(layout)
    assert (m.step, m.prefix, m.revision) == (0, "model.ckpt-0", 2)
    verify(layout, m)
    files = _files(logdir)
    assert sorted(files) == ["model.ckpt-0.data-00000-of-00001", "model.ckpt-0.index"]  # revision 0's 2nd shard gone
    assert files["model.ckpt-0.index"] == "index of step 0 revision 2\n"
    assert sorted(os.listdir(layout.manifests)) == ["model.ckpt-0.json"]


@pytest.mark.parametrize("point", ["before_keep", "mid_keep", "before_rename", "after_rename"])
def test_a_rewrite_of_a_committed_step_killed_before_its_manifest_leaves_the_previous_revision_whole(tmp_path, point):
    """SIGKILL in the rewrite of ``model.ckpt-0`` by its revision 1 (commit 2), at each point before
    its manifest: the recovery at the service's start leaves revision 0 whole (sizes and checksums,
    the same bytes), and the next rewrite commits over it."""
    logdir = str(tmp_path)
    first = _commits(str(tmp_path / "first"), "0:2:0")
    assert first.returncode == 0, first.stderr
    done = _commits(logdir, "0:2:0", "0:1:1", fault=f"checkpoint:{point}:{1 if 'keep' in point else 2}")
    assert done.returncode == -9 and done.stdout.splitlines() == ["committed 0"], done.stderr
    notes = CheckpointStore(Layout(logdir)).recover()
    assert "rolled back the uncommitted rewrite of model.ckpt-0; the previous one is whole" in notes
    layout = Layout(logdir)
    (m,) = list_committed(layout)
    assert (m.step, m.prefix, m.revision) == (0, "model.ckpt-0", 0)
    verify(layout, m)
    assert _files(logdir) == _files(str(tmp_path / "first"))
    assert sorted(os.listdir(layout.manifests)) == ["model.ckpt-0.json"]
    again = _commits(logdir, "0:1:1")
    assert again.returncode == 0, again.stderr
    assert _files(logdir)["model.ckpt-0.index"] == "index of step 0 revision 1\n"
