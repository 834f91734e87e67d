"""The Supervisor's side of non-finite training (a mixin of its step boundary): the watch's
wiring, the policy's decision on a refused snapshot, and ``rollback``'s restore, replay, retry and skip.

Runs in the trainer's main thread, at step boundaries only (:mod:`procsv.trainer.boundary_methods`
calls it). ``rollback`` when a watched loss of step B was found non-finite: the newest finite state
R before B (no snapshot of a poisoned state is ever taken or committed) is restored in place: the
newest snapshot in the trainer's own snapshot memory when it is at least as new as the newest
committed checkpoint and verifies (:mod:`procsv.trainer.checkpoint.memory_restore`), else the
newest committed checkpoint, from disk (once the snapshot in flight, if any, is committed). The
program's loop then replays R+1 .. B-1 (the step numbers it reads come back with the restore) and
runs B once more, whose loss is read right after it. If it is non-finite again, R is restored
again, the loop replays to B-1, and B is skipped: its step function is not called, its input is
consumed (the next element of each ``tf.data`` iterator the checkpoint tracks is taken and
discarded, :mod:`.inputs`; with the input a function of the step there is nothing to take), no
variable changes, and the step count advances past it. More than ``max_skips`` skips within ``skip_window`` steps, a poisoned state without a
known bad step (only the weights were non-finite), or no finite state before B stop training with
exit code 4 instead.

In a trainer group (``procsv launch --nproc N``, MultiWorkerMirroredStrategy: each member holds its
own copy of the variables and every step is a collective) ``rollback`` does not restore in place:
only the chief checks, and a chief that restored and replayed alone would train out of lock with
the others. It stops in order with exit code 4 instead, as ``stop`` does, saying why
(:func:`~procsv.trainer.nonfinite.policy.in_place_refusal`).
"""

from __future__ import annotations

import os
import sys
from typing import Any, Callable, Optional, Sequence

from procsv import cluster
from procsv.common import env
from procsv.ipc.messages import RestoreSource, SessionLogEvent, SessionStatus
from procsv.trainer.checkpoint import memory_restore
from procsv.trainer.checkpoint.agent import CheckpointAgent
from procsv.trainer.checkpoint.name_based import NameBasedCheckpoint
from procsv.trainer.nonfinite import inputs, notices, policy, scan
from procsv.common.errors import NonFiniteState
from procsv.trainer.nonfinite.policy import OnNonfinite
from procsv.trainer.nonfinite.watch import NonfiniteWatch
from procsv.trainer.step_boundary import StepCounter, StepState


class NonfiniteMethods:
    """The watch (``_nonfinite``) of one Supervisor, and what a refused snapshot makes it do."""

    _nonfinite: NonfiniteWatch
    _new_agent: Callable[[], CheckpointAgent]
    _ckpt: Optional[CheckpointAgent]
    _channels: Any
    _state: StepState
    _counter: StepCounter
    _clock: Callable[[], float]
    checkpoint: Any
    stop_grace_secs: float

    def _flush_summaries(self, force: bool, urgent: bool = False, deadline: Optional[float] = None) -> None:
        raise NotImplementedError  # (SummaryMethods)

    def _attach_nonfinite(self, on_nonfinite: Optional[str], tags: Sequence[str], ignore: Sequence[str]) -> None:
        """Watch this Supervisor's losses and snapshots (:mod:`procsv.trainer.nonfinite`); every
        checkpoint agent it makes, this session's and later ones', checks its snapshots."""
        self._nonfinite = NonfiniteWatch(on_nonfinite, tags, ignore)
        spec = cluster.tf_config().get("cluster")
        spec = spec if isinstance(spec, dict) else {}
        members = max(cluster.nproc(), len(spec.get("worker") or ()) + len(spec.get("chief") or ()))
        self._nonfinite.group_refusal = policy.in_place_refusal(members, cluster.ps_tasks() + len(spec.get("ps") or ()))
        if os.environ.get(env.NONFINITE_CHECK, "").strip().lower() in ("0", "off", "no", "false"):
            return  # no detection at all: no loss kept, no snapshot scanned (what it costs: scripts/bench_nonfinite.py)
        self._state.losses = self._nonfinite.losses
        make = self._new_agent

        def new_agent() -> CheckpointAgent:
            agent = make()
            agent.store.watch = self._nonfinite
            agent.on_refused.append(self._nonfinite_refused)
            return agent

        self._new_agent = new_agent
        if self._ckpt is not None:
            self._ckpt.store.watch = self._nonfinite
            self._ckpt.on_refused.append(self._nonfinite_refused)

    def _nonfinite_refused(self, bad: NonFiniteState, final: bool) -> None:
        """A snapshot of a poisoned state was refused (``final``: the final checkpoint): the policy."""
        watch = self._nonfinite
        notices.tell(self._channels, notices.detected(bad.first_step, bad.describe(), watch.position))
        why = ""
        if watch.policy == OnNonfinite.ROLLBACK:
            why = "the final checkpoint's state" if final else self._roll_back(bad.bad_step, bad.describe())
            if not why:
                return
        self._stop_diverged(bad, why, final)

    def _stop_diverged(self, bad: NonFiniteState, why: str, final: bool) -> None:
        agent, ch = self._ckpt, self._channels
        if self._nonfinite.stops and ch is not None:  # stopping in order: what was logged, and the finite
            self._flush_summaries(force=True)  # snapshot in flight, are kept (it passed these checks)
            if agent is not None and agent.in_flight is not None:
                agent.wait_in_flight(ch, bad.step, self._clock() + self.stop_grace_secs)
        self._nonfinite.refused(bad, agent.last_committed if agent is not None else -1, final, why)

    # ------------------------------------------------------------------ rollback
    def _roll_back(self, bad_step: Optional[int], what: str) -> str:
        """Restore the newest finite snapshot before ``bad_step`` in place and arrange its retry (or,
        retried once already, its skip). Returns "" if rolled back, else why it cannot be (the
        skip bound, or the snapshot bound of :class:`~procsv.trainer.nonfinite.policy.RestoreBound`)."""
        watch, agent, ch = self._nonfinite, self._ckpt, self._channels
        if watch.group_refusal:
            return watch.group_refusal
        if bad_step is None:
            return "only the weights were found non-finite, at a snapshot: the step that made them so is not known"
        if agent is None or ch is None:
            return "no checkpoint to roll back to (checkpoint=None)"
        if watch.replay_unsupported:
            return watch.replay_unsupported
        skip = bad_step in watch.retried
        if skip and not watch.budget.allows(bad_step):
            return (f"step {bad_step} would be skip {len(watch.budget.recent(bad_step)) + 1} within "
                    f"{watch.budget.skip_window} steps (--max-skips {watch.budget.max_skips}; skipped so far: "
                    f"{', '.join(map(str, watch.budget.skipped)) or 'none'})")
        diverging = watch.restores.exceeded(bad_step)
        if diverging:
            return diverging
        began = self._clock()
        restored, source, path = self._restore_memory(agent, bad_step)
        kind = RestoreSource.MEMORY
        if restored < 0:
            if agent.in_flight is not None:
                agent.wait_in_flight(ch, bad_step, self._clock() + self.stop_grace_secs)
            restored = agent.last_committed
            if restored < 0 or restored >= bad_step:
                return f"no committed checkpoint or in-memory snapshot before step {bad_step} to roll back to"
            self._flush_summaries(force=True)
            source, kind = f"{agent.basename}-{restored}", RestoreSource.DISK
            path = os.path.join(agent.layout.logdir, source)
            began = self._clock()
            if isinstance(agent.store.checkpoint, NameBasedCheckpoint):  # a TF1 graph program's variables
                agent.store.checkpoint.restore(path)
            else:
                self.checkpoint.read(path).expect_partial()
        secs = self._clock() - began
        forget = getattr(self._counter.global_step, "forget", None)
        if forget is not None:  # a graph program's global step: its last observed value is undone
            forget()
        self._counter.pending = 0  # the variable holds the restored step
        self._state.step = restored
        watch.losses.forget()
        ch.to_summary(SessionLogEvent(SessionStatus.START, restored + 1))  # TensorBoard drops the undone steps
        watch.target, watch.skipping = bad_step, skip
        watch.due = self._next_due(restored)
        watch.rollbacks += 1
        watch.restores.restored(restored)
        for hook in watch.on_restored:
            hook(restored)
        self._bound_nonfinite()
        notices.tell(ch, notices.rolled_back(bad_step, restored, kind, path, skip, secs, watch.position))
        then = f"skipping step {bad_step} (non-finite again when retried)" if skip else f"retrying step {bad_step} once"
        print(f"procsv: non-finite training at step {bad_step}: {what}; --on-nonfinite rollback: restored step "
              f"{restored} from {source}, replaying to step {bad_step - 1}, then {then}",
              file=sys.stderr, flush=True)
        return ""

    def _restore_memory(self, agent: CheckpointAgent, bad_step: int) -> tuple[int, str, str]:
        """Restore the newest in-memory snapshot before ``bad_step`` in place if it is at least as new
        as the newest committed checkpoint and verifies (:mod:`procsv.trainer.checkpoint.memory_restore`);
        returns its step, where it came from in words and as a path (the snapshot memory's, and
        its slot), or (-1, "", "") for the disk."""
        store = agent.store
        if isinstance(store.checkpoint, NameBasedCheckpoint):  # no assign-from-memory ops in its frozen graph
            return -1, "", ""
        copy = memory_restore.newest_before(store.copies, store.arena, bad_step)
        if copy is None or store.arena is None or copy.step < agent.last_committed:
            return -1, "", ""
        ignore = self._nonfinite.ignore
        frames = list(copy.frames)

        def poison(specs: Any, memory: Any) -> tuple[str, ...]:
            return scan.nonfinite_keys(specs, frames, memory, scan.rules(self.checkpoint, ignore))

        why = memory_restore.problem(self.checkpoint, copy, store.arena, poison)
        if why:
            print(f"procsv: not rolling back to the in-memory snapshot of step {copy.step} ({why}); "
                  "restoring from disk", file=sys.stderr, flush=True)
            return -1, "", ""
        self._flush_summaries(force=True)
        memory_restore.restore(self.checkpoint, copy, store.arena)
        return copy.step, "the in-memory snapshot", f"{store.arena.ref().path}#slot{copy.slot}"

    def _skip_input(self, step: int) -> None:
        """Skipped step ``step`` consumes its input; a program's own hooks (Keras fit: its iteration
        counter, its position) move past it too."""
        inputs.consume(self.checkpoint)
        for hook in self._nonfinite.on_skipped:
            hook(step)

    def _advance_past(self, step: int) -> None:
        """The global step moves from ``step`` past the skipped step: procsv's count, or, where the
        program counts itself (a graph program's optimizer), its variable, assigned."""
        counted = self._counter.advance(step)
        if counted is not None and counted != step + 1:
            self._counter.global_step.assign(step + 1)

    def _next_due(self, step: int) -> Optional[int]:
        """The next boundary at or after ``step`` with rollback work: a step skipped before, which the
        replay skips again (uncounted), or the bad step's skip or retry."""
        watch = self._nonfinite
        if watch.target is None:
            return None
        due = [s - 1 for s in watch.budget.skipped if s - 1 >= step and s < watch.target]
        due.append(watch.target - 1 if watch.skipping else watch.target)
        return min(due)

    def _bound_nonfinite(self) -> None:
        """The checkpoint half's boundary comes no later than the rollback's next work."""
        due = self._nonfinite.due
        if due is not None and due < self._state.ckpt_step:
            self._state.set_checkpoint(due, self._state.ckpt_at)

    def _nonfinite_work(self) -> bool:
        """The rollback's work due at the current step, as often as it moves the step; True if it did."""
        moved = False
        while True:
            due, step = self._nonfinite.due, self._state.step
            if due is None or step < due or not self._nonfinite_due(step):
                return moved
            moved = True

    def _nonfinite_due(self, step: int) -> bool:
        """At the boundary after ``step`` (the rollback's ``due``): check the replayed steps (one
        read), then skip the bad step or judge its retry. True if the step count moved."""
        watch = self._nonfinite
        target = watch.target
        watch.due = None
        assert target is not None
        if step + 1 in watch.budget.skipped and step + 1 < target:  # the replay meets a step skipped before
            self._skip_input(step + 1)
            self._advance_past(step)
            self._state.step = step + 1
            watch.due = self._next_due(step + 1)
            self._bound_nonfinite()
            return True
        bad = watch.losses.check()
        if bad is not None and (bad < target or not watch.skipping):
            if bad == target:
                watch.retried.add(target)
            notices.tell(self._channels, notices.detected(bad, f"the loss of step {bad} is NaN or infinite",
                                                          watch.position))
            why = self._roll_back(bad, f"the loss of step {bad} is NaN or infinite"
                                  + (" again when retried" if bad == target else ""))
            if why:
                self._stop_diverged(NonFiniteState(step, bad), why, False)
            return True
        if not watch.skipping:  # the retried step was finite this time
            print(f"procsv: step {target} was finite when retried; training on", file=sys.stderr, flush=True)
            watch.target = None
            return False
        watch.budget.skip(target)
        notices.tell(self._channels, notices.skipped(target, len(watch.budget.skipped), watch.position))
        self._skip_input(target)  # its input: the data position moves past it
        self._advance_past(step)  # the step count moves past the skipped step; no other variable changes
        self._state.step = target
        watch.target = None
        print(f"procsv: skipped step {target} (its loss was NaN or infinite twice); training on from step "
              f"{target + 1}", file=sys.stderr, flush=True)
        return True
