"""procsv's exception vocabulary. Every error procsv raises on purpose derives from ProcsvError."""

from __future__ import annotations

from typing import Optional


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
