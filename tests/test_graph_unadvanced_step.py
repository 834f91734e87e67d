"""Graph mode: a program whose runs change its variables but never its global step (a TF1 program's
``optimizer.minimize(loss)`` without ``global_step=``), under ``procsv launch``.

TensorFlow's Supervisor saves ``model.ckpt-0`` again at each save, so the checkpoint holds the trained
variables. procsv does the same: a snapshot of a committed step whose state changed since is a newer
revision of it (``SaveData.revision``), and the checkpoint service rewrites that step's checkpoint in
place (``procsv.services.checkpoint.inplace``), at the periodic saves and at the final one. A program
whose runs advance the step commits each step once: nothing is rewritten.
"""

from __future__ import annotations

import json
import os
import signal

import pytest

from conftest import PROGRAMS, finish, launch, lifecycle, quiet_env, wait_for, wait_role_pid

pytestmark = pytest.mark.slow  # starts TensorFlow processes: not in the quick tier

UNADVANCED = os.path.join(PROGRAMS, "tf1_unadvanced_step.py")


def _result(out: str) -> dict:
    (line,) = [x for x in out.splitlines() if x.split("] ", 1)[-1].startswith("result ")]
    return json.loads(line.split("result ", 1)[1])


def _starts(out: str) -> list[float]:
    return [float(x.split("start ", 1)[1]) for x in out.splitlines() if x.split("] ", 1)[-1].startswith("start ")]


def _manifest(logdir: str, prefix: str = "model.ckpt-0") -> dict:
    try:
        with open(os.path.join(logdir, ".procsv", "checkpoints", prefix + ".json")) as fh:
            return json.load(fh)
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def test_a_run_that_never_advances_the_global_step_still_saves_its_trained_variables(tmp_path):
    import tensorflow as tf

    logdir = str(tmp_path / "run")
    code, out, err = finish(launch(logdir, logdir, "60", target=UNADVANCED), 300)
    assert code == 0, err[-3000:]
    result = _result(out)
    assert result == {"start": 0.0, "end": 60.0}
    latest = tf.train.latest_checkpoint(logdir)
    assert latest == os.path.join(logdir, "model.ckpt-0")
    assert int(tf.train.load_variable(latest, "global_step")) == 0
    assert float(tf.train.load_variable(latest, "v")) == 60.0  # the final checkpoint: the state at close
    assert _manifest(logdir)["revision"] >= 1  # rewritten in place, once or more, never a second prefix
    assert sorted(n for n in os.listdir(os.path.join(logdir, ".procsv", "checkpoints"))) == ["model.ckpt-0.json"]


def test_a_trainer_sigkilled_after_a_periodic_rewrite_resumes_from_the_rewritten_variables(tmp_path):
    """The trainer is SIGKILLed once a periodic rewrite of ``model.ckpt-0`` holds ``v`` >= 20 (nothing
    advanced the step, so only a rewrite can hold it); the restarted trainer restores that state (or a
    newer rewrite: the one in flight at the kill may commit after), not the initial one, and its final
    checkpoint holds ``v`` at its close, read by ``tf.train.load_variable`` and restored by a plain TF1
    Saver."""
    import tensorflow as tf

    logdir = str(tmp_path / "run")
    prefix = os.path.join(logdir, "model.ckpt-0")

    def saved_v() -> float:
        return float(tf.train.load_variable(prefix, "v")) if _manifest(logdir).get("revision", 0) >= 1 else 0.0

    proc = launch(logdir, logdir, "600", target=UNADVANCED)
    try:
        wait_for(lambda: proc.poll() is not None or saved_v() >= 20.0, 180, what="a rewrite of model.ckpt-0 holding v >= 20")
        assert proc.poll() is None, "the launch ended before its kill"
        at_kill = saved_v()
        os.kill(wait_role_pid(logdir, "trainer"), signal.SIGKILL)
    finally:
        code, out, err = finish(proc, 300)
    assert code == 0, err[-3000:]
    starts = _starts(out)
    exits = [e for e in lifecycle(logdir) if e["event"] in ("exited", "restarted", "hang_detected")]
    assert len(starts) == 2 and starts[0] == 0.0 and at_kill <= starts[1] < 600.0, (at_kill, exits, out[-2000:],
                                                                                    err[-2000:])
    assert _result(out) == {"start": starts[1], "end": starts[1] + 600.0}
    assert [e["event"] for e in lifecycle(logdir)].count("restarted") == 1
    assert int(tf.train.load_variable(prefix, "global_step")) == 0
    assert float(tf.train.load_variable(prefix, "v")) == starts[1] + 600.0
    with tf.Graph().as_default():
        v = tf.compat.v1.get_variable("v", initializer=-1.0)
        tf.compat.v1.train.get_or_create_global_step()
        with tf.compat.v1.Session() as sess:
            tf.compat.v1.train.Saver().restore(sess, tf.train.latest_checkpoint(logdir))
            assert float(sess.run(v)) == starts[1] + 600.0


def test_the_checkpoint_service_sigkilled_mid_rewrite_leaves_the_previous_one_whole_and_the_next_rewrite_commits(tmp_path):
    """``PROCSV_FAULT=checkpoint:after_rename:2``: the service dies by SIGKILL in the first rewrite of
    ``model.ckpt-0`` (commit 2, after the start one), with the new files renamed over the committed ones
    and no new manifest yet. The restarted service rolls the rewrite back (the committed step-0 files
    whole again), the trainer takes the lost snapshot again, and the final checkpoint holds ``v`` at close."""
    import tensorflow as tf

    logdir = str(tmp_path / "run")
    proc = launch(logdir, logdir, "200", target=UNADVANCED, env=quiet_env(PROCSV_FAULT="checkpoint:after_rename:2"))
    code, out, err = finish(proc, 300)
    assert code == 0, err[-3000:]
    assert "rolled back the uncommitted rewrite of model.ckpt-0; the previous one is whole" in out + err, err[-3000:]
    assert _result(out) == {"start": 0.0, "end": 200.0}
    prefix = os.path.join(logdir, "model.ckpt-0")
    assert float(tf.train.load_variable(prefix, "v")) == 200.0
    assert not os.path.exists(os.path.join(logdir, ".procsv", "checkpoints", "model.ckpt-0.prev"))


def test_a_program_whose_runs_advance_the_step_commits_each_step_once_and_rewrites_none(tmp_path):
    """``--advance``: every run is a step; after the last one the program reads ``v`` 50 times (runs
    that change nothing) and closes. Each committed step is committed once (the watchdog's
    ``checkpoint_committed`` records, one per step), no manifest is a rewrite (``revision``), and the
    service says it rewrote nothing."""
    logdir = str(tmp_path / "run")
    code, out, err = finish(launch(logdir, logdir, "120", "--advance", target=UNADVANCED,
                                   opts=("--standby", "fork")), 300)  # no restart: no hot standby
    assert code == 0, err[-3000:]
    assert _result(out) == {"start": 0.0, "end": 120.0}
    steps = [e["step"] for e in lifecycle(logdir) if e["event"] == "checkpoint_committed"]
    assert steps and steps[-1] == 120 and len(steps) == len(set(steps)), steps
    folder = os.path.join(logdir, ".procsv", "checkpoints")
    manifests = [n for n in os.listdir(folder) if n.endswith(".json")]
    assert manifests and all("revision" not in _manifest(logdir, n[: -len(".json")]) for n in manifests)
    assert "rewrite" not in err


def test_the_checkpoint_service_sigkilled_after_a_rewrites_commit_point_loses_no_later_state(tmp_path):
    """``PROCSV_FAULT=checkpoint:before_state_file:3``: the service dies by SIGKILL in the second
    rewrite of ``model.ckpt-0``, after its manifest (the commit point) and before its answer. The
    trainer takes the lost snapshot again; the restarted service has that revision already. The
    runs after it are still saved: the final checkpoint holds ``v`` at close (found by review50c:
    it held the state at the kill, v 96 of 300, and the launch exited 0)."""
    import tensorflow as tf

    logdir = str(tmp_path / "run")
    env = quiet_env(PROCSV_FAULT="checkpoint:before_state_file:3")
    code, out, err = finish(launch(logdir, logdir, "300", target=UNADVANCED, env=env), 300)
    assert code == 0, err[-3000:]
    assert [e["role"] for e in lifecycle(logdir) if e["event"] == "exited" and e.get("signal") == "SIGKILL"] == ["checkpoint"]
    assert _result(out) == {"start": 0.0, "end": 300.0}
    assert float(tf.train.load_variable(os.path.join(logdir, "model.ckpt-0"), "v")) == 300.0, err[-3000:]

