"""Rotation of per-attempt log files: keep the first attempt's and the last N, delete the rest.

Runs in the watchdog. Every attempt of every role gets ``logs/<role>.<attempt>.log`` (and, if it
failed on its own, ``logs/<role>.<attempt>.error.json``); a run that restarts its trainer every
few minutes for weeks would otherwise fill ``logs/`` with thousands of them. After the executor
starts attempt K of a role it calls :func:`rotate`, which keeps, for that role:

* attempt 1 (how the run started: import errors, the first restore), and
* the last ``keep`` attempts (K - keep + 1 .. K),

and deletes the log and error file of every other attempt n with 1 < n <= K - keep, unless that
attempt is still live (an early restart on a death notice starts K before K-1 is reaped: K-1's
files are still to be read). Files of a previous launch of the same logdir numbered above K are
left alone until this launch's attempts pass them. Which files go is decided by the pure
:func:`retired`; :func:`rotate` only lists and unlinks. A file that cannot be deleted is left
in place (rotation never stops a run).
"""

from __future__ import annotations

import os
import re
from typing import Collection, Iterable

DEFAULT_KEEP = 10

_NAME = re.compile(r"^(?P<role>[a-z]+[0-9]*)\.(?P<attempt>[0-9]+)\.(?:log|error\.json)$")  # worker1.3.log


def retired(names: Iterable[str], role: str, current: int, keep: int, live: Collection[int] = ()) -> list[str]:
    """The file names (of ``names``, a listing of ``logs/``) that rotation deletes after attempt ``current`` of ``role``.

    Keeps attempt 1, attempts ``current - keep + 1 .. current``, anything above ``current``, any
    attempt in ``live``, and every name that is not a per-attempt file of ``role``.
    """
    if keep < 1:
        raise ValueError(f"keep must be >= 1, not {keep}")
    out = []
    for name in names:
        m = _NAME.match(name)
        if m is None or m.group("role") != role:
            continue
        n = int(m.group("attempt"))
        if 1 < n <= current - keep and n not in live:
            out.append(name)
    return sorted(out)


def rotate(logs: str, role: str, current: int, keep: int, live: Collection[int] = ()) -> list[str]:
    """Delete the per-attempt files of ``role`` that :func:`retired` names; returns the paths deleted."""
    if current - keep <= 1:
        return []  # nothing can be retired yet: skip the listing
    try:
        names = os.listdir(logs)
    except OSError:
        return []
    deleted = []
    for name in retired(names, role, current, keep, live):
        path = os.path.join(logs, name)
        try:
            os.unlink(path)
        except OSError:
            continue
        deleted.append(path)
    return deleted
