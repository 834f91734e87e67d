"""The non-finite rollback's restores in place: the newest finite state before a bad step put back
into the live variables, and the steps after it undone.

Runs in the trainer's main thread, at step boundaries only (the rollback,
:class:`~procsv.trainer.nonfinite.rollback.NonfiniteRollback`, and a loss spike's response,
:mod:`.spike_response`, call it). :meth:`StateRestore.before` restores the newest in-memory snapshot
before the bad step (:mod:`procsv.trainer.checkpoint.memory_restore`) when it is at least as new as the
newest committed checkpoint and verifies, else the newest committed checkpoint from disk, once the
snapshot in flight, if any, is answered (a TF1 graph program's variables by name,
:class:`~procsv.trainer.checkpoint.name_based.NameBasedCheckpoint`: from disk only; a program without a
global step: its one checkpoint, rewritten in place, at the step its manifest holds).
:meth:`StateRestore.put_back` puts back the state kept before a retry (:mod:`.retry_state`);
:meth:`StateRestore.undone` undoes what came after a restored step (the step count, the losses kept and
judged for spikes, TensorBoard's points).
"""

from __future__ import annotations

import os
import sys
from typing import Any, Callable, Optional

from procsv.common.errors import CorruptCheckpoint, UnreadableCheckpoint
from procsv.common.manifests import Manifest, read_in_place
from procsv.ipc.messages import RestoreSource, SessionLogEvent, SessionStatus
from procsv.trainer.channels import TrainerChannels
from procsv.trainer.checkpoint import memory_restore
from procsv.trainer.checkpoint.agent import CheckpointAgent
from procsv.trainer.checkpoint.name_based import NameBasedCheckpoint
from procsv.trainer.nonfinite import retry_state, scan
from procsv.trainer.nonfinite.watch import NonfiniteWatch
from procsv.trainer.settings import Settings
from procsv.trainer.step_boundary import StepCounter, StepState


class StateRestore:
    """One Supervisor's restores in place (see the module). Owns the furthest step a restore of this
    session undid (``reached``: the loop had trained to it; -1 at a session's start,
    :meth:`new_session`) and which rollback's restore that was (``reached_by``, in words). Given: the
    watch (its ignored keys, the losses kept and the spike history a restore rewinds), the step state and counter (a restore moves the step back), the saved state
    (``checkpoint``), ``flush_summaries`` (everything logged is handed off before a restore), the clock
    and the Supervisor's settings (the ``stop_grace_secs`` a wait for the snapshot in flight takes at most)."""

    def __init__(self, watch: NonfiniteWatch, state: StepState, counter: StepCounter, checkpoint: Any,
                 flush_summaries: Callable[[], None], clock: Callable[[], float], settings: Settings) -> None:
        self._watch = watch
        self._state = state
        self._counter = counter
        self._checkpoint = checkpoint
        self._flush_summaries = flush_summaries
        self._clock = clock
        self._settings = settings  # stop_grace_secs: read live
        self.reached = -1  # the furthest step a restore of this session undid: the loop had trained to it
        self.reached_by = "a non-finite rollback"  # the rollback whose restore undid it, in words

    def new_session(self) -> None:
        """A session is prepared: no restore of it has undone a step yet."""
        self.reached, self.reached_by = -1, "a non-finite rollback"

    def before(self, agent: CheckpointAgent, ch: TrainerChannels,
                        bad_step: int) -> tuple[int, str, RestoreSource, str, float] | str:
        """Restore the newest finite state before ``bad_step`` in place: the newest in-memory snapshot
        (:meth:`_memory`), else the newest committed checkpoint, once the snapshot in flight is
        answered. Returns its step, where it came from in words, as a kind and as a path, and the
        restore's seconds; or why there is none."""
        began = self._clock()
        restored, source, path = self._memory(agent, bad_step)
        kind = RestoreSource.MEMORY
        if restored < 0:
            if agent.in_flight is not None:
                agent.wait_in_flight(ch, bad_step, self._clock() + self._settings.stop_grace_secs)
            kind = RestoreSource.DISK
            if not getattr(agent.global_step, "numbered", True):  # no global step: one prefix, rewritten in place
                self._flush_summaries()
                began = self._clock()
                done = self._in_place(agent, bad_step)
                if isinstance(done, str):
                    return done
                restored, source, path = done
                return restored, source, kind, path, self._clock() - began
            restored = agent.last_committed
            if restored < 0 or restored >= bad_step:
                return f"no committed checkpoint or in-memory snapshot before step {bad_step} to roll back to"
            self._flush_summaries()
            source = f"{agent.policy.basename}-{restored}"
            path = os.path.join(agent.layout.logdir, source)
            began = self._clock()
            self._read(agent, path)
        return restored, source, kind, path, self._clock() - began

    def _read(self, agent: CheckpointAgent, path: str) -> None:
        """Restore the checkpoint at ``path`` in place (the disk tier of a rollback)."""
        if isinstance(agent.store.checkpoint, NameBasedCheckpoint):  # a TF1 graph program's variables
            agent.store.checkpoint.restore(path)
        else:
            self._checkpoint.read(path).expect_partial()

    def _in_place(self, agent: CheckpointAgent, bad_step: int) -> tuple[int, str, str] | str:
        """The disk tier's restore for a program without a global step: its one checkpoint, ``<basename>``
        (as TF's Supervisor names it), is rewritten in place at each save and may hold a newer step than
        the last commit this trainer was told of, so it is read at the step its manifest holds, consistent
        with a rewrite (:func:`~procsv.common.manifests.read_in_place`). Returns that step, where it came
        from in words and as a path; or why there is none before ``bad_step``."""
        import tensorflow as tf

        basename, layout = agent.policy.basename, agent.layout
        path = os.path.join(layout.logdir, basename)
        none = f"no committed checkpoint or in-memory snapshot before step {bad_step} to roll back to"

        def read(manifest: Manifest) -> None:
            if manifest.step >= bad_step:  # not read (its snapshot passed the checks: never expected)
                return
            try:
                self._read(agent, path)
            except (tf.errors.DataLossError, tf.errors.NotFoundError) as exc:  # rewritten while read
                raise CorruptCheckpoint(f"{basename}: {str(exc).splitlines()[0]}") from None

        try:
            done = read_in_place(layout, basename, read, clock=self._clock)
        except (CorruptCheckpoint, UnreadableCheckpoint) as exc:
            return f"{none}: {exc}"
        if done is None:
            return none
        if done.step >= bad_step:
            return f"{none} ({basename}, the one checkpoint of a run without a global step, holds step {done.step})"
        return done.step, basename, path

    def undone(self, ch: TrainerChannels, restored: int, spike: bool = False) -> None:
        """The state of ``restored`` was put back in place (``spike``: by a loss spike's rollback, else a
        non-finite step's): the steps after it are undone (the step count, the losses kept and judged for
        spikes, TensorBoard's points after it)."""
        step = self._counter.global_step
        if not getattr(step, "numbered", True):  # no global step: the count kept in Python, held by no checkpoint
            step.assign(restored)
        elif getattr(step, "forget", None) is not None:  # a graph program's global step: its last observed value is undone
            step.forget()
        self._counter.pending = 0  # the variable holds the restored step
        if self._state.step >= self.reached:
            self.reached, self.reached_by = self._state.step, "a loss spike's rollback" if spike else "a non-finite rollback"
        self._state.step = restored
        self._watch.losses.forget()
        if self._watch.spikes is not None:
            self._watch.spikes.rewind(restored)
        ch.to_summary(SessionLogEvent(SessionStatus.START, restored + 1))  # TensorBoard drops the undone steps

    def put_back(self, kept: Optional[retry_state.KeptState], bad_step: int) -> tuple[int, str, str]:
        """Put back the state kept before the retry of ``bad_step`` (:mod:`.retry_state`), if it is
        that step's and the object graph is the same; returns its step, where it came from in words
        and as a path, or (-1, "", "") if not put back."""
        if kept is None or kept.step != bad_step - 1:
            return -1, "", ""
        self._flush_summaries()
        if not retry_state.put_back(self._checkpoint, kept):
            return -1, "", ""
        return kept.step, "the state kept before the retry", f"memory#retry{kept.step}"

    def exactly(self, agent: CheckpointAgent, step: int) -> tuple[int, str, RestoreSource, str, float] | str:
        """A trainer group's rollback in place (:mod:`.group_verdict`): restore this member's own in-memory
        copy of ``step`` (the group's verdict: every member holds one) in place, verified as
        :meth:`before`'s; returns as :meth:`before` does, or why it cannot (then nothing is assigned)."""
        began = self._clock()
        restored, source, path = self._memory(agent, step + 1, exact=True)
        if restored != step:
            return f"this member's in-memory copy of step {step} is not whole or does not verify"
        return restored, source, RestoreSource.MEMORY, path, self._clock() - began

    def _memory(self, agent: CheckpointAgent, bad_step: int, exact: bool = False) -> tuple[int, str, str]:
        """Restore the newest in-memory snapshot before ``bad_step`` in place if it is at least as new
        as the newest committed checkpoint (``exact``: whatever that is: a group's verdict weighed it) and
        verifies (:mod:`procsv.trainer.checkpoint.memory_restore`); returns its step, where it came from in
        words and as a path (the snapshot memory's, and its slot), or (-1, "", "") for the disk."""
        store = agent.store
        if isinstance(store.checkpoint, NameBasedCheckpoint):  # no assign-from-memory ops in its frozen graph
            return -1, "", ""
        copy = memory_restore.newest_before(store.copies, store.arena, bad_step)
        if copy is None or store.arena is None or (copy.step < agent.last_committed and not exact) \
                or (exact and copy.step != bad_step - 1):
            return -1, "", ""
        ignore = self._watch.ignore
        frames = list(copy.frames)
        checkpoint = self._checkpoint

        def poison(specs: Any, memory: Any) -> tuple[str, ...]:
            return scan.nonfinite_keys(specs, frames, memory, scan.rules(checkpoint, ignore))

        why = memory_restore.problem(checkpoint, copy, store.arena, poison)
        if why:
            print(f"procsv: not rolling back to the in-memory snapshot of step {copy.step} ({why}); "
                  "restoring from disk", file=sys.stderr, flush=True)
            return -1, "", ""
        self._flush_summaries()
        memory_restore.restore(checkpoint, copy, store.arena)
        return copy.step, "the in-memory snapshot", f"{store.arena.ref().path}#slot{copy.slot}"
