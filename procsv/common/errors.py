"""procsv's exception vocabulary. Every error procsv raises on purpose derives from ProcsvError."""

from __future__ import annotations


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


class UnsupportedState(CheckpointError):
    """The trainer's state holds a tensor procsv cannot send to the checkpoint service."""


class TrainingStopped(ProcsvError):
    """``session.run`` was called after a stop was requested (a clean stop, not a failure)."""
