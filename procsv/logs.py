"""``procsv logs DIR``: print or follow one process's log across its attempts.

Runs in the user's shell (the CLI); it only reads. Each attempt of a role writes
``logs/<role>.<attempt>.log`` (the watchdog rotates them: the first attempt's and the last
``--keep-logs`` stay); the watchdog's own record is ``logs/lifecycle.jsonl``, shown as one line
per event. Printing puts a separator line before each attempt, as ``tail`` does for several
files. Following (``-f``) prints what is appended and every new attempt as it appears, woken by
filesystem events (the ``watchdog`` package), and ends once the run is over (its launch no longer
holds the logdir's lock), like ``docker logs -f``. A hot standby writes the trainer's next
attempt log while it waits; until it is promoted that attempt is left out of ``all``, ``last``
and following (its number still selects it). A trainer attempt (or a group's) stopped as hung is
followed by the stacks the watchdog took before its SIGTERM (``<slot>.<attempt>.stacks.txt``).

Attempt numbers start at 1 at every launch of a logdir; the newest launch's files are in
``logs/``, each earlier one's in ``logs/launch-<n>/`` (the watchdog moves them there when the next
launch begins, :func:`procsv.watchdog.logrotate.archive_launch`). ``procsv logs DIR`` shows the
newest launch; ``--launch N`` an earlier one (``N`` as in the ``launch`` record of
``lifecycle.jsonl``; ``--launch list`` lists them). Following is of the newest launch only.
"""

from __future__ import annotations

import json
import os
import re
import time
from typing import IO, AbstractSet, Optional

from procsv.common.errors import UsageError
from procsv.common.layout import Layout, LogdirLock

ROLES = ("trainer", "checkpoint", "summary", "zygote", "watchdog")


_LAUNCH_DIR = re.compile(r"^launch-(\d+)$")


def earlier_launches(layout: Layout) -> list[int]:
    """The numbers of the earlier launches whose logs are kept (``logs/launch-<n>/``), oldest first."""
    try:
        names = os.listdir(layout.logs)
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted(int(m.group(1)) for m in map(_LAUNCH_DIR.match, names) if m is not None)


def launch_folder(layout: Layout, launch: str) -> tuple[str, Optional[int]]:
    """The folder of the launch ``--launch`` names (``newest``, or a number) and that number (None:
    the newest, in ``logs/`` itself)."""
    kept = earlier_launches(layout)
    newest = (kept[-1] if kept else 0) + 1
    if launch == "newest" or launch == str(newest):
        return layout.logs, None
    if not launch.isdigit():
        raise UsageError(f"--launch must be a number, 'newest' or 'list', not {launch!r}")
    if int(launch) not in kept:
        names = ", ".join(map(str, kept)) or "none"
        raise UsageError(f"no logs of launch {launch} in {layout.logs} (earlier launches kept: {names}; the newest "
                         f"is {newest}; older ones are rotated away, see --keep-logs)")
    return layout.launch_logs(int(launch)), int(launch)


def attempts(layout: Layout, role: str, folder: Optional[str] = None) -> list[tuple[int, str]]:
    """The (attempt, path) of every log file of ``role`` that is there (in ``folder``: default the
    newest launch's, ``logs/``), oldest first."""
    if role == "watchdog":
        return [(1, layout.lifecycle)] if os.path.exists(layout.lifecycle) else []
    folder = layout.logs if folder is None else folder
    pattern = re.compile(rf"^{re.escape(role)}\.(\d+)\.log$")
    found = []
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return []
    for name in names:
        m = pattern.match(name)
        if m:
            found.append((int(m.group(1)), os.path.join(folder, name)))
    return sorted(found)


class Spawns:
    """Which trainer attempts the watchdog started as the trainer, and which only as a hot standby
    (its log holds the program's start and a wait; it trains only once promoted), read from
    ``lifecycle.jsonl`` incrementally (it grows for the whole run)."""

    def __init__(self, layout: Layout, launch: Optional[int] = None) -> None:
        self.path = layout.lifecycle
        self.launch = launch  # which launch's spawns (None: the newest's, after the last launch record)
        self.inside = launch is None
        self.offset = 0
        self.trainer: set[int] = set()
        self.standby: set[int] = set()

    def update(self) -> bool:
        """Read what was appended; False if there is no lifecycle file (a run without ``procsv launch``)."""
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                data = fh.read()
        except FileNotFoundError:
            return False
        data = data[:data.rfind(b"\n") + 1]
        self.offset += len(data)
        for line in data.splitlines():
            if b'"spawned"' not in line and b'"launch"' not in line:
                continue
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if rec.get("event") == "launch":  # attempts count from 1 again: another launch's
                if self.launch is None or rec.get("launch") == self.launch:
                    self.trainer, self.standby = set(), set()
                self.inside = self.launch is None or rec.get("launch") == self.launch
            elif self.inside and rec.get("event") == "spawned" and isinstance(rec.get("attempt"), int):
                {"trainer": self.trainer, "standby": self.standby}.get(rec.get("role"), set()).add(rec["attempt"])
        return True

    def only_standby(self) -> set[int]:
        """Attempts that ran only as a standby so far (never promoted to trainer)."""
        return self.standby - self.trainer


def select(found: list[tuple[int, str]], attempt: str, role: str,
           hidden: AbstractSet[int] = frozenset()) -> list[tuple[int, str]]:
    """``attempt``: ``all``, ``last`` or a number; ``hidden`` attempts only by their number."""
    shown = [f for f in found if f[0] not in hidden]
    if attempt == "all" or not found:
        return shown
    if attempt == "last":
        return shown[-1:]
    if not attempt.isdigit():
        raise UsageError(f"--attempt must be a number, 'last' or 'all', not {attempt!r}")
    chosen = [f for f in found if f[0] == int(attempt)]
    if not chosen:
        kept = ", ".join(str(n) for n, _ in found)
        raise UsageError(f"no log of {role} attempt {attempt} (kept: {kept}; older ones are rotated away)")
    return chosen


def stacks_files(folder: str, attempt: int) -> list[str]:
    """The stacks taken before trainer attempt ``attempt`` (or its group's member) was stopped as hung
    (``<slot>.<attempt>.stacks.txt``, named after the member judged), in ``folder``."""
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    pattern = re.compile(rf"^(trainer|worker[0-9]+)\.{attempt}\.stacks\.txt$")
    return sorted(os.path.join(folder, n) for n in names if pattern.match(n))


def header(role: str, attempt: int, path: str, standby: bool = False) -> str:
    if role == "watchdog":
        return f"==> watchdog ({path}) <=="
    return f"==> {role} attempt {attempt}{' (a standby, never promoted)' if standby else ''} ({path}) <=="


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
         liveness_secs: float = 1.0, launch: str = "newest") -> int:
    """Print the selected attempts of the selected launch; with ``follow``, keep printing until the
    run is over (the newest launch only)."""
    if launch == "list":
        kept = earlier_launches(layout)
        for n in kept:
            out.write(f"launch {n}: {layout.launch_logs(n)}\n")
        out.write(f"launch {(kept[-1] if kept else 0) + 1}: {layout.logs} (the newest)\n")
        return 0
    folder, number = launch_folder(layout, launch)
    if number is not None and follow:
        raise UsageError(f"launch {number} has ended: -f follows the newest launch only")
    found = attempts(layout, role, folder)
    if not found and not follow:
        raise UsageError(f"no {role} log in {folder}")
    spawns = Spawns(layout, number)
    standby = spawns.only_standby() if role == "trainer" and spawns.update() else set()
    chosen = select(found, attempt, role, standby)
    readers: dict[str, _Reader] = {}
    for n, path in chosen:
        out.write(header(role, n, path, n in standby) + "\n")
        reader = readers[path] = _Reader(role, path)
        out.write(reader.read())
        if role == "trainer" or role.startswith("worker"):  # a group's stacks file is named after the member judged
            for stacks in stacks_files(folder, n):
                out.write(f"==> the stacks taken before attempt {n} was stopped as hung: {stacks} <==\n")
                try:
                    with open(stacks, errors="replace") as f:
                        out.write(f.read())
                except OSError as exc:
                    out.write(f"(not readable: {exc})\n")
    out.flush()
    if not follow:
        return 0
    last = max((n for n, _ in found if n not in standby), default=0)
    return _follow(layout, role, readers, last, out, liveness_secs, spawns)


def _follow(layout: Layout, role: str, readers: dict[str, _Reader], last: int, out: IO[str],
            liveness_secs: float, spawns: Spawns) -> int:
    if not os.path.isdir(layout.logs):
        raise UsageError(f"no procsv run in {layout.logdir!r} (no logs/ folder)")
    try:
        return _follow_loop(layout, role, readers, last, out, liveness_secs, spawns)
    except KeyboardInterrupt:
        return 0


def _follow_loop(layout: Layout, role: str, readers: dict[str, _Reader], last: int, out: IO[str],
                 liveness_secs: float, spawns: Spawns) -> int:
    from procsv.common.fswake import wakeups

    with wakeups(layout.logs) as woken:
        while True:
            live = LogdirLock.holder(layout) is not None
            launched = role == "trainer" and spawns.update()
            for n, path in attempts(layout, role):
                # a trainer attempt is followed once the watchdog says it started it as the trainer
                # (a hot standby writes the next attempt's log long before it is promoted, if ever)
                if n > last and (not launched or n in spawns.trainer):
                    last = n  # a new attempt: its separator, then follow it from the start
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
