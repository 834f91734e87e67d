"""pytest's assertion rewriting of the test modules, done once per run instead of once per worker.

pytest rewrites each test module's ``assert`` statements when it imports it, and caches the result in
``__pycache__`` only when Python may write bytecode: with ``PYTHONDONTWRITEBYTECODE`` set (as on this
project's machines) every xdist worker rewrote all of them again, about 8 s of CPU a worker at
collection (6,000 asserts), 40 s a run at five workers. The controller (which collects nothing under
xdist) writes the cache here first, split over the cores, with pytest's own rewriting; the workers
then only read it, as pytest reads its cache whatever that setting says. A cache older than its source
is never read (pytest checks the source's hash) and is rewritten here.

This uses pytest's private rewriting functions (``_pytest.assertion.rewrite``): if they are not there,
or fail, nothing is written and each worker rewrites as before; a line says so.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any


def prewrite(config: Any, files: list[Path], procs: int) -> int:
    """Write pytest's rewritten bytecode of ``files`` whose cache is missing or stale, in ``procs``
    processes (forks of this one); return how many were written."""
    if config.getoption("assertmode", "rewrite") != "rewrite":  # --assert=plain: nothing is rewritten
        return 0
    try:
        from _pytest.assertion import rewrite

        state = config.stash[rewrite.assertstate_key]
        todo = [fn for fn in files if rewrite._read_pyc(fn, _pyc(rewrite, fn)) is None]
    except Exception as exc:  # pytest's private API moved: the workers rewrite as before
        print(f"tests/rewrite_cache.py: not written ({type(exc).__name__}: {exc}); each worker rewrites", file=sys.stderr)
        return 0
    if not todo:
        return 0
    chunks = [todo[i::procs] for i in range(procs)]
    children = []
    for chunk in chunks[1:]:
        pid = os.fork()
        if pid == 0:  # pragma: no cover (a fork: reports by exit status)
            code = 0
            try:
                _write(rewrite, state, config, chunk)
            except BaseException:
                code = 1
            finally:
                os._exit(code)
        children.append(pid)
    failed = ""
    try:
        _write(rewrite, state, config, chunks[0])
    except Exception as exc:
        failed = f"{type(exc).__name__}: {exc}"
    for pid in children:
        _, status = os.waitpid(pid, 0)
        if status != 0 and not failed:
            failed = f"a writer exited with status {status}"
    if failed:
        print(f"tests/rewrite_cache.py: part not written ({failed}); the workers rewrite that part", file=sys.stderr)
    return len(todo)


def _pyc(rewrite: Any, fn: Path) -> Path:
    return Path(rewrite.get_cache_dir(fn)) / (fn.stem + rewrite.PYC_TAIL)


def _write(rewrite: Any, state: Any, config: Any, files: list[Path]) -> None:
    for fn in files:
        pyc = _pyc(rewrite, fn)
        if not rewrite.try_makedirs(pyc.parent):
            return
        source_key, code = rewrite._rewrite_test(fn, config)  # (its hash, or its stat in pytest < 9)
        rewrite._write_pyc(state, code, source_key, pyc)
