"""Rotation of per-attempt log files: keep the first attempt's and the last N, delete the rest.

Runs in the watchdog. Every attempt of every role gets ``logs/<role>.<attempt>.log`` (and, if it
failed on its own, ``logs/<role>.<attempt>.error.json``; if it was found hung, the stacks taken
before its kill, ``logs/<role>.<attempt>.stacks.txt``); a run that restarts its trainer every
few minutes for weeks would otherwise fill ``logs/`` with thousands of them. After the executor
starts attempt K of a role it calls :func:`rotate`, which keeps, for that role:

* attempt 1 (how the run started: import errors, the first restore), and
* the last ``keep`` attempts (K - keep + 1 .. K),

and deletes the log and error file of every other attempt n with 1 < n <= K - keep, unless that
attempt is still live (an early restart on a death notice starts K before K-1 is reaped: K-1's
files are still to be read). Files of a previous launch of the same logdir numbered above K are
left alone until this launch's attempts pass them. Which files go is decided by the pure
:func:`retired`; :func:`rotate` only lists and unlinks. A file that cannot be deleted is left
in place (rotation never stops a run). The watchdog and the node agents run :func:`rotate` in a
thread of their own (it lists and unlinks in the logdir), never in their loops.

Each launch of a logdir begins with :func:`archive_launch`: the previous launch's per-attempt
files move into ``logs/launch-<n>/`` (its number), so attempt numbers, which start at 1 at every
launch, name this launch's files only: a relaunch neither appends to nor echoes the previous
launch's logs. The last ``keep`` earlier launches are kept.
"""

from __future__ import annotations

import os
import re
from typing import Collection, Iterable

from procsv.common import faults

DEFAULT_KEEP = 10

_NAME = re.compile(r"^(?P<role>[a-z]+[0-9]*)\.(?P<attempt>[0-9]+)\.(?:log|error\.json|stacks\.txt)$")  # worker1.3.log
_ANY_ATTEMPT = re.compile(r"^[a-z][a-z0-9-]*\.[0-9]+\.(?:log|error\.json|stacks\.txt)$")  # zygote-node1.1.log too
LAUNCH_DIR = re.compile(r"^launch-(?P<n>[0-9]+)$")


def launches(names: Iterable[str]) -> list[int]:
    """The numbers of the earlier launches kept in ``logs/`` (a listing of it), oldest first."""
    return sorted(int(m.group("n")) for m in map(LAUNCH_DIR.match, names) if m is not None)


def archive_plan(names: Iterable[str], keep: int) -> tuple[int, list[str], list[int]]:
    """Pure: from a listing of ``logs/``, (the number of the launch that begins, the per-attempt
    files of the previous one to move into its ``launch-<n>/``, the earlier launches' folders to
    delete so that ``keep`` are left). The previous launch is numbered one above the newest folder;
    a launch that left no per-attempt file gets no folder (its number is the next one's)."""
    names = list(names)
    done = launches(names)
    files = sorted(n for n in names if _ANY_ATTEMPT.match(n))
    previous = (done[-1] if done else 0) + 1
    if files:
        done.append(previous)
        return previous + 1, files, done[:-keep] if len(done) > keep else []
    return previous, [], done[:-keep] if len(done) > keep else []


def archive_launch(logs: str, keep: int) -> int:
    """Move the previous launch's per-attempt files into ``logs/launch-<n>/`` and delete the
    earlier launches' folders beyond ``keep``; returns this launch's number. Whatever cannot be
    moved or deleted stays (a log is never a reason not to run)."""
    import shutil

    try:
        names = os.listdir(logs)
    except OSError:
        return 1
    current, files, drop = archive_plan(names, keep)
    if files:
        folder = os.path.join(logs, f"launch-{current - 1}")
        try:
            os.makedirs(folder, exist_ok=True)
        except OSError:
            return current
        for name in files:
            try:
                os.replace(os.path.join(logs, name), os.path.join(folder, name))
            except OSError:
                continue
    for n in drop:
        shutil.rmtree(os.path.join(logs, f"launch-{n}"), ignore_errors=True)
    return current


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
    faults.stall("watchdog", "rotate_stall")  # tests only: a listing that blocks, as on a stalled filesystem
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
