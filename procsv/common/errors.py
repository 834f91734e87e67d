"""procsv's exception vocabulary. Every error procsv raises on purpose derives from ProcsvError, but
the two of non-finite training: :class:`NonFiniteState` (internal: a snapshot of a poisoned state is
refused; the checkpoint agent and the step boundary catch it), :class:`TrainingDiverged` (the
policy stops training: a ``SystemExit`` with code 4, :data:`procsv.common.exitcodes.EXIT_DIVERGING`,
that leaves the ``managed_session`` block without a final checkpoint, so that the process exits 4)
and :class:`GroupRollback` (a group member asks for the group's rollback: a ``SystemExit`` with code 5,
:data:`procsv.common.exitcodes.EXIT_GROUP_ROLLBACK`, left the same way)."""

from __future__ import annotations

from typing import Optional

from procsv.common.exitcodes import EXIT_DIVERGING, EXIT_GROUP_ROLLBACK


class ProcsvError(Exception):
    """Root of procsv's own errors."""


class UsageError(ProcsvError):
    """Bad input from the user: a missing target, an unwritable logdir, a bad flag value."""


class LogdirLocked(ProcsvError):
    """Another live procsv run holds the logdir's lock."""


class CheckpointError(ProcsvError):
    """A checkpoint could not be written, committed or restored."""


class CorruptCheckpoint(CheckpointError):
    """A committed checkpoint's files do not match the checksums recorded when it was committed."""


class UnreadableCheckpoint(CheckpointError):
    """A committed checkpoint's file could not be read: an OSError other than ENOENT (EACCES, EIO,
    ESTALE on a network filesystem, EISDIR). The checkpoint may well be intact, so you get this
    error, not :class:`CorruptCheckpoint`: procsv retries, then fails; it never passes over,
    quarantines or deletes such a checkpoint, and never starts from scratch because of it.
    ``path`` is the file (relative to the logdir) and ``errno`` its errno, when one file is meant."""

    def __init__(self, message: str, *, path: Optional[str] = None, errno: Optional[int] = None) -> None:
        super().__init__(message)
        self.path = path
        self.errno = errno


class NoRestorableCheckpoint(CheckpointError):
    """Committed checkpoints exist, every one is corrupt, and starting from step 0 was not allowed
    (``procsv launch --allow-reinit``, ``Supervisor(allow_reinit=True)``). The message has one line
    per checkpoint saying why it was not restored."""


class MismatchedCheckpoint(CheckpointError):
    """A checkpoint does not match the program's state (a variable missing, or of another shape)."""


class UnsupportedState(CheckpointError):
    """The trainer's state holds a tensor procsv cannot send to the checkpoint service."""


class TrainingStopped(ProcsvError):
    """``session.run`` was called after a stop was requested (a clean stop, not a failure)."""


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


class LossSpiked(NonFiniteState):
    """The loss spiked before the snapshot of ``step`` (finite, far above its recent distribution:
    ``procsv.trainer.nonfinite.spike``, issue 68), from step ``onset`` to its detection at step
    ``detected``; ``what``: one line on it. Raised under ``--on-spike rollback`` or ``stop``: the
    snapshot is refused as a poisoned one is, and the policy decides (``procsv.trainer.nonfinite.rollback``)."""

    def __init__(self, step: int, onset: int, detected: int, what: str) -> None:
        self.onset = onset
        self.detected = detected
        self.what = what
        super().__init__(step, None)

    def describe(self) -> str:
        return self.what

    @property
    def first_step(self) -> int:
        """The spike's onset."""
        return self.onset


class GroupRolledBack(NonFiniteState):
    """A trainer group rolled back in place at its check of ``step`` (``procsv.trainer.nonfinite.group_verdict``):
    every member restored the same earlier step and skips the bad ones; the rest of that boundary's work
    (its snapshot) is for a state that is no more, and nothing else is to be done for it."""


class TrainingDiverged(SystemExit):
    """Training stopped on non-finite values: exit code 4 ("diverging"), the message names the step."""

    def __init__(self, message: str) -> None:
        super().__init__(EXIT_DIVERGING)
        self.message = message

    def __str__(self) -> str:
        return self.message


class GroupRollback(TrainingDiverged):
    """A member of a trainer group found the loss of ``step`` non-finite under ``--on-nonfinite
    rollback``: exit code 5, so that the watchdog restarts the group, every member restoring the
    newest state before ``step`` and skipping it (``procsv.trainer.nonfinite.rollback``). It leaves
    the session as a diverging stop does (no final checkpoint): only its exit code differs."""

    def __init__(self, step: int, message: str) -> None:
        super().__init__(message)
        self.code = EXIT_GROUP_ROLLBACK
        self.step = step
