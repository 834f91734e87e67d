"""A SIGTERM that reaches a trainer process while its interpreter tears down changes nothing.

Runs real ``python -m procsv.trainer`` processes (a fresh trainer, as a group's worker or a ``--ps``
worker is started without the zygote). The watchdog sends a group's worker its stopping SIGTERM
again every ``stop_resend_secs`` while it lives (rules 2 and 6), and a job-wide stop may send
another. Python puts a signal's default action back where a Python handler was, at its
finalization (before the modules are torn down: 1.7 s with TensorFlow here); a SIGTERM then killed
the process, and its clean exit 0 (or a preemption's 42 with its report) was seen as a death by
SIGTERM.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # starts TensorFlow processes: not in the quick tier

HERE = os.path.dirname(os.path.abspath(__file__))


def test_a_sigterm_during_the_interpreters_teardown_keeps_the_exit_code(tmp_path) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "procsv.trainer", os.path.join(HERE, "programs", "slow_teardown.py")],
                            cwd=str(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        said = []
        for line in proc.stderr:  # (ends at the process's end at the latest)
            said.append(line)
            if line.startswith("tearing down"):
                break
        assert said and said[-1].startswith("tearing down"), said
        proc.send_signal(signal.SIGTERM)  # the watchdog's resend, while the teardown still runs (3 s)
        assert proc.wait(30) == 0  # before: -15, the program's clean end taken for a death by SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
