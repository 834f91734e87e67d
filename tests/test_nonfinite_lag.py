"""A skipped step stays skipped (issue 52) on real processes, on a busy machine: a custom Keras loop
whose snapshots lag the poisoned step, its batch computed by the loop and passed to ``sess.run``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from typing import Iterator

import pytest
import tensorflow as tf

from conftest import PROGRAMS, finish, launch, lifecycle, quiet_env, wait_for, wait_role_pid

NAN_LOOP = os.path.join(PROGRAMS, "nan_keras_loop.py")
# the snapshots lag the poisoned steps by cadence: a checkpoint every 20 steps, no in-memory tier, so
# a NaN at step 55 is rolled back to the state of step 40 and the replay runs 41 .. 54
LAGGING = ("--steps", "80", "--save-steps", "20", "--step-delay", "0.01", "--bind", "args")
NO_MEMORY_TIER = {"PROCSV_MEMORY_SNAPSHOTS": "0"}


@pytest.fixture
def busy() -> Iterator[None]:
    """Two CPU-bound processes beside the test's run (the machine has two cores), killed at the end."""
    procs = [subprocess.Popen([sys.executable, "-c", "while 1: pass"]) for _ in range(2)]
    try:
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def _final_variables(where: str) -> dict[str, bytes]:
    prefix = os.path.join(where, "model.ckpt-80")
    reader = tf.train.load_checkpoint(prefix)
    return {k: reader.get_tensor(k).tobytes() for k in reader.get_variable_to_shape_map()
            if k.endswith("VARIABLE_VALUE") and not k.startswith("save_counter")}


def _plain(tmp_path: str, optimizer: str, skip: tuple[int, ...]) -> dict[str, bytes]:
    """The plain run (no watchdog, no NaN) that never applied the steps ``skip``."""
    where = os.path.join(tmp_path, "plain")
    skips = [a for s in skip for a in ("--skip-at", str(s))]
    done = subprocess.run([sys.executable, NAN_LOOP, "--logdir", where, "--optimizer", optimizer, *LAGGING, *skips],
                          capture_output=True, text=True, env=quiet_env(**NO_MEMORY_TIER), timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return _final_variables(where)


def _skipped(logdir: str) -> list[int]:
    with open(os.path.join(logdir, "logs", "report.json")) as fh:
        return list(json.load(fh).get("skipped_steps") or [])


@pytest.mark.usefixtures("busy")
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_one_poisoned_step_with_lagging_snapshots_is_skipped_once_and_ends_bit_equal(logdir, tmp_path, optimizer):
    # before: the skip of step 55 happened at the boundary inside the run the loop had called with
    # step 55's (poisoned) batch, and procsv then ran that call's step function as step 56: 56 was
    # non-finite, then 57 and 58 the same way, each "skipped", until --max-skips 3 stopped the run
    # with exit code 4 (the restore's run likewise trained the first replayed step on another
    # step's batch). Now a run whose boundary moved the step does not call its step function
    code, out, err = finish(launch(logdir, "--optimizer", optimizer, "--nan-at", "55", *LAGGING, target=NAN_LOOP,
                                   env=quiet_env(**NO_MEMORY_TIER)), 300)
    said = out + err
    assert code == 0, said
    assert "restored step 40 from" in said and "skipped step 55" in said, said
    assert _skipped(logdir) == [55], said
    assert _final_variables(logdir) == _plain(str(tmp_path), optimizer, (55,))  # bit-equal, every variable
