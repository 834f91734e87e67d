"""Rollback of a poisoned step (issue 52) in the programs users write, each at load and each checked
bit-equal against a plain run that never applied the step (or, where rollback is exact only except for
the replay, checked for what it reports): a custom loop with Adam on a learning rate schedule, a
BatchNormalization layer and mixed precision's LossScaleOptimizer (which skips steps of its own);
Keras ``fit`` with a subclassed model
whose ``train_step`` is the Keras guide's, with Adam on a learning rate schedule, and an epoch
rolled back whole under EarlyStopping. The file's six launches are made once per test session, all at
once beside one pair of CPU burners (``loaded``); the plain runs are made once per test session
(``shared_result``), all four in one process (``plain_runs``), before the burners start: the load is
for the runs under procsv."""

from __future__ import annotations

import ast
import os
import re
from typing import Callable

import numpy as np
import pytest

import tensorflow as tf

from conftest import PROGRAMS, finish, launch, quiet_env, sigkill_where_it_says, skipped_steps
from loaded_runs import launch_together_loaded, loaded_result
from plain_runs import run_plain_programs

# slow: starts TensorFlow processes (not in the quick tier). The first test to ask for the shared loaded
# window (``loaded``) makes every launch of it in its setup, each with its own 300 s finish bound:
# more than the suite's 900 s per-test timeout in the worst case, which would fail the whole window
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

KINDS = os.path.join(PROGRAMS, "keras_nan_kinds.py")
NAN_LOOP = os.path.join(PROGRAMS, "nan_keras_loop.py")
# snapshots lag the poisoned step by cadence: a checkpoint every 20 steps, no in-memory tier
LAGGING = ("--steps", "80", "--save-steps", "20", "--step-delay", "0.01", "--bind", "args")
# a custom loop with Adam on a schedule, BatchNormalization and a LossScaleOptimizer that skips 50 and 53 itself
LOSS_SCALED = ("--optimizer", "adam", "--schedule", "--batchnorm", "--loss-scale", "--overflow-at", "50",
               "--overflow-at", "53")
# every launch: no hot standby prepared beside the trainer (a restart forks one from the pre-warmed trainer); no
# test here is about the standby
FORK = ("--standby", "fork")
SharedResult = Callable[[str, Callable[[str], None]], str]


# The plain runs (no watchdog, no NaN) the launches are compared with, each a program run as ``python
# PROGRAM ARGS``, all of them in one process (``plain_runs``: one TensorFlow import for the four; the
# custom loop under mixed precision last): name -> (program, its arguments). A fit writes its weights
# to ``<name>.npz`` in the folder; a custom loop (no logdir, no procsv service) writes its final state
# with TF's own Checkpoint to ``<name>/model.ckpt-80``
PLAIN: dict[str, tuple[str, tuple[str, ...]]] = {
    "custom-step-drop-17": (KINDS, ("--kind", "custom_step", "--drop-at", "17")),
    "validation-adam-schedule-drop-17": (KINDS, ("--kind", "validation", "--adam-schedule", "--drop-at", "17")),
    "adam-skip-45-47": (NAN_LOOP, ("--optimizer", "adam", *LAGGING, "--skip-at", "45", "--skip-at", "47")),
    "loss-scaled-skip-55": (NAN_LOOP, (*LOSS_SCALED, *LAGGING, "--skip-at", "55")),
}


@pytest.fixture(scope="module")
def plain_runs(shared_result: SharedResult) -> str:
    """The folder of every plain run of ``PLAIN``, made once per test session in one process (the
    fits without the callback, as ``--no-callback``; the loops without a logdir, their final state written
    with TF's own Checkpoint)."""
    def produce(folder: str) -> None:
        runs = []
        for name, (program, args) in PLAIN.items():
            where = os.path.join(folder, name)
            runs.append((program, [*args, "--no-callback", "--weights-out", where + ".npz"] if program == KINDS
                         else [*args, "--final-checkpoint", os.path.join(where, "model.ckpt-80")]))
        run_plain_programs(runs, env=quiet_env(PROCSV_MEMORY_SNAPSHOTS="0"), cwd=folder)

    return shared_result("kinds-plain-runs", produce)


@pytest.fixture(scope="module")
def guide_fit_without_17(plain_runs: str) -> dict[str, bytes]:
    """The plain fit of the subclassed model with the guide's train_step that never applied batch 17."""
    return _weights(os.path.join(plain_runs, "custom-step-drop-17.npz"))


@pytest.fixture(scope="module")
def adam_schedule_fit_without_17(plain_runs: str) -> dict[str, bytes]:
    """The plain fit with Adam on a learning rate schedule that never applied batch 17 (two tests
    compare with it: each ran its own before)."""
    return _weights(os.path.join(plain_runs, "validation-adam-schedule-drop-17.npz"))


@pytest.fixture(scope="module")
def loss_scaled_loop_without_55(plain_runs: str) -> str:
    """The folder of the final checkpoint of the plain LOSS_SCALED custom loop that never applied step 55."""
    return os.path.join(plain_runs, "loss-scaled-skip-55")


@pytest.fixture(scope="module")
def adam_loop_without_45_and_47(plain_runs: str) -> str:
    """The folder of the final checkpoint of the plain custom loop with Adam that never applied steps 45 and 47."""
    return os.path.join(plain_runs, "adam-skip-45-47")


def _weights(path: str) -> dict[str, bytes]:
    with np.load(path) as saved:
        return {k: saved[k].tobytes() for k in saved.files}


def _checkpoint(where: str, step: int) -> dict[str, bytes]:
    reader = tf.train.load_checkpoint(os.path.join(where, f"model.ckpt-{step}"))
    return {k: reader.get_tensor(k).tobytes() for k in reader.get_variable_to_shape_map()
            if k.endswith("VARIABLE_VALUE") and not k.startswith("save_counter")}


def _loaded_runs(folder: str) -> None:
    """The file's six launches, all at once beside one pair of CPU burners (each test made its own
    beside burners of its own before; each test repeats its launch's arguments); each one's logdir is
    ``<folder>/<name>``, its weights (if it writes them) ``<folder>/<name>.npz``."""
    def run(name: str, *args: str, target: str, memory_tier: bool = True
            ) -> tuple[str, Callable[[], tuple[int, str, str]]]:
        logdir = os.path.join(folder, name)
        env = quiet_env() if memory_tier else quiet_env(PROCSV_MEMORY_SNAPSHOTS="0")
        return logdir, lambda: finish(launch(logdir, *args, target=target, opts=FORK, env=env), 300)

    def killed_after_20() -> tuple[int, str, str]:
        logdir, kill_file = os.path.join(folder, "adam-schedule-killed"), os.path.join(folder, "kill-me")
        proc = launch(logdir, "--kind", "validation", "--adam-schedule", "--nan-at", "17", "--kill-after", "20",
                      "--kill-file", kill_file, "--weights-out", os.path.join(folder, "adam-schedule-killed.npz"),
                      target=KINDS, opts=FORK, env=quiet_env(PROCSV_MEMORY_SNAPSHOTS="0"))
        return sigkill_where_it_says(proc, logdir, kill_file, "batch 20")

    # all six at once (three at a time before): the burners run for one round, not two, and take a smaller
    # share beside six launches than beside three (the file's CPU, medians of 2: 51.2 -> 45.6 s)
    launch_together_loaded(folder, {
        "adam-schedule-killed": (os.path.join(folder, "adam-schedule-killed"), killed_after_20),
        "custom-step": run("custom-step", "--kind", "custom_step", "--nan-at", "17", "--weights-out",
                           os.path.join(folder, "custom-step.npz"), target=KINDS),
        "early-stopping": run("early-stopping", "--kind", "validation", "--early-stopping", "--epochs", "4",
                              "--batches", "10", "--save-freq", "10", "--nan-at", "19", "--keras-version", "9.9.9",
                              target=KINDS, memory_tier=False),
        "adam-schedule": run("adam-schedule", "--kind", "validation", "--adam-schedule", "--nan-at", "17",
                             "--weights-out", os.path.join(folder, "adam-schedule.npz"), target=KINDS),
        "loss-scaled": run("loss-scaled", *LOSS_SCALED, "--nan-at", "55", *LAGGING, target=NAN_LOOP,
                           memory_tier=False),
        "two-grads": run("two-grads", "--optimizer", "adam", "--grad-nan-at", "45", "--grad-nan-at", "47", *LAGGING,
                         target=NAN_LOOP, memory_tier=False)})


@pytest.fixture
def loaded(shared_result: SharedResult, guide_fit_without_17: dict[str, bytes],
           adam_schedule_fit_without_17: dict[str, bytes], loss_scaled_loop_without_55: str,
           adam_loop_without_45_and_47: str) -> Callable[[str], tuple[str, int, str, str]]:
    """loaded(name): (logdir, code, stdout, stderr) of that launch of ``_loaded_runs``, made once per
    test session after every plain run (without the burners). Every process of a run left behind was
    SIGKILLed (as the ``logdir`` fixture does): the test fails."""
    folder = shared_result("kinds-loaded", _loaded_runs)

    def get(name: str) -> tuple[str, int, str, str]:
        return (os.path.join(folder, name), *loaded_result(folder, name))
    return get


def test_keras_fit_of_a_subclassed_model_with_the_guides_train_step_skips_a_poisoned_batch_bit_equal(
        loaded, guide_fit_without_17: dict[str, bytes]) -> None:
    # a subclassed model built with model.build((None, 4)) has no variable yet (Keras creates them
    # when fit first traces its step) and a train_step with its own Mean loss tracker. Before:
    # BackupAndRestore built the optimizer for the model's variables before fit, none then, and fit's
    # first step failed ("Unknown variable: guide_model/dense/kernel ... This optimizer can only be
    # called for the variables it was originally built with"), twice, a start-up failure; a plain fit
    # ran. Now the layers are built first, as fit's own symbolic build does
    logdir, code, out, err = loaded("custom-step")  # --kind custom_step --nan-at 17
    weights = logdir + ".npz"
    said = out + err
    assert code == 0, said
    assert "skipped step 18" in said, said  # batch 17 of fit is global step 18
    assert skipped_steps(logdir) == [18], said
    assert _weights(weights) == guide_fit_without_17


def test_keras_fit_an_epoch_rolled_back_whole_in_the_fallback_reports_no_loss_and_early_stopping_is_not_fooled(
        loaded) -> None:
    # an untested Keras (the fallback: restore, continue with fit's next batch), a commit every 10
    # batches (an epoch) and no in-memory tier: the NaN of batch 19, the last of epoch 2, is found
    # at the epoch's end and restores step 10, the end of epoch 1; none of epoch 2's batches stands.
    # Before: epoch 2's logs were the metrics fit had reset for it, {"loss": 0.0}, a loss no batch
    # had: EarlyStopping(monitor="loss", patience=0) took 0.0 as its best and stopped fit after
    # epoch 3 (20 iterations of 40, exit 0). Now that epoch has no "loss" (EarlyStopping passes it
    # by, with Keras' own warning) and fit trains its 4 epochs (30 iterations: 11-20 not trained)
    # (--kind validation --early-stopping --epochs 4 --batches 10 --save-freq 10 --nan-at 19 --keras-version 9.9.9)
    logdir, code, out, err = loaded("early-stopping")
    said = out + err
    assert code == 0, said
    assert "restored step 10 from" in said and "steps 11-20 of fit's batches are not trained again" in said, said
    done = re.search(r"fit done: (\d+) iterations, history (\{.*\})", said)
    assert done is not None, said
    history = ast.literal_eval(done.group(2))
    assert len(history["val_loss"]) == 4, history  # every epoch ran: EarlyStopping was not fooled
    assert 0.0 not in history["loss"] and len(history["loss"]) == 3, history  # epoch 2 reports no loss
    assert int(done.group(1)) == 30, said


def test_keras_fit_with_adam_and_a_learning_rate_schedule_skips_a_poisoned_batch_bit_equal_to_a_fit_without_it(
        loaded, adam_schedule_fit_without_17: dict[str, bytes]) -> None:
    # exact, as for custom loops (whose skip leaves the optimizer alone): bit-equal to a fit that never
    # applied the batch, whose iterations (they drive the schedule and Adam's bias correction) did not
    # count it. Before, Keras fit's skip advanced iterations without an update: 30 against the plain fit's 29,
    # and every weight differs (measured: 4 of 4 arrays); no plain fit gives what it gives (a fit with
    # sample weight 0 for the batch would decay Adam's moments). Now the skip leaves iterations alone
    logdir, code, out, err = loaded("adam-schedule")  # --kind validation --adam-schedule --nan-at 17
    weights = logdir + ".npz"
    said = out + err
    assert code == 0, said
    assert skipped_steps(logdir) == [18], said
    assert _weights(weights) == adam_schedule_fit_without_17


def test_a_custom_loop_with_a_schedule_batchnorm_and_a_loss_scale_optimizer_skips_exactly_the_poisoned_step(
        loaded, loss_scaled_loop_without_55: str) -> None:
    # one launch for three things a skip must leave as a run that never applied the step would: the
    # optimizer's iterations (they drive Adam's ExponentialDecay schedule and its bias correction),
    # BatchNormalization's moving statistics (non-trainable variables the step updates, NaN after
    # the poisoned one), and a LossScaleOptimizer's scale and counters under mixed_float16, which
    # skips steps 50 and 53 itself (their scaled gradients overflow float16; their losses are finite:
    # not procsv's to skip; the BatchNormalization makes it skip a few more) and halves its scale at each. Step 55's input is NaN: snapshots at 40,
    # the skip puts back the state of 54 kept before the retry. Found as specified (no defect)
    logdir, code, out, err = loaded("loss-scaled")  # LOSS_SCALED --nan-at 55 LAGGING, no in-memory tier
    said = out + err
    assert code == 0, said
    assert "restored step 40 from" in said and "restored step 54 from the state kept before the retry" in said, said
    assert skipped_steps(logdir) == [55], said
    plain = loss_scaled_loop_without_55
    mine, theirs = _checkpoint(logdir, 80), _checkpoint(plain, 80)
    scale = "optimizer/dynamic_scale/.ATTRIBUTES/VARIABLE_VALUE"
    assert np.frombuffer(theirs[scale], np.float32)[0] <= 8192.0  # it skipped 50, 53 (and others) itself
    assert any("moving_mean" in k for k in mine), sorted(mine)
    assert mine == theirs  # bit-equal, every variable


def test_two_poisoned_gradients_close_together_are_each_skipped_once_within_the_restore_bound(
        loaded, adam_loop_without_45_and_47: str) -> None:
    # steps 45 and 47 add a loss term whose value is 0 and whose gradient is NaN (their losses are
    # finite: 46 and 48 show them). Before: the restore bound counted each poisoning twice (the step
    # that showed it, then the step the bisect found), so the second one, within 10 steps of the
    # snapshot of 40, was the third finding: exit 4 ("the snapshot of step 40 turned non-finite
    # within 10 steps of each of 3 restores (at steps 46, 45, 48)") with --max-skips 3 unspent. Now
    # the bisect's step replaces the one that showed it: both skipped, bit-equal
    # (--optimizer adam --grad-nan-at 45 --grad-nan-at 47 LAGGING, no in-memory tier)
    logdir, code, out, err = loaded("two-grads")
    said = out + err
    assert code == 0, said
    assert "skipping step 45, not step 46" in said and "skipping step 47, not step 48" in said, said
    assert skipped_steps(logdir) == [45, 47], said
    plain = adam_loop_without_45_and_47
    assert _checkpoint(logdir, 80) == _checkpoint(plain, 80)  # bit-equal, every variable


def test_keras_fit_with_adam_and_a_schedule_killed_after_a_poisoned_batch_resumes_and_skips_it_exactly(
        loaded, adam_schedule_fit_without_17: dict[str, bytes]) -> None:
    # the trainer is SIGKILLed after batch 20 (the NaN of batch 17 found or not yet: the check rides
    # on the snapshots, which lag at load); the restarted fit resumes from a committed checkpoint at
    # or before step 16, meets batch 17 again and skips it. Exact across the restart: the skip
    # counts no iteration in either attempt (Adam's schedule and bias correction), bit-equal to a
    # fit that never applied the batch (on main: not, the skip counted an iteration)
    # (--kind validation --adam-schedule --nan-at 17 --kill-after 20, no in-memory tier; killed where it says)
    logdir, code, out, err = loaded("adam-schedule-killed")
    weights = logdir + ".npz"
    said = out + err
    assert code == 0, said
    assert re.search(r"was killed by SIGKILL; restart(ed|ing in \d)", said) and "skipped step 18" in said, said
    assert skipped_steps(logdir) == [18], said
    assert _weights(weights) == adam_schedule_fit_without_17
