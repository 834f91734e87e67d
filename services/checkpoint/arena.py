"""The checkpoint service's mapping of the trainer's snapshot memory.

Runs in the checkpoint service. The trainer names its memfd as ``/proc/<pid>/fd/<fd>`` plus the
memfd's inode (:class:`procsv.ipc.messages.ArenaRef`); this module opens that path, refuses it if the
inode differs (the trainer replaced its arena, or the pid was reused), maps it, and pre-faults
the mapping once (``MADV_POPULATE_READ``), so that a save later reads it at memory speed.
"""

from __future__ import annotations

import ctypes
import mmap
import os
from typing import Optional

import numpy as np

from procsv.ipc.messages import ArenaRef
from procsv.common.errors import CheckpointError
from procsv.common.snapshot_memory import MAX_SLOTS, PAGE, slot_problem

MADV_POPULATE_READ = 22  # Linux 5.14+


class ArenaView:
    """One mapping of one trainer arena."""

    def __init__(self, ref: ArenaRef) -> None:
        try:
            fd = os.open(ref.path, os.O_RDWR | getattr(os, "O_CLOEXEC", 0))
        except OSError as exc:
            raise CheckpointError(f"cannot open the trainer's snapshot memory {ref.path}: {exc.strerror}") from None
        try:
            st = os.fstat(fd)
            if st.st_ino != ref.ino or st.st_size < ref.size:
                raise CheckpointError(f"{ref.path} is not the trainer's snapshot memory any more "
                                      f"(inode {st.st_ino}, {st.st_size} bytes; expected {ref.ino}, {ref.size})")
            self.mm = mmap.mmap(fd, ref.size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        self.ref = ref
        self.array = np.frombuffer(self.mm, dtype=np.uint8)
        self.address = int(self.array.ctypes.data)
        self.populated = False

    def populate(self) -> None:
        """Map every page now (the trainer already allocated them) instead of faulting one by one."""
        if self.populated:
            return
        self.populated = True
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.madvise(ctypes.c_void_p(self.address), ctypes.c_size_t(self.ref.size), MADV_POPULATE_READ)
        except (OSError, AttributeError):
            pass

    def slot_problem(self, slot: int, step: int) -> str:
        """Why ``slot`` does not hold a whole snapshot of ``step`` (its header says so); empty if it does."""
        if not 0 <= slot < MAX_SLOTS or self.ref.size < PAGE:
            return f"slot {slot} is outside the snapshot memory"
        state, held = (int(x) for x in np.frombuffer(self.mm, dtype=np.int64, count=2, offset=16 * slot))
        return slot_problem(state, held, step)

    def close(self) -> None:
        self.array = np.empty(0, np.uint8)
        try:
            self.mm.close()
        except BufferError:
            pass


class ArenaCache:
    """The mapping of the current trainer's arena; a new reference replaces the old mapping.

    A mapping that holds the in-memory snapshot the service keeps is pinned (:attr:`pinned`): it
    stays mapped when a new reference replaces it (a restarted trainer's arena), until unpinned.
    """

    def __init__(self) -> None:
        self.view: Optional[ArenaView] = None
        self.pinned: Optional[ArenaView] = None

    def get(self, ref: ArenaRef) -> ArenaView:
        if self.view is not None and self.view.ref == ref:
            return self.view
        if self.pinned is not None and self.pinned.ref == ref:
            self.drop()
            self.view = self.pinned
            return self.view
        self.drop()
        self.view = ArenaView(ref)
        return self.view

    def pin(self, view: Optional[ArenaView]) -> None:
        """Keep ``view`` mapped (None: release the pinned one, unmapping it unless it is current)."""
        old, self.pinned = self.pinned, view
        if old is not None and old is not view and old is not self.view:
            old.close()

    def drop(self) -> None:
        if self.view is not None:
            if self.view is not self.pinned:
                self.view.close()
            self.view = None
