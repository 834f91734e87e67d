"""``procsv logs DIR``: print or follow one process's log across its attempts.

Runs in the user's shell (the CLI); it only reads. Each attempt of a role writes
``logs/<role>.<attempt>.log`` (the watchdog rotates them: the first attempt's and the last
``--keep-logs`` stay); the watchdog's own record is ``logs/lifecycle.jsonl``, shown as one line
per event. Printing puts a separator line before each attempt, as ``tail`` does for several
files. Following (``-f``) prints what is appended and every new attempt as it appears, woken by
filesystem events (the ``watchdog`` package), and ends once the run is over (its launch no longer
holds the logdir's lock), like ``docker logs -f``.
"""

from __future__ import annotations

import json
import os
import re
import time
from typing import IO

from procsv.common.errors import UsageError
from procsv.common.layout import Layout, LogdirLock

ROLES = ("trainer", "checkpoint", "summary", "zygote", "watchdog")


def attempts(layout: Layout, role: str) -> list[tuple[int, str]]:
    """The (attempt, path) of every log file of ``role`` that is there, oldest first."""
    if role == "watchdog":
        return [(1, layout.lifecycle)] if os.path.exists(layout.lifecycle) else []
    pattern = re.compile(rf"^{re.escape(role)}\.(\d+)\.log$")
    found = []
    try:
        names = os.listdir(layout.logs)
    except FileNotFoundError:
        return []
    for name in names:
        m = pattern.match(name)
        if m:
            found.append((int(m.group(1)), os.path.join(layout.logs, name)))
    return sorted(found)


def select(found: list[tuple[int, str]], attempt: str, role: str) -> list[tuple[int, str]]:
    """``attempt``: ``all``, ``last`` or a number."""
    if attempt == "all" or not found:
        return found
    if attempt == "last":
        return found[-1:]
    if not attempt.isdigit():
        raise UsageError(f"--attempt must be a number, 'last' or 'all', not {attempt!r}")
    chosen = [f for f in found if f[0] == int(attempt)]
    if not chosen:
        kept = ", ".join(str(n) for n, _ in found)
        raise UsageError(f"no log of {role} attempt {attempt} (kept: {kept}; older ones are rotated away)")
    return chosen


def header(role: str, attempt: int, path: str) -> str:
    return f"==> {role} attempt {attempt} ({path}) <==" if role != "watchdog" else f"==> watchdog ({path}) <=="


def render(role: str, data: str) -> str:
    """A log chunk as printed: the trainer's own text as is; lifecycle events as one line each."""
    if role != "watchdog":
        return data
    lines = []
    for line in data.splitlines(keepends=False):
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        when = time.strftime("%H:%M:%S", time.localtime(float(rec.pop("time", 0.0))))
        event = rec.pop("event", "?")
        fields = " ".join(f"{k}={v}" for k, v in rec.items())
        lines.append(f"{when} {event} {fields}".rstrip() + "\n")
    return "".join(lines)


class _Reader:
    """Reads one file from an offset; for the watchdog's JSON lines, only whole lines."""

    def __init__(self, role: str, path: str) -> None:
        self.role, self.path, self.offset = role, path, 0

    def read(self) -> str:
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                data = fh.read()
        except FileNotFoundError:
            return ""
        if self.role == "watchdog":
            data = data[:data.rfind(b"\n") + 1]
        self.offset += len(data)
        return render(self.role, data.decode("utf-8", errors="replace"))


def show(layout: Layout, role: str, attempt: str, out: IO[str], follow: bool = False,
         liveness_secs: float = 1.0) -> int:
    """Print the selected attempts; with ``follow``, keep printing until the run is over."""
    found = attempts(layout, role)
    if not found and not follow:
        raise UsageError(f"no {role} log in {layout.logs}")
    chosen = select(found, attempt, role)
    readers: dict[str, _Reader] = {}
    for n, path in chosen:
        out.write(header(role, n, path) + "\n")
        reader = readers[path] = _Reader(role, path)
        out.write(reader.read())
    out.flush()
    if not follow:
        return 0
    return _follow(layout, role, readers, max((n for n, _ in found), default=0), out, liveness_secs)


def _follow(layout: Layout, role: str, readers: dict[str, _Reader], last: int, out: IO[str],
            liveness_secs: float) -> int:
    if not os.path.isdir(layout.logs):
        raise UsageError(f"no procsv run in {layout.logdir!r} (no logs/ folder)")
    try:
        return _follow_loop(layout, role, readers, last, out, liveness_secs)
    except KeyboardInterrupt:
        return 0


def _follow_loop(layout: Layout, role: str, readers: dict[str, _Reader], last: int, out: IO[str],
                 liveness_secs: float) -> int:
    from procsv.common.fswake import wakeups

    with wakeups(layout.logs) as woken:
        while True:
            live = LogdirLock.holder(layout) is not None
            for n, path in attempts(layout, role):
                if n > last:  # a new attempt: its separator, then follow it from the start
                    last = n
                    out.write(header(role, n, path) + "\n")
                    readers[path] = _Reader(role, path)
            for reader in readers.values():
                out.write(reader.read())
            out.flush()
            if not live:
                return 0
            # a SIGKILLed launch changes nothing on disk: liveness is also checked on a timer
            woken.wait(liveness_secs)
            woken.clear()
