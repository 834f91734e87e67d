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
13    second live launch                          test_launch.py::test_a_second_launch_on_a_live_logdir_is_refused...
      --metrics-port in use, out of range         test_metrics.py::test_a_port_in_use_is_one_line_and_exit_2_before...
                                                  and ::test_bad_metrics_flags_are_usage_errors
18'   changed variable shape (restore agent)      test_restore_faults.py::test_a_changed_variable_shape_is_an_error...
      corrupt checkpoints                         test_checkpoint_faults.py::test_corrupt_newest_checkpoints_fall_back...
22'   a setsid grandchild of the trainer          test_leftovers.py::test_a_setsid_grandchild_dies_with_its_trainer...
      a Supervisor given nothing to save          test_eager_parity.py::test_under_procsv_launch_nothing_to_save_fails...
====  ==========================================  ====================================================================
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from typing import Callable, NamedTuple

import psutil
import pytest

from conftest import (PROGRAMS, REPO, committed_steps, finish, launch, lifecycle, quiet_env, role_pid, run_python,
                      wait_role_pid, run_processes, status_json, wait_for)
from pyfork import ForkedRun
from test_checkpoint_faults import _fill, small_fs  # noqa: F401  (the small-tmpfs fixture)

pytestmark = pytest.mark.slow

BAD = os.path.join(PROGRAMS, "bad_train.py")
# the pre-warmed trainer, grown from the launch's own fork (conftest.launch: TensorFlow imported once, there), and
# no hot standby made to wait (none of these cases is about either). Before: --no-prewarm, when a pre-warmed trainer
# cost an import of its own; now it made every trainer a fresh process that imports TensorFlow (~2-3 s of CPU each)
FAST = ("--standby", "fork")


def _procsv(*args: str, timeout: float = 60) -> ForkedRun:
    return run_python(["-m", "procsv", *args], env=quiet_env(), cwd=REPO, timeout=timeout)


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
    """Trainer attempts started by the last launch in ``logdir``."""
    events = lifecycle(logdir)
    last = max((i for i, e in enumerate(events) if e["event"] == "launch"), default=0)
    return len([e for e in events[last:] if e["event"] == "spawned" and e["role"] == "trainer"])


# ------------------------------------------------------------------------ launch and arguments
def test_2_a_syntax_error_in_target_is_one_line_before_anything_starts(logdir):
    target = os.path.join(PROGRAMS, "syntax_error.py")
    code, out, err = finish(launch(logdir, target=target, opts=FAST), 60)
    assert code == 2
    line = _one_error_line(err)
    assert f"training module {target!r} has a syntax error: invalid syntax ({target}, line 5)" in line
    assert "fix it and launch again" in line
    assert lifecycle(logdir) == []  # nothing was started


def test_2_a_syntax_error_in_a_module_the_target_imports_fails_the_trainer_once_no_restart(logdir):
    code, out, err = finish(launch(logdir, target=os.path.join(PROGRAMS, "imports_syntax_error.py"), opts=FAST),
                            120)
    assert code == 1
    assert "procsv: giving up: the trainer cannot start: SyntaxError (a restart would fail the same way)." in err
    assert "SyntaxError: invalid syntax" in err and "syntax_error.py" in err
    assert _trainer_spawns(logdir) == 1  # a restart cannot cure it: none is tried
    assert status_json(logdir)["state"] == "failed"


def test_4_a_module_that_never_creates_a_supervisor_is_told_nothing_was_supervised(logdir):
    code, out, err = finish(launch(logdir, target=os.path.join(PROGRAMS, "no_supervisor.py"), opts=FAST), 120)
    assert code == 0, err
    assert "no_supervisor: training without procsv" in out
    lines = [line for line in err.splitlines() if "nothing was supervised" in line]
    assert len(lines) == 1 and "managed_session" in lines[0], err
    assert committed_steps(logdir) == []


class Finished(NamedTuple):
    logdir: str
    code: int
    out: str
    err: str


def _finished_run(shared_result: Callable[[str, Callable[[str], None]], str], name: str, *args: str,
                  opts: tuple[str, ...] = FAST, damaged_status: bytes = b"") -> Finished:
    """``procsv launch bad_train.py ARGS`` run to its end once per test session (``shared_result``:
    every pytest-xdist worker reads the same run) in ``<folder>/run`` (with ``damaged_status`` as its
    status.json before the launch, if given); the tests that share it each check their part. Every
    process of the run is killed at its end, and a run that left one behind is not kept."""
    def produce(folder: str) -> None:
        logdir = os.path.join(folder, "run")
        if damaged_status:
            os.makedirs(os.path.join(logdir, ".procsv"))
            with open(os.path.join(logdir, ".procsv", "status.json"), "wb") as fh:
                fh.write(damaged_status)
        try:
            code, out, err = finish(launch(logdir, *args, target=BAD, opts=opts), 120)
        finally:
            leftovers = run_processes(logdir)
            for proc in leftovers:
                proc.kill()
        assert not leftovers, f"processes of the run were left behind: {[p.pid for p in leftovers]}"
        with open(os.path.join(folder, "result.json"), "w") as fh:
            json.dump({"code": code, "out": out, "err": err}, fh)

    folder = shared_result(name, produce)
    with open(os.path.join(folder, "result.json")) as fh:
        result = json.load(fh)
    return Finished(os.path.join(folder, "run"), result["code"], result["out"], result["err"])


@pytest.fixture(scope="module")
def unsaved_nan_image(shared_result) -> Finished:
    """One finished 30-step run of bad_train.py that misbehaves in three ways at once, each read by
    its own test: ``Supervisor(checkpoint=None)`` (test 5), a NaN, +inf and -inf scalar at every step
    with ``--on-nonfinite continue`` (test 20: by default a NaN "loss" is a non-finite training, issue
    41, which stops the run) and a 100 MB image at step 2 (test 21)."""
    return _finished_run(shared_result, "bad-input-unsaved-nan-image", "--no-checkpoint", "--nan", "--big-image",
                         "--steps", "30", opts=FAST + ("--on-nonfinite", "continue"))


def test_5_a_supervisor_without_checkpoint_warns_at_start_that_nothing_will_be_saved(unsaved_nan_image):
    logdir, code, out, err = unsaved_nan_image
    assert code == 0, err
    warning = [line for line in out.splitlines() if "nothing will be saved" in line]
    assert len(warning) == 1 and "Supervisor(checkpoint=None)" in warning[0] and "saved every variable" in warning[0], out
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
    out = run_python(["-m", "procsv", *argv], env=quiet_env(), cwd=tmp_path, timeout=60)
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


@pytest.mark.parametrize("where", ["itself", "inside", "logs"])
def test_8_an_unwritable_logdir_is_one_line_and_exit_2(read_only_dir, tmp_path, where):
    # "logs": the logdir is writable, its logs/ is not (a read-only mount there; another user's, or an
    # immutable one, alike). Before: a traceback at the lifecycle file's open and exit 1
    logdir = str(read_only_dir if where == "itself" else read_only_dir / "run")
    what = f"logdir {logdir!r}"
    if where == "logs":
        logdir = str(tmp_path / "run")
        os.makedirs(logdir)
        os.symlink(read_only_dir, os.path.join(logdir, "logs"))
        what = f"{os.path.join(logdir, 'logs')!r} in logdir {logdir!r}"
    code, out, err = finish(launch(logdir, opts=FAST), timeout=60)
    assert code == 2, out + err
    line = _one_error_line(err)
    assert f"{what} is not writable (Read-only file system)" in line
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
        assert fh.read().split()[0] == str(proc.pid)  # what the dead launch left (its record starts with its pid)
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


@pytest.mark.parametrize("how", ["moved", "deleted", "parent moved"])
def test_12_a_logdir_moved_or_deleted_while_live_stops_the_run_in_order_and_nothing_writes_there(tmp_path, how):
    import shutil

    logdir = str(tmp_path / "parent" / "run")  # no leftover check by the logdir fixture: the path goes away
    proc = launch(logdir, "--steps", "100000", "--save-steps", "20", target=BAD, opts=FAST)
    moved = str(tmp_path / "parent" / "moved")
    try:
        wait_for(lambda: len(committed_steps(logdir)) >= 2, 90, what="two committed checkpoints")
        if how == "moved":
            os.rename(logdir, moved)
        elif how == "parent moved":  # no event of the logdir's parent names it: the loop's own check sees it
            os.rename(tmp_path / "parent", tmp_path / "parent2")
            moved = str(tmp_path / "parent2" / "run")
        else:  # rm -rf, again while the run's processes still create files in it
            wait_for(lambda: (shutil.rmtree(logdir, ignore_errors=True), not os.path.exists(logdir))[1], 10,
                     what="the logdir to be deleted")
    finally:
        code, out, err = finish(proc, 120)  # the launch ends by itself
    assert code == 1, err
    lost = [line for line in err.splitlines() if "was lost while the run was live" in line]
    assert len(lost) == 1, err
    # a move (of the logdir or of its parent) names where it went, whichever look notices it (every
    # round, after a failed save)
    happened = "it was deleted or moved away" if how == "deleted" else f"it was moved to {moved}"
    assert f"the logdir {logdir} was lost while the run was live ({happened}); stopping the run " \
           "in order, nothing more is written there" in lost[0]
    assert "checkpoint at step" not in err  # the emergency checkpoint could not commit: not a second complaint
    assert "cannot write" not in err  # status.json is not written into a lost logdir
    assert not os.path.exists(logdir)  # nothing created it again
    assert not run_processes(logdir)
    if how == "deleted":
        return
    events = lifecycle(moved)  # the watchdog's open log moved along with the directory
    assert [e["reason"] for e in events if e["event"] == "logdir_lost"] == [happened]
    assert _trainer_spawns(moved) == 1  # stopped, never restarted
    st = status_json(moved)
    assert st["state"] == "failed"
    assert st["exit_code"] == 1 and st["last_error"].startswith("the logdir was lost while the run was live")
    kept = committed_steps(moved)[-1]
    # every commit is intact where the directory went; TF's state file may still name the one before the
    # newest (a move between a commit's manifest and its state-file rewrite), never a missing one
    assert _latest_restores(moved) in committed_steps(moved)
    code, out, err = finish(launch(moved, "--steps", str(kept + 5), target=BAD, opts=FAST), 120)
    assert code == 0, err
    assert f"restored step {kept} " in out  # procsv resumes from the newest commit
    assert _latest_restores(moved) == kept + 5


def test_12_pure_a_lost_logdir_stops_the_run_once_in_order_and_fails_it():
    from test_watchdog_decide import Sim, of

    from procsv.watchdog import observe
    from procsv.watchdog.rules.actions import Cause, Restart, Signal, StopFailing
    from procsv.watchdog.rules.lifecycle import RunState
    from procsv.watchdog.rules.state import TRAINER

    sim = Sim()
    sim.start_trainer(steps=3)
    observe.logdir_lost(sim.view, "it was deleted or moved away")
    observe.logdir_lost(sim.view, "a later reason")  # the first one stays
    assert sim.tick() == [StopFailing("logdir", "it was deleted or moved away",
                                      "the logdir was lost while the run was live: it was deleted or moved away", 1)]
    assert of(sim.tick(), Signal) == [Signal(TRAINER, 1, signal.SIGTERM, Cause.STOP)]  # in order: it may save
    assert of(sim.tick(), StopFailing) == []  # said and done once
    sim.dies(TRAINER, 1)  # its emergency checkpoint could not commit
    assert of(sim.tick(), Restart) == []
    assert sim.view.run == RunState.FAILED and sim.view.exit_code == 1
    assert sim.view.last_error == "the logdir was lost while the run was live: it was deleted or moved away"


@pytest.mark.parametrize("how", ["moved", "parent moved", "deleted", "replaced"])
def test_12_look_a_look_at_the_logdir_names_where_it_went_or_that_it_is_gone(tmp_path, how):
    import shutil

    from procsv.watchdog.logdirwatch import Anchor, LogdirHealth, look

    path = tmp_path / "parent" / "run"
    path.mkdir(parents=True)
    anchor = Anchor(str(path))
    try:
        health = LogdirHealth(anchor.identity)
        (path / "inside").write_text("x")  # the run's own writes change nothing
        assert health.judge(look(str(path), anchor), 0.0) is None
        if how == "moved":
            os.rename(path, tmp_path / "parent" / "elsewhere")
            want = f"it was moved to {tmp_path / 'parent' / 'elsewhere'}"
        elif how == "parent moved":  # no event of the logdir's parent folder names this one
            os.rename(tmp_path / "parent", tmp_path / "parent2")
            want = f"it was moved to {tmp_path / 'parent2' / 'run'}"
        else:
            shutil.rmtree(path)
            if how == "replaced":
                path.mkdir()
                # held open, the old directory's inode cannot be the new one's: the path is seen replaced too
                assert look(str(path)).identity not in (None, anchor.identity)
            want = "it was deleted or moved away"
        assert health.judge(look(str(path), anchor), 0.0) == want
    finally:
        anchor.close()


@pytest.mark.parametrize("how", ["umount -l", "named ' (deleted)'", "no /proc"])
def test_12_anchor_a_place_is_named_only_where_a_path_leads_to_the_logdir(tmp_path, how):
    """The kernel's record of an open directory's path is no proof of a place: a detached mount's
    directory is named by its path inside the mount (a bogus "moved to /"), a deleted one by a
    suffix a real name may carry; without /proc there is no record at all."""
    if how == "no /proc":  # a container without /proc: the look falls back to the stat of the path
        script = ("import os, sys\nfrom procsv.watchdog.logdirwatch import Anchor, LogdirHealth, look\n"
                  "a = Anchor(sys.argv[1]); h = LogdirHealth(a.identity)\n"
                  "print(a.start, h.judge(look(sys.argv[1], a), 0.0))\n"
                  "os.rename(sys.argv[1], sys.argv[1] + '2'); print(h.judge(look(sys.argv[1], a), 0.0))\n")
        (tmp_path / "run").mkdir()
        got = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                              'mount -t tmpfs none /proc && exec "$0" -c "$1" "$2"', sys.executable, script,
                              str(tmp_path / "run")], capture_output=True, text=True, cwd=REPO, timeout=60)
        if "unshare failed" in got.stderr or "mount:" in got.stderr:
            pytest.skip(f"no mount namespace here: {got.stderr.strip()}")
        assert got.returncode == 0, got.stderr
        assert got.stdout.splitlines() == ["None None", "it was deleted or moved away"]
        return
    from procsv.watchdog.logdirwatch import Anchor, LogdirHealth, look

    if how == "umount -l":
        mnt = tmp_path / "m"
        mnt.mkdir()
        mounted = subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(mnt)], capture_output=True)
        if mounted.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
        decoy = tmp_path / "decoy"  # what the detached mount's inner path would name, if it were believed
        path = mnt / str(decoy).lstrip("/")
        path.mkdir(parents=True)
        decoy.mkdir()
    else:
        path = tmp_path / "run (deleted)"
        path.mkdir()
    anchor = Anchor(str(path))
    try:
        assert anchor.start == str(path)
        health = LogdirHealth(anchor.identity)
        assert health.judge(look(str(path), anchor), 0.0) is None
        if how == "umount -l":
            subprocess.run(["umount", "-l", str(mnt)], check=True)
            assert os.readlink(f"/proc/self/fd/{anchor.fd}") == str(decoy)  # the kernel's record
            assert anchor.where() is None
            assert health.judge(look(str(path), anchor), 0.0) == "it was deleted or moved away"
        else:
            os.rename(path, tmp_path / "moved (deleted)")
            assert health.judge(look(str(path), anchor), 0.0) == f"it was moved to {tmp_path / 'moved (deleted)'}"
    finally:
        anchor.close()


def test_12_a_logdir_whose_mount_is_detached_while_live_is_lost_and_no_bogus_place_is_named_or_written(tmp_path):
    """``umount -l`` of the logdir's filesystem: the kernel names the open directory by its path inside
    the detached mount, here the path of a decoy directory; neither the lost line nor the final status
    may go there."""
    mnt = tmp_path / "m"
    mnt.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(mnt)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    decoy = tmp_path / "d"
    (decoy / ".procsv").mkdir(parents=True)  # a bogus final status.json would land here
    logdir = str(mnt / str(decoy).lstrip("/"))
    proc = launch(logdir, "--steps", "100000", "--save-steps", "20", target=BAD, opts=FAST)
    try:
        wait_for(lambda: len(committed_steps(logdir)) >= 2, 90, what="two committed checkpoints")
        subprocess.run(["umount", "-l", str(mnt)], check=True)
    finally:
        code, out, err = finish(proc, 120)
        for p in run_processes(logdir):
            p.kill()
    assert code == 1, err
    lost = [line for line in err.splitlines() if "was lost while the run was live" in line]
    assert len(lost) == 1 and "(it was deleted or moved away)" in lost[0], err
    assert os.listdir(decoy / ".procsv") == []


def test_12_a_logdir_moved_away_and_back_while_live_gets_its_final_status_not_a_dead_watchdogs(tmp_path):
    """``mv run run.bak; mv run.bak run`` (a backup script): the run stops as moved; once it is back,
    ``procsv status`` must tell how the run ended, not show the record of a live run whose watchdog
    'died (killed?) without finishing'."""
    logdir = str(tmp_path / "run")
    proc = launch(logdir, "--steps", "100000", "--save-steps", "20", target=BAD, opts=FAST)
    try:
        wait_for(lambda: len(committed_steps(logdir)) >= 2, 90, what="two committed checkpoints")
        os.rename(logdir, logdir + ".bak")
        wait_for(lambda: [e for e in lifecycle(logdir + ".bak") if e["event"] == "logdir_lost"], 30,
                 what="the logdir to be lost")
        os.rename(logdir + ".bak", logdir)
    finally:
        code, out, err = finish(proc, 120)
    assert code == 1, err
    assert f"(it was moved to {logdir}.bak)" in err
    st = status_json(logdir)
    assert st["state"] == "failed", st
    assert st["exit_code"] == 1 and st["last_error"].startswith("the logdir was lost while the run was live"), st
    assert not run_processes(logdir)


# ------------------------------------------------------------------------ state files
DAMAGED_STATUS = (b'{"state": "runn', b"\x00\xff garbage", b'["a", "list"]', b'{"processes": "x"}')


def test_15_a_damaged_status_file_is_one_line_for_status_and_a_new_launch_replaces_it(logdir, seeded):
    """The new launch is ``seeded``'s: it starts on the last of these damaged files."""
    meta = os.path.join(logdir, ".procsv")
    os.makedirs(meta)
    for garbage in DAMAGED_STATUS:
        with open(os.path.join(meta, "status.json"), "wb") as fh:
            fh.write(garbage)
        out = _procsv("status", logdir)
        assert out.returncode == 2
        line = _one_error_line(out.stderr)
        assert "status.json is damaged (truncated or not a status record)" in line
        assert "the next `procsv launch` replaces it" in line
    st = status_json(seeded)
    assert st["state"] == "succeeded" and st["step"] == 30


@pytest.fixture(scope="module")
def seeded(shared_result):
    """A finished run of bad_train.py with several checkpoints, the last at step 30 (copied by each test),
    launched on a logdir whose status.json is damaged (test 15: the launch replaces it)."""
    run = _finished_run(shared_result, "bad-input-seeded", "--steps", "30", "--save-steps", "10",
                        damaged_status=DAMAGED_STATUS[-1])
    assert run.code == 0, run.err
    assert len(committed_steps(run.logdir)) >= 2 and committed_steps(run.logdir)[-1] == 30
    return run.logdir


def _copy(src: str, dst: str) -> None:
    import shutil

    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("lock"))


def _files(logdir: str) -> dict[str, bytes]:
    out = {}
    for name in os.listdir(logdir):
        if name.startswith("model.ckpt-"):
            with open(os.path.join(logdir, name), "rb") as fh:
                out[name] = fh.read()
    return out


def test_16_a_manifest_that_is_not_json_is_named_passed_over_and_never_a_silent_step_0(seeded, logdir):
    _copy(seeded, logdir)
    previous = committed_steps(logdir)[-2]
    manifests = os.path.join(logdir, ".procsv", "checkpoints")
    damaged = os.path.join(manifests, "model.ckpt-30.json")
    with open(damaged, "wb") as fh:
        fh.write(b'{"step": 30, "pref')  # truncated
    code, out, err = finish(launch(logdir, "--steps", "35", "--save-steps", "10", target=BAD, opts=FAST), 120)
    assert code == 0, err
    named = [line for line in out.splitlines() if "ignoring damaged manifest" in line]
    assert len(named) == 1 and damaged in named[0] and "its checkpoint is not restored" in named[0], out
    assert f"restored step {previous} " in out  # the newest valid one, never step 0
    assert _latest_restores(logdir) == 35
    with open(damaged, "rb") as fh:
        assert fh.read() == b'{"step": 30, "pref'  # left for a person to look at
    # every manifest damaged: no silent start from scratch
    for name in os.listdir(manifests):
        if name.endswith(".json"):
            with open(os.path.join(manifests, name), "w") as fh:
                fh.write("garbage")
    before = _files(logdir)
    code, out, err = finish(launch(logdir, "--steps", "50", target=BAD, opts=FAST), 120)
    assert code == 1
    assert "NoRestorableCheckpoint: refusing to start from step 0" in err and "--allow-reinit" in err
    assert _trainer_spawns(logdir) == 1  # a restart cannot cure it: none is tried
    assert _files(logdir) == before  # nothing moved, deleted or written


def test_17_a_hand_edited_state_file_naming_a_missing_checkpoint_is_rewritten_from_the_manifests(seeded,
                                                                                                  logdir):
    _copy(seeded, logdir)
    with open(os.path.join(logdir, "checkpoint"), "w") as fh:
        fh.write('model_checkpoint_path: "model.ckpt-999"\nall_model_checkpoint_paths: "model.ckpt-999"\n')
    code, out, err = finish(launch(logdir, "--steps", "35", target=BAD, opts=FAST), 120)
    assert code == 0, err
    assert "restored step 30 " in out
    with open(os.path.join(logdir, "logs", "checkpoint.1.log")) as fh:
        log = fh.read()
    assert "the checkpoint state file named 'model.ckpt-999', which is not the newest committed checkpoint" in log
    assert "latest is model.ckpt-30" in log
    assert _latest_restores(logdir) == 35


def test_18_a_checkpoint_of_a_different_model_names_the_variable_and_is_never_re_initialized(seeded,
                                                                                             logdir):
    _copy(seeded, logdir)
    before, steps = _files(logdir), committed_steps(logdir)
    code, out, err = finish(launch(logdir, "--units", "8", target=BAD, opts=FAST), 120)
    assert code == 1
    assert "MismatchedCheckpoint" in err and "weights" in err and "model.ckpt-30" in err
    assert "the trainer cannot start: MismatchedCheckpoint (a restart would fail the same way)" in err
    assert _trainer_spawns(logdir) == 1
    assert committed_steps(logdir) == steps and _files(logdir) == before
    assert _latest_restores(logdir) == 30


# ------------------------------------------------------------------------ misbehaving programs
def test_19_a_trainer_that_ignores_sigterm_is_killed_after_the_grace_period_and_its_last_commit_stays(logdir):
    proc = launch(logdir, "--ignore-sigterm", "--steps", "100000", "--save-steps", "20", target=BAD,
                  opts=FAST + ("--stop-grace-secs", "2"))
    try:
        wait_for(lambda: committed_steps(logdir), 90, what="a committed checkpoint")
        trainer = wait_role_pid(logdir, "trainer")
        proc.send_signal(signal.SIGTERM)
    finally:
        code, out, err = finish(proc, 60)
    # its last step was not committed (killed at the grace): exit 1, not 128+15, which says nothing was lost (issue 51)
    assert code == 1 and "its checkpoint of the last step did not commit" in err, err
    assert "procsv: trainer did not stop within 2 s; killing it" in out + err
    killed = [e for e in lifecycle(logdir) if e["event"] == "exited" and e["pid"] == trainer]
    assert killed and killed[0]["signal"] == "SIGKILL"
    assert _trainer_spawns(logdir) == 1  # stopped, not restarted
    assert status_json(logdir)["state"] == "stopped"
    assert _latest_restores(logdir) == committed_steps(logdir)[-1]
    assert not run_processes(logdir)


def test_20_nan_and_inf_summaries_are_kept_counted_and_shown_by_status(unsaved_nan_image):
    import math

    from tensorboard.backend.event_processing import event_accumulator as ea

    logdir, code, out, err = unsaved_nan_image
    assert code == 0, err
    st = status_json(logdir)
    assert st["summaries"]["nonfinite"] == 3 * 30 and st["summaries"]["dropped"] == 0
    human = _procsv("status", logdir)
    assert "90 NaN or infinite scalars (kept as logged: check the loss)" in human.stdout
    acc = ea.EventAccumulator(logdir, size_guidance={ea.SCALARS: 0})
    acc.Reload()
    assert [e.step for e in acc.Scalars("loss")] == list(range(1, 31))
    assert all(math.isnan(e.value) for e in acc.Scalars("loss"))
    assert all(e.value == math.inf for e in acc.Scalars("up"))
    assert all(e.value == -math.inf for e in acc.Scalars("down"))


def test_21_a_100_mb_image_is_refused_at_the_call_and_the_run_goes_on(unsaved_nan_image):
    from tensorboard.backend.event_processing import event_accumulator as ea

    logdir, code, out, err = unsaved_nan_image
    assert code == 0, err
    refused = [line for line in out.splitlines() if "log_image refused" in line]
    assert len(refused) == 1, out
    assert "image 'huge': 95.4 MiB is more than the 16 MiB one summary may take" in refused[0]
    assert "bad: done at step 30" in out
    acc = ea.EventAccumulator(logdir, size_guidance={ea.SCALARS: 0, ea.IMAGES: 0})
    acc.Reload()
    assert [e.step for e in acc.Scalars("ok")] == list(range(1, 31))
    assert "huge" not in acc.Tags()["images"]
    assert status_json(logdir)["summaries"]["dropped"] == 0


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_22_child_processes_of_the_train_module_are_cleaned_up_after_a_sigkill_and_at_the_end(logdir, tmp_path):
    pidfile = str(tmp_path / "child.pid")
    proc = launch(logdir, "--spawn-child", pidfile, "--steps", "100000", "--save-steps", "20", target=BAD,
                  opts=FAST)
    try:
        wait_for(lambda: committed_steps(logdir), 90, what="a committed checkpoint")
        first = int(open(pidfile).read())
        assert not _gone(first)
        os.unlink(pidfile)
        os.kill(wait_role_pid(logdir, "trainer"), signal.SIGKILL)
        wait_for(lambda: _gone(first), 10, what="the killed trainer's child to be cleaned up")
        assert proc.poll() is None  # the run goes on
        wait_for(lambda: os.path.exists(pidfile), 90, what="the restarted trainer's child")
        second = int(open(pidfile).read())
        assert not _gone(second)
        proc.send_signal(signal.SIGTERM)
    finally:
        code, out, err = finish(proc, 120)
    assert code == 128 + signal.SIGTERM, err
    assert _gone(second)
    assert status_json(logdir)["restarts"] == 1
