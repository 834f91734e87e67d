"""A rollback stays exact in programs users write (issue 52, attacked from outside): a custom
loop whose ``tf.function`` step trains on a ``tf.data`` iterator the checkpoint tracks, with the batch
taken inside the step or by the loop and passed in, on real processes, on a busy machine (the file's
three launches made at once beside one pair of CPU burners)."""

from __future__ import annotations

import json
import os
from typing import Callable

import pytest
import tensorflow as tf

from conftest import PROGRAMS, finish, launch, launch_and_kill_trainer_once, lifecycle, quiet_env
from loaded_runs import launch_together_loaded, loaded_result
from plain_runs import run_plain_programs

# slow: starts TensorFlow processes (not in the quick tier). The first test to ask for the shared loaded
# window (``loaded``) makes every launch of it in its setup, each with its own 300 s finish bound:
# more than the suite's 900 s per-test timeout in the worst case, which would fail the whole window
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

NAN_DATA = os.path.join(PROGRAMS, "nan_data_loop.py")
# a checkpoint every 20 steps, no in-memory tier: a NaN at step 35 is rolled back to step 20
LAGGING = ("--steps", "60", "--save-steps", "20", "--step-delay", "0.01", "--wait-commit", "20")
NO_MEMORY_TIER = {"PROCSV_MEMORY_SNAPSHOTS": "0"}
# every launch: no hot standby prepared beside the trainer (a restart forks one from the pre-warmed trainer); no
# test here is about the standby
FORK = ("--standby", "fork")


# The plain runs (no watchdog, no NaN) the launches are compared with: (the steps that took their batch
# and applied nothing, extra arguments), each ``python nan_data_loop.py LAGGING EXTRA --skip-at S ...
# --final-checkpoint <it>/model.ckpt-60``, all of them in one process (``plain_runs``: one TensorFlow import
# for the three). No logdir, no procsv service: the final state is written with TF's own Checkpoint (each
# run's checkpoint service loaded TensorFlow for the iterator's state before: 3 s of CPU a run)
PLAIN: tuple[tuple[tuple[int, ...], tuple[str, ...]], ...] = (
    ((35,), ("--bind", "args")), ((35,), ("--bind", "inside")), ((), ("--bind", "args")))


def _plain_name(skip: tuple[int, ...], extra: tuple[str, ...]) -> str:
    return "-".join(["plain", *map(str, skip), *extra]).replace("--", "")


@pytest.fixture
def plain(shared_result: Callable[[str, Callable[[str], None]], str]) -> Callable[..., dict[str, bytes]]:
    """plain(skip, *extra): the final variables of the plain run of ``PLAIN`` whose steps ``skip``
    took their batch and applied nothing; every one made once per test session, in one process."""
    def produce(folder: str) -> None:
        run_plain_programs([(NAN_DATA, [*LAGGING, *extra, *[a for s in skip for a in ("--skip-at", str(s))],
                                        "--final-checkpoint", os.path.join(folder, _plain_name(skip, extra), "model.ckpt-60")])
                            for skip, extra in PLAIN], env=quiet_env(**NO_MEMORY_TIER), cwd=folder)

    def get(skip: tuple[int, ...], *extra: str) -> dict[str, bytes]:
        assert (skip, extra) in PLAIN, (skip, extra)
        return final_variables(os.path.join(shared_result("nan-data-plain-runs", produce), _plain_name(skip, extra)))
    return get


def final_variables(where: str, step: int = 60) -> dict[str, bytes]:
    """Every model and optimizer variable of the checkpoint of ``step`` (not the data position)."""
    reader = tf.train.load_checkpoint(os.path.join(where, f"model.ckpt-{step}"))
    return {k: reader.get_tensor(k).tobytes() for k in reader.get_variable_to_shape_map()
            if k.endswith("VARIABLE_VALUE") and not k.startswith("save_counter")}


def skipped(logdir: str) -> list[int]:
    with open(os.path.join(logdir, "logs", "report.json")) as fh:
        return list(json.load(fh).get("skipped_steps") or [])


LOADED = "nan-data-loaded"  # the shared_result folder of the three launches made at once beside the burners


def _loaded_runs(folder: str) -> None:
    """The file's three launches, made at once beside one pair of CPU burners (each test made its own
    beside burners of its own before): ``nan-35-args`` and ``nan-35-inside`` (``--bind``, a NaN at
    step 35) and ``restart-args`` (no NaN, the trainer SIGKILLed once past a commit, as
    ``launch_and_kill_trainer_once(past=5)``); each one's logdir is ``<folder>/<name>``."""
    def nan_at_35(bind: str) -> tuple[str, Callable[[], tuple[int, str, str]]]:
        logdir = os.path.join(folder, f"nan-35-{bind}")
        return logdir, lambda: finish(launch(logdir, "--bind", bind, "--nan-at", "35", *LAGGING, target=NAN_DATA,
                                             opts=FORK, env=quiet_env(**NO_MEMORY_TIER)), 900)

    restart = os.path.join(folder, "restart-args")
    launch_together_loaded(folder, {
        "nan-35-args": nan_at_35("args"), "nan-35-inside": nan_at_35("inside"),
        # its steps 0.1 s apart (their values are LAGGING's: the delay is a sleep), so that the SIGKILL past
        # step 25 lands before its end: at 0.01 s the 35 steps left took less than status.json's 0.5 s
        # between writes, and a quiet machine's trainer had ended when it came (ProcessLookupError)
        "restart-args": (restart, lambda: launch_and_kill_trainer_once(
            restart, "--bind", "args", *LAGGING, "--step-delay", "0.1", target=NAN_DATA,
            opts=FORK, env=quiet_env(**NO_MEMORY_TIER), past=5))})


@pytest.fixture
def loaded(shared_result: Callable[[str, Callable[[str], None]], str],
           plain: Callable[..., dict[str, bytes]]) -> Callable[[str], tuple[str, int, str, str]]:
    """loaded(name): (logdir, code, stdout, stderr) of that launch of ``_loaded_runs``, made once per
    test session; the plain runs the tests compare with are made before, without the burners.
    Every process of a run left behind was SIGKILLed (as the ``logdir`` fixture does): the test fails."""
    plain((35,), "--bind", "args")  # every plain run, in one process
    folder = shared_result(LOADED, _loaded_runs)

    def get(name: str) -> tuple[str, int, str, str]:
        return (os.path.join(folder, name), *loaded_result(folder, name))
    return get


@pytest.mark.parametrize("bind", ["args", "inside"])
def test_a_skipped_step_of_a_tf_data_loop_takes_exactly_its_own_batch(loaded, plain, bind):
    # the loop's batches come from a tf.data iterator the checkpoint tracks. "inside": the step
    # function's next(it) takes it; "args": the loop takes it, x, y = next(it), and passes it in
    # (the pattern of TF's checkpoint guide). Before, with "args": the snapshot of step 20 was taken
    # at the boundary inside the run of step 21, after the loop had taken element 21, so it held the
    # iterator one element ahead: after the restore step 21 trained on element 22, ..., step 34 on
    # element 35 (the NaN), and the rollback skipped the healthy step 34 (exit 0, not bit-equal).
    # Now a step handed its input has its boundary after it: the snapshot's data position is its step's
    # (launched beside two CPU burners, with the file's other launches: _loaded_runs)
    logdir, code, out, err = loaded(f"nan-35-{bind}")
    said = out + err
    assert code == 0, said
    assert "restored step 20 from" in said and "skipped step 35" in said, said
    assert skipped(logdir) == [35], said
    assert final_variables(logdir) == plain((35,), "--bind", bind)  # bit-equal, every variable


def test_a_restart_of_a_loop_fed_from_a_checkpointed_iterator_resumes_at_its_own_batch(loaded, plain):
    # "args" again, no NaN: the trainer is SIGKILLed past the checkpoint of step 20 and the restarted
    # one resumes from it. Before: that checkpoint held the iterator one element past step 20
    # (taken inside the run of step 21, after the loop's next(it)): element 21 was never trained and
    # every later step trained on the next step's batch. Now the final variables are bit-equal to
    # a plain run's (launched beside two CPU burners, with the file's other launches: _loaded_runs)
    logdir, code, out, err = loaded("restart-args")
    said = out + err
    assert code == 0, said
    restored = [e["step"] for e in lifecycle(logdir) if e["event"] == "restored"]
    assert len(restored) == 1 and restored[0] >= 20, restored  # the restart resumed from a checkpoint
    assert final_variables(logdir) == plain((), "--bind", "args")  # bit-equal, every variable
