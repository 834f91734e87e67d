"""Counting the messages a receiver refused, and saying so without flooding its log.

Runs in every process that binds a socket (the watchdog, the checkpoint and summary services).
Each refused message (a :class:`~procsv.ipc.codec.ProtocolError`, whose ``reason`` is a
:class:`~procsv.ipc.codec.RejectReason`) is counted by reason; the counts travel in the process's
stats record (``status.json`` for the watchdog, ``.procsv/checkpoint_stats.json``,
``.procsv/summary_stats.json``), which ``procsv status`` shows. The log gets one line for the
first rejection of each reason, and a schema-version mismatch -- another procsv release talking
to this run -- one clear line of its own, once per process: a flood of garbage costs a few lines,
never one per message.
"""

from __future__ import annotations

from typing import Any, Callable

from procsv.ipc.codec import ProtocolError, RejectReason, SchemaMismatch
from procsv.ipc.messages import SCHEMA_VERSION


class Rejections:
    """The refused messages of one receiving process, by reason.

    ``who`` names the process in its log lines (``procsv checkpoint``); ``where`` is where the
    counts can be read (a file name); ``say`` writes one log line.
    """

    def __init__(self, who: str, where: str, say: Callable[[str], None]) -> None:
        self.who = who
        self.where = where
        self.say = say
        self.total = 0
        self.by_reason: dict[str, int] = {}

    def count(self, err: ProtocolError) -> None:
        """Count ``err``; the first of its reason (or the first version mismatch) is logged."""
        self.total += 1
        reason = err.reason.value
        first = reason not in self.by_reason
        self.by_reason[reason] = self.by_reason.get(reason, 0) + 1
        if not first:
            return
        if err.reason == RejectReason.SCHEMA_VERSION:
            version = err.version if isinstance(err, SchemaMismatch) else None
            said = "no schema version" if version is None else f"schema version {version}"
            self.say(f"{self.who}: refusing messages with {said}; this procsv speaks schema version "
                     f"{SCHEMA_VERSION}: a process of another procsv release is talking to this run "
                     f"(said once; every such message is counted in {self.where})")
        else:
            self.say(f"{self.who}: refused a malformed message ({reason}: {err}); further ones of this "
                     f"kind are only counted (in {self.where})")

    def record(self) -> dict[str, Any]:
        """``{"total": n, "by_reason": {reason: n}}`` for a stats file."""
        return {"total": self.total, "by_reason": dict(sorted(self.by_reason.items()))}
