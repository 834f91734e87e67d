"""End-to-end: `procsv launch` on the built-in example, with real processes and real signals."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from typing import NamedTuple

import pytest

from conftest import (CLEAN_ARGS, PROGRAMS, REPO, committed_steps, final_weights, finish, launch, lifecycle, quiet_env,
                      raw_status, role_pid, run_python, wait_role_pid, run_processes, status_json, wait_for)

pytestmark = pytest.mark.slow


def _restore_with_plain_tf(path: str):
    """Restore a checkpoint of the digits example with nothing but TensorFlow and Keras."""
    import keras
    import tensorflow as tf

    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(10)])
    optimizer = keras.optimizers.Adam(1e-3)
    optimizer.build(model.trainable_variables)
    step = tf.Variable(0, dtype=tf.int64)
    before = [v.numpy().copy() for v in model.trainable_variables]
    tf.train.Checkpoint(model=model, optimizer=optimizer, global_step=step).restore(path).assert_consumed()
    changed = any((b != v.numpy()).any() for b, v in zip(before, model.trainable_variables))
    return int(step.numpy()), changed


def test_example_finishes_and_its_final_checkpoint_restores_with_plain_tf(logdir):
    import tensorflow as tf
    from tensorboard.backend.event_processing import event_accumulator as ea

    proc = launch(logdir, "--steps", "400", "--save-model-secs", "1", "--save-summaries-secs", "1",
                  opts=("--standby", "fork"))  # it restarts nothing: no hot standby prepared to wait unused
    code, out, err = finish(proc)
    assert code == 0, err
    latest = tf.train.latest_checkpoint(logdir)
    assert latest == os.path.join(logdir, "model.ckpt-400")
    step, changed = _restore_with_plain_tf(latest)
    assert step == 400 and changed
    acc = ea.EventAccumulator(logdir, size_guidance={ea.SCALARS: 0})
    acc.Reload()
    losses = acc.Scalars("loss")
    assert [e.step for e in losses] == list(range(10, 401, 10))
    assert losses[-1].value < losses[0].value
    st = status_json(logdir)
    assert st["state"] == "succeeded" and st["step"] == 400 and st["restarts"] == 0
    assert st["last_checkpoint"] == {"step": 400, "path": latest}
    assert "trainer finished at step 400" in out


class KilledRun(NamedTuple):
    logdir: str
    victim: int  # the pid of the SIGKILLed trainer
    code: int
    out: str
    err: str


@pytest.fixture(scope="module")
def killed_and_resumed(shared_result) -> KilledRun:
    """One digits run of CLEAN_ARGS checkpointing every 100 steps whose trainer is SIGKILLed once its
    first checkpoint committed (a commit at step 100 or later), run to its end (the default hot
    standby); made once per test session (``shared_result``: every pytest-xdist worker reads the
    same run), and the restart tests below each check their part of it. Every process of the run is
    killed at its end, and a run that left one behind is not kept."""
    def produce(folder: str) -> None:
        logdir = os.path.join(folder, "run")
        proc = launch(logdir, *CLEAN_ARGS, "--save-checkpoint-steps", "100")
        victim = 0
        try:
            wait_for(lambda: committed_steps(logdir), 90, what="the first checkpoint")
            victim = wait_role_pid(logdir, "trainer")
            os.kill(victim, signal.SIGKILL)
        finally:
            code, out, err = finish(proc)
            leftovers = run_processes(logdir)
            for p in leftovers:
                p.kill()
        assert not leftovers, f"processes of the run were left behind: {[p.pid for p in leftovers]}"
        with open(os.path.join(folder, "result.json"), "w") as fh:
            json.dump({"victim": victim, "code": code, "out": out, "err": err}, fh)

    folder = shared_result("launch-killed-and-resumed", produce)
    with open(os.path.join(folder, "result.json")) as fh:
        result = json.load(fh)
    return KilledRun(os.path.join(folder, "run"), result["victim"], result["code"], result["out"], result["err"])


def test_sigkill_of_the_trainer_restarts_it_from_the_latest_checkpoint(killed_and_resumed):
    logdir, victim, code, out, err = killed_and_resumed
    assert code == 0, err
    st = status_json(logdir)
    steps = int(CLEAN_ARGS[CLEAN_ARGS.index("--steps") + 1])
    assert st["state"] == "succeeded" and st["restarts"] == 1 and st["step"] == steps, (st, err[-4000:])
    assert st["restored_step"] > 0
    trainer = next(p for p in st["processes"] if p["role"] == "trainer")
    assert trainer["pid"] != victim and trainer["restarts"] == 1
    assert f"restored step {st['restored_step']}" in out
    with open(os.path.join(logdir, "logs", "trainer.2.log")) as fh:
        assert f"restored step {st['restored_step']}" in fh.read()
    events = lifecycle(logdir)
    killed = [e for e in events if e["event"] == "exited" and e.get("pid") == victim]
    assert killed and killed[0]["signal"] == "SIGKILL"
    assert [e["step"] for e in events if e["event"] == "restored"] == [st["restored_step"]]


def test_a_killed_and_resumed_run_ends_with_bit_identical_weights(killed_and_resumed, clean_weights):
    """The reference is conftest's uninterrupted run of the same CLEAN_ARGS (made once per session);
    this run checkpoints every 100 steps, so its kill comes after a commit at step 100 or later."""
    logdir, _, code, _, err = killed_and_resumed
    assert code == 0, err
    assert status_json(logdir)["restarts"] == 1
    a, b = clean_weights, final_weights(logdir)
    assert a.keys() == b.keys() and len([k for k in a if "_trainable_variables" in k]) == 4
    for key in a:
        assert (a[key] == b[key]).all(), f"{key} differs after a kill and resume"


def test_sigint_checkpoints_the_last_step_and_leaves_no_process(logdir):
    """Ctrl-C to the launch: exit 130, the emergency checkpoint holds the last step, nothing is left
    running. (SIGTERM, with a later launch resuming from exactly that step: ``procsv stop`` in
    test_a_second_launch_on_a_live_logdir_is_refused_...)"""
    proc = launch(logdir, "--steps", "100000", "--step-delay", "0.005", "--save-model-secs", "1000")
    try:
        wait_for(lambda: (raw_status(logdir) or {}).get("step", 0) > 20, 90, what="training to start")
        children = run_processes(logdir)
        assert len(children) >= 4
        proc.send_signal(signal.SIGINT)
    finally:
        code, out, err = finish(proc)
    assert code == 128 + signal.SIGINT, err
    gone = wait_for(lambda: not run_processes(logdir), 5, what="every process of the run to exit")
    assert gone
    st = status_json(logdir)
    assert st["state"] == "stopped"
    assert committed_steps(logdir)[-1] == st["step"] > 20  # the emergency checkpoint holds the last step
    assert any(e["event"] == "preempted" for e in lifecycle(logdir))


def test_sigkill_of_the_watchdog_takes_every_process_of_the_run_along(logdir):
    proc = launch(logdir, "--steps", "100000", "--step-delay", "0.01")
    try:
        wait_for(lambda: len(run_processes(logdir)) >= 4 and (raw_status(logdir) or {}).get("step", 0) > 0, 90,
                 what="four processes")
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        wait_for(lambda: not run_processes(logdir), 2.0, interval=0.02, what="no survivors within 2 s")
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
    assert status_json(logdir)["state"] == "failed"  # its watchdog is gone: not reported as running
    # the dead launch's lock is stale: a new launch takes it over and resumes
    saved = committed_steps(logdir)
    again = launch(logdir, "--steps", str((saved[-1] if saved else 0) + 20),
                   opts=("--standby", "fork"))  # it restarts nothing: no hot standby
    code, out, err = finish(again)
    assert code == 0, err
    if saved:
        assert f"restored step {saved[-1]} " in out


def test_a_second_launch_on_a_live_logdir_is_refused_status_lists_four_processes_stacks_reads_them_live_and_procsv_stop_saves_the_last_step(
        logdir):
    """One live run for all of these (the default hot standby: a fifth process, never listed among
    the processes of ``status.json``; tests/test_standby.py):

    * a second launch on its logdir is refused (exit 2, naming the live run's pid) and starts nothing;
    * ``procsv status --json`` lists four live processes (watchdog, trainer, checkpoint, summary) with
      distinct pids, the watchdog's the launch's, none restarted, and ``procsv status`` says running;
    * ``procsv stop`` from another shell (a SIGTERM to the watchdog) stops the run in order: exit 143,
      every process gone, the emergency checkpoint holds the last step (the periodic ones are 1000 s
      apart), a ``preempted`` event; a second ``procsv stop`` finds no run;
    * a later launch resumes from exactly that step."""
    # steps of 20 ms: every check waits on an event (step > 20, a running status), not on a step count
    proc = launch(logdir, "--steps", "100000", "--step-delay", "0.02", "--save-model-secs", "1000")
    stop_asked = False
    try:
        wait_for(lambda: raw_status(logdir), 60, what="the first launch to start")
        second = launch(logdir, "--steps", "10")
        code, out, err = finish(second, timeout=60)
        assert code == 2, "the second launch"
        assert "in use by a live procsv run" in err and str(proc.pid) in err
        wait_for(lambda: (raw_status(logdir) or {}).get("step", 0) > 20, 90, what="training to start")
        st = wait_for(lambda: (s := status_json(logdir)) and s["step"] > 0 and
                      sum(p["alive"] for p in s["processes"]) == 4 and s, 90, what="a running status")
        assert st["state"] == "running"
        roles = {p["role"]: p for p in st["processes"]}
        assert set(roles) == {"watchdog", "trainer", "checkpoint", "summary"}
        assert len({p["pid"] for p in st["processes"]}) == 4
        assert roles["watchdog"]["pid"] == proc.pid
        assert all(p["restarts"] == 0 for p in st["processes"])
        human = run_python(["-m", "procsv", "status", logdir], env=quiet_env(), timeout=30)
        assert human.returncode == 0 and "running" in human.stdout and "trainer" in human.stdout
        assert len(run_processes(logdir)) >= 4
        # `procsv stacks`: the live trainer's threads, its main thread in the example's training loop,
        # read without stopping it (the run trains on after it)
        stacks = run_python(["-m", "procsv", "stacks", logdir], env=quiet_env(), timeout=60)
        assert stacks.returncode == 0, stacks.stderr
        head = stacks.stdout.splitlines()[0]
        assert head.startswith(f"trainer (pid {roles['trainer']['pid']}): in "), stacks.stdout
        assert "(digits.py:" in stacks.stdout and "'MainThread'" in stacks.stdout, stacks.stdout
        assert all(role not in stacks.stdout for role in ("checkpoint (pid", "summary (pid", "watchdog (pid"))
        read = json.loads(run_python(["-m", "procsv", "stacks", logdir, "--all", "--json"], env=quiet_env(),
                                     timeout=60).stdout)
        assert {p["role"] for p in read["processes"]} == set(roles) and not any(p["error"] for p in read["processes"])
        at = (raw_status(logdir) or {}).get("step", 0)
        wait_for(lambda: (raw_status(logdir) or {}).get("step", 0) > at, 30, what="training to go on after the stacks")
        out = run_python(["-m", "procsv", "stop", logdir], env=quiet_env(), timeout=200)
        stop_asked = True
        assert out.returncode == 0, out.stderr
        assert "run stopped" in out.stdout
    finally:
        if not stop_asked:  # failed before the stop: end the run
            proc.send_signal(signal.SIGTERM)
        code, stdout, err = finish(proc)
    assert code == 128 + signal.SIGTERM, err
    gone = wait_for(lambda: not run_processes(logdir), 5, what="every process of the run to exit")
    assert gone
    st = status_json(logdir)
    assert st["state"] == "stopped"
    assert committed_steps(logdir)[-1] == st["step"] > 20  # the emergency checkpoint holds the last step
    assert any(e["event"] == "preempted" for e in lifecycle(logdir))
    again = run_python(["-m", "procsv", "stop", logdir], env=quiet_env(), timeout=60)
    assert again.returncode == 2 and "no live procsv run" in again.stderr
    stacks = run_python(["-m", "procsv", "stacks", logdir], env=quiet_env(), timeout=60)
    assert stacks.returncode == 2 and "no live procsv run" in stacks.stderr
    saved = st["step"]  # a later launch resumes from exactly that step
    code, out, err = finish(launch(logdir, "--steps", str(saved + 30), opts=("--standby", "fork")))  # restarts nothing
    assert code == 0, err
    assert f"restored step {saved} " in out
    assert status_json(logdir)["step"] == saved + 30


def test_a_target_that_does_not_exist_is_one_clear_line_and_starts_nothing(logdir):
    code, out, err = finish(launch(logdir, target="no_such_module.train"), timeout=60)
    assert code == 2
    lines = [l for l in err.splitlines() if l.strip()]
    assert len(lines) == 1 and "no_such_module.train" in lines[0] and lines[0].startswith("procsv: error:")
    assert lifecycle(logdir) == []
    code, out, err = finish(launch(logdir, target="missing/train.py"), timeout=60)
    assert code == 2 and "missing/train.py" in err and "does not exist" in err and "check the path" in err


def test_a_target_that_fails_at_import_gives_its_traceback_and_no_restart_loop(logdir):
    code, out, err = finish(launch(logdir, target=os.path.join(PROGRAMS, "fails_at_import.py")), timeout=120)
    assert code == 1
    assert "RuntimeError: boom: the model config is broken" in err
    assert "start-up failure" in err
    spawned = [e for e in lifecycle(logdir) if e["event"] == "spawned" and e["role"] == "trainer"]
    assert 1 <= len(spawned) <= 2
    import json

    with open(os.path.join(logdir, "logs", "trainer.1.error.json")) as fh:
        record = json.load(fh)
    assert record["type"] == "RuntimeError" and record["phase"] == "startup"
    assert "fails_at_import.py" in record["traceback"]
    assert status_json(logdir)["state"] == "failed"


def test_an_unwritable_logdir_is_a_clear_error_before_anything_starts(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    logdir = str(blocker / "run")
    code, out, err = finish(launch(logdir), timeout=60)
    assert code == 2
    assert "not writable" in err and logdir in err
    assert not run_processes(logdir)


def test_unknown_flags_print_usage():
    out = run_python(["-m", "procsv", "launch", "procsv.examples.digits", "--logdir", "x", "--bogus-flag"],
                     env=quiet_env(), cwd=REPO, timeout=60)
    assert out.returncode == 2
    assert "usage:" in out.stderr and "--bogus-flag" in out.stderr


def test_plain_python_run_without_launch_checkpoints_and_resumes(logdir):
    cmd = ["-m", "procsv.examples.digits", "--logdir", logdir, "--save-model-secs", "1"]
    first = run_python(cmd + ["--steps", "300"], env=quiet_env(), timeout=180)
    assert first.returncode == 0, first.stderr
    assert committed_steps(logdir)[-1] == 300
    second = run_python(cmd + ["--steps", "350"], env=quiet_env(), timeout=180)
    assert second.returncode == 0, second.stderr
    assert "restored step 300 " in second.stdout
    assert committed_steps(logdir)[-1] == 350
