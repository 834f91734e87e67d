"""Non-finite training (issue 41) on real processes: exit code 4 "diverging" under ``procsv launch``,
detection of a non-finite loss, never committing a poisoned state, and the ``--on-nonfinite`` policies."""

from __future__ import annotations

import os

from conftest import PROGRAMS, finish, launch, lifecycle, status_json

EXIT_TRAIN = os.path.join(PROGRAMS, "exit_train.py")


def _events(logdir: str, kind: str, role: str = "") -> list[dict]:
    return [e for e in lifecycle(logdir) if e["event"] == kind and (not role or e.get("role") == role)]


def test_a_trainer_that_exits_4_ends_the_launch_diverging_failed_no_restart_on_failure_runs(logdir, tmp_path):
    # before: a trainer's exit 4 was a failure like any other: restarted (at once after progress)
    calls = tmp_path / "calls.txt"
    proc = launch(logdir, "--exit-at-step", "5", "--exit-code", "4", target=EXIT_TRAIN,
                  opts=("--max-restarts", "5", "--on-failure", f"echo $PROCSV_EXIT_CODE >> {calls}"))
    code, out, err = finish(proc, 180)
    assert code == 4, err
    assert len(_events(logdir, "spawned", "trainer")) == 1
    assert not _events(logdir, "restarting")
    assert "giving up: the trainer is diverging" in err, err
    assert calls.read_text() == "4\n"
    st = status_json(logdir)
    assert st is not None and st["state"] == "failed"
