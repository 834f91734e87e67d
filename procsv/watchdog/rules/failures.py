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

import signal
from dataclasses import dataclass
from typing import Any, Optional


@dataclass(frozen=True)
class ChildError:
    """What a child recorded about its own failure."""

    type: str
    message: str
    traceback: str
    phase: str


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

    @property
    def signal_name(self) -> Optional[str]:
        return signal_name(self.code)

    def describe(self) -> str:
        """``was killed by SIGKILL`` or ``exited with code 3``."""
        return describe(self.code)

    def fields(self) -> dict[str, Any]:
        """The exit status as ``lifecycle.jsonl`` records it: ``{"code": n}`` or ``{"signal": name}``."""
        return exit_fields(self.code)

    def headline(self, before_first_step: bool = False) -> str:
        """One line: who, how, and the child's own exception if it recorded one."""
        head = f"{self.role} attempt {self.attempt} (pid {self.pid}) {self.describe()}"
        if before_first_step:
            head += " before completing a step"
        if self.error is not None:
            head += f": {self.error.type}: {self.error.message}"
        return head

    def root_cause(self, before_first_step: bool = False, note: str = "") -> str:
        """The headline (with ``note`` appended), the child's traceback indented, and where its log is."""
        head = self.headline(before_first_step) + (f" ({note})" if note else "")
        lines = [head]
        if self.error is not None and self.error.traceback.strip():
            lines += ["  | " + line for line in self.error.traceback.rstrip().splitlines()]
        lines.append(f"  (full log: {self.log_path})")
        return "\n".join(lines)


def signal_name(code: Optional[int]) -> Optional[str]:
    if code is None or code >= 0:
        return None
    try:
        return signal.Signals(-code).name
    except ValueError:
        return str(-code)


def describe(code: Optional[int]) -> str:
    name = signal_name(code)
    return f"was killed by {name}" if name else f"exited with code {code}"


def exit_fields(code: Optional[int]) -> dict[str, Any]:
    name = signal_name(code)
    return {"signal": name} if name else {"code": code}
