"""The end of a checkpoint agent's session: the wait for the snapshot in flight, and the final commit.

Runs in the trainer's main thread, when the Supervisor stops (a clean finish, a preemption, a stop
for non-finite training): :class:`FinalCommit` is the half of
:class:`~procsv.trainer.checkpoint.agent.CheckpointAgent` that waits, until a deadline, for the
snapshot in flight to be answered (heartbeating on, so that a replaced checkpoint service answers
``LOST`` for a snapshot it never received; past the snapshot's own deadline it is overdue) and then
commits the last completed step within ``stop_grace_secs``, saying so in one line either way. The
snapshot triggers, the sending and the results are the agent's.
"""

from __future__ import annotations

import sys
from typing import Callable, Optional

from procsv.common.errors import NonFiniteState
from procsv.ipc.messages import Busy, CommitLoading, SaveReason, SaveResult
from procsv.ipc.transport import NoReply
from procsv.trainer.channels import TrainerChannels
from procsv.trainer.checkpoint.commits import CommitTracker

HEARTBEAT_EVERY = 2.0  # seconds between CheckpointSetup heartbeats to the checkpoint service


class FinalCommit:
    """The end of a session's checkpointing (see the module). Given by the agent: its commit
    tracker, the newest step known committed, when it last heartbeat, the listeners of a refused
    snapshot, and its heartbeat, overdue check, result handling, slot and send."""

    commits: CommitTracker
    last_committed: int
    last_heartbeat: float
    refused_final: bool
    sent_revision: int
    on_refused: list[Callable[[NonFiniteState, bool], None]]

    @property
    def in_flight(self) -> Optional[int]:
        raise NotImplementedError

    def behind(self, step: int) -> bool:
        raise NotImplementedError

    def heartbeat(self, ch: TrainerChannels, step: int, now: float) -> None:
        raise NotImplementedError

    def _overdue(self, ch: TrainerChannels, now: float) -> None:
        raise NotImplementedError

    def _on_result(self, msg: SaveResult) -> None:
        raise NotImplementedError

    def _free_slot(self, ch: TrainerChannels, step: int, deadline: float) -> bool:
        raise NotImplementedError

    def _send(self, ch: TrainerChannels, step: int, reason: SaveReason, busy_after: Busy = Busy.NONE,
              until: Optional[float] = None) -> bool:
        raise NotImplementedError

    def _await_in_flight(self, ch: TrainerChannels, step: int, deadline: float) -> tuple[bool, Optional[SaveResult]]:
        """Wait until ``deadline`` for the snapshot in flight to be answered, as :meth:`poll` would at
        steps: past its own deadline it is overdue (the watchdog replaces the service), and heartbeats
        go on, so that a replaced service answers ``LOST`` for a snapshot it never received. Returns
        whether it was answered, and the last answer."""
        result: Optional[SaveResult] = None
        while self.in_flight is not None:
            now = ch.clock()
            if now >= deadline:
                break
            if now >= self.commits.overdue_at:
                self._overdue(ch, now)
            if now - self.last_heartbeat >= HEARTBEAT_EVERY:
                self.heartbeat(ch, step, now)
            try:
                result = ch.wait_save_result(self.in_flight, min(deadline, self.commits.overdue_at, now + HEARTBEAT_EVERY),
                                             lambda msg: self.commits.load_moved(msg) if isinstance(msg, CommitLoading) else None)
            except NoReply:
                continue
            self._on_result(result)
        return self.in_flight is None, result

    def wait_in_flight(self, ch: TrainerChannels, step: int, deadline: float) -> bool:
        """Wait until ``deadline`` for the snapshot in flight to be answered (a stop that takes no
        checkpoint of its own: the one in flight is the last); True if it was."""
        return self._await_in_flight(ch, step, deadline)[0]

    def final(self, ch: TrainerChannels, step: int, reason: SaveReason, grace_secs: float) -> Optional[SaveResult]:
        """Commit ``step`` (unless it already is, with the state as it is now) within ``grace_secs``;
        return the result. A committed step whose state changed since (:meth:`behind`) is rewritten."""
        if step <= self.last_committed and not self.behind(step):
            return None
        deadline = ch.clock() + grace_secs
        if self.in_flight is not None:
            waited_for = self.in_flight
            answered, result = self._await_in_flight(ch, step, deadline)
            if not answered:  # the service may still read the snapshot memory: do not overwrite it
                print(f"procsv: the checkpoint of step {waited_for} did not commit within "
                      f"stop_grace_secs={grace_secs:g}; the previous checkpoint is kept", file=sys.stderr, flush=True)
                return None
            if step <= self.last_committed and not self.behind(step):  # the one in flight was of ``step`` as it is
                if result is not None and result.ok and result.step == step:
                    print(f"procsv: {reason} checkpoint committed at step {step}", flush=True)
                return result
        for _ in range(2):  # a second snapshot only when the first was a revision the service had already (below)
            self.heartbeat(ch, step, ch.clock())  # a just-restarted service learns our settings before the snapshot
            try:
                sent = self._free_slot(ch, step, deadline) and self._send(ch, step, reason, Busy.FINAL_CHECKPOINT, deadline)
            except NonFiniteState as bad:
                self.refused_final = True
                for refused in self.on_refused:
                    refused(bad, True)  # the policy: --on-nonfinite stop raises
                return None
            if not sent:
                print(f"procsv: the {reason} checkpoint at step {step} could not be handed to the checkpoint service "
                      f"within stop_grace_secs={grace_secs:g}; the previous checkpoint is kept", file=sys.stderr, flush=True)
                return None
            step = self.in_flight if self.in_flight is not None else step  # the step stored in it names it
            try:
                result = ch.wait_save_result(step, deadline)
            except NoReply:
                print(f"procsv: the {reason} checkpoint at step {step} did not commit within "
                      f"stop_grace_secs={grace_secs:g}; the previous checkpoint is kept", file=sys.stderr, flush=True)
                return None
            self._on_result(result)
            # ``again`` for a newer revision of a committed step: the service has that revision already, an
            # older state (a service that died after its commit point, before its answer, or a dead trainer's
            # snapshot); the answer named it, so this state goes again as the revision above it
            if not (result.ok and result.again and self.sent_revision and self.behind(step)):
                break
        if result is not None and result.ok:
            print(f"procsv: {reason} checkpoint committed at step {step}", flush=True)
        return result

