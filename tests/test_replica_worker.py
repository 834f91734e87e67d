"""Worker replicas on the trainer side (``is_chief=False``): restore the chief's checkpoints, never
write, wait for the chief's first checkpoint on filesystem events.

The chief is the built-in digits example run as a real process (plain ``python``: it starts its
own checkpoint and summary services); the worker runs in the test process, as a second replica of
a ``tf.distribute`` job would run in its own.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time

import psutil
import pytest
import tensorflow as tf

from conftest import REPO, committed_steps, quiet_env
from pyfork import popen_python

from procsv.common.layout import Layout


def _chief(logdir: str, steps: int, *extra: str) -> subprocess.Popen:
    return popen_python(["-m", "procsv.examples.digits", "--logdir", logdir, "--steps", str(steps), *extra],
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=quiet_env(), cwd=REPO)


def _train_chief(logdir: str) -> None:
    chief = _chief(logdir, 60, "--save-checkpoint-steps", "20")
    try:
        _, err = chief.communicate(timeout=300)
    finally:  # timed out or interrupted: the chief (and the services it started) must not outlive the test
        if chief.poll() is None:
            chief.kill()
            chief.communicate()
    assert chief.returncode == 0, err
    assert committed_steps(logdir)[-1] == 60


@pytest.fixture(scope="module")
def chief_run(shared_result):
    """A logdir a real chief trained 60 steps in (commits at 20, 40, 60), trained once per session
    whichever pytest-xdist worker asks first; tests copy it."""
    folder = shared_result("replica-chief", lambda f: _train_chief(os.path.join(f, "run")))
    return os.path.join(folder, "run")


def _copy(src: str, tmp_path) -> str:
    dst = str(tmp_path / "run")
    shutil.copytree(src, dst)
    return dst


def _state():
    from procsv.examples.digits import build_model

    model, optimizer, _ = build_model()
    return model, tf.train.Checkpoint(model=model, optimizer=optimizer)


def _tree(logdir: str) -> dict[str, tuple[int, int]]:
    out = {}
    for root, _, files in os.walk(logdir):
        for name in files:
            path = os.path.join(root, name)
            st = os.stat(path)
            out[os.path.relpath(path, logdir)] = (st.st_size, st.st_mtime_ns)
    return out


@pytest.mark.slow
def test_a_worker_restores_the_chiefs_newest_checkpoint_trains_and_writes_nothing(chief_run, tmp_path):
    import procsv

    logdir = _copy(chief_run, tmp_path)
    before = _tree(logdir)
    model, ckpt = _state()
    sv = procsv.Supervisor(logdir=logdir, is_chief=False, checkpoint=ckpt, save_model_secs=0.01,
                           save_summaries_secs=0.01, summary_fn=lambda: {"x": 1.0})
    children_before = {p.pid for p in psutil.Process().children(recursive=True)}
    with sv.managed_session() as sess:
        assert sv.step == 60 and sv.restored_from == os.path.join(logdir, "model.ckpt-60")
        for _ in range(5):
            sess.run(lambda: None)
            sv.log_scalar("loss", 1.0)
            time.sleep(0.02)
        started = {p.pid for p in psutil.Process().children(recursive=True)} - children_before
        assert started == set()  # a worker starts no service: the chief's process runs them
    assert sv.step == 65
    assert _tree(logdir) == before  # no checkpoint, no event file, no manifest: only the chief writes


@pytest.mark.slow
def test_a_worker_waiting_for_a_checkpoint_is_woken_by_the_chiefs_first_commit_not_by_its_poll(tmp_path):
    from procsv.trainer.replica import wait_for_committed

    logdir = str(tmp_path / "run")
    waited: dict[str, float] = {}

    def worker() -> None:
        waited["secs"] = wait_for_committed(Layout(logdir), max_wait_secs=300, poll_secs=60)
        waited["at"] = time.time()

    thread = threading.Thread(target=worker)
    thread.start()
    time.sleep(0.5)
    assert thread.is_alive()  # nothing committed yet: it waits
    chief = _chief(logdir, 200, "--save-checkpoint-steps", "50", "--step-delay", "0.01")
    try:
        thread.join(timeout=200)
        assert not thread.is_alive()
    finally:
        chief.kill()
        chief.communicate()
    layout = Layout(logdir)
    first = min((os.stat(os.path.join(layout.manifests, n)).st_mtime for n in os.listdir(layout.manifests)
                 if n.endswith(".json")))
    # woken by the filesystem event of the commit, not by the 60 s fallback poll
    assert 0 <= waited["at"] - first < 10, (waited, first)
    assert waited["secs"] > 0


def test_max_wait_secs_with_no_checkpoint_is_tensorflows_deadline_exceeded(tmp_path):
    import procsv

    _, ckpt = _state()
    sv = procsv.Supervisor(logdir=str(tmp_path / "run"), is_chief=False, checkpoint=ckpt)
    t0 = time.monotonic()
    with pytest.raises(tf.errors.DeadlineExceededError, match="no committed checkpoint appeared"):
        sv.prepare_or_wait_for_session(wait_for_checkpoint=True, max_wait_secs=0.5)
    assert time.monotonic() - t0 < 30
    sv._release()


def test_a_worker_under_a_single_trainer_launch_is_refused(tmp_path, monkeypatch):
    import procsv
    from procsv.common import env

    monkeypatch.setenv(env.LOGDIR, str(tmp_path))
    monkeypatch.setenv(env.RUNTIME_DIR, str(tmp_path / "rt"))
    monkeypatch.setenv(env.WATCHDOG, "1")
    with pytest.raises(procsv.UsageError, match="is_chief=False under procsv launch"):
        procsv.Supervisor(is_chief=False)


@pytest.mark.slow
def test_a_monitored_worker_session_restores_runs_only_its_own_hooks_and_writes_nothing(chief_run, tmp_path):
    from procsv import train

    logdir = _copy(chief_run, tmp_path)
    before = _tree(logdir)
    _, ckpt = _state()
    seen: list[int] = []

    class Steps(train.SessionRunHook):
        def after_run(self, run_context, run_values):
            seen.append(int(train.get_global_step().numpy()))

    with train.MonitoredTrainingSession(is_chief=False, checkpoint_dir=logdir, checkpoint=ckpt,
                                        hooks=[Steps(), train.StopAtStepHook(last_step=65)]) as sess:
        while not sess.should_stop():
            sess.run(lambda: None)
    assert seen == [61, 62, 63, 64, 65]
    assert _tree(logdir) == before


def test_an_eager_program_under_ps_is_refused_in_one_line(tmp_path, monkeypatch):
    import procsv
    from procsv.common import env

    monkeypatch.setenv(env.LOGDIR, str(tmp_path))
    monkeypatch.setenv(env.RUNTIME_DIR, str(tmp_path / "rt"))
    monkeypatch.setenv(env.WATCHDOG, "1")
    monkeypatch.setenv(env.PS, "1")  # procsv launch --ps 1 --workers 2, task 0
    monkeypatch.setenv(env.NPROC, "2")
    monkeypatch.setenv(env.RANK, "0")
    with pytest.raises(procsv.UsageError, match="--ps/--workers runs TF1 between-graph replication") as exc:
        procsv.Supervisor(checkpoint=None)
    assert "\n" not in str(exc.value)
