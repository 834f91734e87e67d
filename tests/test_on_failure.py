"""``procsv launch --on-failure CMD``: the user's command runs once when the run fails, never otherwise."""

from __future__ import annotations

import os

import pytest

from conftest import PROGRAMS, finish, launch

pytestmark = pytest.mark.slow  # starts TensorFlow processes: not in the quick tier


def _env_of(path: str) -> dict[str, str]:
    with open(path) as fh:
        return dict(line.rstrip("\n").split("=", 1) for line in fh if line.startswith("PROCSV_"))


def test_a_run_that_gives_up_runs_the_command_once_with_the_root_cause(logdir, tmp_path):
    out = tmp_path / "hook.txt"
    cmd = f"env >> {out}; echo called >> {tmp_path / 'calls.txt'}"
    code, _, err = finish(launch(logdir, target=os.path.join(PROGRAMS, "imports_syntax_error.py"),
                                 opts=("--on-failure", cmd)), 120)
    assert code == 1
    assert (tmp_path / "calls.txt").read_text() == "called\n"
    got = _env_of(str(out))
    assert got["PROCSV_EXIT_CODE"] == "1" and got["PROCSV_RUN_STATE"] == "failed"
    assert got["PROCSV_LOGDIR"] == os.path.abspath(logdir)
    assert "SyntaxError" in got["PROCSV_ROOT_CAUSE"] and "\n" not in got["PROCSV_ROOT_CAUSE"]
    assert "PROCSV_ROLE" not in got  # no child's variables leak into it
    assert "running --on-failure command" in err


def test_a_run_that_succeeds_never_runs_the_command(logdir, tmp_path):
    calls = tmp_path / "calls.txt"
    code, _, err = finish(launch(logdir, "--steps", "20", opts=("--on-failure", f"echo called >> {calls}",
                                                                "--standby", "fork")), 120)  # no restart: no standby
    assert code == 0, err
    assert not calls.exists() and "--on-failure" not in err


def test_a_failing_command_is_reported_and_does_not_change_the_exit_code(logdir):
    code, _, err = finish(launch(logdir, target=os.path.join(PROGRAMS, "imports_syntax_error.py"),
                                 opts=("--on-failure", "exit 7")), 120)
    assert code == 1
    assert "the --on-failure command exited with code 7" in err
