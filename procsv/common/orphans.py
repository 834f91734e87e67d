"""Processes a run leaves behind: become their subreaper, then kill and reap them.

Runs in the process at the top of a run: the watchdog (``procsv launch``) or, for a plain
``python train.py``, the trainer that started its own services (:mod:`procsv.trainer.standalone`).
A helper the train module starts with ``setsid`` escapes its process group and does not inherit the
parent-death signal; when its parent dies it would be re-parented to init and outlive the run.
:func:`become_subreaper` (Linux ``PR_SET_CHILD_SUBREAPER``) makes such orphans ours instead, and
:class:`Orphans` kills and reaps them.
"""

from __future__ import annotations

import ctypes
import os
import time
from typing import Callable, Optional

import psutil

_PR_SET_CHILD_SUBREAPER = 36


def become_subreaper(on: bool = True) -> bool:
    """Mark (or unmark) this process as a child subreaper; False where the kernel refuses."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1 if on else 0, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


class Orphans:
    """Adopted processes of the run: which to kill, and the ones killed but not reaped yet.

    The owner becomes a subreaper at construction. :meth:`sweep` kills every child that is not one
    of the owner's own (with its descendants) and reaps them. ``outside_group_only`` narrows that to
    children outside the owner's process group: a plain ``python train.py`` run leaves the user's own
    children in its group alone (the terminal's Ctrl-C reaches them, and the program may still be
    using them) and kills only the ones that escaped with ``setsid``/``setpgid``. ``spare_existing``
    leaves alone the children the owner had at construction too: a plain run's program started them
    before its Supervisor, they are no helpers of the run, and the program may still wait for them (a
    sweep that killed and reaped one, or reaped one that had exited, made its ``Popen`` report exit 0).
    """

    def __init__(self, outside_group_only: bool = False, spare_existing: bool = False) -> None:
        self.enabled = become_subreaper()
        self.outside_group_only = outside_group_only
        self._killed: set[int] = set()  # adopted processes killed but not reaped yet
        self._spared: set[int] = set(self._children() or []) if spare_existing else set()

    @staticmethod
    def _children() -> Optional[list[int]]:
        pids = child_pids()
        if pids is None:
            try:
                pids = [proc.pid for proc in psutil.Process().children()]
            except psutil.Error:
                return None
        return pids

    def _adopted(self, known: set[int]) -> list[psutil.Process]:
        own_group = os.getpgrp()
        found: list[psutil.Process] = []
        pids = self._children()
        if pids is None:
            return found
        for pid in pids:
            if pid in known or pid in self._killed or pid in self._spared:
                continue
            if self.outside_group_only and _group_of(pid) in (own_group, None):
                continue
            try:
                found.append(psutil.Process(pid))
            except psutil.Error:  # gone meanwhile
                continue
        return found

    def sweep(self, known: set[int]) -> list[int]:
        """Kill adopted processes (children not in ``known``) and their descendants; reap the dead.

        Returns the pids killed now (not the ones reaped from earlier sweeps).
        """
        killed: list[int] = []
        for proc in self._adopted(known):
            try:
                family = [proc, *proc.children(recursive=True)]
            except psutil.Error:
                family = [proc]
            for member in family:
                try:
                    member.kill()
                except psutil.Error:
                    pass
            killed.append(proc.pid)
            self._killed.add(proc.pid)
        for pid in list(self._killed):
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done = pid
            if done:
                self._killed.discard(pid)
        return killed

    def sweep_and_reap(self, known: set[int], wait_secs: float,
                       clock: Callable[[], float] = time.monotonic) -> list[int]:
        """:meth:`sweep`, then sweep again every 10 ms until every process killed is reaped or
        ``wait_secs`` (on ``clock``) have passed; returns every pid killed."""
        killed = self.sweep(known)
        deadline = clock() + wait_secs
        while self.pending and clock() < deadline:
            time.sleep(0.01)
            killed += self.sweep(known)
        return killed

    @property
    def pending(self) -> int:
        """Killed, not reaped yet."""
        return len(self._killed)


def child_pids() -> Optional[list[int]]:
    """This process's children, from ``/proc/self/task/*/children`` (an orphan is re-parented to any
    live thread of its subreaper): a few small reads, where psutil's ``children()`` reads the stat
    file of every process on the machine (1.3 ms with 75 processes here, every sweep). None where
    the kernel does not offer those files (psutil is used then)."""
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return None
    pids: list[int] = []
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/children") as fh:
                pids += [int(p) for p in fh.read().split()]
        except FileNotFoundError:
            if tid == str(os.getpid()):  # the main thread is alive: the kernel has no such files
                return None
        except (OSError, ValueError):
            return None
    return pids


def _group_of(pid: int) -> Optional[int]:
    try:
        return os.getpgid(pid)
    except OSError:
        return None
