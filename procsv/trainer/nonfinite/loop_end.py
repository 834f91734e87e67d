"""The non-finite rollback's settle at a training loop's end: a rollback the loop ended inside finished
(or its lost steps said), the losses still unchecked checked and judged for spikes, before the final checkpoint.

Runs in the trainer's main thread, once per session, when the program's loop ended on its own (the
Supervisor's and the MonitoredSession's end call it through
:meth:`~procsv.trainer.nonfinite.rollback.NonfiniteRollback.settle_at_end`), and at Keras fit's epoch
ends (:meth:`LoopEnd.spikes_refused`). The restores, retries and skips it leads to are the rollback's
(``roll_back``, the walk :mod:`.boundary_work`); the furthest step a restore undid is the restore's
(:class:`~procsv.trainer.nonfinite.restore.StateRestore`).
"""

from __future__ import annotations

import sys
from typing import Callable, Optional

from procsv.common.errors import LossSpiked, NonFiniteState
from procsv.ipc.messages import Message
from procsv.trainer.nonfinite import notices
from procsv.trainer.nonfinite.boundary_work import BoundaryWork
from procsv.trainer.nonfinite.policy import OnNonfinite
from procsv.trainer.nonfinite.restore import StateRestore
from procsv.trainer.nonfinite.spike_response import SpikeResponse
from procsv.trainer.nonfinite.watch import NonfiniteWatch
from procsv.trainer.step_boundary import StepState


class LoopEnd:
    """The loop end's settle of one Supervisor's rollback (see the module). Given: the watch (the
    policy, the losses kept, the rollback's course), the walk (the work due at a boundary), the step
    state, the restore (``reached``), the spike response (a spike found here is refused through it),
    ``tell`` (a notice to the watchdog), and the rollback's ``roll_back`` (restore before a bad step:
    "" if done, else why not) and ``stop_diverged`` (stop where it cannot)."""

    def __init__(self, watch: NonfiniteWatch, walk: BoundaryWork, state: StepState, restore: StateRestore,
                 spikes: SpikeResponse, tell: Callable[[Message], None], roll_back: Callable[[int, str], str],
                 stop_diverged: Callable[[NonFiniteState, str, bool], None]) -> None:
        self._watch = watch
        self._walk = walk
        self._state = state
        self._restore = restore
        self._spikes = spikes
        self._tell = tell
        self._roll_back = roll_back
        self._stop_diverged = stop_diverged

    def spikes_refused(self, step: int) -> bool:
        """The finite losses read since the last judgement judged for spikes now (at the state of ``step``,
        not at a snapshot: the loop's end, Keras fit's epoch end), one found followed as a refused
        snapshot's would be (:meth:`~.spike_response.SpikeResponse.refused`: rolled back, or a stop in order that raises
        :class:`~procsv.common.errors.TrainingDiverged`); True if one was refused."""
        try:
            self._watch.judge_spikes(step)
        except LossSpiked as spiked:
            self._spikes.refused(spiked, False)
            return True
        return False

    def settle(self, replay: Optional[Callable[[], bool]]) -> None:
        """The loop ended on its own at the current step E, before the final checkpoint: under ``rollback``,
        the training is finished as if the loop had run on. A rollback's replay the loop ended inside (E
        before the furthest step D a restore undid: a loop bounded by its own count of runs) is replayed
        on to D by ``replay`` (one more run of the loop's last step function, which reads its step itself;
        False: the program's own hook asked for no more runs), the pending retry judged and its step
        skipped or given up on the way, as at any boundary. Then the losses kept since the last check are
        checked (one read) and a non-finite one at step B is rolled back, replayed and retried or skipped
        like any other, until the step is E (or D) again. ``replay`` None (the last step function was
        handed its input as arguments; a TF1 graph program's loop feeds its own): nothing is replayed or
        checked here; a replay the loop ended inside is said in one line naming the steps lost (no
        checkpoint older than the newest committed one is committed:
        :meth:`~procsv.trainer.checkpoint.agent.CheckpointAgent.final`), and the final checkpoint's check
        stops the run with exit code 4 as ``stop`` does. Raises :class:`~procsv.common.errors.TrainingDiverged`
        where a rollback cannot be (the skip bound, ...; the program's ``NanTensorHook``'s error)."""
        watch = self._watch
        if watch.policy != OnNonfinite.ROLLBACK or replay is None or watch.group_refusal:
            self.say_lost()
            return
        end = max(self._state.step, self._restore.reached)
        while True:
            if self._walk.work():  # the retry's judgement or a skip, due at this step
                continue
            if self._state.step < end:
                if replay():
                    continue
                self.say_lost()
                return
            bad = watch.losses.check()
            if bad is None:
                if self.spikes_refused(end):  # the spikes among them (--on-spike): rolled back like any other, or a stop
                    continue
                return
            what = f"the loss of step {bad} is NaN or infinite (found when the loop ended)"
            self._tell(notices.detected(bad, what, watch.position))
            why = self._roll_back(bad, what)
            if why:
                self._stop_diverged(NonFiniteState(end, bad), why, False)
                return

    def say_lost(self) -> None:
        """The loop ended inside a rollback's replay, which is not finished here: one line naming the steps lost."""
        step, reached, pending = self._state.step, self._restore.reached, self._watch.retry.target
        if reached <= step:
            return
        one = reached == step + 1
        lost = f"step {reached}" if one else f"steps {step + 1}-{reached}"
        retry = (f"; step {pending} is neither retried nor skipped" if pending is not None and pending > step else "")
        print(f"procsv: the training loop ended at step {step}, inside the replay after {self._restore.reached_by}: {lost}, "
              f"trained before the rollback, {'is' if one else 'are'} lost{retry} (procsv cannot replay "
              f"{'it' if one else 'them'} without the program's loop); "
              f"the final checkpoint is of step {step}, and none older than the newest committed one is committed",
              file=sys.stderr, flush=True)
