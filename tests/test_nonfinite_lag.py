"""A skipped step stays skipped (issue 52) on real processes, on a busy machine: a custom Keras loop
whose snapshots lag the poisoned step, its batch computed by the loop and passed to ``sess.run``.
The file's six launches are made once per test session, all at once beside one pair of CPU
burners (``loaded``; each test made its own beside burners of its own before); each plain run is made
once per test session (``shared_result``), before the burners start: the load is for the runs under procsv."""

from __future__ import annotations

import os
import re
from typing import Callable

import pytest
import tensorflow as tf

from conftest import PROGRAMS, finish, launch, lifecycle, quiet_env, sigkill_where_it_says, skipped_steps
from loaded_runs import launch_together_loaded, loaded_result
from plain_runs import run_plain_programs

# slow: starts TensorFlow processes (not in the quick tier). The first test to ask for the shared loaded
# window (``loaded``) makes every launch of it in its setup, each with its own 300 s finish bound:
# more than the suite's 900 s per-test timeout in the worst case, which would fail the whole window
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

NAN_LOOP = os.path.join(PROGRAMS, "nan_keras_loop.py")
# the snapshots lag the poisoned steps by cadence: a checkpoint every 20 steps, no in-memory tier, so
# a NaN at step 55 is rolled back to the state of step 40 and the replay runs 41 .. 54
LAGGING = ("--steps", "80", "--save-steps", "20", "--step-delay", "0.01", "--bind", "args")
NO_MEMORY_TIER = {"PROCSV_MEMORY_SNAPSHOTS": "0"}
# every launch: no hot standby prepared beside the trainer (a restart forks one from the pre-warmed trainer); no
# test here is about the standby
FORK = ("--standby", "fork")


# The plain runs (no watchdog, no NaN) the launches are compared with: (optimizer, the steps it never
# applied, extra arguments), each ``python nan_keras_loop.py --optimizer O LAGGING EXTRA --skip-at S ...
# --final-checkpoint <it>/model.ckpt-<its last step>``, all of them in one process (``plain_runs``: one
# TensorFlow import for the six). No logdir, no procsv service: the final state is written with TF's own Checkpoint
PLAIN: tuple[tuple[str, tuple[int, ...], tuple[str, ...]], ...] = (
    ("sgd", (55,), ()), ("adam", (55,), ()), ("sgd", (55, 58), ()), ("sgd", (55,), ("--steps", "60")),
    ("sgd", (45,), ()), ("sgd", (40,), ()))


def _plain_name(optimizer: str, skip: tuple[int, ...], extra: tuple[str, ...]) -> str:
    return "-".join([optimizer, *map(str, skip), *extra]).replace("--", "")


@pytest.fixture
def plain(shared_result: Callable[[str, Callable[[str], None]], str]) -> Callable[..., dict[str, bytes]]:
    """plain(optimizer, skip, *extra, steps=80): the final variables of the plain run of ``PLAIN``
    that never applied the steps ``skip``; every one made once per test session, in one process."""
    def produce(folder: str) -> None:
        run_plain_programs([(NAN_LOOP, ["--optimizer", o, *LAGGING, *extra, *[a for s in skip for a in ("--skip-at", str(s))],
                                        "--final-checkpoint", os.path.join(folder, _plain_name(o, skip, extra),
                                                                           f"model.ckpt-{_last_step([*LAGGING, *extra])}")])
                            for o, skip, extra in PLAIN], env=quiet_env(**NO_MEMORY_TIER), cwd=folder)

    def get(optimizer: str, skip: tuple[int, ...], *extra: str, steps: int = 80) -> dict[str, bytes]:
        assert (optimizer, skip, extra) in PLAIN, (optimizer, skip, extra)
        folder = shared_result("nan-loop-plain-runs", produce)
        return _final_variables(os.path.join(folder, _plain_name(optimizer, skip, extra)), steps)
    return get


def _last_step(args: list[str]) -> int:
    """The step a run of ``nan_keras_loop.py ARGS`` ends at (its last ``--steps``)."""
    return int(args[max(i for i, a in enumerate(args) if a == "--steps") + 1])


def _final_variables(where: str, step: int = 80) -> dict[str, bytes]:
    prefix = os.path.join(where, f"model.ckpt-{step}")
    reader = tf.train.load_checkpoint(prefix)
    return {k: reader.get_tensor(k).tobytes() for k in reader.get_variable_to_shape_map()
            if k.endswith("VARIABLE_VALUE") and not k.startswith("save_counter")}


LOADED = "nan-loop-lagging-loaded"  # the shared_result folder of the file's launches, made beside the burners


def _loaded_runs(folder: str) -> None:
    """The file's six launches, all at once beside one pair of CPU burners (each test made its own
    beside burners of its own before; each test repeats its launch's arguments); each one's logdir is
    ``<folder>/<name>``. All at once (three at a time before): the burners run for one round, not two,
    and take a smaller share beside six launches than beside three."""
    env = quiet_env(**NO_MEMORY_TIER)

    def run(name: str, *args: str) -> tuple[str, Callable[[], tuple[int, str, str]]]:
        logdir = os.path.join(folder, name)
        return logdir, lambda: finish(launch(logdir, *args, target=NAN_LOOP, opts=FORK, env=env), 300)

    def killed_between_55_and_58() -> tuple[int, str, str]:
        logdir, kill_file = os.path.join(folder, "nan-55-58-killed"), os.path.join(folder, "kill-me")
        proc = launch(logdir, "--nan-at", "55", "--nan-at", "58", *LAGGING, "--kill-after", "57", "--kill-visit", "2",
                      "--kill-file", kill_file, target=NAN_LOOP, opts=FORK, env=env)
        return sigkill_where_it_says(proc, logdir, kill_file, "step 57 after the skip")

    launch_together_loaded(folder, {
        "nan-55-58-killed": (os.path.join(folder, "nan-55-58-killed"), killed_between_55_and_58),
        "sgd-nan-55": run("sgd-nan-55", "--optimizer", "sgd", "--nan-at", "55", *LAGGING),
        "adam-nan-55": run("adam-nan-55", "--optimizer", "adam", "--nan-at", "55", *LAGGING),
        "nan-55-loop-ends": run("nan-55-loop-ends", "--nan-at", "55", *LAGGING, "--steps", "60", "--bind", "inside"),
        "grad-nan-45": run("grad-nan-45", "--grad-nan-at", "45", *LAGGING),
        "grad-nan-40": run("grad-nan-40", "--grad-nan-at", "40", *LAGGING, "--wait-commit", "20")})


@pytest.fixture
def loaded(shared_result: Callable[[str, Callable[[str], None]], str],
           plain: Callable[..., dict[str, bytes]]) -> Callable[[str], tuple[str, int, str, str]]:
    """loaded(name): (logdir, code, stdout, stderr) of that launch of ``_loaded_runs``, made once per
    test session; the plain runs the tests compare with are made before, without the burners.
    Every process of a run left behind was SIGKILLed (as the ``logdir`` fixture does): the test fails."""
    plain("sgd", (55,))  # every plain run, in one process
    folder = shared_result(LOADED, _loaded_runs)

    def get(name: str) -> tuple[str, int, str, str]:
        return (os.path.join(folder, name), *loaded_result(folder, name))
    return get


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_one_poisoned_step_with_lagging_snapshots_is_skipped_once_and_ends_bit_equal(loaded, plain, optimizer):
    # before: the skip of step 55 happened at the boundary inside the run the loop had called with
    # step 55's (poisoned) batch, and procsv then ran that call's step function as step 56: 56 was
    # non-finite, then 57 and 58 the same way, each "skipped", until --max-skips 3 stopped the run
    # with exit code 4 (the restore's run likewise trained the first replayed step on another
    # step's batch). Now a run whose boundary moved the step does not call its step function
    # (--optimizer OPTIMIZER --nan-at 55 LAGGING, no in-memory tier)
    logdir, code, out, err = loaded(f"{optimizer}-nan-55")
    said = out + err
    assert code == 0, said
    assert "restored step 40 from" in said and "skipped step 55" in said, said
    assert skipped_steps(logdir) == [55], said
    assert _final_variables(logdir) == plain(optimizer, (55,))  # bit-equal, every variable


def test_two_poisoned_steps_close_together_and_a_sigkill_between_them_each_skipped_once(loaded, plain):
    # steps 55 and 58, both after the checkpoint of step 40; the trainer is SIGKILLed right after the
    # skip of 55 (at step 57 again, before 58 was found): the restarted trainer resumes from step 40.
    # Before: it met step 55 again, retried it, restored step 40 twice more and skipped it again
    # (another two rollbacks, and --max-skips spent on it anew). Now it reads the steps this run
    # skipped (the step_skipped records) and skips 55 when its loop reaches it, then finds 58
    # (--nan-at 55 --nan-at 58 LAGGING --kill-after 57 --kill-visit 2, no in-memory tier; killed where it says)
    logdir, code, out, err = loaded("nan-55-58-killed")
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


def test_a_nan_first_seen_when_the_loop_ends_is_rolled_back_and_replayed_not_exit_4(loaded, plain):
    # 60 steps, a checkpoint every 20, NaN at 55: the first snapshot after it would be step 60's,
    # the final checkpoint. Before: its check found step 55, exit 4 ("no rollback: the final
    # checkpoint's state"). Now the losses are checked when the loop ends, before the final
    # checkpoint: step 40 is restored and the loop's last step function (it reads sv.step) replays
    # 41 .. 54, retries 55, skips it and trains 56 .. 60 again
    # (--nan-at 55 LAGGING --steps 60 --bind inside, no in-memory tier)
    logdir, code, out, err = loaded("nan-55-loop-ends")
    said = out + err
    assert code == 0, said
    assert "found when the loop ended" in said, said
    # the newest snapshot before step 55: the one due at 40 (at load taken a boundary or more late: "restored
    # step 41 from" once), never one at or past the NaN
    restored = [int(n) for n in re.findall(r"restored step (\d+) from", said)]
    assert restored and 40 <= restored[0] < 55, said  # (the first rollback's; the retry's puts back 54)
    assert "skipped step 55" in said and "final checkpoint committed at step 60" in said, said
    assert skipped_steps(logdir) == [55], said
    assert _final_variables(logdir, 60) == plain("sgd", (55,), "--steps", "60", steps=60)


# A step whose gradient is NaN and whose loss is finite (a loss term of value 0 and NaN gradient: a NaN in
# one batch whose loss term stays finite), found by what sees it first, skipped, the run bit-equal:
# * grad-nan-45: the first non-finite loss is step 46's. Before: 46 was retried and skipped (the replay
#   applied 45 again each time), then 47, 48, until exit 4. Now the skip of 46 finds the weights before it
#   non-finite after the replay, restores again, checks the weights after each replayed step, and skips 45
#   (--grad-nan-at 45 LAGGING, no in-memory tier);
# * grad-nan-40: the ordinary case, one step in save_steps: its step is a snapshot's, and the snapshot of
#   step 40 sees the non-finite weights before any loss does (step 41's has not run). Before: exit 4, "only
#   the weights were found non-finite, at a snapshot: the step that made them so is not known". Now they are
#   bisected as a bad step's: restore before step 41, check the weights after each replayed step, skip 40
#   (--grad-nan-at 40 LAGGING --wait-commit 20: the snapshot of 40 taken at step 40, no in-memory tier)
@pytest.mark.parametrize("name, step, found", [
    ("grad-nan-45", 45, "the weights turned non-finite at step 45"),
    ("grad-nan-40", 40, "the weights of the snapshot of step 40 are non-finite, every loss up to it finite")])
def test_a_step_whose_gradient_is_nan_and_loss_finite_is_found_and_skipped_not_the_next_one(
        loaded, plain, name: str, step: int, found: str) -> None:
    logdir, code, out, err = loaded(name)
    said = out + err
    assert code == 0, said
    assert found in said, said
    # the skip line says why: its gradient, not its loss (which was finite)
    assert f"skipped step {step} (its gradient turned the weights non-finite, its loss finite)" in said, said
    assert f"skipped step {step + 1}" not in said, said
    assert skipped_steps(logdir) == [step], said
    assert _final_variables(logdir) == plain("sgd", (step,))  # bit-equal, every variable


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_the_skip_after_a_failed_retry_puts_back_the_state_before_the_retry_without_a_second_replay(
        loaded, plain, optimizer):
    # NaN at 55, the newest state before it step 40's: the first rollback restores 40, replays 41 .. 54
    # and retries 55. Before: the retry's NaN restored 40 again and replayed 41 .. 54 a second time
    # (rolled back to 40 twice). Now the state of step 54, kept at the boundary before the retry,
    # is put back: no step is replayed twice, and the result is still bit-equal
    # (the same launch as test_one_poisoned_step_with_lagging_snapshots_is_skipped_once_and_ends_bit_equal's)
    logdir, code, out, err = loaded(f"{optimizer}-nan-55")
    said = out + err
    assert code == 0, said
    back = [e for e in lifecycle(logdir) if e["event"] == "rolled_back"]
    assert [(e["step"], e["restored_step"], e["skip"]) for e in back] == [(55, 40, False), (55, 54, True)], back
    assert "restored step 54 from the state kept before the retry" in said, said
    assert skipped_steps(logdir) == [55], said
    assert _final_variables(logdir) == plain(optimizer, (55,))  # bit-equal, every variable
