"""A look at the logdir that fails (EIO, ESTALE: a network filesystem's blip) is not a lost logdir.

The watchdog looks at its logdir every round of its loop (one ``stat``). The path gone or another
directory there stops the run at once (tests/test_bad_input.py, case 12); a look that fails for
another reason is counted (status, metrics) and stops the run only after ``--logdir-timeout``
seconds in which every look failed. The real launches inject the EIO with a fault point
(``PROCSV_FAULT=watchdog:logdir_eio:N-M``): a filesystem that fails ``stat`` on demand cannot be
made here without FUSE.
"""

from __future__ import annotations

import errno
import os

import pytest

from conftest import PROGRAMS, finish, launch, lifecycle, quiet_env, status_json
from procsv.common import faults
from procsv.watchdog.logdirwatch import Look, LogdirHealth

TINY = os.path.join(PROGRAMS, "tiny_train.py")
START = (1, 100)


def test_blips_are_counted_and_forgiven_until_every_look_of_the_timeout_failed():
    health = LogdirHealth(START, timeout=60.0)
    eio = Look(None, errno.EIO)
    assert health.judge(Look(START), 0.0) is None
    for t in range(0, 59):
        assert health.judge(eio, 10.0 + t) is None  # 59 s of failures: not yet
    assert health.errors == 59 and health.last_error == "EIO"
    assert health.judge(Look(START), 69.5) is None  # one good look ends the run of failures
    assert health.judge(Look(None, errno.ESTALE), 70.0) is None
    assert health.judge(Look(None, errno.ESTALE), 129.0) is None
    reason = health.judge(Look(None, errno.ESTALE), 130.0)
    assert reason == "it could not be looked at for 60 s (ESTALE on every look; --logdir-timeout 60)"
    assert health.errors == 62


def test_a_path_that_is_gone_or_another_directory_is_lost_at_once_even_during_blips():
    health = LogdirHealth(START, timeout=60.0)
    assert health.judge(Look(None, errno.EIO), 0.0) is None
    assert health.judge(Look(None), 0.1) == "it was deleted or moved away"
    assert LogdirHealth(START).judge(Look((1, 101)), 0.0) == \
        "it was replaced by another directory (deleted or moved, then created again)"


def test_a_fault_point_fires_on_a_range_of_hits(monkeypatch):
    monkeypatch.setenv("PROCSV_FAULT", "watchdog:testpoint:3-5")
    monkeypatch.delenv("PROCSV_ATTEMPT", raising=False)
    monkeypatch.setattr(faults, "_hits", {})
    assert [faults.fires("watchdog", "testpoint") for _ in range(7)] == [False, False, True, True, True, False, False]
    monkeypatch.setenv("PROCSV_FAULT", "watchdog:other:2")
    assert [faults.fires("watchdog", "other") for _ in range(3)] == [False, True, False]


def test_fault_specs_fire_each_in_the_attempt_it_names_and_only_there(monkeypatch):
    """Several specs, separated by ``,``: each fires at its own hits, in its own attempt of the process (the
    first where it names none); a point named for another attempt is neither fired nor counted."""
    assert faults.parse("checkpoint:before_rename:2@3, watchdog:round,x,checkpoint:mid_delete:1-4") == [
        faults.Spec("checkpoint", "before_rename", 2, 2, 3), faults.Spec("watchdog", "round", 1, 1, 1),
        faults.Spec("checkpoint", "mid_delete", 1, 4, 1)]
    spec = "checkpoint:a:2,checkpoint:b:2@2,checkpoint:a:1@3,checkpoint:a:3@3"
    monkeypatch.setenv("PROCSV_FAULT", spec)
    for attempt, a, b in (("1", [False, True, False], [False] * 3), ("2", [False] * 3, [False, True, False]),
                          ("3", [True, False, True], [False] * 3), ("x", [False] * 3, [False] * 3)):
        monkeypatch.setenv("PROCSV_ATTEMPT", attempt)
        monkeypatch.setattr(faults, "_hits", {})
        assert [faults.fires("checkpoint", "a") for _ in range(3)] == a, attempt
        assert [faults.fires("checkpoint", "b") for _ in range(3)] == b, attempt
        assert not faults.fires("trainer", "a")
    monkeypatch.delenv("PROCSV_ATTEMPT")  # unset: the first attempt
    monkeypatch.setattr(faults, "_hits", {})
    assert [faults.fires("checkpoint", "a") for _ in range(2)] == [False, True]


@pytest.mark.slow
def test_a_launch_whose_logdir_fails_eleven_looks_finishes_and_counts_them(logdir):
    """Before: the first EIO was 'the logdir was lost', and a healthy run ended with exit 1."""
    proc = launch(logdir, "--steps", "400", "--step-delay", "0.01", target=TINY, opts=("--standby", "fork"),
                  env=quiet_env(PROCSV_FAULT="watchdog:logdir_eio:5-15"))
    code, out, err = finish(proc)
    assert code == 0, err
    assert not [e for e in lifecycle(logdir) if e["event"] == "logdir_lost"]
    st = status_json(logdir)
    assert st is not None and st["state"] == "succeeded" and st["step"] == 400
    assert st["logdir_errors"] == {"count": 11, "last": "EIO"}


@pytest.mark.slow
def test_a_logdir_that_fails_every_look_for_the_timeout_stops_the_run_as_lost(logdir):
    proc = launch(logdir, "--steps", "100000", "--step-delay", "0.01", target=TINY,
                  opts=("--standby", "fork", "--logdir-timeout", "2"),
                  env=quiet_env(PROCSV_FAULT="watchdog:logdir_eio:5-1000000"))
    code, out, err = finish(proc)
    assert code == 1, err
    lost = [e for e in lifecycle(logdir) if e["event"] == "logdir_lost"]
    assert len(lost) == 1
    assert lost[0]["reason"].startswith("it could not be looked at for 2 s (EIO on every look; --logdir-timeout 2)")
    assert "was lost while the run was live (it could not be looked at for 2 s (EIO on every look" in err


def test_a_logdir_timeout_that_is_not_positive_is_a_usage_error(tmp_path):
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "procsv", "launch", TINY, "--logdir", str(tmp_path / "r"),
                          "--logdir-timeout", "0"], capture_output=True, text=True, env=quiet_env(), timeout=60)
    assert out.returncode == 2
    assert out.stderr.strip() == "procsv: error: --logdir-timeout must be > 0, not 0"
    assert not os.path.exists(tmp_path / "r")
