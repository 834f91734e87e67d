"""The machine's yardstick, printed at the end of a whole run: runs in the pytest controller only.

The suite's minutes depend on the machine as much as on the code: on 2026-12-02 the same code took
17:41 of pytest at noon and 29:21 in the evening, on a fresh machine where a fresh ``import tensorflow``
cost 4.4 CPU-s instead of about 1.9, and a run alone could not tell the code's growth from the
machine's speed. So at the end of a run of at least :data:`MIN_TESTS` tests (the whole suite, not the quick tier
and not a file or two), with every worker gone and the machine as quiet as the run leaves it, the
controller times one fresh ``python -c "import tensorflow"`` (the unit most of the suite's CPU is
made of: every zygote, service that loads TensorFlow and direct run pays it) and prints, in the
terminal summary::

    yardstick: a fresh `import tensorflow` took 4.41 CPU-s (4.9 s, load 0.4); this run 3,175 CPU-s (720 imports' worth)

(the load beside it: other work on the machine slows the import as it slows the run, and a figure
taken beside it says little of the machine)

The run's CPU is this process's and its reaped children's: the xdist workers (reaped at the session's
finish, before the terminal summary) and all they reaped. docs/testing.md's table judges runs by both
figures.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time

import pytest

# fewer tests than this (the quick tier, a file or two) print no yardstick: its 2-5 s are not worth it
MIN_TESTS = 1000


def _cpu(usage: resource.struct_rusage) -> float:
    return usage.ru_utime + usage.ru_stime


def import_cpu() -> float | str:
    """CPU seconds (user + system) of one fresh Python process that imports TensorFlow and exits, or why
    there is no figure (a measuring aid never fails the run it measures)."""
    before = _cpu(resource.getrusage(resource.RUSAGE_CHILDREN))
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    try:
        done = subprocess.run([sys.executable, "-c", "import tensorflow"], env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, timeout=300)
    except subprocess.TimeoutExpired:
        return "the import took more than 300 s"
    if done.returncode != 0:
        return f"the import exited {done.returncode}"
    return _cpu(resource.getrusage(resource.RUSAGE_CHILDREN)) - before


def line(tests: int, quick: bool) -> str | None:
    """The yardstick's line for a run of ``tests`` tests, or None for a run too small to measure."""
    if quick or tests < MIN_TESTS:
        return None
    run_cpu = _cpu(resource.getrusage(resource.RUSAGE_SELF)) + _cpu(resource.getrusage(resource.RUSAGE_CHILDREN))
    started = time.monotonic()
    unit = import_cpu()
    load = os.getloadavg()[0]
    if isinstance(unit, str):
        return f"yardstick: none ({unit}, load {load:.1f}); this run {run_cpu:,.0f} CPU-s"
    return (f"yardstick: a fresh `import tensorflow` took {unit:.2f} CPU-s ({time.monotonic() - started:.1f} s, "
            f"load {load:.1f}); this run {run_cpu:,.0f} CPU-s ({run_cpu / unit:,.0f} imports' worth)")


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, exitstatus: int, config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):
        return
    tests = sum(len(terminalreporter.stats.get(k, [])) for k in ("passed", "failed", "error", "skipped"))
    text = line(tests, bool(config.getoption("--quick")))
    if text:
        terminalreporter.write_line(text)
