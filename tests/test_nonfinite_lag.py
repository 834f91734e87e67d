"""A skipped step stays skipped (issue 52) on real processes, on a busy machine: a custom Keras loop
whose snapshots lag the poisoned step, its batch computed by the loop and passed to ``sess.run``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Callable

import pytest
import tensorflow as tf

from conftest import (PROGRAMS, cpu_burners_beside, finish, launch, lifecycle, quiet_env, kill_leftovers,
                      sigkill_where_it_says, skipped_steps)

pytestmark = pytest.mark.slow  # starts TensorFlow processes: not in the quick tier

NAN_LOOP = os.path.join(PROGRAMS, "nan_keras_loop.py")
# the snapshots lag the poisoned steps by cadence: a checkpoint every 20 steps, no in-memory tier, so
# a NaN at step 55 is rolled back to the state of step 40 and the replay runs 41 .. 54
LAGGING = ("--steps", "80", "--save-steps", "20", "--step-delay", "0.01", "--bind", "args")
NO_MEMORY_TIER = {"PROCSV_MEMORY_SNAPSHOTS": "0"}


@pytest.fixture
def plain(shared_result: Callable[[str, Callable[[str], None]], str]) -> Callable[..., dict[str, bytes]]:
    """plain(optimizer, skip, *extra, steps=80): the final variables of the plain run (no watchdog, no
    NaN) that never applied the steps ``skip``; each made once per test session."""
    def get(optimizer: str, skip: tuple[int, ...], *extra: str, steps: int = 80) -> dict[str, bytes]:
        skips = [a for s in skip for a in ("--skip-at", str(s))]

        def produce(where: str) -> None:
            done = subprocess.run([sys.executable, NAN_LOOP, "--logdir", where, "--optimizer", optimizer, *LAGGING,
                                   *extra, *skips], capture_output=True, text=True, env=quiet_env(**NO_MEMORY_TIER),
                                  timeout=300)
            assert done.returncode == 0, done.stdout + done.stderr

        name = "nan-loop-plain-" + "-".join([optimizer, *map(str, skip), *extra]).replace("--", "")
        return _final_variables(shared_result(name, produce), steps)
    return get


def _final_variables(where: str, step: int = 80) -> dict[str, bytes]:
    prefix = os.path.join(where, f"model.ckpt-{step}")
    reader = tf.train.load_checkpoint(prefix)
    return {k: reader.get_tensor(k).tobytes() for k in reader.get_variable_to_shape_map()
            if k.endswith("VARIABLE_VALUE") and not k.startswith("save_counter")}


def poisoned_at_55(shared_result: Callable[[str, Callable[[str], None]], str], optimizer: str
                   ) -> tuple[str, int, str, str]:
    """(logdir, exit code, stdout, stderr) of the launch with ``optimizer``, NaN at step 55 and the lagging
    snapshots, beside two CPU burners: made once per test session for the tests that look at it (each
    launched this same run before). As the ``logdir`` fixture does, every process of the run left behind
    is SIGKILLed; the tests fail if any was."""
    def produce(folder: str) -> None:
        logdir = os.path.join(folder, "run")
        with cpu_burners_beside():
            code, out, err = finish(launch(logdir, "--optimizer", optimizer, "--nan-at", "55", *LAGGING,
                                           target=NAN_LOOP, env=quiet_env(**NO_MEMORY_TIER)), 300)
        leftovers = kill_leftovers(logdir)
        with open(os.path.join(folder, "result.json"), "w") as fh:
            json.dump({"code": code, "out": out, "err": err, "leftovers": leftovers}, fh)

    folder = shared_result(f"nan-loop-lagging-{optimizer}-nan-at-55", produce)
    with open(os.path.join(folder, "result.json")) as fh:
        result = json.load(fh)
    assert not result["leftovers"], f"processes of the run were left behind: {result['leftovers']}"
    return os.path.join(folder, "run"), result["code"], result["out"], result["err"]


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_one_poisoned_step_with_lagging_snapshots_is_skipped_once_and_ends_bit_equal(shared_result, plain, optimizer):
    # before: the skip of step 55 happened at the boundary inside the run the loop had called with
    # step 55's (poisoned) batch, and procsv then ran that call's step function as step 56: 56 was
    # non-finite, then 57 and 58 the same way, each "skipped", until --max-skips 3 stopped the run
    # with exit code 4 (the restore's run likewise trained the first replayed step on another
    # step's batch). Now a run whose boundary moved the step does not call its step function
    logdir, code, out, err = poisoned_at_55(shared_result, optimizer)
    said = out + err
    assert code == 0, said
    assert "restored step 40 from" in said and "skipped step 55" in said, said
    assert skipped_steps(logdir) == [55], said
    assert _final_variables(logdir) == plain(optimizer, (55,))  # bit-equal, every variable


def test_two_poisoned_steps_close_together_and_a_sigkill_between_them_each_skipped_once(logdir, tmp_path, plain):
    # steps 55 and 58, both after the checkpoint of step 40; the trainer is SIGKILLed right after the
    # skip of 55 (at step 57 again, before 58 was found): the restarted trainer resumes from step 40.
    # Before: it met step 55 again, retried it, restored step 40 twice more and skipped it again
    # (another two rollbacks, and --max-skips spent on it anew). Now it reads the steps this run
    # skipped (the step_skipped records) and skips 55 when its loop reaches it, then finds 58
    kill_file = str(tmp_path / "kill-me")
    with cpu_burners_beside():
        proc = launch(logdir, "--nan-at", "55", "--nan-at", "58", *LAGGING, "--kill-after", "57", "--kill-visit", "2",
                      "--kill-file", kill_file, target=NAN_LOOP, env=quiet_env(**NO_MEMORY_TIER))
        code, out, err = sigkill_where_it_says(proc, logdir, kill_file, "step 57 after the skip")
    said = out + err
    assert code == 0, said
    first = open(os.path.join(logdir, "logs", "trainer.1.log")).read()
    assert "skipped step 55" in first and "step 58" not in first, first  # killed between the two
    logs = os.path.join(logdir, "logs")
    second = "".join(open(os.path.join(logs, n)).read() for n in sorted(os.listdir(logs))
                     if n.startswith("trainer.") and n.endswith(".log") and n != "trainer.1.log")
    assert "skipping step 55 again" in second and "retrying step 55" not in second, second
    assert "skipped step 58" in second, second
    spawned = [e for e in lifecycle(logdir) if e["event"] == "spawned" and e.get("role") == "trainer"]
    assert len(spawned) == 2, spawned  # the kill's restart, and no other
    assert [e["step"] for e in lifecycle(logdir) if e["event"] == "rolled_back"] == [55, 55, 58, 58]
    assert skipped_steps(logdir) == [55, 58], said
    assert _final_variables(logdir) == plain("sgd", (55, 58))  # bit-equal, every variable


def test_a_nan_first_seen_when_the_loop_ends_is_rolled_back_and_replayed_not_exit_4(logdir, plain):
    # 60 steps, a checkpoint every 20, NaN at 55: the first snapshot after it would be step 60's,
    # the final checkpoint. Before: its check found step 55, exit 4 ("no rollback: the final
    # checkpoint's state"). Now the losses are checked when the loop ends, before the final
    # checkpoint: step 40 is restored and the loop's last step function (it reads sv.step) replays
    # 41 .. 54, retries 55, skips it and trains 56 .. 60 again
    with cpu_burners_beside():
        code, out, err = finish(launch(logdir, "--nan-at", "55", *LAGGING, "--steps", "60", "--bind", "inside",
                                       target=NAN_LOOP, env=quiet_env(**NO_MEMORY_TIER)), 300)
    said = out + err
    assert code == 0, said
    assert "found when the loop ended" in said and "restored step 40 from" in said, said
    assert "skipped step 55" in said and "final checkpoint committed at step 60" in said, said
    assert skipped_steps(logdir) == [55], said
    assert _final_variables(logdir, 60) == plain("sgd", (55,), "--steps", "60", steps=60)


def test_a_step_whose_gradient_is_nan_and_loss_finite_is_found_and_skipped_not_the_next_one(logdir, plain):
    # step 45 adds a loss term whose value is 0 and whose gradient is NaN: its loss is finite, the
    # weights after it are not, and the first non-finite loss is step 46's. Before: 46 was retried
    # and skipped (the replay applied 45 again each time), then 47, 48, until exit 4. Now the skip
    # of 46 finds the weights before it non-finite after the replay, restores again, checks the
    # weights after each replayed step, and skips 45, the step that poisoned them
    with cpu_burners_beside():
        code, out, err = finish(launch(logdir, "--grad-nan-at", "45", *LAGGING, target=NAN_LOOP,
                                       env=quiet_env(**NO_MEMORY_TIER)), 300)
    said = out + err
    assert code == 0, said
    assert "the weights turned non-finite at step 45" in said, said
    # the skip line says why: its gradient, not its loss (which was finite)
    assert "skipped step 45 (its gradient turned the weights non-finite, its loss finite)" in said, said
    assert "skipped step 46" not in said, said
    assert skipped_steps(logdir) == [45], said
    assert _final_variables(logdir) == plain("sgd", (45,))  # bit-equal, every variable


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_the_skip_after_a_failed_retry_puts_back_the_state_before_the_retry_without_a_second_replay(
        shared_result, plain, optimizer):
    # NaN at 55, the newest state before it step 40's: the first rollback restores 40, replays 41 .. 54
    # and retries 55. Before: the retry's NaN restored 40 again and replayed 41 .. 54 a second time
    # (rolled back to 40 twice). Now the state of step 54, kept at the boundary before the retry,
    # is put back: no step is replayed twice, and the result is still bit-equal
    # (the same launch as test_one_poisoned_step_with_lagging_snapshots_is_skipped_once_and_ends_bit_equal's)
    logdir, code, out, err = poisoned_at_55(shared_result, optimizer)
    said = out + err
    assert code == 0, said
    back = [e for e in lifecycle(logdir) if e["event"] == "rolled_back"]
    assert [(e["step"], e["restored_step"], e["skip"]) for e in back] == [(55, 40, False), (55, 54, True)], back
    assert "restored step 54 from the state kept before the retry" in said, said
    assert skipped_steps(logdir) == [55], said
    assert _final_variables(logdir) == plain(optimizer, (55,))  # bit-equal, every variable
