"""What ``--on-spike`` does with a loss spike (issue 68): the record, and ``warn``, ``stop`` or ``rollback``
(a replay that tells whose the spike is first).

Runs in the trainer's main thread, at step boundaries: the check before a snapshot (or the loop's end)
judges the finite losses it read (:mod:`.spike`, through the watch) and hands the spikes it found to
:meth:`SpikeResponse.judged`; a snapshot it refused comes back through the step boundary to
:meth:`SpikeResponse.refused`. Kept by the non-finite rollback
(:class:`~procsv.trainer.nonfinite.rollback.NonfiniteRollback`), whose restore (:mod:`.restore`) it uses.

* Every spike is told to the watchdog (:class:`~procsv.ipc.messages.SpikeDetected`: the lifecycle
  record ``spike_detected``) as it is found.
* ``warn``: one line, and training goes on (the snapshot is taken).
* ``stop``: the snapshot is refused (:class:`~procsv.common.errors.LossSpiked`) and the run stops in
  order with exit code 4 (diverging): what was logged and the snapshot in flight are kept, nothing
  after the check is.
* ``rollback``: the snapshot is refused and the newest state before the spike's onset is restored in
  place (the rollback's restore: the newest in-memory snapshot, else the newest committed
  checkpoint); the loop then *replays* the steps from there, the onset to the detection included,
  to tell the data's (or the model's) spike from a transient fault of the machine (a bit flipped, a
  miscomputed kernel). The boundary right after the replay's detection step (the rollback's walk
  checks it there, :mod:`.boundary_work`, not at a snapshot that may come only after the loop's
  end) compares the losses the replay gave the onset .. the detection with the first ones, bit for bit (:class:`~procsv.ipc.messages.SpikeReplayed`,
  the record ``spike_replayed``), whether or not the rule flags them again (its window may differ
  after the restore). Equal, the spike is the data's: the state is refused (no snapshot of it), the state
  before the onset is restored once more, and the steps from the onset to the detection join the
  steps skipped so far: the replay skips them as a non-finite step skipped before is skipped (its
  input consumed, no variable changed, the step count past it), and each is told to the watchdog
  at once (:class:`~procsv.ipc.messages.StepSkipped`), so that a restarted trainer and a relaunch
  skip it too; they count against ``--max-skips``. Not equal, the spike was this machine's:
  nothing is skipped, the batches are kept (trained in the replay), and the line names the host.
  Exact replays need deterministic kernels (``tf.config.experimental.enable_op_determinism``): where
  a step's result varies from run to run, every spike is taken for the machine's. A spike found by
  the final checkpoint's check (no step left to replay), or one the skip bound does not allow, stops
  the run as ``stop`` does, saying why. A spike whose steps the program cannot replay (a restore hook
  gave the replay up: Keras fit's batches since the restored state not all kept) gets no verdict, said
  in the rollback's line. Nor does one whose replay's first step before the onset gives another loss than the
  first run's (:func:`~.plan.input_differs`: the program's input does not come back with the restored step, a
  counter or an iterator of its own, or random numbers no checkpoint holds): the replay trained other
  batches, its state is kept, training goes on, and one line says what it cost (its record's ``differs_at``
  counts no fault of the host). A non-finite step's rollback under way is not cut short:
  such a spike is only said.

In a trainer group (``--nproc``, MultiWorkerMirroredStrategy) the chief alone judges its losses (its
loss is the group's when the step returns ``strategy.reduce(SUM, ...)``), and no member rolls back
in place alone: found at the group's K-th step, the group's verdict rolls every member back in place at
once (:class:`~.group_ask.GroupInPlace`: :meth:`settled` then drops the spike here); otherwise, under
``rollback``, the chief asks for the group's rollback as a member does for a non-finite step (the
rollback's ``ask_group``: exit code 5, the watchdog restarts the group, every member restores the newest
state before the onset and skips the onset .. the detection). No replay tells the machine's spike from the
data's first: a group's spike is always taken as the data's, and its steps are skipped.
"""

from __future__ import annotations

import socket
import sys
from typing import Callable

from procsv.common.errors import LossSpiked, TrainingDiverged
from procsv.ipc.messages import Message, RestoreSource
from procsv.trainer.nonfinite import notices
from procsv.trainer.nonfinite.boundary_work import BoundaryWork
from procsv.trainer.nonfinite.plan import first_replayed, input_differs, input_lost
from procsv.trainer.nonfinite.spike import OnSpike, Spike
from procsv.trainer.nonfinite.watch import NonfiniteWatch

Restore = Callable[[int], "tuple[int, str, RestoreSource, str, float] | str"]


class SpikeResponse:
    """``--on-spike`` on one Supervisor's spikes (see the module). Owns the spikes being replayed
    (``_replaying``: each one as first found and its first losses of its onset .. its detection, by
    its detection step) and what the next refusal of one does (``_skip``: the (onset, detection) of
    those whose steps it skips; any other is replayed). Given: the watch
    (its ``spike_policy``, the skips so far, the rollback's course, the spike history), the rollback's
    walk (which skips the steps when the replay meets them), ``tell`` (a notice to the watchdog), and
    the rollback's ``restore`` (the newest state before a step, in place: its step, where from in
    words, as a kind and a path, and its seconds; or why not), ``undone`` (the steps after a restored
    one are undone), ``wind_down`` (before a stop in order at a step: returns the newest committed
    step), ``over_budget`` (why a skip of a step breaks ``--max-skips``) and ``ask_group`` (a group's
    member: the group's rollback past a spike, raising :class:`~procsv.common.errors.GroupRollback`, or
    why not)."""

    def __init__(self, watch: NonfiniteWatch, walk: BoundaryWork, tell: Callable[[Message], None],
                 restore: Restore, undone: Callable[[int], None], wind_down: Callable[[int], int],
                 over_budget: Callable[[int], str], ask_group: Callable[[LossSpiked], str]) -> None:
        self._watch = watch
        self._walk = walk
        self._tell = tell
        self._restore = restore
        self._undone = undone
        self._wind_down = wind_down
        self._over_budget = over_budget
        self._ask_group = ask_group
        self._replaying: dict[int, tuple[Spike, tuple[float, ...], dict[int, float]]] = {}
        self._skip: set[tuple[int, int]] = set()

    def judged(self, spikes: tuple[Spike, ...], step: int) -> None:
        """The check before the snapshot of ``step`` judged the losses read since the last one and
        found ``spikes`` (none, mostly). First the spikes being replayed whose detection the replay
        has passed: the replay's losses of their onset .. detection equal to the first ones, bit for
        bit, the spike is the data's: the snapshot is refused (raises
        :class:`~procsv.common.errors.LossSpiked`) and its steps are skipped; else it was the
        machine's (whether or not the rule flags the replay's losses: its window may differ after the
        restore). Then each other spike's record and policy (:meth:`found`: ``rollback`` and ``stop``
        raise)."""
        history = self._watch.spikes
        last = history.last if history is not None else None
        resolved: set[int] = set()
        for detected in sorted(d for d in self._replaying if last is not None and last >= d):
            first, losses, earlier = self._replaying.pop(detected)
            again = history.losses_of(first.steps) if history is not None else None
            resolved.add(detected)  # (a spike the replay's losses show again is not rolled back again)
            differs = input_differs(earlier, history.losses_at(range(min(earlier), first.onset))
                                    if history is not None and earlier else {})
            if differs is not None:  # the replay trained other batches: it says nothing of whose the spike was
                self._unanswered(first, again[-1] if again else None, differs)
                continue
            if again is not None and again == losses:
                self._tell(notices.replayed(first, True, again[-1]))
                self._skip.add((first.onset, first.step))
                raise LossSpiked(step, first.onset, first.step,
                                 f"{first.describe()}, and so again when replayed, bit for bit")
            self._transient(first, again[-1] if again else None)
        for spike in spikes:
            if spike.step not in resolved:
                self.found(spike, step)

    def found(self, spike: Spike, step: int) -> None:
        """The check before the snapshot of ``step`` found ``spike``: its record, then the policy."""
        watch = self._watch
        action = watch.spike_policy
        busy = action == OnSpike.ROLLBACK and watch.retry.target is not None
        self._tell(notices.spiked(spike, OnSpike.WARN.value if busy else action.value, watch.position))
        if action == OnSpike.WARN or busy:
            note = (f" (not rolled back: the rollback of non-finite step {watch.retry.target} is under way)"
                    if busy else "")
            print(f"procsv: {spike.describe()}; --on-spike {action.value}: training on{note}",
                  file=sys.stderr, flush=True)
            return
        if action == OnSpike.ROLLBACK:
            self._replaying[spike.step] = (spike, spike.losses or (spike.loss,), {})
        raise LossSpiked(step, spike.onset, spike.step, spike.describe())

    def settled(self, detected: int) -> None:
        """The spike detected at ``detected`` was rolled back by its trainer group in place, its steps skipped
        (:mod:`.group_verdict`): nothing more is judged or replayed for it."""
        self._replaying.pop(detected, None)
        self._skip = {k for k in self._skip if k[1] != detected}

    def _unanswered(self, first: Spike, replay_loss: float | None, differs: tuple[int, float, float]) -> None:
        """The replay of the spike ``first`` trained other batches than the first run (its first step
        ``differs``): no verdict, neither the data's nor the machine's; its state is kept and training goes on."""
        self._tell(notices.replayed(first, False, replay_loss, differs[0]))
        print(f"procsv: the loss spike at step {first.step} got no verdict: its replay {input_lost(differs, first.step)}; "
              f"the replayed state is kept; training on", file=sys.stderr, flush=True)

    def _transient(self, first: Spike, replay_loss: float | None) -> None:
        """The replay of the spike ``first`` did not give its losses again: a fault of this machine."""
        self._tell(notices.replayed(first, False, replay_loss))
        then = f"{replay_loss:.6g}" if replay_loss is not None else "not reached"
        print(f"procsv: the loss spike at step {first.step} did not come again when replayed (loss {first.loss:.6g}, "
              f"then {then}): a transient fault of this machine ({socket.gethostname()}), not the data's; its "
              f"batches are kept; training on", file=sys.stderr, flush=True)

    def refused(self, bad: LossSpiked, final: bool) -> None:
        """A snapshot was refused for ``bad`` (``final``: the final checkpoint): replayed, or rolled
        back and skipped, under ``rollback`` where it can be; else a stop in order, exit code 4 (raises
        :class:`~procsv.common.errors.TrainingDiverged`)."""
        why = ""
        policy = self._watch.spike_policy
        key = (bad.onset, bad.detected)
        skip = key in self._skip
        self._skip.discard(key)
        if policy == OnSpike.ROLLBACK and self._watch.group_refusal:  # a group's member: the group rolls back
            why = self._ask_group(bad)  # (raises GroupRollback; at the final checkpoint too: its restart replays)
        elif policy == OnSpike.ROLLBACK:
            why = ("it was found by the final checkpoint's check, with no step left to replay" if final
                   else self._roll_back(bad, skip))
            if not why:
                return
        self._replaying.pop(bad.detected, None)
        committed = self._wind_down(bad.step)
        newest = (f"the newest committed checkpoint is of step {committed}" if committed >= 0
                  else "no checkpoint was committed before it")
        message = (f"procsv: {bad.what}; --on-spike {policy.value}: stopping in order with exit code 4 "
                   f"(diverging), without a checkpoint of this state ({newest})")
        if why:
            message += f" (no rollback: {why})"
        print(message, file=sys.stderr, flush=True)
        raise TrainingDiverged(message.removeprefix("procsv: "))

    def _roll_back(self, bad: LossSpiked, skip: bool) -> str:
        """Restore the newest state before the onset; replay the onset .. the detection, or (``skip``:
        the replay found them again) skip them (see the module). Returns "" if done, else why not."""
        watch = self._watch
        steps = range(bad.onset, bad.detected + 1)
        over = watch.budget.first_refused(steps) if skip else None
        if over is not None:
            return f"skipping steps {bad.onset}-{bad.detected}: {self._over_budget(over)}"
        done = self._restore(bad.onset)
        if isinstance(done, str):
            return done
        restored, source, kind, path, secs = done
        history = watch.spikes
        if not skip and bad.detected in self._replaying and history is not None and not watch.on_restored:
            # the first run's loss the replay gives again before the onset, if its input comes back with the
            # restored step (a front-end that replays the batches it kept, Keras fit's, gives them back itself)
            spike_, losses, _ = self._replaying[bad.detected]
            self._replaying[bad.detected] = (spike_, losses, history.losses_at(first_replayed(restored, bad.onset)))
        self._undone(restored)
        self._tell(notices.rolled_back(bad.onset, restored, kind, path, skip, secs, watch.position))
        if skip:
            for s in steps:
                if s not in watch.budget.skipped:
                    watch.budget.skip(s)
                self._tell(notices.skipped(s, len(watch.budget.skipped), watch.position))
            watch.budget.skipped.sort()
        walk = self._walk
        walk.restored()
        if skip:
            walk.skip_quietly(steps)  # (the line below says so, not one line a step)
        else:  # judged when the replay passes the detection, not at a snapshot that may come after the loop's end
            walk.check_spike_at(bad.detected)
        for hook in watch.on_restored:
            hook(restored)
        skipped = f"step {bad.onset}" if bad.onset == bad.detected else f"steps {bad.onset}-{bad.detected}"
        then = (f"replaying to step {bad.onset - 1}, then skipping {skipped}" if skip else
                f"replaying {skipped} to tell a transient fault of the machine from the data's")
        if walk.abandoned and not skip:  # a hook cannot replay them (Keras fit: not all its batches since are kept)
            walk.drop_spike_check(bad.detected)  # a verdict on other batches' losses would be no verdict on these
            self._replaying.pop(bad.detected, None)
            then = f"{walk.abandoned}; {skipped} not replayed: no verdict on whose the spike was"
        walk.plan_next(restored)
        print(f"procsv: {bad.what}; --on-spike rollback: restored step {restored} from {source}, {then}; training on",
              file=sys.stderr, flush=True)
        return ""
