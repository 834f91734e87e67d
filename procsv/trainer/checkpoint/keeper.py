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
trainer group, every worker restores exactly what its chief restored (the group's pin,
:class:`~procsv.trainer.replica.GroupPin`), since a newer commit in between would diverge them: a
checkpoint, or the group's in-memory snapshot of one step, each member its own copy
(:mod:`~procsv.trainer.checkpoint.group_restore`).
"""

from __future__ import annotations

import os
import sys
from typing import Any, Callable, Optional

from procsv.common.bootstrap import ChildConfig
from procsv.common.errors import CorruptCheckpoint
from procsv.ipc.messages import DeleteCheckpoints
from procsv.ipc.transport import NoReply
from procsv.trainer.channels import TrainerChannels
from procsv.trainer.checkpoint import group_restore, restore_at_start
from procsv.trainer.checkpoint.agent import CheckpointAgent
from procsv.trainer.replica import GroupPin, PinRecord


class CheckpointKeeper:
    """The checkpoint agent of each session of one Supervisor, made by ``make``."""

    def __init__(self, make: Callable[[], CheckpointAgent]) -> None:
        self._make = make
        self._setup: list[Callable[[CheckpointAgent], None]] = []
        self._channels: Optional[TrainerChannels] = None
        self.agent = make()
        # what the next session's restore restores into instead of the agent's checkpoint object (None: that):
        # an object with ``restore(path)`` as ``tf.train.Checkpoint``'s (FrontEnd.restore_into); used once
        self.restore_target: Optional[Any] = None
        self._restored: Optional[tuple[str, Any]] = None  # the path and TF's status of the last restore, till checked
        self.configure(lambda agent: agent.hooks.restored.append(self._note_restored))

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

    def _note_restored(self, path: str, status: Any) -> None:
        self._restored = (path, status)

    def check_restored(self) -> None:
        """After the session's first step (the program has built its model): one line if the restore did
        not reach variables the program created after it (:func:`~.restore_at_start.unassigned`: they kept
        their initial values, and the run goes on from them, as TF's own restore would); checked once."""
        if self._restored is None:
            return
        (path, status), self._restored = self._restored, None
        missed = restore_at_start.unassigned(status)
        if missed:
            names = ", ".join(k.split("/.ATTRIBUTES")[0] for k in missed[:4]) + (", ..." if len(missed) > 4 else "")
            print(f"procsv: the restore of {os.path.basename(path)} did not reach {len(missed)} variable(s) the "
                  f"program created after it ({names}): they keep their initial values, and an optimizer's state "
                  "built after it may be matched to the wrong variables too (Keras 3 numbers them), so this run "
                  "goes on from them, not from the checkpoint (TensorFlow's own restore does the same: a Keras 3 "
                  "layer built after a restore is not restored); build the model and its optimizer before "
                  "managed_session() (model.build(...) or one call on a batch, optimizer.build(model.trainable_variables)) "
                  "to resume it whole", file=sys.stderr, flush=True)

    def take_restore_target(self) -> Optional[Any]:
        """What the next restore restores into (:attr:`restore_target`), used once: an auditor's replay takes it."""
        target, self.restore_target = self.restore_target, None
        return target

    def prepare_snapshot(self) -> None:
        """What a snapshot writes first (the step into its variable, a Keras fit's position), run now: an
        auditor's state at S2 then holds what the trainer's checkpoint S2 holds."""
        for before_snapshot in self.agent.hooks.prepare:
            before_snapshot()

    @property
    def restored_from(self) -> Optional[str]:
        """The checkpoint prefix this session restored, or None if it initialized."""
        return self.agent.restored_from

    def restore(self, init: Callable[[], None], *, chief: bool, restarted: bool, reused: bool,
                pin_path: Optional[str], config: ChildConfig = ChildConfig()) -> list[str]:
        """Restore the newest committed checkpoint that verifies (else call ``init``); return the corrupt
        prefixes passed over. ``restarted``: this trainer replaces a dead one (the launch's attempt > 1),
        so the checkpoint service may hold its in-memory snapshot, which the chief recovers first unless
        ``reused`` (a session again in this process: the service's snapshot is this process's own).
        ``pin_path``: the group's pin file (``--nproc`` > 1, a group of ``config.place.nproc``), None alone;
        ``config``: this trainer's (its group, and the rollback its attempt was started for)."""
        agent, channels = self.agent, self._channels
        assert channels is not None
        target, self.restore_target = self.restore_target, None
        if pin_path:
            # a group over hosts asks at a launch's first attempt too: node 0 relaunched, node 1's holder handed
            # its replica of the group's copies back to node 0's new checkpoint service (issue 70)
            ask = (restarted or config.place.hosts > 1) and not reused
            return self._restore_group(GroupPin(pin_path), init, chief, restarted and not reused, config, target, ask)
        # restarted for a rollback of step B (an audit found the trainer's machine computed wrongly after B - 1,
        # issue 71): the newest checkpoint before B, never the in-memory snapshot of a later step
        before = config.resume.rollback_before if restarted and not reused else None
        if restarted and chief and not reused and agent.memory.budget > 0 and before is None:
            restore_at_start.recover_memory(channels)  # a dead trainer's in-memory snapshot, if the service held one
        return agent.restore_or_init(init, before=before, target=target)

    def _restore_group(self, pin: GroupPin, init: Callable[[], None], chief: bool, restarted: bool,
                       config: ChildConfig, target: Optional[Any] = None, ask: bool = False) -> list[str]:
        """A group member's restore: every member restores exactly what the chief pinned (a newer
        commit in between would diverge them): the group's in-memory snapshot of one step, each
        member its own copy (:mod:`~procsv.trainer.checkpoint.group_restore`), or one checkpoint.
        ``ask``: the chief asks the checkpoint service for the group's in-memory snapshots."""
        agent, channels = self.agent, self._channels
        assert channels is not None
        group = agent.group
        if not chief:
            record = pin.wait()
            if record.memory_step is None:
                return agent.restore_or_init(init, pinned=restore_at_start.Pinned(record.path), target=target)
            if group is None:
                raise CorruptCheckpoint(f"the group's chief pinned its in-memory snapshot of step {record.memory_step}, "
                                        "and this member keeps none (PROCSV_GROUP_SNAPSHOT_STEPS differs)")
            group_restore.restore_copy(channels, agent, group[0], record.memory_step, record.memory_attempt)
            remote = agent.memory.remote
            agent.restored_memory(record.memory_step, group_restore.newest_committed(agent), peer=remote)
            if remote:  # (node 0's service holds this member's copy: its peer copy, off its own host)
                print(f"procsv: member {group[0]} restored step {record.memory_step} from its peer copy on node 0",
                      file=sys.stderr, flush=True)
            return []
        # restarted for the group's rollback of step B: the newest state before B (a checkpoint the chief
        # committed after B holds B's update; the chief checks only its own losses, a worker's NaN is found later)
        before = config.resume.rollback_before if restarted else None
        newest = group_restore.newest_committed(agent, before)
        held = group_restore.whole_step(channels, config.place.nproc, newest, before, say=restarted) \
            if ask and group is not None else None
        if held is not None and before is not None and held[0] >= before:  # (the service answers one before B)
            print(f"procsv: the group restores from disk: its in-memory snapshot of step {held[0]} is not before "
                  f"step {before}, which it rolls back", file=sys.stderr, flush=True)
            held = None
        if held is not None:
            try:
                group_restore.restore_copy(channels, agent, 0, held[0], held[1])
            except CorruptCheckpoint as exc:
                print(f"procsv: the group restores from disk: {exc}", file=sys.stderr, flush=True)
                held = None
        if held is not None:
            passed = group_restore.passed_over(agent.layout, before)
            if passed:  # (restored from disk, the walk over the committed checkpoints says the same)
                restore_at_start.say_passed_over(before, passed, group=True)
            agent.restored_memory(held[0], newest, peer=held[2], passed={m.step: m.revision for m in passed})
            pin.publish(PinRecord(None, held[0], held[1]))
            return []
        skipped = agent.restore_or_init(init, before=before, target=target)
        pin.publish(PinRecord(agent.restored_from or None))
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
