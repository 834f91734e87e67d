"""End to end: the checkpoint service killed at every commit step, killed mid-run, corrupt and full disks.

Real processes (``procsv launch`` on the digits example), real signals, real TensorFlow readers.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess

import pytest

from conftest import (committed_steps, finish, launch, lifecycle, quiet_env, raw_status, role_pid, run_processes,
                      status_json, wait_for, wait_role_pid)
from pyfork import popen_python
from procsv.common.layout import Layout
from procsv.common.manifests import list_committed, verify
from procsv.services.checkpoint.store import FAULT_POINTS

pytestmark = pytest.mark.slow
# No test here restarts a trainer: its hot standby would never be promoted, so none is prepared
# (the first trainer is still forked from the pre-warmed one, as by default)
NO_STANDBY = ("--standby", "fork")


def _restore_plain(path: str) -> int:
    """Restore a digits checkpoint with nothing but TensorFlow and Keras; return its global step."""
    import keras
    import tensorflow as tf

    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(10)])
    optimizer = keras.optimizers.Adam(1e-3)
    optimizer.build(model.trainable_variables)
    step = tf.Variable(0, dtype=tf.int64)
    tf.train.Checkpoint(model=model, optimizer=optimizer, global_step=step).restore(path).assert_consumed()
    return int(step.numpy())


def _latest_loads(logdir: str) -> int:
    import tensorflow as tf

    latest = tf.train.latest_checkpoint(logdir)
    assert latest is not None, "no checkpoint named by the state file"
    return _restore_plain(latest)


def _all_committed_verify(logdir: str) -> None:
    layout = Layout(logdir)
    for m in list_committed(layout):
        verify(layout, m)


def _service_deaths(logdir: str) -> list[dict]:
    return [e for e in lifecycle(logdir) if e["event"] == "exited" and e.get("role") == "checkpoint"]


# every commit step's fault point, a launch per group of them: the service SIGKILLed at the first point at its
# second commit, its restart at the second point at its second commit, and so on (each point once, at the
# second commit of an attempt of its own: there is a previous one). Two launches, not one per point (seven
# before: 2.5-3.5 CPU-s each, most of it the launch), and four deaths at most in one: five within a minute are
# the most a service may have (``Limits.service_restart_limit``) before the run gives up on it. The second
# launch's service is then SIGKILLed from outside, at no fault point (a launch of its own before): it is
# restarted under the same trainer and the next checkpoint commits
POINT_GROUPS = ((FAULT_POINTS[:4], False), (FAULT_POINTS[4:], True))


def test_the_point_groups_hold_every_fault_point_once():
    assert sorted(p for group, _ in POINT_GROUPS for p in group) == sorted(FAULT_POINTS)
    assert all(len(group) + killed <= 4 for group, killed in POINT_GROUPS)


@pytest.mark.parametrize("points, then_killed", [pytest.param(*group, id="+".join(group[0]) + "+sigkill" * group[1])
                                                 for group in POINT_GROUPS])
def test_service_killed_at_each_commit_step_leaves_a_loadable_latest_and_the_run_finishes(logdir, points, then_killed):
    spec = ",".join(f"checkpoint:{point}:2@{attempt}" for attempt, point in enumerate(points, start=1))
    env = quiet_env(PROCSV_FAULT=spec)
    # 600 steps of 20 ms: the run outlasts its services' deaths, each at an attempt's second commit (every 0.3 s),
    # and their restarts (300 for one death before; the delay is a sleep, a step's CPU its computation)
    proc = launch(logdir, "--steps", "600", "--save-model-secs", "0.3", "--step-delay", "0.02", env=env,
                  opts=NO_STANDBY)
    try:
        trainer = None
        for n, point in enumerate(points, start=1):
            wait_for(lambda: len(_service_deaths(logdir)) >= n, 120, what=f"the service to die at {point}")
            trainer = trainer or wait_role_pid(logdir, "trainer")
            assert _latest_loads(logdir) >= 1, point  # at once, before the restarted service repairs anything
        if then_killed:  # the SIGKILL of a service at no fault point: restarted, and the next checkpoint commits
            victim = wait_for(lambda: next((p["pid"] for p in (raw_status(logdir) or {}).get("processes", [])
                                            if p["role"] == "checkpoint" and p["restarts"] == len(points)), None),
                              30, what="the last restarted service")
            before = wait_for(lambda: committed_steps(logdir), 90, what="a committed checkpoint")[-1]
            os.kill(victim, signal.SIGKILL)
            wait_for(lambda: role_pid(logdir, "checkpoint") not in (None, victim), 30, what="a new checkpoint service")
            wait_for(lambda: committed_steps(logdir)[-1] > before, 90, what="a checkpoint from the new service")
            assert role_pid(logdir, "trainer") == trainer
            assert (raw_status(logdir) or {}).get("state") == "running"
    finally:
        code, out, err = finish(proc)
    assert code == 0, err
    kills = len(points) + then_killed
    deaths = _service_deaths(logdir)[:kills]  # (then the last service's own exit, at the run's end)
    assert [(d["signal"], d["attempt"]) for d in deaths] == [("SIGKILL", n) for n in range(1, kills + 1)]
    st = status_json(logdir)
    assert st["state"] == "succeeded" and st["step"] == 600
    roles = {p["role"]: p for p in st["processes"]}
    assert roles["trainer"]["pid"] == trainer and roles["trainer"]["restarts"] == 0
    assert roles["checkpoint"]["restarts"] == kills
    assert _latest_loads(logdir) == 600 == committed_steps(logdir)[-1]
    _all_committed_verify(logdir)
    assert os.listdir(os.path.join(logdir, ".procsv", "tmp")) == []
    leftovers = [n for n in os.listdir(logdir) if n.startswith("model.ckpt-")
                 and n.split(".")[1].split("-")[1] not in {str(s) for s in committed_steps(logdir)}]
    assert leftovers == []  # nothing of an interrupted commit stays behind


def _finished_run(logdir: str) -> None:
    code, out, err = finish(launch(logdir, "--steps", "400", "--save-model-secs", "0.2", "--step-delay", "0.004",
                                   opts=NO_STANDBY))
    assert code == 0, err
    assert committed_steps(logdir)[-1] == 400


@pytest.fixture
def finished(shared_result, logdir):
    """``logdir`` holding a copy of one finished 400-step run with several checkpoints: the run is
    made once per session (whichever pytest-xdist worker asks first) and each test damages its
    own copy, as it damaged its own run before."""
    seed = os.path.join(shared_result("faults-finished-400", lambda f: _finished_run(os.path.join(f, "run"))), "run")
    shutil.copytree(seed, logdir, ignore=shutil.ignore_patterns("lock"))
    return logdir


def test_corrupt_newest_checkpoints_fall_back_with_a_clear_line_and_the_run_finishes(finished):
    logdir = finished
    steps = committed_steps(logdir)
    assert len(steps) >= 3, steps
    newest, second, third = steps[-1], steps[-2], steps[-3]
    data = os.path.join(logdir, f"model.ckpt-{newest}.data-00000-of-00002")
    with open(data, "r+b") as fh:  # flip one byte in the middle
        fh.seek(os.path.getsize(data) // 2)
        byte = fh.read(1)
        fh.seek(-1, os.SEEK_CUR)
        fh.write(bytes([byte[0] ^ 0x5A]))
    index = os.path.join(logdir, f"model.ckpt-{second}.index")
    os.truncate(index, os.path.getsize(index) // 2)  # "file is too short to be an sstable"
    truncated = os.path.getsize(index)
    code, out, err = finish(launch(logdir, "--steps", "450", opts=NO_STANDBY))
    assert code == 0, err
    assert f"procsv: skipping corrupt checkpoint model.ckpt-{newest} " in out
    assert f"procsv: skipping corrupt checkpoint model.ckpt-{second} " in out
    assert f"restored step {third} " in out
    st = status_json(logdir)
    assert st["state"] == "succeeded" and st["step"] == 450 and st["restarts"] == 0
    assert _latest_loads(logdir) == 450
    assert newest not in committed_steps(logdir) and second not in committed_steps(logdir)  # retired, not latest
    _all_committed_verify(logdir)
    service_log = _read(os.path.join(logdir, "logs", "checkpoint.1.log"))
    for step in (newest, second):  # quarantined for a person to look at, not deleted
        prefix = f"model.ckpt-{step}"
        folder = os.path.join(logdir, ".procsv", "quarantine", prefix)
        assert sorted(os.listdir(folder)) == sorted([f"{prefix}.data-00000-of-00002", f"{prefix}.data-00001-of-00002",
                                                     f"{prefix}.index", f"{prefix}.json"])
        assert f"procsv checkpoint: quarantined corrupt checkpoint {prefix} (" in service_log
        assert not any(n.startswith(prefix + ".") for n in os.listdir(logdir))
    moved = os.path.join(logdir, ".procsv", "quarantine", f"model.ckpt-{second}", f"model.ckpt-{second}.index")
    assert os.path.getsize(moved) == truncated  # the damaged file itself, as it was


def _read(path: str) -> str:
    with open(path) as fh:
        return fh.read()


def _checkpoint_files(logdir: str) -> dict[str, int]:
    """Every checkpoint file and manifest of the logdir (quarantine included), with its size."""
    found = {}
    for folder, _, names in os.walk(logdir):
        for name in names:
            if name.startswith("model.ckpt-") or name == "checkpoint":
                path = os.path.join(folder, name)
                found[os.path.relpath(path, logdir)] = os.path.getsize(path)
    return found


def test_unreadable_checkpoints_fail_the_launch_clearly_touch_nothing_and_the_run_resumes_once_readable(
        finished, tmp_path):
    logdir = finished
    steps = committed_steps(logdir)
    assert len(steps) >= 2 and steps[-1] == 400, steps
    stash = tmp_path / "stash"
    stash.mkdir()
    moved = []
    for step in steps:  # EISDIR for every reader (root ignores chmod): a directory in place of a data file
        name = f"model.ckpt-{step}.data-00000-of-00002"
        os.rename(os.path.join(logdir, name), stash / name)
        os.mkdir(os.path.join(logdir, name))
        moved.append(name)
    before, seen = _checkpoint_files(logdir), len(lifecycle(logdir))
    code, out, err = finish(launch(logdir, "--steps", "450", opts=("--allow-reinit", *NO_STANDBY)))
    assert code == 1, out + err
    said = out + err
    assert f"UnreadableCheckpoint: cannot read checkpoint model.ckpt-{steps[-1]}; " in said
    assert f"file model.ckpt-{steps[-1]}.data-00000-of-00002 cannot be read (EISDIR: " in said
    assert "procsv: skipping corrupt checkpoint" not in said and "restored step" not in said
    events = [e["event"] for e in lifecycle(logdir)[seen:]]
    assert "initialized" not in events and "restored" not in events and "first_step" not in events
    assert _checkpoint_files(logdir) == before  # nothing moved, deleted, quarantined or rewritten
    assert committed_steps(logdir) == steps
    assert not os.path.exists(os.path.join(logdir, ".procsv", "quarantine"))
    for name in moved:
        os.rmdir(os.path.join(logdir, name))
        os.rename(stash / name, os.path.join(logdir, name))
    code, out, err = finish(launch(logdir, "--steps", "450", opts=NO_STANDBY))
    assert code == 0, err
    assert f"restored step {steps[-1]} " in out  # the progress was never lost
    assert _latest_loads(logdir) == 450


def test_every_checkpoint_corrupt_refuses_step_0_and_starts_from_scratch_only_with_allow_reinit(finished):
    logdir = finished
    steps = committed_steps(logdir)
    assert len(steps) >= 2, steps
    for step in steps:
        index = os.path.join(logdir, f"model.ckpt-{step}.index")
        os.truncate(index, os.path.getsize(index) - 1)
    before, seen = _checkpoint_files(logdir), len(lifecycle(logdir))
    code, out, err = finish(launch(logdir, "--steps", "420", opts=NO_STANDBY))
    assert code == 1, out + err
    said = out + err
    assert "NoRestorableCheckpoint: refusing to start from step 0: none of the " in said
    for step in steps:
        prefix = f"model.ckpt-{step}"
        assert f"  {prefix} (step {step}): corrupt: {prefix}: file {prefix}.index has " in said
    assert "--allow-reinit" in said
    assert _checkpoint_files(logdir) == before and committed_steps(logdir) == steps
    assert not [e for e in lifecycle(logdir)[seen:] if e["event"] in ("initialized", "restored")]
    seen = len(lifecycle(logdir))
    code, out, err = finish(launch(logdir, "--steps", "60", opts=("--allow-reinit", *NO_STANDBY)))
    assert code == 0, err
    assert "starting from scratch as allowed (allow_reinit)" in out + err
    (init,) = [e for e in lifecycle(logdir)[seen:] if e["event"] == "initialized"]
    assert init["step"] == 0 and sorted(init["skipped"]) == sorted(f"model.ckpt-{s}" for s in steps)
    for step in steps:  # set aside, not deleted
        prefix = f"model.ckpt-{step}"
        folder = os.path.join(logdir, ".procsv", "quarantine", prefix)
        assert os.path.getsize(os.path.join(folder, prefix + ".index")) == before[prefix + ".index"]
        assert os.path.exists(os.path.join(folder, prefix + ".json"))
    assert committed_steps(logdir) == [60]  # only the new run's final checkpoint
    assert _latest_loads(logdir) == 60
    _all_committed_verify(logdir)


@pytest.fixture
def small_fs(tmp_path):
    """A 16 MiB tmpfs to fill up; every process of a run in it is killed and it is unmounted at the end."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mnt)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield mnt
    finally:
        for p in run_processes(str(mnt / "run")):
            p.kill()
        if subprocess.run(["umount", str(mnt)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def _fill(path: str, leave: int) -> None:
    st = os.statvfs(os.path.dirname(path))
    size = st.f_bavail * st.f_frsize - leave
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.posix_fallocate(fd, 0, max(size, 4096))
    finally:
        os.close(fd)


def test_with_continue_a_full_filesystem_fails_the_save_clearly_keeps_the_previous_checkpoint_and_trains_on(small_fs):
    mnt = small_fs
    logdir = str(mnt / "run")
    (mnt / "run").mkdir()
    (mnt / "run" / "notes.txt").write_text("not procsv's")
    proc = launch(logdir, "--steps", "100000", "--save-model-secs", "0.3", "--step-delay", "0.01",
                  opts=("--on-checkpoint-failure", "continue", *NO_STANDBY))
    try:
        wait_for(lambda: len(committed_steps(logdir)) >= 2, 90, what="two committed checkpoints")
        trainer = wait_role_pid(logdir, "trainer")
        filler = str(mnt / "filler")
        _fill(filler, leave=48 << 10)  # small files still fit; a checkpoint (~60 KB of data) does not
        failed = wait_for(lambda: [e for e in lifecycle(logdir) if e["event"] == "checkpoint_failed"], 60,
                          what="a failed save")
        assert "No space left on device" in failed[0]["error"]
        kept = committed_steps(logdir)[-1]
        assert _latest_loads(logdir) == kept  # the previous checkpoint is still the latest, and loads
        _all_committed_verify(logdir)
        stepped = (raw_status(logdir) or {}).get("step", 0)
        wait_for(lambda: (raw_status(logdir) or {}).get("step", 0) > stepped + 50, 60, what="training to go on")
        os.unlink(filler)
        wait_for(lambda: committed_steps(logdir)[-1] > kept, 60, what="a checkpoint once there is space again")
        assert role_pid(logdir, "trainer") == trainer
    finally:
        proc.send_signal(signal.SIGTERM)
        code, out, err = finish(proc)
    assert code == 128 + signal.SIGTERM, err
    assert f"checkpoint at step {failed[0]['step']} failed: " in out + err
    st = status_json(logdir)
    assert st["restarts"] == 0 and committed_steps(logdir)[-1] == st["step"]
    assert _latest_loads(logdir) == st["step"]
    assert (mnt / "run" / "notes.txt").read_text() == "not procsv's"


def test_checkpoints_that_keep_failing_stop_the_run_in_order_with_exit_code_3(small_fs):
    mnt = small_fs
    logdir = str(mnt / "run")
    proc = launch(logdir, "--steps", "100000", "--save-model-secs", "0.3", "--step-delay", "0.01", opts=NO_STANDBY)
    try:
        wait_for(lambda: len(committed_steps(logdir)) >= 2, 90, what="two committed checkpoints")
        _fill(str(mnt / "filler"), leave=48 << 10)  # every further checkpoint fails
    finally:
        code, out, err = finish(proc)  # the launch ends by itself
    assert code == 3, err
    assert "3 checkpoints in a row failed to commit" in err and "No space left on device" in err
    failed = [e for e in lifecycle(logdir) if e["event"] == "checkpoint_failed"]
    assert len(failed) >= 3
    st = status_json(logdir)
    assert st["state"] == "failed" and "failed to commit" in st["last_error"]
    # Whether the trainer ends on its own CheckpointError or on the watchdog's SIGTERM is a race
    # (both count the same failures); the program's side is the next test, with no watchdog.
    kept = committed_steps(logdir)[-1]
    assert _latest_loads(logdir) == kept  # the last good checkpoint is intact and the latest
    _all_committed_verify(logdir)


def test_without_a_watchdog_the_program_sees_failing_checkpoints_the_tf_way_and_the_block_reraises(small_fs):
    """Plain ``python train.py``: the Supervisor counts the failed commits itself; should_stop()
    turns true and the managed_session block re-raises a CheckpointError naming the cause."""
    mnt = small_fs
    logdir = str(mnt / "run")
    proc = popen_python(["-m", "procsv.examples.digits", "--logdir", logdir, "--steps", "100000", "--save-model-secs",
                         "0.3", "--step-delay", "0.01"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                        env=quiet_env(), start_new_session=True)
    try:
        wait_for(lambda: len(committed_steps(logdir)) >= 2, 90, what="two committed checkpoints")
        _fill(str(mnt / "filler"), leave=48 << 10)  # every further checkpoint fails
    finally:
        code, out, err = finish(proc)
    assert code == 1, err
    assert re.search(r"CheckpointError: 3 checkpoints in a row failed to commit, the last at step \d+: "
                     r"OSError: \[Errno 28\] No space left on device", err), err
    kept = committed_steps(logdir)[-1]
    assert _latest_loads(logdir) == kept
    _all_committed_verify(logdir)
