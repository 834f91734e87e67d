"""The messages of the zygote's pipe, between the watchdog and the pre-warmed trainer (zygote).

Length-prefixed frames on a pipe pair (:mod:`procsv.ipc.pipe`): the watchdog sends
:class:`ForkRequest`; the zygote sends :class:`ZygoteReady`, :class:`ForkReply` and
:class:`ChildExit`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Optional

from procsv.ipc.message_base import Message


@dataclass(frozen=True)
class ZygoteReady(Message):
    """Pre-warmed trainer (zygote) -> watchdog: TensorFlow is imported; forks are cheap now."""

    KIND: ClassVar[str] = "zygote_ready"
    pid: int
    import_secs: float


@dataclass(frozen=True)
class ForkRequest(Message):
    """Watchdog -> zygote: fork a trainer running ``argv`` (procsv.trainer's) with this environment."""

    KIND: ClassVar[str] = "fork_request"
    attempt: int
    argv: list[str]
    env: dict[str, str]
    log_path: str
    cwd: str
    rank: int = 0  # the task in a trainer group (procsv launch --nproc): one fork per task per attempt


@dataclass(frozen=True)
class ForkReply(Message):
    """Zygote -> watchdog: the forked trainer's pid, or why the fork failed."""

    KIND: ClassVar[str] = "fork_reply"
    attempt: int
    pid: int
    error: Optional[str] = None
    rank: int = 0


@dataclass(frozen=True)
class ChildExit(Message):
    """Zygote -> watchdog: a forked trainer was reaped; ``code`` < 0 means killed by signal -code."""

    KIND: ClassVar[str] = "child_exit"
    pid: int
    code: int


__all__ = ["ZygoteReady", "ForkRequest", "ForkReply", "ChildExit"]
