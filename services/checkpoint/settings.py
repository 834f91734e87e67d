"""The trainer's checkpoint settings, kept by the checkpoint service across its own restarts.

Runs in the checkpoint service. Retention (``max_to_keep``, ``keep_checkpoint_every_n_hours``)
deletes checkpoints, so the service acts only on the settings the trainer itself sent in its
:class:`~procsv.ipc.messages.CheckpointSetup`, never on defaults. Each new setting is written
atomically to ``<logdir>/.procsv/checkpoint_settings.json`` with the ZeroMQ identity of the
trainer that sent it; a restarted service reads the file at start and applies it only to a
snapshot from that same trainer. A snapshot from a trainer whose settings the service does not
have is held, uncommitted, until that trainer's next heartbeat brings them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Optional

from procsv.ipc.messages import CheckpointSetup
from procsv.common.layout import Layout, read_json, write_json


@dataclass(frozen=True)
class CheckpointSettings:
    """What a trainer asked for, and which trainer (its ZeroMQ identity, hex) asked."""

    trainer: str
    basename: str
    save_model_secs: Optional[float]
    max_to_keep: int
    keep_checkpoint_every_n_hours: Optional[float]

    @staticmethod
    def from_setup(identity: bytes, msg: CheckpointSetup) -> "CheckpointSettings":
        return CheckpointSettings(identity.hex(), msg.basename, msg.save_model_secs, msg.max_to_keep,
                                  msg.keep_checkpoint_every_n_hours)

    def of(self, identity: bytes) -> bool:
        """True if these are the settings of the trainer with this identity."""
        return self.trainer == identity.hex()

    @staticmethod
    def from_json(obj: Any) -> Optional["CheckpointSettings"]:
        """The settings in a parsed file, or None if it is missing or malformed."""
        if not isinstance(obj, dict):
            return None
        try:
            trainer, basename, max_to_keep = obj["trainer"], obj["basename"], obj["max_to_keep"]
            secs, hours = obj["save_model_secs"], obj["keep_checkpoint_every_n_hours"]
        except KeyError:
            return None
        if not (isinstance(trainer, str) and isinstance(basename, str) and type(max_to_keep) is int):
            return None
        for value in (secs, hours):
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
                return None
        return CheckpointSettings(trainer, basename, None if secs is None else float(secs), max_to_keep,
                                  None if hours is None else float(hours))


def load(layout: Layout) -> Optional[CheckpointSettings]:
    return CheckpointSettings.from_json(read_json(layout.checkpoint_settings))


def store(layout: Layout, settings: CheckpointSettings) -> None:
    """Write the settings atomically and durably (they decide what retention deletes)."""
    write_json(layout.checkpoint_settings, asdict(settings))
