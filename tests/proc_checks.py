"""Process checks shared by the tests that look for what a run left behind (``test_leftovers``,
``test_hosts``): run in the test process, against real pids."""

from __future__ import annotations

import psutil


def gone(pid: int) -> bool:
    """Killed and reaped (a zombie is not gone: its parent has not collected it)."""
    try:
        psutil.Process(pid)
    except psutil.NoSuchProcess:
        return True
    return False
