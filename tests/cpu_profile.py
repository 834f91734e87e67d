"""Where the suite's CPU goes, per test: a pytest plugin, registered by conftest for ``--cpu-log``.

    .venv/bin/python -m pytest -q -n 5 --dist worksteal --cpu-log suite-cpu.jsonl
    .venv/bin/python scripts/suite_cpu.py suite-cpu.jsonl

Runs in each pytest (xdist worker) process. The suite is CPU-bound on 2 cores, so a test's cost is
the CPU it burns, not the seconds it waits: for each test (its setup, call and teardown) this
records the CPU time the worker and its children burned meanwhile: the worker's own, that of every
process it reaped (the kernel's ``RUSAGE_CHILDREN``: a launch's watchdog, its zygote, trainers and
services count once the watchdog reaped them and the test reaped the watchdog), and the growth of
the CPU of its children not reaped yet, alive or dead (``/proc/<pid>/stat``: each one's own and its
reaped descendants'). A child that outlives its test is charged to each test for what it burned
during it, not all at once to the test that happens to reap it: ``subprocess`` reaps a dropped
``Popen`` at the next one's start, and a plain-python Supervisor's sweep reaped every child of the
worker in a session of its own (``procsv.common.orphans``, since fixed): a test of one second was once
charged an earlier test's processes (``test_summary_api``'s real Supervisor: 48.9 CPU-s in 1.0 s of wall).
Such children are named in the test's line (``left``: pid and command of each child the test leaves
that it did not find). An orphan re-parented away from the worker is not counted at all. One JSON
line per test, appended (``O_APPEND``: the workers share the file). A run forked by the tests' fork
server (``tests/pyfork.py``) is counted as the server's growth: the server is the worker's child, and it
reaps what it forks.
"""

from __future__ import annotations

import json
import os
import resource
import time
from typing import Iterator, Optional

import pytest

_TICK = os.sysconf("SC_CLK_TCK")


def _children() -> list[int]:
    """The pids of this process's children not reaped yet (alive or zombie), every thread's."""
    pids: list[int] = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/children") as fh:
                pids += [int(p) for p in fh.read().split()]
        except OSError:  # a thread gone meanwhile
            continue
    return pids


def _stat_cpu(pid: int) -> float:
    """CPU seconds of ``pid`` (a child not reaped yet) and of the descendants it reaped; 0 if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rpartition(")")[2].split()
    except OSError:
        return 0.0
    return sum(int(f) for f in fields[11:15]) / _TICK  # utime stime cutime cstime (fields 14-17)


def _cpu() -> tuple[float, set[int]]:
    """This process's CPU, its reaped children's, and its unreaped children's, in seconds; and those
    children. A child reaped between the reads would count twice (or not at all): read again then."""
    for _ in range(5):
        reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
        kids = set(_children())
        unreaped = sum(_stat_cpu(pid) for pid in kids)
        own, again = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        if again.ru_utime + again.ru_stime == reaped.ru_utime + reaped.ru_stime:
            break
    return own.ru_utime + own.ru_stime + again.ru_utime + again.ru_stime + unreaped, kids


def _command(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return " ".join(a.decode(errors="replace") for a in fh.read().split(b"\0") if a)[:160] or "(exited)"
    except OSError:
        return "(gone)"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: Optional[pytest.Item]) -> Iterator[None]:
    path = item.config.getoption("--cpu-log")
    if not path:
        yield
        return
    (cpu0, kids0), wall0 = _cpu(), time.monotonic()
    yield
    cpu1, kids1 = _cpu()
    record: dict[str, object] = {"test": item.nodeid, "cpu": round(cpu1 - cpu0, 3),
                                 "wall": round(time.monotonic() - wall0, 3)}
    left = sorted(kids1 - kids0)
    if left:
        record["left"] = [f"{pid} {_command(pid)}" for pid in left]
    line = json.dumps(record) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)
