"""The messages of the zygote's pipe, between the watchdog and the pre-warmed trainer (zygote), and
of a service seed's.

Length-prefixed frames on a pipe pair (:mod:`procsv.ipc.pipe`): the watchdog sends
:class:`ForkRequest` (and, to a zygote seed, first :class:`ZygoteStart`); the zygote sends :class:`ZygoteReady` and :class:`ForkReply` (no exit
status: what the zygote forks is its parent's child, reaped there). A service seed's pipe (one way)
carries a single :class:`ServiceStart`.
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
class ZygoteStart(Message):
    """Watchdog -> a zygote seed (:mod:`procsv.zygote.seed`, forked from a watchdog that had imported
    TensorFlow): become the zygote, with this environment, log and working directory, as
    ``python -m procsv.zygote`` started with them would be."""

    KIND: ClassVar[str] = "zygote_start"
    env: dict[str, str]
    log_path: str
    cwd: str


@dataclass(frozen=True)
class ServiceStart(Message):
    """Watchdog -> a service seed (:mod:`procsv.services.seed`, forked at the launch's start with its
    service's modules imported): become the service, with this environment, log and working directory,
    as ``python -m procsv.services.<role>`` started with them would be."""

    KIND: ClassVar[str] = "service_start"
    env: dict[str, str]
    log_path: str
    cwd: str


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
    """Zygote -> watchdog: the forked trainer's pid (the watchdog's own child by then), or why the fork failed."""

    KIND: ClassVar[str] = "fork_reply"
    attempt: int
    pid: int
    error: Optional[str] = None
    rank: int = 0


__all__ = ["ZygoteReady", "ZygoteStart", "ServiceStart", "ForkRequest", "ForkReply"]
