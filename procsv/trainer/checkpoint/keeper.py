"""The Supervisor's checkpoints collaborator: each session's checkpoint agent, and the restore at its start.

Runs in the trainer's main thread, the one that prepares the session. :class:`CheckpointKeeper`
owns the :class:`~procsv.trainer.checkpoint.agent.CheckpointAgent` of the open session (the agent
owns the snapshots, the in-memory tier and the commits) and makes a new one for a session prepared
again after a stop; what every agent must be told (the step counter's sync before each snapshot,
the step boundary's wake-up on a requested save, the non-finite watch) is registered once with
:meth:`CheckpointKeeper.configure` and applied to the agent of today and to every later one.

At a session's start :meth:`CheckpointKeeper.restore` restores the newest committed checkpoint (or
initializes): after a restart, first the dead trainer's in-memory snapshot if the checkpoint
service held one (:func:`~procsv.trainer.checkpoint.restore_at_start.recover_memory`); in a
trainer group, every worker restores exactly the checkpoint its chief restored (the group's pin,
:class:`~procsv.trainer.replica.GroupPin`), since a newer commit in between would diverge them.
"""

from __future__ import annotations

import os
from typing import Callable, Optional

from procsv.ipc.messages import DeleteCheckpoints
from procsv.ipc.transport import NoReply
from procsv.trainer.channels import TrainerChannels
from procsv.trainer.checkpoint import restore_at_start
from procsv.trainer.checkpoint.agent import CheckpointAgent
from procsv.trainer.replica import GroupPin


class CheckpointKeeper:
    """The checkpoint agent of each session of one Supervisor, made by ``make``."""

    def __init__(self, make: Callable[[], CheckpointAgent]) -> None:
        self._make = make
        self._setup: list[Callable[[CheckpointAgent], None]] = []
        self._channels: Optional[TrainerChannels] = None
        self.agent = make()

    def attach(self, channels: TrainerChannels) -> None:
        """A session is prepared: the checkpoint service is reached through ``channels``."""
        self._channels = channels

    def detach(self) -> None:
        """The session ended (the Supervisor's stop released it): no service to reach, and the agent's
        snapshot memory is let go (each session's agent made its own arena, a memfd of the state's
        size, kept until the process exited: one more per ``managed_session`` block)."""
        self._channels = None
        self.agent.store.close()

    def configure(self, setup: Callable[[CheckpointAgent], None]) -> None:
        """Apply ``setup`` to the agent now and to every agent made later (:meth:`renew`)."""
        self._setup.append(setup)
        setup(self.agent)

    def renew(self) -> CheckpointAgent:
        """A new agent, for a session prepared again after a stop (the old one's state is that session's)."""
        self.agent = self._make()
        for setup in self._setup:
            setup(self.agent)
        return self.agent

    @property
    def restored_from(self) -> Optional[str]:
        """The checkpoint prefix this session restored, or None if it initialized."""
        return self.agent.restored_from

    def restore(self, init: Callable[[], None], *, chief: bool, restarted: bool, reused: bool,
                pin_path: Optional[str]) -> list[str]:
        """Restore the newest committed checkpoint that verifies (else call ``init``); return the corrupt
        prefixes passed over. ``restarted``: this trainer replaces a dead one (the launch's attempt > 1),
        so the checkpoint service may hold its in-memory snapshot, which the chief recovers first unless
        ``reused`` (a session again in this process: the service's snapshot is this process's own) or in
        a group. ``pin_path``: the group's pin file (``--nproc`` > 1), None alone."""
        agent, channels = self.agent, self._channels
        assert channels is not None
        pin = GroupPin(pin_path) if pin_path else None
        if restarted and chief and not reused and pin is None and agent.memory_budget > 0:
            restore_at_start.recover_memory(channels)  # a dead trainer's in-memory snapshot, if the service held one
        # a group's workers restore exactly what the chief restored (a newer commit in between would diverge them)
        pinned = restore_at_start.Pinned(pin.wait()) if pin is not None and not chief else None
        skipped = agent.restore_or_init(init, pinned=pinned)
        if pin is not None and chief:
            pin.publish(agent.restored_from or None)
        return skipped

    def delete_all(self, grace_secs: float) -> Optional[str]:
        """Have the checkpoint service delete this run's checkpoints (Keras' ``delete_checkpoint``:
        data, index, manifests, the state file; the service is their one writer), waiting up to
        ``grace_secs`` for its answer; None if done, else why not. Needs an open session."""
        channels = self._channels
        if channels is None:
            return "no open session"
        try:
            answer = channels.delete_checkpoints(DeleteCheckpoints(os.getpid()), channels.clock() + grace_secs)
        except NoReply as exc:
            return str(exc)
        return answer.error or None
