"""The checkpoint agent's bookkeeping of revisions: newer states of a step already committed.

Runs in the trainer's main thread, owned by :class:`procsv.trainer.checkpoint.agent.CheckpointAgent`.
Pure bookkeeping: no TensorFlow, no socket, no file, no clock.

A step is committed, then runs change the state without advancing it (a graph program's
``minimize(loss)`` without ``global_step=``; :attr:`~procsv.trainer.step_boundary.StepState.changed`):
its next snapshot is a newer *revision* of the same step, which the checkpoint service rewrites in
place (``SaveData.revision``; 0 for a step not committed yet). And a group rolled back from step B
passes over the checkpoints committed after B (``superseded``): this attempt's snapshot of such a
step is their next revision, written in place, never answered "committed already".
"""

from __future__ import annotations

from typing import Mapping


class Revisions:
    """Owns the revision of the newest committed checkpoint (``committed``), the revision of the
    snapshot in flight (``sent``: 0 when it is not a rewrite) and the steps passed over by a
    rollback with their revisions (``superseded``)."""

    def __init__(self) -> None:
        self.committed = 0
        self.sent = 0
        self.superseded: dict[int, int] = {}

    def passed_over(self, passed: Mapping[int, int]) -> None:
        """The restore passed over these checkpoints (step -> revision): a rollback's bound is below them."""
        self.superseded = dict(passed)

    def restored(self, revision: int) -> None:
        """The checkpoint restored, the newest committed, is of this revision."""
        self.committed = revision

    def take(self, step: int, last_committed: int) -> int:
        """A snapshot of ``step`` is handed over, the newest committed step being ``last_committed``:
        its revision (a newer state of a committed step, or of one a rollback passed over)."""
        sent = self.committed + 1 if step == last_committed else 0
        self.sent = max(sent, self.superseded.get(step, -1) + 1)
        return self.sent

    def answered(self, step: int, ok: bool, again: bool, revision: int, last_committed: int) -> bool:
        """The result of the snapshot in flight of ``step`` (``again``: the service had that revision
        already, or a newer one; ``revision``: the committed copy's), ``last_committed`` the newest
        step committed before it. True if the state sent, a rewrite, is not on disk as sent (failed,
        or the service holds another revision): it must be taken again."""
        retake = bool(self.sent) and (not ok or again)
        if ok:
            if not again:
                self.superseded.pop(step, None)
            if step >= last_committed:
                self.committed = revision if step > last_committed else max(self.committed, revision)
        return retake
