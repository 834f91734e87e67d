"""What a launch's audit leaves the next launch of its logdir, and how the next takes it (issue 71).

Runs in the watchdog. Pure: no clock, no process, no file (the executor writes and reads ``<logdir>/.procsv/audit.json``:
:meth:`~procsv.watchdog.executor.Executor.carry_audit`, :meth:`~procsv.watchdog.executor.Executor.audit_left`). A launch's
end leaves intervals committed and not judged (waiting, being replayed, a candidate undecided, a trainer verdict the
end rolled nothing back for: :func:`~procsv.watchdog.audit.verdict.unrolled`); their checkpoints hold what the next
launch resumes from. :func:`carried` says what the book leaves (persisted at every commit and verdict),
:func:`carry_in` puts it in the next launch's book (replayed first), for the same program, platform and layout only
(another's replays would differ without a fault), and :func:`kept_for_later` says which checkpoints a launch without
``--audit`` holds from retention for the next launch with it.

One concern: the audit's state across launches (its schema, what is carried in, what is held meanwhile).
"""

from __future__ import annotations

import difflib
import json
from typing import Optional

from procsv.watchdog.audit.verdict import QUEUE_MAX, AuditBook, AuditMode, Interval, Newest, waiting

CARRY_VERSION = 1  # the schema of what a launch's audit leaves the next (:func:`carried`)


def carried(book: AuditBook) -> dict[str, object]:
    """What this launch's audit leaves the next launch of its logdir (pure; JSON): the intervals not judged yet (an
    undecided candidate's or trial's, the one being replayed, the ones waiting, by their steps: the next launch finds
    their checkpoints on disk), the newest commit's step (the next launch's first interval starts there), whether the
    program's steps were shown to replay exactly, and the hosts a group's audit spans. An audit switched off leaves
    nothing."""
    if book.off:
        return {"version": CARRY_VERSION, "group": book.group, "program": book.known.program,
                "platform": book.known.platform, "newest": None, "exact": False, "pending": []}
    undecided = [j.interval for j in (book.known.candidate, book.known.trial) if j is not None]
    pending: list[Interval] = []
    for i in sorted([*undecided, *([book.current] if book.current is not None else []), *book.queue],
                    key=lambda i: (i.start, i.end)):
        if i not in pending:
            pending.append(i)
    return {"version": CARRY_VERSION, "group": book.group, "program": book.known.program,
            "platform": book.known.platform, "newest": book.last.step if book.last is not None else None, "exact": book.known.exact, "pending": [[i.start, i.end, i.resumed, i.session_start, i.part] for i in pending]}


def _int(value: object) -> bool:
    """Whether ``value`` (JSON as read back) is an integer, a boolean not taken for one."""
    return isinstance(value, int) and not isinstance(value, bool)


def _read_left(left: object) -> Optional[tuple[list[tuple[int, int, bool, bool, int]], Optional[int], int, bool, int,
                                               str, str]]:
    """:func:`carried`'s JSON as read back: its intervals (start, end, resumed, session_start, part), newest commit,
    group, exactness, version, program and platform; None when it is not what :func:`carried` writes (a file written by hand, a
    person's edit, another tool's): each field of the type written, every interval's steps ``0 <= start < end``. A
    step is never taken from a float, a boolean or a string: a file that says ``Infinity`` or ``200.7`` is not
    read as some other interval."""
    if not isinstance(left, dict):
        return None
    pending, newest, group, exact = left.get("pending", []), left.get("newest"), left.get("group", 0), \
        left.get("exact", False)
    version, program, platform = left.get("version", 0), left.get("program", ""), left.get("platform", "")
    if not (isinstance(pending, list) and (newest is None or _int(newest)) and _int(group) and isinstance(exact, bool)
            and _int(version) and isinstance(program, str) and isinstance(platform, str)):
        return None
    rows: list[tuple[int, int, bool, bool, int]] = []
    for row in pending:
        if not (isinstance(row, list) and len(row) == 5 and _int(row[0]) and _int(row[1]) and 0 <= row[0] < row[1]
                and isinstance(row[2], bool) and isinstance(row[3], bool) and _int(row[4]) and row[4] >= 0):
            return None
        rows.append((row[0], row[1], row[2], row[3], row[4]))
    return rows, newest, group, exact, version, program, platform


def _program_change(then: str, now: str) -> str:
    """What differs between two :func:`~procsv.watchdog.config.program_fingerprint` (``[TARGET, *args, digest]``,
    JSON), for the line that refuses an earlier launch's intervals (pure): another TARGET, its source edited, or the
    arguments that differ, each side's as given (``--steps 1500`` then, ``--steps 3000`` now)."""
    try:
        was, is_ = json.loads(then), json.loads(now)
    except ValueError:
        was, is_ = None, None
    if not (isinstance(was, list) and isinstance(is_, list) and len(was) >= 2 and len(is_) >= 2
            and all(isinstance(x, str) for x in (*was, *is_))):
        return "not said by the earlier launch" if not then else "another program"
    if was[0] != is_[0]:
        return f"TARGET {was[0]} then, {is_[0]} now"
    if was[1:-1] != is_[1:-1]:
        a, b = was[1:-1], is_[1:-1]
        parts = []
        for op, i1, i2, j1, j2 in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes():
            if op == "equal":
                continue
            flag = i1 > 0 and j1 > 0 and a[i1 - 1] == b[j1 - 1] and a[i1 - 1].startswith("-")  # (the option a value is of)
            i1, j1 = (i1 - 1, j1 - 1) if flag else (i1, j1)
            parts.append(f"{' '.join(a[i1:i2]) or '(none)'} then, {' '.join(b[j1:j2]) or '(none)'} now")
        return "arguments: " + "; ".join(parts)[:300]
    return f"{was[0]}'s source edited since"


def carry_in(book: AuditBook, left: object, on_disk: dict[int, str]) -> list[str]:
    """Put what an earlier launch's audit left (``left``: :func:`carried`'s JSON as read back) in this launch's new
    book (pure), ``on_disk`` the committed checkpoints now (step -> path): its intervals whose two checkpoints are both
    on disk wait first (merged as :func:`waiting` merges); the newest commit, if it is still the newest on disk, is
    where the next interval starts (the new trainer resumes from it); the checkpoints after the oldest interval's
    start are noted as an earlier launch's commits (attempt 0: a rollback to that start quarantines them). Returns
    the lines to say (none: nothing was left). An interval whose checkpoint is gone is a hole, said and counted;
    nothing is carried in from an earlier launch of another program, other arguments, another layout, or another
    machine or TensorFlow (a preempted run relaunched on another kind of VM, TensorFlow upgraded: its replays could
    differ without a fault, a false verdict)."""
    if book.mode == AuditMode.OFF or book.off or left is None:
        return []
    read = _read_left(left)
    if read is None:
        return ["procsv: audit: what an earlier launch's audit left (.procsv/audit.json) is not readable; its "
                "intervals, if any, are not audited"]
    rows, newest, group, exact, version, program, platform = read
    if version != CARRY_VERSION or group != book.group or program != book.known.program \
            or platform != book.known.platform:
        other = "of another version" if version != CARRY_VERSION else "of another layout" if group != book.group else \
            (f"of another program or other arguments ({_program_change(program, book.known.program)}: a replay by "
             "this one could differ from its checkpoints without a fault)") if program != book.known.program else \
            (f"on another machine or TensorFlow ({platform or 'not said'} then, {book.known.platform} now: a replay "
             "here could differ from its checkpoints without a fault, the floating-point kernels chosen otherwise)")
        return [f"procsv: audit: an earlier launch's audit {other} left {len(rows)} interval(s) unaudited: not audited "
                "in this launch"] if rows else []
    said, kept = [], []
    for start, end, resumed, session_start, part in rows:
        if start in on_disk and end in on_disk and start < end:
            kept.append(Interval(start, end, on_disk[start], on_disk[end], resumed, session_start, part))
            continue
        book.dropped_steps += max(0, end - start)
        gone = ", ".join(str(s) for s in (start, end) if s not in on_disk)
        said.append(f"procsv: audit: steps {start}-{end} of an earlier launch were not audited and cannot be: the "
                    f"checkpoint(s) of step(s) {gone} are gone")
    if isinstance(newest, int) and on_disk and newest == max(on_disk):
        book.last = Newest(newest, on_disk[newest], None, True)
    if kept:
        book.known.exact = exact
        book.queue = waiting([*kept, *book.queue], book.mode)
        lost = [i for i in kept if not any(j.start <= i.start and i.end <= j.end for j in book.queue)]
        if lost:  # (more than wait for an auditor, none mergeable: each launch's first interval is a resumed one)
            kept = [i for i in kept if i not in lost]
            book.dropped_steps += sum(i.steps for i in lost)
            said.append(f"procsv: audit: steps {', '.join(f'{i.start}-{i.end}' for i in lost)} of an earlier launch "
                        f"were not audited and will not be: more intervals were left than wait for an auditor (at "
                        f"most {QUEUE_MAX}; the oldest dropped, counted in status.json's audit.dropped_steps)")
        floor = min(i.start for i in kept)
        book.commits.update({s: 0 for s in on_disk if s > floor})
        said.append(f"procsv: audit: steps {', '.join(f'{i.start}-{i.end}' for i in kept)}, committed by an earlier "
                    "launch and not audited yet: replayed first")
    return said


def kept_for_later(left: object, program: str, group: int, on_disk: dict[int, str]) -> tuple[list[int], list[str]]:
    """A launch without ``--audit`` of the logdir an earlier launch's audit left intervals unjudged in (``left``:
    :func:`carried`'s JSON as read back; ``program``, ``group``: this launch's, as :func:`carry_in` compares them;
    ``on_disk`` the committed checkpoints, step -> path): the steps retention must keep (both ends of each interval
    still on disk) and the line that says so (pure). Retention in such a launch deleted them otherwise, and the next
    launch with ``--audit`` could replay none of them: a fault in them passed for good (measured: digits, a bit
    flipped at 250, the watchdog killed as 400 commits, a launch without --audit to 1200 kept 5 checkpoints, 800-1200,
    and the next with --audit found 100-400 gone and ended with other weights than a clean run). Another program's,
    another layout's, or a file not readable: nothing (a launch with ``--audit`` says why it takes none)."""
    read = _read_left(left) if left is not None else None
    if read is None:
        return [], []
    rows, _, was_group, _, version, was_program, _ = read
    if version != CARRY_VERSION or was_group != group or was_program != program:
        return [], []
    kept = [(start, end) for start, end, *_ in rows if start in on_disk and end in on_disk]
    if not kept:
        return [], []
    steps = sorted({s for pair in kept for s in pair})
    return steps, [f"procsv: audit: steps {', '.join(f'{s}-{e}' for s, e in kept)}, committed by an earlier launch "
                   "under --audit, are not audited yet and this launch runs without it: their checkpoints (step(s) "
                   f"{', '.join(str(s) for s in steps)}) are kept past retention until a launch with --audit replays "
                   "them (removing .procsv/audit.json lets them go)"]
