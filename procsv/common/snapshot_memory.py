"""The layout of the trainer's snapshot memory, shared by the trainer (which writes it) and the
checkpoint service (which reads it).

Imported by the trainer (:mod:`procsv.trainer.checkpoint.snapshot`) and the checkpoint service
(:mod:`procsv.services.checkpoint.arena`). The memory is one memfd: a header page, then equal
slots, each page-aligned. The header holds two int64 per slot, native byte order: its state and
the step it holds. The trainer sets ``WRITING`` (with the step) before it copies into a slot and
``COMPLETE`` after the copy; a slot whose header is not ``COMPLETE`` with the expected step is
torn (a copy was cut short) and is never persisted.
"""

from __future__ import annotations

PAGE = 4096
SLOT_EMPTY = 0
SLOT_WRITING = 1
SLOT_COMPLETE = 2
MAX_SLOTS = PAGE // 16  # two int64 per slot in the header page
_ITEMSIZE = {"bfloat16": 2, "half": 2, "qint8": 1, "quint8": 1, "qint16": 2, "quint16": 2, "qint32": 4}


def itemsize(dtype: str) -> int:
    """Bytes per element of a numeric TensorFlow dtype name, without importing TensorFlow."""
    import numpy as np

    from procsv.common.errors import CheckpointError

    if dtype in _ITEMSIZE:
        return _ITEMSIZE[dtype]
    try:
        return int(np.dtype(dtype).itemsize)
    except TypeError:
        raise CheckpointError(f"cannot size a tensor of dtype {dtype}") from None


def slot_problem(state: int, held_step: int, expected_step: int) -> str:
    """Why a slot whose header says (``state``, ``held_step``) does not hold a whole snapshot of
    ``expected_step``; empty if it does."""
    if state == SLOT_WRITING:
        return f"its copy of step {held_step} was cut short (torn)"
    if state != SLOT_COMPLETE:
        return "it was never written"
    if held_step != expected_step:
        return f"it holds step {held_step}, not {expected_step} (overwritten)"
    return ""
