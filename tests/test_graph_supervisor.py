"""Graph mode: TF1 graph programs under ``procsv.Supervisor`` with only the import changed.

Every graph program runs in its own process (``tests/programs/tf1_*.py``): eager execution is never
disabled in the pytest process. Where TensorFlow's own class can run the same program, the test
runs it too and compares: procsv must do what TF does (``--tf`` selects TF's classes).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from conftest import PROGRAMS, REPO, quiet_env

TRAIN = os.path.join(PROGRAMS, "tf1_train.py")
CASES = os.path.join(PROGRAMS, "tf1_cases.py")


def _run(argv: list[str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([sys.executable, *argv], capture_output=True, text=True, env=quiet_env(), cwd=REPO,
                          timeout=timeout)
    return done


def _case(name: str, logdir: str, tf_own: bool = False) -> dict:
    done = _run([CASES, name, logdir] + (["--tf"] if tf_own else []))
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith("result ")]
    assert len(lines) == 1, done.stdout + done.stderr[-3000:]
    return json.loads(lines[0][len("result "):])


def _outs(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if line.startswith(("out ", "start ", "done "))]


def test_a_tf1_program_gets_what_a_plain_session_returns_and_its_merge_all_summaries_are_written(tmp_path):
    """The same program under TF's own Supervisor (summary_op=None: TF's fails with merge_all on
    this graph, whose summaries need the fed placeholders) and under procsv's with the default
    summary_op: every run returns the same values in the same structure (op, list, dict, tuple,
    nested with a namedtuple), and the merge_all summaries reach the event file."""
    theirs = _run([TRAIN, "--logdir", str(tmp_path / "tf"), "--steps", "12", "--tf", "--no-summary-op"])
    assert theirs.returncode == 0, theirs.stderr[-3000:]
    ours = _run([TRAIN, "--logdir", str(tmp_path / "ours"), "--steps", "12", "--step-delay", "0.02"])
    assert ours.returncode == 0, ours.stderr[-3000:]
    assert _outs(ours.stdout) == _outs(theirs.stdout)
    assert len([line for line in _outs(ours.stdout) if line.startswith("out ")]) == 10
    acc = EventAccumulator(str(tmp_path / "ours"), size_guidance={"scalars": 0, "histograms": 0})
    acc.Reload()
    losses = acc.Scalars("loss")
    assert losses and all(1 <= e.step <= 12 for e in losses)
    assert acc.Tags()["histograms"]  # merge_all's histogram of w2 too
    assert "cannot run" not in ours.stderr


@pytest.mark.parametrize("case", ["defaults", "no_init_op", "nothing_to_init", "init_fn_only",
                                  "not_ready_for_local_init", "queue_runners", "session_manager"])
def test_the_tf1_arguments_and_session_manager_do_what_tensorflows_do_on_a_fresh_start(case, tmp_path):
    """init_op with init_feed_dict, init_fn, local_init_op, ready_op, ready_for_local_init_op (TF's
    RuntimeErrors), the queue runners started with the session and by start_queue_runners, and
    SessionManager's prepare_session/recover_session/wait_for_session: the same results as
    TensorFlow's own Supervisor and SessionManager."""
    ours = _case(case, str(tmp_path / "ours"))
    theirs = _case(case, str(tmp_path / "tf"), tf_own=True)
    assert ours == theirs
    expected = {
        "defaults": lambda r: r == {"v": 10.0, "local": 5.0, "v_end": 13.0, "step": 3, "log": ["init_fn v=10.0"]},
        "no_init_op": lambda r: r["error"] == "Init operations did not make model ready",
        "nothing_to_init": lambda r: r["error"].startswith("Model is not initialized and no init_op"),
        "init_fn_only": lambda r: r == {"v": 1.0, "log": ["init_fn"]},
        "not_ready_for_local_init": lambda r: "ready for local_init" in r["error"] and "never" in r["error"],
        "queue_runners": lambda r: r["first"] == [2, 3, 4] and r["seven"] == 7,
        "session_manager": lambda r: (r["recover_empty"] is False and r["prepared"] == 4.0
                                      and r["init_fn_saw"] == [3.0] and r["restored"] == 4.0
                                      and r["init_fn_on_restore"] == [] and r["recovered"] == [True, 4.0]
                                      and "not ready" in r["wait_deadline"] and r["wait_ready"] == "Session"
                                      and r["prepare_nothing"].startswith("Model is not initialized and no init_op")),
    }[case]
    assert expected(ours), ours


def test_a_default_summary_op_that_cannot_run_is_said_once_and_turned_off_and_training_goes_on(tmp_path):
    """merge_all over a placeholder no run feeds: TF's summary thread failed the training; procsv
    says so once, turns the default summary_op off, and sv.summary_computed still writes."""
    logdir = str(tmp_path / "run")
    done = _run([CASES, "summary_placeholder", logdir])
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr.count("default summary_op (merge_all) cannot run") == 1, done.stderr[-3000:]
    result = json.loads(done.stdout.split("result ", 1)[1])
    assert result == {"summary_op_off": True, "step": 20}
    acc = EventAccumulator(logdir, size_guidance={"scalars": 0})
    acc.Reload()
    # (computed in the step's own run, so of the global step before the run: TF1's order, 0 at step 1)
    assert [(e.step, e.value) for e in acc.Scalars("hand")] == [(s, 2.0 * (s - 1)) for s in range(1, 21)]
