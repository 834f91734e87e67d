"""Where the suite's CPU goes, per test: a pytest plugin, registered by conftest for ``--cpu-log``.

    .venv/bin/python -m pytest -q -n 3 --dist worksteal --cpu-log suite-cpu.jsonl
    .venv/bin/python scripts/suite_cpu.py suite-cpu.jsonl

Runs in each pytest (xdist worker) process. The suite is CPU-bound on 2 cores, so a test's cost is
the CPU it burns, not the seconds it waits: for each test (its setup, call and teardown) this
records the CPU time of the worker itself and of every process the worker waited for (the
kernel's ``RUSAGE_CHILDREN``: a launch's watchdog, its zygote, trainers and services count once
the watchdog reaped them and the test reaped the watchdog). A process a module- or session-scoped
fixture keeps alive is counted in the test during which it is reaped; an orphan nobody waits for
is not counted at all. A run forked by the tests' fork server (``tests/pyfork.py``) counts when it
ends, as the server reports it (``pyfork.uncounted_cpu``); the server's own import in the test of
its first run. One JSON line per test, appended (``O_APPEND``: the workers share the file).
"""

from __future__ import annotations

import json
import os
import resource
import time
from typing import Iterator, Optional

import pytest

import pyfork


def _cpu() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime + pyfork.uncounted_cpu()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: Optional[pytest.Item]) -> Iterator[None]:
    path = item.config.getoption("--cpu-log")
    if not path:
        yield
        return
    cpu0, wall0 = _cpu(), time.monotonic()
    yield
    line = json.dumps({"test": item.nodeid, "cpu": round(_cpu() - cpu0, 3),
                       "wall": round(time.monotonic() - wall0, 3)}) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)
