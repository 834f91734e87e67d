"""A restarted trainer's wait for the processes it replaces (procsv.trainer.ends.predecessors.py): real processes,
real pidfds; no TensorFlow (the launch that needs it: tests/test_standby_own_server.py)."""

from __future__ import annotations

import subprocess
import sys
import time

from procsv.trainer.ends.predecessors import wait_gone


def test_the_wait_ends_when_the_process_has_exited_not_before_and_a_reaped_one_is_not_waited_for(capsys) -> None:
    dying = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.3)"])
    gone = subprocess.Popen(["true"])
    gone.wait()  # reaped: no pidfd can be had of it
    t0 = time.monotonic()
    assert wait_gone((dying.pid, gone.pid), bound=10.0) == []
    assert dying.poll() == 0  # it had exited (its pidfd said so: no wait here) ...
    assert time.monotonic() - t0 >= 0.2  # ... and the wait lasted until then
    assert capsys.readouterr().err == ""


def test_a_process_that_does_not_end_is_named_in_one_line_once_the_bound_passed(capsys) -> None:
    stuck = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        t0 = time.monotonic()
        assert wait_gone((stuck.pid,), bound=0.2) == [stuck.pid]
        assert 0.2 <= time.monotonic() - t0 < 5
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"process(es) {stuck.pid} of this host still not gone 0.2 s" in err, err
    finally:
        stuck.kill()
        stuck.wait()
