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
import textwrap

import pytest

from conftest import run_python

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


_ENDS = """
import atexit, sys, threading
atexit.register(lambda: print("atexit", file=sys.stderr))
main = threading.main_thread()
threading.Thread(target=lambda: (main.join(), print("thread", file=sys.stderr))).start()
sys.exit("a message")
"""

_NEVER = """
import atexit, sys, threading, time
atexit.register(lambda: print("atexit", file=sys.stderr))
threading.Thread(target=lambda: [time.sleep(0.05) for _ in iter(int, 1)], name="loader").start()
"""

_FORK = """
import os, sys
from procsv.common import spawn
def child(code, wait):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        os.dup2(w, 2)
        spawn.exit_after(lambda: exec(code, {}) or 0, ends_as_interpreter=lambda: True, threads_wait=wait)
    os.close(w)
    said = b""
    while chunk := os.read(r, 4096):
        said += chunk
    return f"{os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])}|{said.decode()}"
print(child(sys.argv[1], 60), child(sys.argv[2], 0.5), sep="#", end="")
"""


def test_a_forked_child_that_ends_as_the_interpreter_prints_its_exit_message_waits_for_its_threads_then_runs_atexit(
        tmp_path) -> None:
    # what a trainer forked by the zygote does at its program's end (procsv.common.spawn.exit_after), against a
    # fresh interpreter running the same lines: sys.exit's message, the non-daemon thread outliving the main one
    # joined, then the atexit handler; exit code 1. A thread that never ends is waited for a bounded time only
    # (a fresh interpreter waits for good): one line naming it, then the handler, the exit code kept
    forked = run_python(["-c", _FORK, _ENDS, _NEVER], timeout=60)
    fresh = subprocess.run([sys.executable, "-c", _ENDS], capture_output=True, text=True, timeout=60)
    assert (fresh.returncode, fresh.stderr) == (1, "a message\nthread\natexit\n")
    assert forked.returncode == 0, forked.stderr
    ends, never = forked.stdout.split("#")
    assert ends == f"{fresh.returncode}|{fresh.stderr}"
    assert never == ("0|procsv: the program's non-daemon threads (loader) still ran 0.5 s after its end: leaving "
                     "without them (its atexit handlers run now)\natexit\n")
