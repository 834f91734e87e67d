"""The watchdog survives its own trouble: a stalled terminal, unwritable files, a bug of its own."""

from __future__ import annotations

import json
import os
import signal

import pytest

from conftest import PROGRAMS, committed_steps, finish, launch, lifecycle, quiet_env, raw_status, wait_for

pytestmark = pytest.mark.slow
TINY = os.path.join(PROGRAMS, "tiny_train.py")


def test_a_terminal_that_does_not_read_never_stalls_the_watchdog(logdir):
    # 150 steps x 4 KB of trainer output echoed by the watchdog: far beyond a pipe's 64 KB buffer
    proc = launch(logdir, "--steps", "150", "--step-delay", "0.005", "--chatty", "4000", target=TINY,
                  opts=("--standby", "fork"))  # no restart: no hot standby
    try:
        # nobody reads the launch's stdout: a watchdog blocked on it would stop updating its status
        wait_for(lambda: (raw_status(logdir) or {}).get("state") == "succeeded", 180,
                 what="the run to finish while its stdout is not read")
        assert (raw_status(logdir) or {}).get("step") == 150
    finally:
        code, out, err = finish(proc)  # now drain it
    assert code == 0, err
    assert "line(s) of output were dropped" in out or out.count("tiny: step") == 150


def test_an_unwritable_status_file_is_reported_once_and_the_run_goes_on(logdir):
    proc = launch(logdir, "--steps", "150", "--step-delay", "0.01", target=TINY,
                  opts=("--standby", "fork"))  # no restart: no hot standby
    try:
        wait_for(lambda: (raw_status(logdir) or {}).get("step", 0) > 5, 90, what="training to start")
        status = os.path.join(logdir, ".procsv", "status.json")
        os.unlink(status)
        os.makedirs(os.path.join(status, "blocker"))  # a non-empty directory: rename onto it fails
    finally:
        code, out, err = finish(proc)
    assert code == 0, err
    assert err.count("cannot write") == 1 and "status.json" in err
    finished = [e for e in lifecycle(logdir) if e["event"] == "finished"]
    assert finished and finished[0]["state"] == "succeeded" and finished[0]["step"] == 150


def test_an_internal_error_of_the_watchdog_stops_the_run_in_order(logdir):
    proc = launch(logdir, "--steps", "100000", "--step-delay", "0.01", target=TINY,
                  env=quiet_env(PROCSV_FAULT="watchdog:round"))
    code, out, err = finish(proc)
    assert code == 70, err
    assert "internal error in the watchdog: RuntimeError: injected fault" in err
    with open(os.path.join(logdir, "logs", "watchdog.1.error.json")) as fh:
        record = json.load(fh)
    assert record["type"] == "RuntimeError" and "fault_point" in record["traceback"]
    events = lifecycle(logdir)
    saved = [e for e in events if e["event"] == "checkpoint_committed" and e["reason"] == "preempted"]
    exited = [e for e in events if e["event"] == "exited" and e["role"] == "trainer"]
    assert saved and exited and exited[-1].get("code") == 42  # the emergency checkpoint came first
    assert committed_steps(logdir)[-1] == saved[-1]["step"]
    assert raw_status(logdir)["state"] == "failed"
    # the logdir fixture fails the test if any process of the run is left


def _spawns(logdir: str) -> list[dict]:
    return [e for e in lifecycle(logdir) if e["event"] == "spawned"]


def test_a_zygote_that_does_not_answer_never_blocks_the_watchdog_loop(logdir):
    # restarts fork from the zygote (no standby): the fork request is what it never answers
    # steps of 50 ms: its waits are on events and checkpoints, not on steps (each step costs CPU)
    proc = launch(logdir, "--steps", "100000", "--step-delay", "0.05", "--save-model-secs", "1", target=TINY,
                  opts=("--standby", "fork"))
    try:
        wait_for(lambda: [e for e in lifecycle(logdir) if e["event"] == "zygote_ready"] and committed_steps(logdir),
                 120, what="the pre-warmed trainer and a first checkpoint")
        zygote = next(e["pid"] for e in _spawns(logdir) if e["role"] == "zygote")
        trainer = next(e["pid"] for e in _spawns(logdir) if e["role"] == "trainer")
        os.kill(zygote, signal.SIGSTOP)  # alive, but it will never answer a fork request
        os.kill(trainer, signal.SIGKILL)
        wait_for(lambda: [e for e in lifecycle(logdir) if e["event"] == "restarted"], 30,
                 what="the restart to be asked of the zygote")
        service = next(e["pid"] for e in _spawns(logdir) if e["role"] == "checkpoint")
        os.kill(service, signal.SIGKILL)  # while the fork request is pending
        wait_for(lambda: [e for e in _spawns(logdir) if e["role"] == "trainer" and e["attempt"] == 2], 60,
                 what="the second trainer, started fresh once the zygote's answer is overdue")
        spawns = _spawns(logdir)
        order = [(e["role"], e["attempt"]) for e in spawns]
        # the loop went on while the zygote did not answer: the dead service came back first
        assert order.index(("checkpoint", 2)) < order.index(("trainer", 2)), order
        assert next(e for e in spawns if e["role"] == "trainer" and e["attempt"] == 2)["via"] == "fresh"
        assert [e for e in lifecycle(logdir) if e["event"] == "zygote_gone"]
        newest = max(committed_steps(logdir))
        wait_for(lambda: max(committed_steps(logdir)) > newest, 90, what="checkpoints of the fresh trainer")
    finally:
        proc.send_signal(signal.SIGTERM)
        code, out, err = finish(proc)
    assert code == 128 + signal.SIGTERM, err
    assert "did not answer the fork request" in err  # (no exit status comes from the zygote any more)
