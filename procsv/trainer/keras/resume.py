"""Where each ``fit`` of a program begins after its restore: a pure decision, and the position's packing.

Runs in the trainer process, called by :class:`procsv.trainer.keras.fit.BackupAndRestore` as a ``fit``
begins (after the Supervisor's restore) and before each snapshot. A program may call ``fit`` more than
once with one backup directory (TensorFlow's multi-worker Keras tutorial and fault-tolerance migration
guide: fit, then fit more, or on another dataset). Under ``procsv launch`` a restart runs the program
from its top again, so the position a snapshot records names which of the program's fits it is in:
``fits``, the number of fits of that directory the program had completed before it (a completed
fit's final commit records the position past its last epoch, its own). Then, after a restart, a fit
that had completed before the kill trains nothing (the state restored is a later fit's), the fit that
was killed resumes where it was, and a fit that follows a completed one begins at its own first
epoch, never at the position where the one before it ended.

``fits`` is packed with the epoch in the one ``fit/epoch`` variable of procsv's checkpoints
(:func:`pack`, :func:`unpack`): a checkpoint of an older procsv, which has no other variable for it,
still restores (as its program's first fit) instead of failing as a checkpoint of another program.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

FITS_SHIFT = 32  # fit/epoch holds fits * 2**32 + epoch (an epoch index is far below 2**32)


def pack(fits: int, epoch: int) -> int:
    """The value of ``fit/epoch`` for ``epoch`` of the fit that ``fits`` completed fits preceded."""
    return (fits << FITS_SHIFT) + epoch


def unpack(value: int) -> tuple[int, int]:
    """``(fits, epoch)`` of a ``fit/epoch`` value (an older procsv's, the epoch alone: fits 0)."""
    return value >> FITS_SHIFT, value & ((1 << FITS_SHIFT) - 1)


def whole_epochs(epoch: int, batch: int, steps: Optional[int]) -> tuple[int, int]:
    """Where a fit resumes from a position that recorded (``epoch``, ``batch`` done in it) with ``steps``
    batches an epoch (None: not known): a position at or past an epoch's end (a snapshot taken after its
    last batch: a fit that raised in an epoch-end callback) resumes at the next epoch's first batch, as
    Keras' own BackupAndRestore does, never inside or past the epoch it finished."""
    if steps is not None and steps > 0 and batch >= steps:
        return epoch + 1, 0
    return epoch, batch


@dataclasses.dataclass(frozen=True)
class Begin:
    """How one fit begins. ``epoch``: the epoch its loop begins at (None: its own ``initial_epoch``);
    ``batch``: the batches of that epoch done before (drawn again, not trained); ``fits``: the fits the
    position it records counts before it; ``passed``: it completed before a restart, it trains nothing."""

    epoch: Optional[int]
    batch: int
    fits: int
    passed: bool = False

    @property
    def resumes(self) -> bool:
        """It resumes a position inside its own epochs (not its beginning)."""
        return self.epoch is not None and not self.passed


def begin(done: int, restored: Optional[tuple[int, int, int]], steps: Optional[int]) -> Begin:
    """Where a fit begins that ``done`` fits of its directory preceded in this process, given the position
    restored (``fits``, ``epoch``, ``batch`` done in it; None: nothing restored) and its ``steps`` batches
    an epoch (None: not known)."""
    if restored is None:
        return Begin(None, 0, done)
    fits, epoch, batch = restored
    if fits > done:  # the state is of a later fit of the program: this one completed before the restart
        return Begin(epoch, batch, fits, passed=True)
    if fits < done or (epoch, batch) == (0, 0):  # the end of a fit before it (completed here), or its beginning
        return Begin(None, 0, done)
    epoch, batch = whole_epochs(epoch, batch, steps)
    return Begin(epoch, batch, done)


__all__ = ["Begin", "FITS_SHIFT", "begin", "pack", "unpack", "whole_epochs"]
