"""``sys.exit`` inside the ``managed_session`` block (or in an ``sv.loop`` thread), with real processes.

``sys.exit(0)`` / ``sys.exit()`` is a clean stop: the final checkpoint of the last completed step
commits, then the program exits 0 (it does not go on after the block). ``sys.exit(N)`` with N != 0
is the program's failure, as any exception from the block: no final checkpoint, exit N. The
programs checkpoint every 600 s, so only the final checkpoint can hold the step they stop at.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from conftest import PROGRAMS, committed_steps, finish, launch, quiet_env, run_python, status_json

pytestmark = pytest.mark.slow

EXIT_TRAIN = os.path.join(PROGRAMS, "exit_train.py")
# none of these runs restarts its trainer: no hot standby (one would only warm up to be stopped at the end)
NO_STANDBY = ("--standby", "fork")


def _checkpoint_holds(logdir: str) -> tuple[str, int, float]:
    """The newest checkpoint (plain TF), its global_step and its first weight (= the steps it holds)."""
    import tensorflow as tf

    latest = tf.train.latest_checkpoint(logdir)
    assert latest is not None, "no checkpoint"
    weights, step = tf.Variable(tf.zeros([4])), tf.Variable(0, dtype=tf.int64)
    tf.train.Checkpoint(weights=weights, global_step=step).restore(latest).assert_existing_objects_matched()
    return os.path.basename(latest), int(step.numpy()), float(weights.numpy()[0])


@pytest.mark.parametrize("where,code,final", [
    ("block", "0", 7),     # sys.exit(0) after step 7 completed
    ("block", "none", 7),  # sys.exit()
    ("step", "0", 6),      # sys.exit(0) at the start of step 7: step 6 is the last completed one
])
def test_sys_exit_zero_in_the_block_commits_the_final_checkpoint_and_succeeds(logdir, where, code, final):
    ended = os.path.join(logdir, "ended.txt")  # (a trainer forked by the zygote: ends as a fresh interpreter)
    code_, out, err = finish(launch(logdir, "--exit-at-step", "7", "--exit-code", code, "--exit-from", where,
                                    "--at-exit", ended, target=EXIT_TRAIN, opts=NO_STANDBY))
    assert code_ == 0, err
    assert "went on after the block" not in out
    with open(ended) as fh:  # its non-daemon thread waited for, then its atexit handler run
        assert fh.read() == "thread\natexit\n"
    assert _checkpoint_holds(logdir) == (f"model.ckpt-{final}", final, float(final))
    st = status_json(logdir)
    assert st is not None and st["state"] == "succeeded" and st["restarts"] == 0
    assert st["last_checkpoint"]["step"] == final


def test_sys_exit_zero_in_an_sv_loop_thread_is_a_clean_stop_with_a_final_checkpoint(logdir):
    code, out, err = finish(launch(logdir, "--exit-at-step", "20", "--exit-code", "0", "--exit-from", "loop",
                                   target=EXIT_TRAIN, opts=NO_STANDBY))
    assert code == 0, err
    assert "went on after the block" not in out
    name, step, weight = _checkpoint_holds(logdir)
    assert step >= 20 and name == f"model.ckpt-{step}" and weight == step  # the last completed step, exactly
    st = status_json(logdir)
    assert st is not None and st["state"] == "succeeded" and st["step"] == step


def _plain(logdir: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``python exit_train.py --logdir DIR ARGS``: no watchdog, so no restart after a failure."""
    return run_python([EXIT_TRAIN, "--logdir", logdir, *args], env=quiet_env(), timeout=180)


def test_plain_run_sys_exit_zero_commits_the_final_checkpoint(logdir):
    ended = os.path.join(logdir, "ended.txt")
    done = _plain(logdir, "--exit-at-step", "5", "--at-exit", ended)
    assert done.returncode == 0, done.stderr
    assert "went on after the block" not in done.stdout
    with open(ended) as fh:  # the interpreter's end, which a launch's forked trainer's matches (above)
        assert fh.read() == "thread\natexit\n"
    assert _checkpoint_holds(logdir) == ("model.ckpt-5", 5, 5.0)


@pytest.mark.parametrize("where", ["block", "loop"])
def test_sys_exit_nonzero_is_the_programs_failure_without_a_final_checkpoint(logdir, where):
    done = _plain(logdir, "--exit-at-step", "5", "--exit-code", "3", "--exit-from", where)
    assert done.returncode == 3, done.stderr
    assert "went on after the block" not in done.stdout
    assert [s for s in committed_steps(logdir) if s >= 5] == []
