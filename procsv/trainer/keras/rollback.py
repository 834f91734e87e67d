"""``procsv.keras.BackupAndRestore``'s side of ``--on-nonfinite rollback``: fit's batches trained again.

Runs in the trainer process, inside ``model.fit`` (a mixin of :class:`procsv.trainer.keras.fit.BackupAndRestore`).
Keras' loop only goes forward; when the Supervisor restores an earlier state in place
(:mod:`procsv.trainer.nonfinite.methods`) the step count goes back, and the steps up to the one
fit is at are trained again here, from the batches :class:`~procsv.trainer.keras.replay.BatchReplay`
kept, all inside the one call of the train function ``fit`` made (:meth:`FitRollback._kept_step`,
called by ``sess.run`` until it has drawn fit's own next batch). A non-finite loss is found where
procsv reads the state anyway (before a snapshot), and also at the end of each epoch (so that its
logs are of the epoch without the poisoned batch) and of ``fit`` (:meth:`FitRollback._settle`); after
every batch when ``keras.callbacks.TerminateOnNaN`` reads each batch's ``logs["loss"]`` anyway (so
that a NaN rolled back never reaches it). A
skipped step advances Keras' iteration counter as if it ran; the (epoch, batch) position a
snapshot records follows the restored and the replayed steps.
"""

from __future__ import annotations

import time
from typing import Any, Optional

from procsv.trainer.keras.replay import BatchReplay
from procsv.trainer.managed import ManagedSession
from procsv.common.errors import NonFiniteState
from procsv.trainer.nonfinite.policy import OnNonfinite
from procsv.trainer.supervisor import Supervisor


class _NoLiveInput(Exception):
    """A step past the batches fit has drawn, outside fit's loop (the rollback settled at the end)."""


class FitRollback:
    """The rollback's replay of a fit's batches (mixed into ``BackupAndRestore``)."""

    model: Any
    sv: Optional[Supervisor]
    epoch_var: Any
    batch_var: Any
    _sess: Optional[ManagedSession]
    _replay: Optional[BatchReplay]
    _spe: int
    _epoch: int
    _batch: int
    _live_epoch: int
    _live_batch: int
    _drew: bool
    _train_secs: float

    def _position_of(self, step: int) -> Optional[tuple[int, int]]:
        raise NotImplementedError  # (BackupAndRestore)

    def _kept_step(self, iterator: Any) -> Any:
        """One step, in ``sess.run``: the batch kept for it if a rollback put the step count back
        (its position is the one a snapshot after it records), else the next batch of ``iterator``,
        kept. Returns {"logs", "loss": the batch's own loss, "data"}; the Supervisor keeps the loss."""
        replay = self._replay
        assert replay is not None and self.sv is not None
        step = self.sv.step
        kept = replay.kept.get(step)
        if kept is not None:
            epoch, index, _ = kept
            if index == 0:  # the first batch of an epoch: Keras reset the metrics before it
                self.model.reset_metrics()
            out = replay.again(step)
            self._epoch, self._batch = epoch, index + 1
            return out
        if iterator is None:
            raise _NoLiveInput(f"step {step}")
        t0 = time.perf_counter()
        out = replay.run(iterator)
        self._train_secs = time.perf_counter() - t0
        replay.keep(step, self._live_epoch, self._live_batch, out["data"])
        self._drew = True
        return out

    def _settle(self) -> bool:
        """Check the losses kept since the last check (one read) and, if one is non-finite, roll back,
        replay, retry and skip now, as a snapshot's check would have later; True if it rolled back.
        At the end of an epoch (its logs are the epoch's) and of fit (its final checkpoint)."""
        sv, sess, replay = self.sv, self._sess, self._replay
        if sv is None or sess is None or replay is None or replay.unsupported or sv._ckpt is None:
            return False
        watch = sv._nonfinite
        if watch.policy != OnNonfinite.ROLLBACK or sv._state.losses is None:
            return False
        last, moved = sv.step, False
        while True:
            if sv._nonfinite_work():  # the retry's judgement or a skip, due at this step
                moved = True
                continue
            if sv.step < last:
                try:
                    sess.run(self._kept_step, None)
                except _NoLiveInput:
                    pass  # a skip at that boundary reached the last step: nothing more to replay
                continue
            bad = watch.losses.check()
            if bad is None:
                return moved
            moved = True
            sv._nonfinite_refused(NonFiniteState(sv.step, bad), False)  # rolls back, or stops (exit 4)

    def _restored(self, step: int) -> None:
        """A rollback restored ``step``: the position a snapshot records is the restored one."""
        self._epoch, self._batch = int(self.epoch_var.numpy()), int(self.batch_var.numpy())

    def _skipped(self, step: int) -> None:
        """Step ``step`` was skipped: Keras' iteration counter moves past it as if it ran (a learning
        rate schedule too), and the position past its batch."""
        self.model.optimizer.iterations.assign_add(self._spe)
        where = self._position_of(step)
        if where is not None:
            self._epoch, self._batch = where[0], where[1] + self._spe
