"""A trainer group's rollback (``procsv launch --nproc N``): in place, on the group's verdict at a K-th step
(:class:`GroupInPlace`), else the ask of the member that found a bad step for the group's restart past it
(:class:`GroupAsk`).

Runs in the trainer's main thread, at step boundaries only (the non-finite rollback,
:class:`~procsv.trainer.nonfinite.rollback.NonfiniteRollback`, and a loss spike's response,
:mod:`.spike_response`, call it). In a MultiWorkerMirroredStrategy group each member holds its own copy
of the variables and every step is a collective: a member that restored and replayed alone would train
out of lock with the others (:func:`group_refusal` says why, :func:`~.policy.in_place_refusal`). The
member that finds step B non-finite (or the chief, a loss spike) sends its finding and exits with code 5
(:class:`~procsv.common.errors.GroupRollback`); the watchdog records B as skipped and restarts the
group, whose members all restore the same state before B and skip it when their replay reaches it
(:meth:`~procsv.trainer.nonfinite.rollback.NonfiniteRollback.resume`, from ``PROCSV_SKIP_STEPS``).
Past ``--max-skips`` it stops in order with exit code 4 instead, as a single trainer does.

In place (:class:`GroupInPlace`, at the group's K-th steps, where every member stands at the same step with
its own in-memory copies of the same earlier K-th steps): every member's finding is exchanged in one
collective and every member decides the same verdict (:mod:`.group_verdict`). Found and uniform, every
member restores its own copy of the newest step before the bad one in place (no member restarts: its
traced step, its strategy and its collectives stay), the steps after it are undone, and the bad step (a
spike's onset .. its detection) joins the steps skipped, skipped when the replay meets it, as a restarted
group skips it; the chief tells the watchdog (``nonfinite_detected`` or the spike's record, ``rolled_back``
with ``group``, a ``step_skipped`` each: they survive restarts and relaunches and count toward
``--max-skips``). Not uniform (a member cannot, a copy missing on one, a checkpoint after the bad step, a
finding at a check that is no K-th step, the skip bound, ``--on-nonfinite`` or ``--on-spike`` other than
``rollback``): the members that found something act as before (the restart, exit 5, or the stop), and the
others wait in their next step until the watchdog ends them. ``PROCSV_GROUP_ROLLBACK=restart`` turns the
verdict off (no collective at the K-th steps; the restart always).
"""

from __future__ import annotations

import sys
from typing import Any, Callable, Optional

from procsv import cluster
from procsv.common.bootstrap import ChildConfig
from procsv.common.errors import GroupRolledBack, GroupRollback, LossSpiked, NonFiniteState
from procsv.ipc.messages import Message
from procsv.trainer.channels import TrainerChannels
from procsv.trainer.checkpoint import memory_restore, memory_tier
from procsv.trainer.checkpoint.agent import CheckpointAgent
from procsv.trainer.checkpoint.name_based import NameBasedCheckpoint
from procsv.trainer.nonfinite import notices, policy
from procsv.trainer.nonfinite.boundary_work import BoundaryWork
from procsv.trainer.nonfinite.group_verdict import FIXED, Exchange, Row, Verdict, decide, member, strategy_of
from procsv.trainer.nonfinite.policy import OnNonfinite
from procsv.trainer.nonfinite.restore import StateRestore
from procsv.trainer.nonfinite.spike import OnSpike
from procsv.trainer.nonfinite.watch import NonfiniteWatch


def group_refusal(config: ChildConfig) -> str:
    """Why this trainer cannot roll back in place ("" if it can): a member of a group (see the module)."""
    return policy.in_place_refusal(group_members(config), ps_tasks(config))


def group_members(config: ChildConfig) -> int:
    """The trainers of this trainer's group, over every host (1: alone)."""
    spec = cluster.tf_config().get("cluster")
    spec = spec if isinstance(spec, dict) else {}
    return max(config.place.nproc, len(spec.get("worker") or ()) + len(spec.get("chief") or ()))


def ps_tasks(config: ChildConfig) -> int:
    """The parameter-server tasks of this trainer's job (0: none)."""
    spec = cluster.tf_config().get("cluster")
    return config.place.ps + len((spec if isinstance(spec, dict) else {}).get("ps") or ())


class GroupAsk:
    """A group member's ask for the group's rollback (see the module). Given: the watch (the skips so
    far, the input position), ``tell`` (a notice to the watchdog) and ``hand_off`` (before the exit at a
    step: what was logged is handed off and the snapshot in flight, finite, is committed)."""

    def __init__(self, watch: NonfiniteWatch, tell: Callable[[Message], None], hand_off: Callable[[int], None]) -> None:
        self._watch = watch
        self._tell = tell
        self._hand_off = hand_off

    def ask(self, bad_step: int, what: str) -> str:
        """A group member found step ``bad_step`` non-finite (its ``NonfiniteDetected`` is sent): past
        ``--max-skips``, why it stops (exit 4); else it raises :class:`~procsv.common.errors.GroupRollback`
        (exit 5), once what was logged is handed off and the snapshot in flight (finite) is committed:
        the watchdog restarts the group, which skips ``bad_step`` (see the module). No retry first: a
        retry would cost a second restart of every member."""
        watch = self._watch
        if not watch.budget.allows(bad_step):
            return watch.budget.refusal(bad_step)
        self._hand_off(bad_step)
        message = (f"non-finite training at step {bad_step}: {what}; --on-nonfinite rollback in a trainer group: "
                   f"asking for the group's restart (exit code 5); every member restores the newest state before "
                   f"step {bad_step} and skips it (skip {len(watch.budget.recent(bad_step)) + 1} of --max-skips "
                   f"{watch.budget.max_skips} within {watch.budget.skip_window} steps)")
        print(f"procsv: {message}", file=sys.stderr, flush=True)
        raise GroupRollback(bad_step, message)

    def ask_spike(self, bad: LossSpiked) -> str:
        """The chief of a group found a loss spike ``bad`` under ``--on-spike rollback`` (its ``SpikeDetected``
        is sent, with its onset: the watchdog takes the onset as the step the group's rollback skips): past
        ``--max-skips``, why it stops (exit 4); else, once what was logged is handed off and the snapshot in
        flight is committed, the steps after the onset up to the detection are told skipped (the restarted
        group skips them with the onset) and it raises :class:`~procsv.common.errors.GroupRollback` (exit 5),
        as :meth:`ask` for a non-finite step. No replay first: a group's spike is taken as the data's."""
        watch = self._watch
        steps = range(bad.onset, bad.detected + 1)
        over = watch.budget.first_refused(steps)
        if over is not None:
            return f"skipping steps {bad.onset}-{bad.detected}: {watch.budget.refusal(over)}"
        self._hand_off(bad.detected)
        told = len(watch.budget.skipped) + 1  # (the onset: counted when the watchdog restarts the group)
        for s in steps[1:]:
            told += 1
            self._tell(notices.skipped(s, told, watch.position))
        skipped = f"step {bad.onset}" if bad.onset == bad.detected else f"steps {bad.onset}-{bad.detected}"
        message = (f"{bad.what}; --on-spike rollback in a trainer group: asking for the group's restart (exit code "
                   f"5); every member restores the newest state before step {bad.onset} and skips {skipped} (a "
                   f"group's spike is taken as the data's, not replayed first)")
        print(f"procsv: {message}", file=sys.stderr, flush=True)
        raise GroupRollback(bad.onset, message)


class GroupInPlace:
    """A group member's check at its K-th steps with the group's verdict, and the rollback in place it
    decides (see the module). Owns the exchange (made at its first use: the program's strategy is found
    in its saved state then; None after, where none is). Given: the watch, this member's ``rank`` among
    ``members``, the Supervisor's ``agent`` and ``channels`` (each read when asked), ``tell`` (a notice to
    the watchdog), the rollback's restore (:class:`~.restore.StateRestore`) and walk, ``settle_spike``
    (the spike response's :meth:`~.spike_response.SpikeResponse.settled`) and the ask for the group's
    restart (:class:`GroupAsk`, where a member cannot restore after all)."""

    def __init__(self, watch: NonfiniteWatch, rank: int, members: int,
                 agent: Callable[[], Optional[CheckpointAgent]], channels: Callable[[], Optional[TrainerChannels]],
                 tell: Callable[[Message], None], restore: StateRestore, walk: BoundaryWork,
                 settle_spike: Callable[[int], None], ask: GroupAsk) -> None:
        self._watch = watch
        self._rank, self._members = rank, members
        self._agent, self._channels = agent, channels
        self._tell = tell
        self._restore = restore
        self._walk = walk
        self._settle_spike = settle_spike
        self._ask = ask
        self._exchange: Optional[Exchange] = None
        self._no_strategy = False
        # the step of the last exchange, or of the state a session began at or the group restored in place: a boundary
        # of that step again (the first one of a session, the one right after a restore, a graph program's runs that
        # advance no step) exchanges nothing, on every member alike: the members exchange once each time their
        # training completes a K-th step, whatever else brings a boundary
        self._last = -1

    def begin(self, step: int) -> None:
        """A session begins at ``step`` (restored or initialized): no exchange at its boundary."""
        self._last = step

    def check(self, step: int) -> None:
        """The check at the K-th step ``step`` (the checkpoint agent's ``hooks.group_check``): this member's
        losses, then the group's verdict. Returns when nothing was found, or when the group is not rolled
        back in place and this member found nothing; raises this member's own finding
        (:class:`~procsv.common.errors.NonFiniteState`) when it is not, and
        :class:`~procsv.common.errors.GroupRolledBack` once every member rolled back in place."""
        watch = self._watch
        mine: Optional[NonFiniteState] = None
        try:
            watch.precheck(step)
        except NonFiniteState as bad:
            mine = bad
        exchange = self._exchange_for() if step != self._last else None
        if exchange is None:
            if mine is not None:
                raise mine
            return
        self._last = step
        rows = exchange.rows(self._row(mine))
        verdict = decide(rows)
        if not verdict.found:
            return
        why = verdict.why or self._refusal(verdict)
        if why:
            if self._rank == 0:
                print(f"procsv: the group's check at step {step} found {self._found(verdict)}; not rolled back in "
                      f"place ({why}): the group's restart", file=sys.stderr, flush=True)
            if mine is not None:
                raise mine
            return
        self._in_place(step, verdict, mine)

    def _exchange_for(self) -> Optional[Exchange]:
        agent = self._agent()
        if self._exchange is None and not self._no_strategy and agent is not None:
            strategy = strategy_of(agent.store.checkpoint)
            if strategy is None:
                self._no_strategy = True
                print("procsv: no distribution strategy's variables in the program's state: a trainer group's "
                      "rollback restarts every member", file=sys.stderr, flush=True)
                return None
            task = cluster.tf_config().get("task")
            task = task if isinstance(task, dict) else {}
            device = f"/job:{task.get('type', 'worker')}/replica:0/task:{int(task.get('index', self._rank))}/device:CPU:0"
            self._exchange = Exchange(device, self._members, self._rank, FIXED + memory_tier.SLOTS)
        return self._exchange

    def _row(self, mine: Optional[NonFiniteState]) -> Row:
        """What this member says (see :class:`~.group_verdict.Row`)."""
        agent, watch = self._agent(), self._watch
        nan = onset = detected = -1
        if isinstance(mine, LossSpiked):
            onset, detected = mine.onset, mine.detected
        elif mine is not None:
            nan = mine.first_step
        able = (agent is not None and self._channels() is not None and agent.store.arena is not None
                and not isinstance(agent.store.checkpoint, NameBasedCheckpoint) and watch.retry.target is None
                and not watch.on_restored and not watch.replay_unsupported)
        copies = memory_restore.whole_steps(agent.store.copies, agent.store.arena) if agent is not None else ()
        saving = agent is not None and agent.saving
        committed = agent.last_committed if saving and agent is not None else -1
        in_flight = agent.in_flight if saving and agent is not None and agent.in_flight is not None else -1
        return Row(nan, onset, detected, able, committed, in_flight, copies)

    def _refusal(self, verdict: Verdict) -> str:
        """Why this verdict's rollback is not done in place by the policy or the skip bound ("" if it is): the
        same on every member."""
        watch = self._watch
        if verdict.spike and watch.spike_policy != OnSpike.ROLLBACK:
            return f"--on-spike {watch.spike_policy.value}"
        if not verdict.spike and watch.policy != OnNonfinite.ROLLBACK:
            return f"--on-nonfinite {watch.policy.value}"
        over = watch.budget.first_refused(verdict.steps)
        return watch.budget.refusal(over) if over is not None else ""

    @staticmethod
    def _found(verdict: Verdict) -> str:
        if verdict.spike:
            return f"a loss spike at steps {verdict.first}-{verdict.last}"
        return f"the loss of step {verdict.first} non-finite ({member(verdict.finder)})"

    def _in_place(self, step: int, verdict: Verdict, mine: Optional[NonFiniteState]) -> None:
        """Every member restores its copy of ``verdict.restore`` and skips ``verdict.steps`` (see the module);
        raises :class:`GroupRolledBack`, or, where this member's copy cannot be restored after all, asks for
        the group's restart (raises :class:`~procsv.common.errors.GroupRollback`)."""
        watch, agent, ch = self._watch, self._agent(), self._channels()
        what = mine.describe() if mine is not None and mine.first_step == verdict.first else \
            f"the loss of step {verdict.first} is NaN or infinite ({member(verdict.finder)} found it)"
        if verdict.spike and mine is not None:
            what = mine.describe()
        done = self._restore.exactly(agent, verdict.restore) if agent is not None and ch is not None else "no session"
        if isinstance(done, str):
            print(f"procsv: the group's rollback in place to step {verdict.restore} failed here: {done}",
                  file=sys.stderr, flush=True)
            self._tell(notices.detected(verdict.first, what, watch.position))
            if isinstance(mine, LossSpiked):
                self._ask.ask_spike(mine)
            self._ask.ask(verdict.first, what)
            raise GroupRollback(verdict.first, f"the group's rollback in place failed: {done}")
        restored, source, kind, path, secs = done
        self._last = restored
        if ch is None:  # (exactly() had it)
            return
        self._restore.undone(ch, restored, spike=verdict.spike)
        if verdict.spike:
            self._settle_spike(verdict.last)
        chief = self._rank == 0
        if chief and not verdict.spike:
            self._tell(notices.detected(verdict.first, what, watch.position))
        if chief:
            self._tell(notices.rolled_back(verdict.first, restored, kind, path, True, secs, watch.position, group=True))
        for s in verdict.steps:
            if s not in watch.budget.skipped:
                watch.budget.skip(s)
            if chief:
                self._tell(notices.skipped(s, len(watch.budget.skipped), watch.position))
        watch.budget.skipped.sort()
        walk = self._walk
        walk.restored()
        walk.skip_quietly(verdict.steps)
        walk.plan_next(restored)
        skipped = f"step {verdict.first}" if verdict.first == verdict.last else f"steps {verdict.first}-{verdict.last}"
        print(f"procsv: {what}; the group's verdict at step {step}: every member restored its in-memory copy of "
              f"step {restored} in place ({secs:.3f} s, no restart), replaying to step {verdict.first - 1}, then "
              f"skipping {skipped}", file=sys.stderr, flush=True)
        raise GroupRolledBack(step, verdict.first)
