"""Outcomes that tell the truth (issue 38, points 2 and 4), on real processes under ``procsv launch``.

* A 42 is a preemption only when the trainer itself was stopped by SIGTERM/SIGINT and its
  checkpoint committed (it says so in its exit report); a 42 the program returns itself is a
  failure under the normal policy, and ``procsv preempt`` / chaos ``signal=TERM`` stay preemptions.
* A death by SIGKILL from outside (the OOM killer, a flapping node) before the restarted trainer's
  first step is not a start-up failure: it goes through the normal policy.
"""

from __future__ import annotations

import os
import signal
import time

import pytest
import tensorflow as tf

from conftest import PROGRAMS, finish, launch, lifecycle, quiet_env, raw_status, run_python, status_json, wait_for

pytestmark = pytest.mark.slow  # starts TensorFlow processes: not in the quick tier

TINY = os.path.join(PROGRAMS, "tiny_train.py")
EXITS_42 = os.path.join(PROGRAMS, "exits_42.py")
KERAS = "procsv.examples.keras_fit"


def _events(logdir: str, kind: str, role: str = "") -> list[dict]:
    return [e for e in lifecycle(logdir) if e["event"] == kind and (not role or e.get("role") == role)]


@pytest.mark.parametrize("how", ["sys", "os"])
def test_a_42_the_program_returns_itself_is_a_failure_not_a_preemption(logdir, how):
    # before: every 42 restarted at once with the counts reset, so this launch never ended.
    # The in-memory tier is off: a dead attempt's held snapshot, persisted at the next restore, is a
    # new checkpoint, which resets the count of failures without progress (what --max-restarts
    # counts); with it on, how many attempts run depends on when snapshots were taken (CI saw 4)
    proc = launch(logdir, "--how", how, target=EXITS_42, opts=("--max-restarts", "2", "--standby", "fork"),
                  env=quiet_env(PROCSV_MEMORY_SNAPSHOTS="0"))  # (restarts fork: the subject is the exit code)
    code, out, err = finish(proc, 240)
    assert code == 1, err
    spawned = _events(logdir, "spawned", "trainer")
    assert 2 <= len(spawned) <= 3, spawned
    assert all(e.get("code") == 42 for e in _events(logdir, "exited", "trainer"))
    assert not [e for e in _events(logdir, "restarting") if e["error"] == "preempted"]
    assert "giving up" in err and "exited with code 42 of its own, not as a preemption" in err, err
    assert status_json(logdir)["state"] == "failed"


def test_procsv_preempt_of_the_trainer_is_still_a_preemption_with_max_restarts_0(logdir):
    # --max-restarts 0: a failure would end the run; a preemption restarts whatever it says
    proc = launch(logdir, "--steps", "400", "--step-delay", "0.02", target=TINY, opts=("--max-restarts", "0"))
    try:
        wait_for(lambda: (raw_status(logdir) or {}).get("step", 0) > 20, 120, what="training to start")
        done = run_python(["-m", "procsv", "preempt", logdir, "--target", "trainer"], env=quiet_env(), timeout=30)
        assert done.returncode == 0, done.stderr
    finally:
        code, out, err = finish(proc, 240)
    assert code == 0, err
    (restarting,) = _events(logdir, "restarting")
    assert restarting["error"] == "preempted"
    saved = [e["step"] for e in _events(logdir, "checkpoint_committed") if e["reason"] == "preempted"]
    restored = [e["step"] for e in _events(logdir, "restored")]
    assert saved and restored == saved[:1]
    latest = tf.train.latest_checkpoint(logdir)
    weights = tf.Variable(tf.zeros([4]))
    tf.train.Checkpoint(weights=weights).restore(latest).expect_partial()
    assert latest.endswith("model.ckpt-400") and float(weights.numpy()[0]) == 400.0  # tiny adds 1 a step


def test_chaos_sigterm_to_the_trainer_is_still_a_preemption(logdir):
    # chaos counts 1.5 s from each attempt's first step: the first attempt, at least 150 * 0.02 = 3 s
    # long, is signalled once at least; each restart more only costs a standby's warm-up
    proc = launch(logdir, "--steps", "150", "--step-delay", "0.02", target=TINY,
                  opts=("--max-restarts", "0", "--chaos", "every=1.5,target=trainer,signal=TERM"))
    code, out, err = finish(proc, 300)
    assert code == 0, err
    restarts = _events(logdir, "restarting")
    assert restarts and all(e["error"] == "preempted" for e in restarts), restarts


def _spawned_pid(logdir: str, attempt: int) -> int:
    for e in _events(logdir, "spawned", "trainer"):
        if e["attempt"] == attempt:
            return int(e["pid"])
    return 0


def test_sigkills_of_a_keras_trainer_before_its_first_step_are_not_a_start_up_failure(short_tmp):
    # a flapping node or the OOM killer: SIGKILL the trainer mid-epoch, then twice more each time
    # right after its restart (a resumed fit takes ~1.7 s to its first step); before, the second of
    # those ended the run: "failed before its first step 2 times in a row (start-up failure)", exit 1
    # --standby fork: each restart is a fork that resumes the fit (~1.7 s to its first step); a hot
    # standby promoted in its place, warmed up already, reached its first step within the 0.4 s (CI)
    logdir = os.path.join(short_tmp, "run")
    proc = launch(logdir, "--epochs", "2", "--batch-delay", "0.02", target=KERAS, opts=("--standby", "fork"))
    try:
        wait_for(lambda: (raw_status(logdir) or {}).get("step", 0) > 10, 180, what="fit to train")
        os.kill(_spawned_pid(logdir, 1), signal.SIGKILL)
        for attempt in (2, 3):
            pid = wait_for(lambda: _spawned_pid(logdir, attempt), 120, interval=0.02,
                           what=f"trainer attempt {attempt}")
            time.sleep(0.4 if attempt == 2 else 0.1)  # a kill 0.4 s into the start-up, then one at once
            os.kill(pid, signal.SIGKILL)
        code, out, err = finish(proc, 300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert code == 0, err
    assert "start-up failure" not in err
    first_steps = [e["pid"] for e in _events(logdir, "first_step")]
    assert _spawned_pid(logdir, 2) not in first_steps and _spawned_pid(logdir, 3) not in first_steps  # killed before
    kills = [e for e in _events(logdir, "exited", "trainer") if e.get("signal") == "SIGKILL"]
    assert [e["attempt"] for e in kills] == [1, 2, 3]
    delays = [e["delay"] for e in _events(logdir, "restarting")]
    assert len(delays) == 3 and delays[-1] > 0  # the normal policy's backoff: failures without a checkpoint
    st = status_json(logdir)
    assert st["state"] == "succeeded" and st["restarts"] == 3
