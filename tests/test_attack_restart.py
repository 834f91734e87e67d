"""Attacks on the "same failure again" rule of the restart policy (f7b6912), on real launches.

False positive: a run that fails the same way after the same number of steps of each attempt, but
trains further each time and would end (a data stream that resets its connection after a fixed number
of batches), is stopped after three attempts, where the same run with ``os._exit`` (no error file)
trains to its end (tests/test_watchdog.py's crash-after-every-checkpoint). False negative: the PTB
pattern the rule was made for, with the global step in its error message, restarts at once again and
again (the storm the rule was to end).
"""

from __future__ import annotations

import os
import time

import pytest

from conftest import PROGRAMS, committed_steps, finish, launch, lifecycle

pytestmark = pytest.mark.slow

STREAM_DROPS = os.path.join(PROGRAMS, "stream_drops.py")
FAILS_NAMING_STEP = os.path.join(PROGRAMS, "fails_naming_step.py")


def test_a_run_that_trains_further_each_attempt_and_fails_the_same_way_each_time_trains_to_its_end(logdir):
    # 100 steps, 20 per attempt (the stream's quota), a checkpoint every 10: five attempts, each further
    code, out, err = finish(launch(logdir, "--steps", "100", "--save-steps", "10", "--batches-per-connection", "20",
                                   target=STREAM_DROPS), 300)
    said = out + err
    starts = [e for e in lifecycle(logdir) if e["event"] == "spawned" and e["role"] == "trainer"]
    assert "the trainer failed the same way" not in said, (committed_steps(logdir), said)
    assert code == 0 and "stream_drops: done at step 100" in out, said
    assert len(starts) >= 5, starts


def test_a_deterministic_error_whose_message_names_the_step_is_no_restart_storm(logdir):
    proc = launch(logdir, target=FAILS_NAMING_STEP)
    deadline = time.monotonic() + 150
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(1)
    still = proc.poll() is None
    if still:
        os.killpg(proc.pid, 9)
    out, err = proc.communicate()
    starts = [e for e in lifecycle(logdir) if e["event"] == "spawned" and e["role"] == "trainer"]
    # the same ValueError at the same line after 20 steps of every attempt; only its number grows
    assert not still and proc.returncode == 1, (f"still restarting after 150 s: {len(starts)} attempts",
                                                 (out + err)[-3000:])
    assert len(starts) <= 4, starts
