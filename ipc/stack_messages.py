"""The stacks of a run's trainer processes, as data and on the wire (issue 69: the members on other hosts).

Owned by no process: the watchdog and ``procsv stacks`` read stacks into these types
(:mod:`procsv.watchdog.stacks.capture`), and they travel as they are. Two messages:

* :class:`StacksAsked`: read the stacks of these trainer processes. Master -> node agent, over the
  job's CURVE link (:mod:`procsv.ipc.node_messages`): before the kill of a hung group (rule 4) and
  for a ``procsv stacks`` on node 0's host. ``procsv stacks`` -> node 0's watchdog, on the
  ``stacks.sock`` ROUTER of its private runtime directory (the other hosts' members: it asks their
  agents).
* :class:`StacksTaken`: the answer, one message per process (a process's stacks are bounded by
  their frames; a host's members in one message might not fit a frame), each saying how many the
  answer holds (``of``).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import ClassVar, Optional

from procsv.ipc.message_base import Message


@dataclass(frozen=True)
class Frame:
    """One frame: a Python function (``file`` a ``.py`` path, ``line`` its line) or a native one."""

    name: str
    file: str
    line: int
    native: bool

    def text(self) -> str:
        where = os.path.basename(self.file) if self.file else "?"
        return f"{self.name} ({where}:{self.line})" if not self.native else f"{self.name} [{where}]"


@dataclass(frozen=True)
class ThreadStack:
    """One thread: its frames, innermost first; ``idle``: py-spy judged it waiting (not on a CPU);
    ``waiting_in``: the system call it is in (``read(socket:[123])``), "" if running or not known."""

    tid: int
    name: str
    idle: bool
    gil: bool
    frames: list[Frame]
    waiting_in: str = ""


@dataclass(frozen=True)
class ProcessStacks:
    """One process of the run at one moment: ``role`` (``trainer``, ``worker1``...), its threads, main first;
    ``error``: why its frames could not be read ("" if they were); ``host``: the host it runs on, when
    the run spans hosts ("" for a run on one host)."""

    role: str
    pid: int
    threads: list[ThreadStack] = field(default_factory=list)
    error: str = ""
    native: bool = False
    secs: float = 0.0  # how long the capture took
    stopped: bool = False  # it was stopped (SIGSTOP) when read
    host: str = ""

    @property
    def main(self) -> Optional[ThreadStack]:
        return next((t for t in self.threads if t.tid == self.pid), None)


@dataclass(frozen=True)
class StacksAsked(Message):
    """Read the stacks of ``slots`` (the members of this host named so; empty: every live one), Python
    frames and, with ``native``, native ones, each within ``timeout`` seconds; answered by a
    :class:`StacksTaken` per process, naming ``ask``."""

    KIND: ClassVar[str] = "stacks_asked"
    ask: int
    slots: list[str]
    native: bool
    timeout: float


@dataclass(frozen=True)
class StacksTaken(Message):
    """One process's stacks read for :class:`StacksAsked` ``ask``, one of ``of`` (``stacks`` None and
    ``of`` 0: there was none to read)."""

    KIND: ClassVar[str] = "stacks_taken"
    ask: int
    of: int
    stacks: Optional[ProcessStacks] = None


# what one StacksTaken may hold, estimated (its frame's limit is the link's 1 MiB, transport.CONTROL_FRAME_MAX: a
# larger one is dropped by ZeroMQ with the connection, and the host's stacks were said "not answered")
STACKS_BYTES = 512 * 1024
_FRAME_BYTES = 48  # a frame's encoding besides its name and file (measured ~65 B a frame in all with short names)


def _size(frames: list[Frame]) -> int:
    return sum(_FRAME_BYTES + len(f.name) + len(f.file) for f in frames)


def fitted(stacks: ProcessStacks, limit: int = STACKS_BYTES) -> ProcessStacks:
    """``stacks`` whose frames fit one :class:`StacksTaken` (an estimate of ``limit`` bytes): deep stacks (a
    recursion in many threads) keep each thread's innermost frames and its outermost few, fewer as needed,
    a frame in place of the rest naming how many were left out; the main thread is cut last."""
    if sum(_size(t.frames) for t in stacks.threads) <= limit:
        return stacks
    keep = 1024
    while True:
        threads = [_cut(t, keep if t.tid != stacks.pid else max(keep, 64)) for t in stacks.threads]
        if sum(_size(t.frames) for t in threads) <= limit or keep <= 4:
            break
        keep //= 2
    while len(threads) > 1 and sum(_size(t.frames) for t in threads) > limit:
        threads.pop()  # (threads beyond what fits, the last listed first: the main thread is listed first)
    left = len(stacks.threads) - len(threads)
    if left:
        threads.append(ThreadStack(0, f"{left} more threads left out (the answer's size)", True, False, []))
    return dataclasses.replace(stacks, threads=threads)


def _cut(thread: ThreadStack, keep: int) -> ThreadStack:
    if len(thread.frames) <= keep:
        return thread
    inner, outer = thread.frames[:keep - keep // 4], thread.frames[len(thread.frames) - keep // 4:]  # (innermost first)
    gap = Frame(f"... {len(thread.frames) - len(inner) - len(outer)} frames left out (the answer's size) ...", "", 0, False)
    return dataclasses.replace(thread, frames=inner + [gap] + outer)


__all__ = ["Frame", "ThreadStack", "ProcessStacks", "StacksAsked", "StacksTaken", "STACKS_BYTES", "fitted"]
