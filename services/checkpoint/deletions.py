"""What the checkpoint service deletes, and when: retention's retired checkpoints and a trainer's
:class:`~procsv.ipc.messages.DeleteCheckpoints`.

Runs in the checkpoint service's loop. Both wait while a trainer restores (the restore lock,
:func:`procsv.common.manifests.retiring`, which :meth:`CheckpointStore.delete` and
:meth:`CheckpointStore.delete_all` take without waiting): what they could not delete yet is kept
here and tried again at every tick of the loop, said once, not at every try.
"""

from __future__ import annotations

from typing import Callable, Optional

from procsv.common.manifests import Manifest
from procsv.ipc.messages import CheckpointsDeleted
from procsv.services.checkpoint.store import CheckpointStore


class Deletions:
    """Retired checkpoints whose deletion waits for a restore to end, and a trainer's request to
    delete every checkpoint that waits for the same."""

    def __init__(self, store: CheckpointStore, say: Callable[[str], None]) -> None:
        self.store = store
        self.say = say
        self.retired: list[Manifest] = []  # retired checkpoints whose deletion waits for a restore to end
        self.delete_for: Optional[bytes] = None  # a trainer's DeleteCheckpoints that waits for a restore to end
        self.held: frozenset[int] = frozenset()  # --audit: the steps retention keeps for it (the watchdog's AuditHold)

    def hold(self, steps: list[int]) -> None:
        """The watchdog's :class:`~procsv.ipc.messages.AuditHold`: the steps retention keeps from now on."""
        self.held = frozenset(steps)

    def retire(self, retired: list[Manifest]) -> None:
        """Delete ``retired`` and any retired earlier whose deletion waited for a restore
        (:meth:`CheckpointStore.delete`); what a restore still holds waits for the next tick."""
        waiting = {m.prefix: m for m in self.retired}
        waiting.update((m.prefix, m) for m in retired)
        if not waiting:
            return
        try:
            self.retired = self.store.delete(list(waiting.values()))
        except OSError as exc:
            self.retired = []
            self.say(f"procsv checkpoint: could not delete retired checkpoints: {exc}")
            return
        if self.retired and retired:  # said once per commit, not at every tick it still waits
            self.say("procsv checkpoint: a trainer is restoring; deleting the retired "
                     f"{', '.join(m.prefix for m in self.retired)} once it is done")

    def delete_all(self, identity: bytes) -> Optional[CheckpointsDeleted]:
        """A trainer's :class:`DeleteCheckpoints`: delete every committed checkpoint once no trainer
        restores (said once while one does). The answer to send, or None while it waits."""
        waited, self.delete_for = self.delete_for is not None, None
        try:
            deleted = self.store.delete_all()
        except OSError as exc:
            self.say(f"procsv checkpoint: could not delete the checkpoints: {exc}")
            return CheckpointsDeleted(0, f"{type(exc).__name__}: {exc}")
        if deleted is None:
            if not waited:
                self.say("procsv checkpoint: a trainer is restoring; deleting the checkpoints once it is done")
            self.delete_for = identity
            return None
        self.retired = []
        self.say(f"procsv checkpoint: deleted {deleted} checkpoint(s), as the trainer asked")
        return CheckpointsDeleted(deleted, None)
