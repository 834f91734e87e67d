"""Failures as data: how a child ended, with the traceback it wrote itself.

Runs in the watchdog. When a child is reaped the watchdog builds a :class:`Failure` from its exit
status and, if the child wrote one, its error file (``logs/<role>.<attempt>.error.json``, written
atomically by the child: :func:`procsv.common.bootstrap.write_error_file`, or into the runtime
directory if the logdir could not take it; read by :func:`procsv.watchdog.children.read_child_error`).
Pure data: this module reads no file. Every message about a
death -- the line on stderr, ``last_error`` in ``status.json``, the ``exited`` event -- is rendered
from this record instead of being assembled where the death is handled.
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass
from typing import Any, Optional

from procsv.common.exitcodes import EXIT_PREEMPTED

# Deaths by these signals come from another process (the OOM killer, a flapping node, a user's
# ``kill``, procsv's own chaos), never from a fault of the program itself; SIGSEGV, SIGABRT, SIGBUS,
# SIGFPE, SIGILL, SIGPIPE, ... are the program's own. The start-up failure rule counts only the latter.
OUTSIDE_SIGNALS = frozenset({signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGHUP})
_FRAME = re.compile(r'\s*File "([^"]+)", line (\d+), in (.+)$')  # a frame of a Python traceback
_NUMBER = re.compile(r"\d+(\.\d+)?")  # a number in an exception's message
# the lines of a TensorFlow op error's message that say where the op was defined, not what failed
_TF_WHERE = ("File ", "Detected at node ", "[[")


@dataclass(frozen=True)
class ChildError:
    """What a child recorded about its own failure."""

    type: str
    message: str
    traceback: str
    phase: str
    steps: Optional[int] = None  # the steps a trainer completed before it (None: not said)
    committed: bool = False  # a checkpoint of a step past the one it began at committed while it lived

    @property
    def place(self) -> str:
        """The innermost frame of its traceback, ``path:line in function`` ("" without one)."""
        for line in reversed(self.traceback.splitlines()):
            found = _FRAME.match(line)
            if found:
                return f"{found.group(1)}:{found.group(2)} in {found.group(3)}"
        return ""

    @property
    def fingerprint(self) -> Optional[tuple[str, str, str, int]]:
        """What makes two trainer failures the same one: the exception's type, its message with every
        number blanked (a message naming the step or a size is the same failure), where it was raised,
        after how many steps of the attempt. None: the steps were not said, or a checkpoint committed
        while it lived (an attempt that saved progress of its own before failing is never "the same
        failure again": a run that crashes the same way after every checkpoint goes on)."""
        if self.steps is None or self.committed:
            return None
        return self.type, _NUMBER.sub("#", self.message), self.place, self.steps


@dataclass(frozen=True)
class ExitReport:
    """What a trainer said about its own exit with code 42 before it exited (its exit report,
    ``<runtime dir>/<role>.<attempt>.exit.json``, written atomically by
    :mod:`procsv.trainer.__main__` and read at the reap): a SIGTERM/SIGINT stopped it and the
    checkpoint of its last step committed. Written only then, so its presence is the claim."""

    stop_signal: str  # the stop signal it received: "SIGTERM" or "SIGINT"
    steps_completed: int

    @staticmethod
    def from_record(record: Any, pid: int) -> Optional["ExitReport"]:
        """The report in ``record`` (parsed JSON) if ``pid`` wrote it and it claims a saved
        preemption; None for anything else (another process's, malformed, no claim)."""
        if not isinstance(record, dict) or record.get("pid") != pid or record.get("preempted") is not True:
            return None
        sig, steps = record.get("signal"), record.get("steps_completed")
        if not isinstance(sig, str) or not isinstance(steps, int) or isinstance(steps, bool):
            return None
        return ExitReport(sig, steps)


@dataclass(frozen=True)
class Failure:
    """How one attempt of one role ended (``code`` < 0: killed by signal ``-code``)."""

    role: str
    attempt: int
    pid: int
    code: int
    time: float  # wall-clock time the end was noticed
    log_path: str
    error: Optional[ChildError] = None
    exit_report: Optional[ExitReport] = None  # a trainer's own account of an exit with code 42
    unread: str = ""  # what could not be read at its end, and why (a stalled logdir): decided without it
    # another host's member: whether a signal of the watchdog reached it alive before its end (its agent
    # says: False, whatever killed it, it was not the watchdog); None: a member of the watchdog's own host
    signalled: Optional[bool] = None

    @property
    def preempted(self) -> bool:
        """Exit code 42 and the trainer's exit report: a SIGTERM/SIGINT stopped it and its checkpoint
        committed. A 42 without the report (``sys.exit(42)``, ``os._exit(42)``, TensorFlow's own
        ``PreemptionCheckpointHandler`` without a procsv commit) is a failure like any other code."""
        return self.code == EXIT_PREEMPTED and self.exit_report is not None

    def fields(self) -> dict[str, Any]:
        """The exit status as ``lifecycle.jsonl`` records it: ``{"code": n}`` or ``{"signal": name}``."""
        name = signal_name(self.code)
        return {"signal": name} if name else {"code": self.code}

    def headline(self, before_first_step: bool = False) -> str:
        """One line: who, how, and the child's own exception if it recorded one. A member asked of a host that was
        lost before it started it has pid 0 (:meth:`~procsv.watchdog.multihost.remote.RemoteMembers.lost`): it never
        started, and nothing killed it (before: "worker1 attempt 3 (pid 0) was killed by SIGKILL: HostLost")."""
        head = f"{self.role} attempt {self.attempt} (pid {self.pid}) {describe(self.code)}" if self.pid else \
            f"{self.role} attempt {self.attempt} never started"
        if self.code == EXIT_PREEMPTED and self.exit_report is None:
            head += (" of its own, not as a preemption (that is a SIGTERM/SIGINT to the trainer and its checkpoint "
                     "committed): a failure")
        if before_first_step:
            head += " before completing a step"
        if self.error is not None:
            head += f": {self.error.type}: {one_line(self.error.message)}"
        if self.unread:
            head += f" ({self.unread})"
        return head

    def root_cause(self, before_first_step: bool = False, note: str = "") -> str:
        """The headline (with ``note`` appended), the child's traceback indented, and where its log is."""
        head = self.headline(before_first_step) + (f" ({note})" if note else "")
        lines = [head]
        if self.error is not None and self.error.traceback.strip():
            lines += ["  | " + line for line in self.error.traceback.rstrip().splitlines()]
        lines.append(f"  (full log: {self.log_path})")
        return "\n".join(lines)


def one_line(message: str) -> str:
    """An exception's message as one line: its first line, and when that only heads what follows (ends with ":",
    as TensorFlow's ``Graph execution error:``, then where the op was defined, then what failed) the first line
    after it that is not where; a "..." says lines were left out (they are in the error file and the log).
    Before, a member's line, ``last_error`` and the ``breaker`` record held TensorFlow's whole message: a dozen
    lines of frames for a peer's collective failure, the cause on the ninth."""
    lines = [ln.strip() for ln in message.splitlines() if ln.strip()]
    if len(lines) <= 1:
        return lines[0] if lines else ""
    head, rest = lines[0], lines[1:]
    if head.endswith(":"):
        said = next((ln for ln in rest if not ln.startswith(_TF_WHERE)), None)
        if said is not None:
            return f"{head} {said}" + (" ..." if len(lines) > 2 else "")
    return f"{head} ..."


def signal_name(code: Optional[int]) -> Optional[str]:
    if code is None or code >= 0:
        return None
    try:
        return signal.Signals(-code).name
    except ValueError:
        return str(-code)


def killed_from_outside(code: Optional[int]) -> bool:
    """``code`` (subprocess's convention) is a death by one of :data:`OUTSIDE_SIGNALS`."""
    return code is not None and code < 0 and -code in OUTSIDE_SIGNALS


def describe(code: Optional[int]) -> str:
    """``was killed by SIGKILL`` or ``exited with code 3``."""
    name = signal_name(code)
    return f"was killed by {name}" if name else f"exited with code {code}"
