"""Checkpoints never stop silently: a stuck checkpoint service (SIGSTOP) is replaced while training goes on."""

from __future__ import annotations

import os
import re
import signal
import subprocess

import pytest

from conftest import (PROGRAMS, burners, committed_steps, finish, launch, lifecycle, on_one_core, quiet_env, raw_status,
                      role_pid, run_python, wait_for)
from procsv.common import env

pytestmark = pytest.mark.slow
TINY = os.path.join(PROGRAMS, "tiny_train.py")
# No test here restarts a trainer: its hot standby would never be promoted, so none is prepared (the
# first trainer is still forked from the pre-warmed one, as by default; --standby off made it a fresh
# process, which imports TensorFlow: ~2-3 s of CPU more a launch)
NO_STANDBY = ("--standby", "fork")


def test_a_stopped_checkpoint_service_is_replaced_and_the_next_checkpoint_commits(logdir):
    proc = launch(logdir, "--steps", "100000", "--step-delay", "0.01", "--save-model-secs", "1", target=TINY,
                  opts=NO_STANDBY)
    try:
        wait_for(lambda: len(committed_steps(logdir)) >= 2, 90, what="two checkpoints")
        stuck = role_pid(logdir, "checkpoint")
        os.kill(stuck, signal.SIGSTOP)  # like a service blocked on an fsync to a dead NFS server
        newest = max(committed_steps(logdir))
        at_stop = raw_status(logdir)["step"]
        stall = wait_for(lambda: [e for e in lifecycle(logdir) if e["event"] == "checkpoint_stalled"], 60,
                         what="the watchdog to notice that checkpoints stopped")
        assert stall[0]["pid"] == stuck and "no checkpoint committed" in stall[0]["reason"]
        wait_for(lambda: max(committed_steps(logdir)) > newest, 60,
                 what="a checkpoint committed by the replacement service")
        # training never waited for the stuck service: it went on through the whole stall
        stalled_at = raw_status(logdir)["step"]
        assert stalled_at - at_stop > 300  # ~10 s of 10 ms steps, with room for a slow machine
        # status.json is refreshed at most every 0.5 s: the replacement can commit before it shows
        wait_for(lambda: role_pid(logdir, "checkpoint") not in (None, stuck), 10,
                 what="status.json to name the replacement checkpoint service")
        assert "checkpoint service stalled" in (raw_status(logdir)["last_error"] or "")
    finally:
        proc.send_signal(signal.SIGTERM)
        code, out, err = finish(proc)
    assert code == 128 + signal.SIGTERM, err
    assert "checkpoints stalled" in err


def test_a_snapshot_past_its_deadline_gets_the_checkpoint_service_replaced_before_the_stall_rule(logdir):
    # a step schedule: the trainer itself sends snapshots to the stopped service. Its deadline
    # (floor 3 s here) passes long before the watchdog's own stall rule (10 s floor) would fire.
    proc = launch(logdir, "--steps", "100000", "--step-delay", "0.01", "--save-steps", "25",
                  target=TINY, opts=NO_STANDBY, env=quiet_env(**{env.SAVE_DEADLINE: "3"}))
    try:
        wait_for(lambda: len(committed_steps(logdir)) >= 2, 90, what="two checkpoints")
        stuck = role_pid(logdir, "checkpoint")
        os.kill(stuck, signal.SIGSTOP)
        newest = max(committed_steps(logdir))
        stall = wait_for(lambda: [e for e in lifecycle(logdir) if e["event"] == "checkpoint_stalled"], 60,
                         what="the trainer's overdue snapshot to reach the watchdog")
        assert stall[0]["pid"] == stuck
        assert "had no result within 3.0 s" in stall[0]["reason"], stall[0]
        wait_for(lambda: max(committed_steps(logdir)) > newest, 60,
                 what="the lost snapshot retaken and committed by the replacement service")
        # status.json is refreshed at most every 0.5 s: the replacement can commit before it shows
        wait_for(lambda: role_pid(logdir, "checkpoint") not in (None, stuck), 10,
                 what="status.json to name the replacement checkpoint service")
    finally:
        proc.send_signal(signal.SIGTERM)
        code, out, err = finish(proc)
    assert code == 128 + signal.SIGTERM, err
    with open(os.path.join(logdir, "logs", "trainer.1.log")) as fh:  # the trainer's own line
        assert f"checkpoint at step {stall[0]['reason'].split()[4]} failed: no result from the checkpoint service " \
               "within 3.0 s" in fh.read()


def test_a_snapshot_in_flight_to_a_stopped_service_at_the_end_gets_it_replaced_and_the_final_checkpoint_commits(logdir):
    # the program ends while its snapshot waits on a stopped service: the final checkpoint waits
    # for that snapshot only until its deadline, the watchdog replaces the service, and the final
    # one commits there, instead of giving up after stop_grace_secs and exiting as if it had
    proc = launch(logdir, "--steps", "600", "--step-delay", "0.01", "--save-steps", "25",
                  target=TINY, opts=NO_STANDBY, env=quiet_env(**{env.SAVE_DEADLINE: "3"}))
    try:
        wait_for(lambda: (raw_status(logdir) or {}).get("step", 0) >= 450, 120, what="step 450")
        stuck = role_pid(logdir, "checkpoint")
        os.kill(stuck, signal.SIGSTOP)
        code, out, err = finish(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 0, err
    stall = [e for e in lifecycle(logdir) if e["event"] == "checkpoint_stalled"]
    assert stall and stall[0]["pid"] == stuck, lifecycle(logdir)
    assert max(committed_steps(logdir)) == 600
    import tensorflow as tf

    assert tf.train.latest_checkpoint(logdir) == os.path.join(logdir, "model.ckpt-600")
    with open(os.path.join(logdir, "logs", "trainer.1.log")) as fh:
        log = fh.read()
    # the deadline it names: the floor (3 s here), or longer where the measured persist rate says so (3.2 s at load 13)
    named = re.search(r"no result from the checkpoint service within (\d+\.\d) s", log)
    assert named and float(named.group(1)) >= 3.0 and "final checkpoint committed at step 600" in log, log


def test_snapshots_refused_under_on_nonfinite_continue_never_get_the_checkpoint_service_killed(logdir):
    """Issue 51, point 5: once the state is non-finite, --on-nonfinite continue refuses every snapshot
    (procsv never commits a poisoned state), so nothing commits; the stall rule SIGKILLed the healthy
    checkpoint service every three save intervals (here: 30 steps and the 10 s floor), forever. The
    trainer says why nothing commits, and the stall rule counts from its last refusal. Its refusals'
    nonfinite_detected records are coalesced, and procsv status and report count every one."""
    # 1500 steps of 15 ms: more than two stall windows (the 10 s floor) of refusals
    proc = launch(logdir, "--how", "return", "--nan-at", "25", "--steps", "1500", "--save-steps", "10",
                  "--step-delay", "0.015", target=os.path.join(PROGRAMS, "nan_train.py"),
                  opts=("--on-nonfinite", "continue", *NO_STANDBY))
    code, out, err = finish(proc, 300)
    assert code == 0, err[-3000:]
    events = lifecycle(logdir)
    assert not [e for e in events if e["event"] == "checkpoint_stalled"], err[-3000:]
    assert len([e for e in events if e["event"] == "spawned" and e["role"] == "checkpoint"]) == 1
    refused = [e for e in events if e["event"] == "nonfinite_detected"]
    told = sum(e["repeats"] for e in refused)
    assert told > 100 and max(committed_steps(logdir)) < 25  # a refusal every 10 steps, from step 30
    said = out + err
    assert "no checkpoint commits: the snapshot of step" in said and "snapshots refused since step 25" in said, said[-3000:]
    # ... coalesced in lifecycle.jsonl (one record each grew it by ~71 MB a day): the first, at most one
    # a minute, the last (at the trainer's end); procsv status and report still say how many
    span = refused[-1]["time"] - refused[0]["time"]
    assert 2 <= len(refused) <= 2 + span / 60, [(e["time"], e["repeats"]) for e in refused]
    assert refused[0]["repeats"] == 1 and refused[0]["step"] == 25, refused[0]
    status = raw_status(logdir)
    assert status is not None and status["nonfinite_detected"] == told, status
    for command in ("status", "report"):
        shown = run_python(["-m", "procsv", command, logdir], env=quiet_env(), timeout=120)
        assert shown.returncode == 0 and f"{told} time(s) found non-finite" in shown.stdout, shown


def test_a_watchdog_killed_under_on_nonfinite_continue_leaves_procsv_report_counting_what_status_counts(logdir):
    """The coalesced nonfinite_detected records write a trainer's later detections at most once a
    minute: a watchdog SIGKILLed meanwhile never writes the ones it held (up to a minute's). procsv
    report added up the records' repeats alone, so after the kill it said 1 where procsv status (from
    status.json, written as they came) said dozens. The report counts what status.json counts when
    that is more; the lifecycle records lose at most the minute's tail (docs/observability.md)."""
    proc = launch(logdir, "--how", "return", "--nan-at", "25", "--steps", "100000", "--save-steps", "10",
                  "--step-delay", "0.02", target=os.path.join(PROGRAMS, "nan_train.py"),
                  opts=("--on-nonfinite", "continue", *NO_STANDBY))
    try:  # a refusal every 10 steps from step 30: dozens well within the minute after the first record
        wait_for(lambda: (raw_status(logdir) or {}).get("nonfinite_detected", 0) >= 20, 120, what="20 refusals")
    finally:
        os.kill(proc.pid, signal.SIGKILL)  # the watchdog only: its children follow (parent-death signal)
        proc.communicate(timeout=60)
    refused = [e for e in lifecycle(logdir) if e["event"] == "nonfinite_detected"]
    assert refused and refused[0]["step"] == 25 and sum(e["repeats"] for e in refused) < 20, refused
    counted = raw_status(logdir)["nonfinite_detected"]  # type: ignore[index]
    assert counted >= 20
    for command in ("status", "report"):
        shown = run_python(["-m", "procsv", command, logdir], env=quiet_env(), timeout=120)
        assert shown.returncode == 0 and f"{counted} time(s) found non-finite" in shown.stdout, shown


def _unburn(burners: list[subprocess.Popen]) -> None:
    for b in burners:
        if b.poll() is None:
            b.kill()
        b.wait()


def _text(logdir: str, name: str) -> str:
    try:
        with open(os.path.join(logdir, "logs", name)) as fh:
            return fh.read()
    except FileNotFoundError:
        return ""


def test_a_checkpoint_service_loading_tensorflow_for_a_tf_data_iterator_is_not_a_stall_at_load(logdir):
    """Issue 51, point 7, with a CPU-bound process beside the run on its one core (``on_one_core``: less
    CPU for the run than two burners over two cores gave it, half the CPU burnt): a checkpoint that holds a
    tf.data iterator (a variant tensor) makes the checkpoint service import TensorFlow at its first
    commit, which the stall rule (10 s floor) took for a stall: it killed the service before its
    first commit, and its successor began the same import. The service now tells the watchdog it is
    loading, and remembers the need: the next launch's service loads TensorFlow before its Hello."""
    args = ("--input", "iterator", "--steps", "1000000", "--save-steps", "10", "--step-delay", "0.02")
    load: list[subprocess.Popen] = []
    try:
        for launch_no in (1, 2):
            # launch 1: a snapshot deadline of 3 s (the floor is 30 s), which the load outlasts
            extra = quiet_env(**{env.SAVE_DEADLINE: "3"}) if launch_no == 1 else None
            with on_one_core():  # the run and the burner share one core (the run keeps it to its end)
                load = burners()  # the load lasts from the launch to its first checkpoints (the TensorFlow load)
                proc = launch(logdir, *args, target=os.path.join(PROGRAMS, "nan_train.py"), opts=NO_STANDBY,
                              env=extra)
            try:
                before = max(committed_steps(logdir), default=-1)
                wait_for(lambda: proc.poll() is not None or max(committed_steps(logdir), default=-1) > before + 20, 600,
                         what=f"launch {launch_no}'s first checkpoints")
                assert proc.poll() is None, proc.communicate()[1][-3000:]
            finally:
                _unburn(load)  # the orderly stop needs no load
                proc.send_signal(signal.SIGTERM)
                code, out, err = finish(proc, 300)
            assert code == 128 + signal.SIGTERM, err[-3000:]
            events = lifecycle(logdir)
            events = events[max(i for i, e in enumerate(events) if e["event"] == "launch"):]  # this launch's
            assert not [e for e in events if e["event"] == "checkpoint_stalled"], err[-3000:]
            assert [e["attempt"] for e in events if e["event"] == "spawned" and e["role"] == "checkpoint"] == [1]
            service = _text(logdir, "checkpoint.1.log")
            if launch_no == 1:  # found out at its first commit: loaded then, the watchdog told
                assert "loading TensorFlow for this commit (a variant tensor" in service, service[-3000:]
                assert "procsv: the checkpoint service loaded TensorFlow in" in out + err, err[-3000:]
                trainer = _text(logdir, "trainer.1.log")  # the service told the trainer (CommitLoading): slow, not dead
                assert "failed: no result from the checkpoint service" not in trainer, trainer[-3000:]
                loaded = re.search(r"the checkpoint service loaded TensorFlow in ([0-9.]+) s", out + err)
                assert loaded is not None, err[-3000:]
                if float(loaded.group(1)) > 3.5:  # past the 3 s deadline (a quick import may beat it: nothing to see)
                    assert "is slow: the checkpoint service still loads TensorFlow for it" in trainer, trainer[-3000:]
                assert not os.path.exists(os.path.join(logdir, ".procsv", "tmp")) or \
                    not [n for n in os.listdir(os.path.join(logdir, ".procsv", "tmp")) if n.startswith("loading.")]
            else:  # the next launch's service loaded it before it said it was ready
                assert "before saying ready (this run's checkpoints need it: a variant tensor" in service, service
                assert "loading TensorFlow for this commit" not in service
    finally:
        _unburn(load)


def _launch_loading_forever(logdir: str, gate: str) -> tuple[subprocess.Popen, int]:
    """A launch whose first checkpoint service's TensorFlow import (at its first commit, for a
    tf.data iterator's variant tensor) hangs until ``gate`` exists (the fault point in the import
    thread: an import deadlocked on a lock, or blocked on a stalled filesystem). A snapshot deadline
    of 8 s (the floor is 30 s): past the loader's first sign of life, well within the test's wait.
    Returns the launch and the service's pid, once it said it is loading. Steps of 50 ms (20 before): the tests
    wait seconds on deadlines and TensorFlow's imports and count no step, and each step is CPU of the trainer."""
    proc = launch(logdir, "--input", "iterator", "--steps", "1000000", "--save-steps", "10", "--step-delay", "0.05",
                  target=os.path.join(PROGRAMS, "nan_train.py"), opts=NO_STANDBY,
                  env=quiet_env(**{env.SAVE_DEADLINE: "8", env.FAULT: "checkpoint:loading", env.FAULT_GATE: gate}))
    wait_for(lambda: proc.poll() is not None or "loading TensorFlow for this commit" in _text(logdir, "checkpoint.1.log"),
             300, what="the checkpoint service to begin loading TensorFlow at its first commit")
    assert proc.poll() is None, proc.communicate()[1][-3000:]
    stuck = role_pid(logdir, "checkpoint")
    assert stuck is not None
    return proc, stuck


def test_a_checkpoint_service_stopped_while_loading_tensorflow_is_replaced_and_training_goes_on(logdir, tmp_path):
    """A service SIGSTOPped (or in uninterruptible sleep) while it loads TensorFlow for a commit sends
    the trainer no CommitLoading: the trainer's snapshot deadline passes with no progress and it tells the watchdog
    (SaveOverdue), which must replace the service as it does for any stuck commit. The watchdog
    ignored every SaveOverdue while the service had said it was loading (up to 900 s): nothing
    replaced it, and the trainer counted a failed checkpoint at each deadline (three in a row stop
    training: exit 3)."""
    gate = str(tmp_path / "gate")
    proc, stuck = _launch_loading_forever(logdir, gate)
    try:
        os.kill(stuck, signal.SIGSTOP)  # (it said it is loading: its CommitLoading went to the trainer before that line)
        stall = wait_for(lambda: proc.poll() is not None or
                         [e for e in lifecycle(logdir) if e["event"] == "checkpoint_stalled"], 60,
                         what="the watchdog to replace the stopped, loading checkpoint service")
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert stall[0]["pid"] == stuck, stall
        wait_for(lambda: proc.poll() is not None or committed_steps(logdir), 300,
                 what="a checkpoint committed by the replacement service")
        assert proc.poll() is None, proc.communicate()[1][-3000:]
    finally:
        open(gate, "w").close()
        try:
            os.kill(stuck, signal.SIGCONT)
        except ProcessLookupError:
            pass
        proc.send_signal(signal.SIGTERM)
        code, out, err = finish(proc, 300)
    assert code == 128 + signal.SIGTERM, err[-3000:]


def test_a_checkpoint_service_whose_tensorflow_import_hangs_is_replaced_long_before_the_loading_limit(logdir, tmp_path):
    """An import that hangs for real (a deadlock on an import lock, a stalled filesystem) while the
    service's main thread lives: the CommitLoading the loader sends the trainer ('slow, not dead') must
    come only while the import makes progress, or the trainer never finds the commit overdue and
    nothing notices the hang before loading_limit_secs (900 s): no checkpoint for 15 minutes, and a
    kill -9 of the trainer then loses them all. Here the import hangs for up to 120 s (the fault's
    bound); the trainer's 8 s deadline must get the service replaced within a minute."""
    gate = str(tmp_path / "gate")
    proc, stuck = _launch_loading_forever(logdir, gate)
    try:
        stall = wait_for(lambda: proc.poll() is not None or
                         [e for e in lifecycle(logdir) if e["event"] == "checkpoint_stalled"], 60,
                         what="the watchdog to replace the checkpoint service whose import hangs")
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert stall[0]["pid"] == stuck, stall
        wait_for(lambda: proc.poll() is not None or committed_steps(logdir), 300,
                 what="a checkpoint committed by the replacement service")
        assert proc.poll() is None, proc.communicate()[1][-3000:]
    finally:
        open(gate, "w").close()
        proc.send_signal(signal.SIGTERM)
        code, out, err = finish(proc, 300)
    assert code == 128 + signal.SIGTERM, err[-3000:]
