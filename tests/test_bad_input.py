"""Bad input (issue #10): what procsv answers when the user, the filesystem or the program is wrong.

Real `procsv launch` processes, real TensorFlow, real signals. Each case expects one clear line
naming the problem and what to do, a non-zero exit where the run cannot go on, no restart storm,
and the last committed checkpoint still loadable with plain TensorFlow.

Cases covered elsewhere (not repeated here):

====  ==========================================  ====================================================================
case  what                                        test
====  ==========================================  ====================================================================
1     TARGET missing                              test_launch.py::test_a_target_that_does_not_exist_is_one_clear_line...
3     exception at import time                    test_launch.py::test_a_target_that_fails_at_import_gives_its_trace...
6     unknown flag                                test_launch.py::test_unknown_flags_print_usage
7     malformed --chaos                           test_watchdog.py::test_bad_chaos_spec_is_a_usage_error (+ pure)
8'    logdir under a regular file (ENOTDIR)       test_launch.py::test_an_unwritable_logdir_is_a_clear_error_before...
11    filesystem fills up mid-run                 test_checkpoint_faults.py::test_checkpoints_that_keep_failing_stop...
                                                  and ..._with_continue_a_full_filesystem_fails_the_save_clearly...
13    second live launch                          test_launch.py::test_a_second_launch_on_a_live_logdir_is_refused
18'   changed variable shape (restore agent)      test_restore_faults.py::test_a_changed_variable_shape_is_an_error...
      corrupt checkpoints                         test_checkpoint_faults.py::test_corrupt_newest_checkpoints_fall_back...
22'   a setsid grandchild of the trainer          test_leftovers.py::test_a_setsid_grandchild_dies_with_its_trainer...
====  ==========================================  ====================================================================
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import psutil
import pytest

from conftest import (PROGRAMS, REPO, committed_steps, finish, launch, lifecycle, quiet_env, raw_status, role_pid,
                      run_processes, status_json, wait_for)
from test_checkpoint_faults import _fill, small_fs  # noqa: F401  (the small-tmpfs fixture)

pytestmark = pytest.mark.slow

BAD = os.path.join(PROGRAMS, "bad_train.py")
FAST = ("--no-prewarm",)  # one TensorFlow import less per launch; none of these cases is about the zygote


def _procsv(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "procsv", *args], capture_output=True, text=True, env=quiet_env(),
                          cwd=REPO, timeout=timeout)


def _one_error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("procsv: error: "), err
    return lines[0]


def _latest_restores(logdir: str, units: int = 4) -> int:
    """Restore the newest checkpoint of bad_train.py with plain TensorFlow; return its global step."""
    import tensorflow as tf

    latest = tf.train.latest_checkpoint(logdir)
    assert latest is not None, "no checkpoint named by the state file"
    weights = tf.Variable(tf.zeros([units]))
    step = tf.Variable(0, dtype=tf.int64)
    tf.train.Checkpoint(weights=weights, global_step=step).restore(latest).assert_consumed()
    assert float(weights.numpy()[0]) == float(step.numpy())  # each step adds one to every weight
    return int(step.numpy())


def _trainer_spawns(logdir: str) -> int:
    return len([e for e in lifecycle(logdir) if e["event"] == "spawned" and e["role"] == "trainer"])


# ------------------------------------------------------------------------ launch and arguments
def test_2_a_syntax_error_in_target_is_its_line_and_no_second_attempt(logdir):
    code, out, err = finish(launch(logdir, target=os.path.join(PROGRAMS, "syntax_error.py"), opts=FAST), 120)
    assert code == 1
    assert "SyntaxError" in err and "syntax_error.py" in err
    assert "the trainer cannot start: SyntaxError (a restart would fail the same way)" in err
    assert _trainer_spawns(logdir) == 1  # a restart cannot cure it: none is tried
    assert status_json(logdir)["state"] == "failed"


def test_4_a_module_that_never_creates_a_supervisor_is_told_nothing_was_supervised(logdir):
    code, out, err = finish(launch(logdir, target=os.path.join(PROGRAMS, "no_supervisor.py"), opts=FAST), 120)
    assert code == 0, err
    assert "no_supervisor: training without procsv" in out
    lines = [line for line in err.splitlines() if "nothing was supervised" in line]
    assert len(lines) == 1 and "managed_session" in lines[0], err
    assert committed_steps(logdir) == []


def test_5_a_supervisor_without_checkpoint_warns_at_start_that_nothing_will_be_saved(logdir):
    code, out, err = finish(launch(logdir, "--no-checkpoint", "--steps", "20", target=BAD, opts=FAST), 120)
    assert code == 0, err
    warning = [line for line in out.splitlines() if "nothing will be saved" in line]
    assert len(warning) == 1 and "Supervisor(checkpoint=None)" in warning[0], out
    assert out.index("nothing will be saved") < out.index("bad: starts at step 0")  # at start, not at the end
    assert committed_steps(logdir) == []
    assert "nothing was supervised" not in err  # it was supervised, just not saved


@pytest.mark.parametrize("argv, expected", [
    (["launch", "procsv.examples.digits"], "the following arguments are required: --logdir"),
    (["launch", "procsv.examples.digits", "--logdir", "x", "--max-restarts", "-1"], "--max-restarts must be >= 0, not -1"),
    (["launch", "procsv.examples.digits", "--logdir", "x", "--hang-timeout", "abc"],
     "argument --hang-timeout: invalid float value: 'abc'"),
    (["launch", "procsv.examples.digits", "--logdir", "x", "--stop-grace-secs", "0"],
     "--stop-grace-secs must be > 0, not 0"),
    (["launch", "procsv.examples.digits", "--logdir", "x", "--startup-timeout", "nan"],
     "--startup-timeout must be >= 0 (0 turns it off), not nan"),
])
def test_6_missing_and_out_of_range_flags_are_one_usage_line_and_exit_2(tmp_path, argv, expected):
    out = subprocess.run([sys.executable, "-m", "procsv", *argv], capture_output=True, text=True, env=quiet_env(),
                         cwd=tmp_path, timeout=60)
    assert out.returncode == 2
    assert expected in out.stderr
    assert [line for line in out.stderr.splitlines() if "error" in line] == \
        [line for line in out.stderr.splitlines() if expected in line]
    assert not os.path.exists(tmp_path / "x")  # nothing was created


# ------------------------------------------------------------------------ logdir
@pytest.fixture
def read_only_dir(tmp_path):
    """A read-only tmpfs: root cannot write there either (chmod alone does not stop root)."""
    mnt = tmp_path / "ro"
    mnt.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(mnt)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a read-only tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield mnt
    finally:
        if subprocess.run(["umount", str(mnt)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


@pytest.mark.parametrize("where", ["itself", "inside"])
def test_8_an_unwritable_logdir_is_one_line_and_exit_2(read_only_dir, where):
    logdir = str(read_only_dir if where == "itself" else read_only_dir / "run")
    code, out, err = finish(launch(logdir, opts=FAST), timeout=60)
    assert code == 2
    line = _one_error_line(err)
    assert f"logdir {logdir!r} is not writable (Read-only file system)" in line
    assert "pass a --logdir on a writable filesystem" in line
    assert not run_processes(logdir)


def test_9_a_logdir_that_is_a_regular_file_is_one_line_and_the_file_is_untouched(tmp_path):
    logdir = tmp_path / "run"
    logdir.write_text("my notes")
    code, out, err = finish(launch(str(logdir), opts=FAST), timeout=60)
    assert code == 2
    line = _one_error_line(err)
    assert f"logdir {str(logdir)!r} is a file, not a directory: pass a directory for --logdir" in line
    assert logdir.read_text() == "my notes"


def test_10_a_full_filesystem_at_start_is_one_line_and_exit_2(small_fs):  # noqa: F811
    _fill(str(small_fs / "filler"), leave=0)
    logdir = str(small_fs / "run")
    code, out, err = finish(launch(logdir, opts=FAST), timeout=60)
    assert code == 2
    line = _one_error_line(err)
    assert f"logdir {logdir!r} is not writable (No space left on device)" in line and "free some space" in line
    assert not run_processes(logdir)


def test_14_a_stale_lock_of_a_killed_launch_is_taken_over_with_a_line_saying_so(logdir):
    proc = launch(logdir, "--steps", "100000", "--save-steps", "20", target=BAD, opts=FAST)
    try:
        wait_for(lambda: committed_steps(logdir), 90, what="a committed checkpoint")
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        wait_for(lambda: not run_processes(logdir), 5, what="the run to die with its watchdog")
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
    with open(os.path.join(logdir, ".procsv", "lock")) as fh:
        assert fh.read().strip() == str(proc.pid)  # what the dead launch left
    saved = committed_steps(logdir)[-1]
    code, out, err = finish(launch(logdir, "--steps", str(saved + 5), target=BAD, opts=FAST), 120)
    assert code == 0, err
    taken = [line for line in err.splitlines() if "took over the lock" in line]
    assert len(taken) == 1 and f"(pid {proc.pid}) died without releasing it" in taken[0], err
    assert f"restored step {saved} " in out
    # an orderly end leaves no stale pid: the next launch says nothing about a lock
    code, out, err = finish(launch(logdir, "--steps", str(saved + 6), target=BAD, opts=FAST), 120)
    assert code == 0, err
    assert "took over the lock" not in err
    assert _latest_restores(logdir) == saved + 6


# ------------------------------------------------------------------------ state files
def test_15_a_damaged_status_file_is_one_line_for_status_and_a_new_launch_replaces_it(logdir):
    meta = os.path.join(logdir, ".procsv")
    os.makedirs(meta)
    for garbage in (b'{"state": "runn', b"\x00\xff garbage", b'["a", "list"]', b'{"processes": "x"}'):
        with open(os.path.join(meta, "status.json"), "wb") as fh:
            fh.write(garbage)
        out = _procsv("status", logdir)
        assert out.returncode == 2
        line = _one_error_line(out.stderr)
        assert "status.json is damaged (truncated or not a status record)" in line
        assert "the next `procsv launch` replaces it" in line
    code, out, err = finish(launch(logdir, "--steps", "10", "--save-steps", "5", target=BAD, opts=FAST), 120)
    assert code == 0, err
    st = status_json(logdir)
    assert st["state"] == "succeeded" and st["step"] == 10
