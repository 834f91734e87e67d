"""Nothing of a run is left behind: setsid grandchildren, runtime directories of killed launches."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile

import psutil
import pytest

from conftest import (PROGRAMS, finish, launch, lifecycle, quiet_env, raw_status, run_python, runtime_dir, wait_for,
                      wait_role_pid)
from proc_checks import gone
from procsv.common.layout import RUNTIME_LOCK, RUNTIME_OWNER, RuntimeDir, release_runtime_dir, remove_stale_runtime_dirs

TINY = os.path.join(PROGRAMS, "tiny_train.py")


def _dead(pid: int) -> bool:
    """Gone, or a zombie: dead, holding no file or lock any more, waiting for a reaper that is not
    procsv's (an orphan of a SIGKILLed watchdog goes to this machine's init, which here reaps its
    adopted zombies 1.5 s late, later at load: a 30 s wait for the reap failed once at load 14)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _read(path: str) -> tuple[int, str]:
    with open(path) as fh:
        pid, runtime = fh.read().split()
    return int(pid), runtime


@pytest.mark.slow
def test_a_setsid_grandchild_dies_with_its_trainer_and_the_run_leaves_nothing(logdir, tmp_path):
    marker = str(tmp_path / "orphan")
    proc = launch(logdir, "--steps", "100000", "--step-delay", "0.01", "--spawn-orphan", marker, target=TINY)
    try:
        wait_for(lambda: os.path.exists(marker) and (raw_status(logdir) or {}).get("step", 0) > 5, 90,
                 what="the trainer with its setsid helper")
        orphan, runtime = _read(marker)
        assert os.path.isdir(runtime)
        trainer = next(p["pid"] for p in raw_status(logdir)["processes"] if p["role"] == "trainer")
        assert os.getsid(orphan) != os.getsid(trainer)  # it escaped the trainer's process group
        os.kill(trainer, signal.SIGKILL)
        wait_for(lambda: gone(orphan), 30, what="the trainer's setsid helper to be killed and reaped")
        wait_for(lambda: (raw_status(logdir) or {}).get("restarts", 0) >= 1 and
                 (raw_status(logdir) or {}).get("step", 0) > 10, 90, what="the restarted trainer")
    finally:
        proc.send_signal(signal.SIGTERM)
        code, out, err = finish(proc)
    assert code == 128 + signal.SIGTERM, err
    killed = [e for e in lifecycle(logdir) if e["event"] == "orphans_killed"]
    assert killed and orphan in killed[0]["pids"]
    assert not os.path.exists(runtime)
    # the logdir fixture fails the test if any process of the run is left


@pytest.mark.parametrize("via_shell", [False, True], ids=["setsid-child", "orphaned-setsid-grandchild"])
@pytest.mark.slow
def test_a_plain_python_run_kills_the_setsid_helpers_it_leaves_behind(logdir, tmp_path, via_shell):
    # no watchdog: the trainer that started its own services is the helpers' subreaper and sweeps
    # them when its supervised block ends; helpers in its own process group are the program's business
    marker = str(tmp_path / "orphan")
    cmd = [TINY, "--logdir", logdir, "--steps", "30", "--step-delay", "0.01",
           "--spawn-orphan", marker] + (["--orphan-via-shell"] if via_shell else [])
    orphan = 0
    try:
        done = run_python(cmd, env=quiet_env(), timeout=180)
        with open(marker) as fh:
            written = fh.read().split()
        orphan = int(written[0])
        assert done.returncode == 0, done.stderr
        assert "tiny: done at step 30" in done.stdout
        assert gone(orphan), "the setsid helper outlived the plain run"
        assert f"killed 1 process(es) the run left behind in a session of their own (pids {orphan})" in done.stderr
        assert written[1:] == []  # no watchdog's runtime directory in a plain run's environment
    finally:
        if orphan and not gone(orphan):
            os.kill(orphan, signal.SIGKILL)


@pytest.mark.slow
def test_a_plain_python_run_spares_the_children_its_program_started_before_its_supervisor(logdir):
    # children in sessions of their own that the program started before its Supervisor (a tool it runs;
    # in this suite, a worker's earlier launch) are no helpers of the run. Before: the sweep at the end of
    # the supervised block SIGKILLed the live one and reaped both, and each one's Popen said exit 0 (the
    # reap charged an earlier test's launch to test_summary_api's one-second Supervisor: 48.9 CPU-s)
    import procsv

    exited = subprocess.Popen(["sh", "-c", "exit 3"], start_new_session=True)
    running = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"], start_new_session=True)
    try:
        wait_for(lambda: psutil.Process(exited.pid).status() == psutil.STATUS_ZOMBIE, 30, what="the first child's exit")
        sv = procsv.Supervisor(logdir=logdir, checkpoint=None, save_summaries_secs=None)
        with sv.managed_session() as sess:
            sess.run(lambda: None)
        assert running.poll() is None  # alive
        assert exited.wait(10) == 3  # its own exit status, for its own Popen
    finally:
        running.kill()
        running.wait()


@pytest.mark.slow
def test_the_runtime_directory_of_a_killed_launch_is_removed_by_the_next_one(logdir, short_tmp):
    # a temp folder of their own: any other launch of this user (a test running in parallel)
    # would remove the dead launch's runtime directory just as well as the next one here
    private = short_tmp
    env = quiet_env(TMPDIR=private)
    first = launch(logdir, "--steps", "100000", "--step-delay", "0.01", target=TINY, env=env)
    wait_for(lambda: (raw_status(logdir) or {}).get("step", 0) > 0, 90, what="the first launch's trainer")
    trainer = next(p["pid"] for p in raw_status(logdir)["processes"] if p["role"] == "trainer")
    runtime = runtime_dir(wait_role_pid(logdir, "checkpoint"))
    os.kill(first.pid, signal.SIGKILL)  # the watchdog cannot clean up after itself
    first.wait(30)
    wait_for(lambda: _dead(trainer), 30, what="the run to die with its watchdog")
    assert os.path.isdir(runtime)
    assert os.path.dirname(runtime) == private
    code, out, err = finish(launch(logdir, "--steps", "3", "--step-delay", "0", target=TINY, env=env))
    assert code == 0, err
    assert not os.path.exists(runtime)


def test_only_runtime_directories_whose_owner_lock_is_free_are_removed(tmp_path):
    folder = str(tmp_path)
    mine = RuntimeDir.create().path  # held by this live process
    try:
        dead = tempfile.mkdtemp(prefix="procsv-", dir=folder)
        open(os.path.join(dead, RUNTIME_LOCK), "w").close()  # nobody holds it: its owner is gone
        with open(os.path.join(dead, RUNTIME_OWNER), "w") as fh:
            fh.write(f"{os.getpid()} {0.0!r}\n")  # what the record says is not asked
        by_pid = tempfile.mkdtemp(prefix="procsv-", dir=folder)  # an older procsv's: an owner record, no lock
        with open(os.path.join(by_pid, RUNTIME_OWNER), "w") as fh:
            fh.write("999999999 1.0\n")  # no such pid here, which says nothing of another PID namespace
        unknown = tempfile.mkdtemp(prefix="procsv-", dir=folder)  # nothing in it yet: being created
        other = tempfile.mkdtemp(prefix="other-", dir=folder)
        open(os.path.join(other, RUNTIME_LOCK), "w").close()
        assert remove_stale_runtime_dirs(folder) == [dead]
        assert os.path.isdir(by_pid) and os.path.isdir(unknown) and os.path.isdir(other)
        remove_stale_runtime_dirs(os.path.dirname(mine))  # the real temp folder: its owner lives
        assert os.path.isdir(mine)
    finally:
        release_runtime_dir(mine)
    assert not os.path.exists(mine)


def test_a_live_runtime_directory_of_another_pid_namespace_is_kept_and_removed_once_its_owner_died(short_tmp):
    """Containers that share /tmp: the owner's pid means nothing in another PID namespace (here it
    is 1 or 2, another process of ours), so liveness is the owner's lock. Before, this directory was
    removed while its owner lived: its sockets went with it."""
    import shutil
    import subprocess
    import sys

    if shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) is not installed")
    code = ("import sys, time; from procsv.common.layout import RuntimeDir; "
            "print(RuntimeDir.create().path, flush=True); sys.stdin.read()")
    owner = subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", code],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "TMPDIR": short_tmp})
    try:
        path = owner.stdout.readline().strip()
        assert path.startswith(short_tmp), path
        with open(os.path.join(path, RUNTIME_OWNER)) as fh:
            assert int(fh.read().split()[0]) <= 2  # the owner's pid in its own namespace
        assert remove_stale_runtime_dirs(short_tmp) == []
        assert os.path.isdir(path)
    finally:
        owner.stdin.close()  # the owner ends
        owner.wait(30)
    assert remove_stale_runtime_dirs(short_tmp) == [path]
    assert not os.path.exists(path)


@pytest.mark.slow
def test_a_temp_folder_too_long_for_socket_paths_puts_the_runtime_directory_in_tmp(logdir, tmp_path):
    deep = tmp_path / ("d" * 100)
    deep.mkdir()
    code, out, err = finish(launch(logdir, "--steps", "3", "--step-delay", "0", target=TINY,
                                   env=quiet_env(TMPDIR=str(deep))))
    assert code == 0, err  # not "ipc path ... is longer than 107 characters"
    assert os.listdir(deep) == []
