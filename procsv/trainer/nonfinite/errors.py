"""The two exceptions of non-finite training, raised in the trainer.

* :class:`NonFiniteState`: a snapshot about to be taken (or just copied) holds a non-finite loss or
  variable; the snapshot is refused (never handed to the checkpoint service). Internal: the
  checkpoint agent and the step boundary catch it.
* :class:`TrainingDiverged`: the policy stops training (``--on-nonfinite stop``, or more skipped
  steps than the bound). A ``SystemExit`` with code 4 (:data:`procsv.common.exitcodes.EXIT_DIVERGING`):
  it leaves the ``managed_session`` block without a final checkpoint (the newest committed one is
  the newest finite one), and the process, in plain python as under ``procsv launch``, exits 4.
"""

from __future__ import annotations

from typing import Optional

from procsv.common.exitcodes import EXIT_DIVERGING


class NonFiniteState(Exception):
    """The state of ``step`` is poisoned: ``bad_step`` is the first step whose watched loss was
    non-finite (None: the loss was finite, or not watched), ``keys`` the non-finite tensors of the
    snapshot (empty: it was refused on the loss alone, before any copy)."""

    def __init__(self, step: int, bad_step: Optional[int], keys: tuple[str, ...] = ()) -> None:
        self.step = step
        self.bad_step = bad_step
        self.keys = keys
        super().__init__(self.describe())

    def describe(self) -> str:
        parts = []
        if self.bad_step is not None:
            parts.append(f"the loss of step {self.bad_step} is NaN or infinite")
        if self.keys:
            more = f" and {len(self.keys) - 3} more" if len(self.keys) > 3 else ""
            parts.append(f"non-finite values in {', '.join(self.keys[:3])}{more}")
        return "; ".join(parts) or "non-finite state"

    @property
    def first_step(self) -> int:
        """The first step known to be poisoned (the snapshot's own step when only its weights are)."""
        return self.bad_step if self.bad_step is not None else self.step


class TrainingDiverged(SystemExit):
    """Training stopped on non-finite values: exit code 4 ("diverging"), the message names the step."""

    def __init__(self, message: str) -> None:
        super().__init__(EXIT_DIVERGING)
        self.message = message

    def __str__(self) -> str:
        return self.message
