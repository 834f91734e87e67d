"""``procsv.keras.BackupAndRestore``'s side of ``--on-nonfinite rollback``: fit's batches trained again.

Runs in the trainer process, inside ``model.fit`` (:class:`FitRollback`, owned by :class:`procsv.trainer.keras.fit.BackupAndRestore`).
Keras' loop only goes forward; when the Supervisor restores an earlier state in place
(:mod:`procsv.trainer.nonfinite.rollback`) the step count goes back, and the steps up to the one
fit is at are trained again here, from the batches :class:`~procsv.trainer.keras.replay.BatchReplay`
kept, all inside the one call of the train function ``fit`` made (:meth:`FitRollback.kept_step`,
called by ``sess.run`` until it has drawn fit's own next batch). A non-finite loss is found where
procsv reads the state anyway (before a snapshot), and also at the end of each epoch (so that its
logs are of the epoch without the poisoned batch) and of ``fit`` (:meth:`FitRollback.settle`); after
every batch when ``keras.callbacks.TerminateOnNaN`` reads each batch's ``logs["loss"]`` anyway (so
that a NaN rolled back never reaches it). Under ``--on-spike rollback`` the same replay trains a loss
spike's batches again (to tell the data's spike from the machine's) and its skips skip them; a spike
since the last check is judged at those epoch and ``fit`` ends too (:meth:`FitRollback.settle`). A
skipped step changes no variable (Keras' iteration counter does not count it); the (epoch, batch)
position a snapshot records follows the restored and the replayed steps. A step this run skipped
before, met again by a restarted trainer (or a relaunch) before fit's loop drew its batch, has that
batch drawn by the loop's next call, which trains none (:meth:`FitRollback.draw_skipped`). A step whose batch is not kept (past
the cap, or none kept: :mod:`procsv.trainer.keras.replay`) is trained on fit's next batch instead:
the fallback, exact except for the batches not trained again, which one line names at the restore
(:func:`not_trained_again`; the bad step is then not retried). When fit has no batch left for
them (the NaN found at the end of fit), fit stops in order with exit code 4 and one line naming the
steps not trained: nothing is lost silently.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Optional

from procsv.trainer.frontend.port import RollbackPort
from procsv.trainer.keras.replay import LOGS, BatchReplay
from procsv.trainer.keras.resume import unpack
from procsv.trainer.managed import ManagedSession, follows_moves


def not_trained_again(first: int, last: int, why: str) -> str:
    """What a rollback that cannot replay steps ``first``..``last`` says (``why``: their batches are not kept)."""
    steps = f"step {first}" if first == last else f"steps {first}-{last}"
    return (f"{steps} of fit's batches are not trained again ({why}): fit continues with its next batch as "
            f"step {first}")


def not_trained(first: int, last: int, why: str) -> str:
    """Why a fit with no batch left after such a rollback stops (exit code 4)."""
    steps = f"step {first}" if first == last else f"steps {first}-{last}"
    return f"{steps} of fit's batches were not trained ({why}) and fit has no batch left to train in their place"


PAST_CAP = "their batches were not kept: past the replay cap, BackupAndRestore(replay_memory_bytes=...)"
UNTESTED = "their batches were not kept: a Keras version the replay is not tested with"


def stop_untrained(rollback: RollbackPort, gap: Optional[tuple[int, int, int]], why: str) -> None:
    """At the end of fit: a rollback's steps not trained again (``gap``: first, last, the bad step)
    that no later batch of fit took the place of stop it in order with exit code 4, named (raises
    :class:`~procsv.common.errors.TrainingDiverged`); nothing if none."""
    if gap is not None:
        first, last, bad = gap
        rollback.stop_diverged(last, bad, not_trained(first, last, why))


class _NoLiveInput(Exception):
    """A step past the batches fit has drawn, outside fit's loop (the rollback settled at the end)."""


class SkippedBatch(Exception):
    """The batch this call of fit's train function draws is a skipped step's (one this run skipped before,
    met again by a restarted trainer before fit's iterator gave its batch): drawn, not trained; the call
    trains nothing (:meth:`FitRollback.draw_skipped`)."""


@dataclasses.dataclass
class FitPosition:
    """Where one ``fit`` is. ``epoch``/``batch``: the position a snapshot records (the epoch, and the
    batches done in it); ``live_epoch``/``live_batch``: where fit's own loop is (a rollback's replay is
    behind it); ``epoch_starts``: the global step of each epoch's first batch (this fit's); ``spe``:
    Keras' ``steps_per_execution`` (batches per global step); ``fits``: the program's fits of this
    directory completed before the position (:mod:`procsv.trainer.keras.resume`); ``passed``: this fit
    completed before a restart (the position is a later fit's, which it keeps)."""

    spe: int = 1
    epoch: int = 0
    batch: int = 0
    live_epoch: int = 0
    live_batch: int = 0
    epoch_starts: dict[int, int] = dataclasses.field(default_factory=dict)
    ended: bool = False  # fit's loop ended ``epoch`` (its epoch-end callbacks ran) and began no other since
    fits: int = 0
    passed: bool = False
    first: int = 0  # fit's own initial_epoch
    pending: int = 0  # skipped steps whose batches fit's loop has not drawn yet (the position a snapshot records is past them)

    def of(self, step: int) -> Optional[tuple[int, int]]:
        """The (epoch, batch) of global step ``step``, Keras's indices from 0 (with ``steps_per_execution``
        > 1: the step's first batch), if this fit ran it; for the non-finite lifecycle events."""
        known = [(start, epoch) for epoch, start in self.epoch_starts.items() if start <= step]
        if not known:
            return None
        start, epoch = max(known)
        return epoch, (step - start) * self.spe

    def to_live(self) -> None:
        """The position a snapshot records is where fit's loop is."""
        self.epoch, self.batch = self.live_epoch, self.live_batch

    def record(self, epoch: int, batch: int) -> None:
        """The position a snapshot records is (``epoch``, ``batch``): a rollback's, behind fit's loop."""
        self.epoch, self.batch = epoch, batch

    def restored(self, epoch: int, batch: int, fits: int = 0, passed: bool = False, first: int = 0) -> None:
        """fit starts at the position a restore (or an initialization) put in the variables (``first``: its
        own ``initial_epoch``)."""
        self.epoch = self.live_epoch = epoch
        self.batch = self.live_batch = batch
        self.fits, self.passed, self.first = fits, passed, first

    def begin_epoch(self, epoch: int) -> None:
        """fit's loop begins ``epoch``: no batch done in it yet."""
        self.epoch = self.live_epoch = epoch
        self.live_batch = 0
        self.batch = self.pending * self.spe  # (a skipped step's batches not drawn yet: past them)
        self.ended = False

    def end_epoch(self) -> None:
        """fit's loop ended its epoch (its epoch-end callbacks run now)."""
        self.ended = True

    def past_epoch_end(self) -> None:
        """fit stopped after ``epoch`` ended, before the next began (a callback raised at its end): a
        snapshot now records the next epoch's start, where Keras' own callback resumes."""
        if self.ended:
            self.record(self.epoch + 1, 0)

    def completed(self, epochs: int) -> None:
        """fit completed after ``epoch`` ended: a snapshot now records the position past its last epoch,
        ``epochs`` (fit's own, or the next epoch if later), also when a callback ended it early (EarlyStopping's
        ``stop_training``): a restarted program's run of it trains nothing, as the run that completed it."""
        if self.ended:
            self.record(max(self.epoch + 1, epochs), 0)

    def drawn_untrained(self, n: int) -> None:
        """``n`` batches trained before the interruption were drawn again, and not trained."""
        self.batch += n
        self.live_batch = self.batch

    def skipped_ahead(self) -> None:
        """A step whose batches fit's loop has not drawn yet was skipped: the position a snapshot records is past
        them; fit's loop draws them next, untrained (:meth:`drew_skipped`)."""
        self.pending += 1
        self.record(self.live_epoch, self.live_batch + self.pending * self.spe)

    def drew_skipped(self) -> None:
        """fit's loop drew a skipped step's batches (``spe``), untrained; the position a snapshot records stays."""
        self.pending -= 1
        self.live_batch += self.spe

    def trained(self) -> None:
        """fit's loop trained one global step's batches (``spe``); a snapshot records that."""
        self.live_batch += self.spe
        self.to_live()


class FitRollback:
    """The rollback's replay of one fit's batches, owned by its ``BackupAndRestore``.

    Owns the batches kept (``replay``: :class:`BatchReplay`), whether the last ``sess.run`` drew fit's
    own next batch (``drew``) and how long its train step took (``train_secs``). Given: the model,
    fit's position (it moves it on a restore, a replayed batch and a skip), the variables the position
    is saved in, the Supervisor's step (``step``: read at each call) and the port to its rollback (it
    registers its ``restored`` and ``skipped`` there)."""

    def __init__(self, model: Any, replay: BatchReplay, position: FitPosition, epoch_var: Any, batch_var: Any,
                 step: Callable[[], int], rollback: RollbackPort) -> None:
        self.model = model
        self._step = step
        self.replay = replay
        self.position = position
        self._epoch_var, self._batch_var = epoch_var, batch_var
        self._rollback = rollback
        self.drew = False
        self.train_secs = 0.0
        self.drawn = -1  # the newest step trained on a batch drawn from fit's own iterator
        self.gap: Optional[tuple[int, int, int]] = None  # a rollback's steps not trained again (first, last, bad)
        rollback.on_restored(self.restored)
        rollback.on_skipped(self.skipped)

    @follows_moves
    def kept_step(self, iterator: Any) -> Any:
        """One step, in ``sess.run``: the batch kept for it if a rollback put the step count back (its
        position is the one a snapshot after it records), else the next batch of ``iterator``, kept.
        Returns {"logs", "loss": the batch's own loss, "data"}; the Supervisor keeps the loss."""
        replay, where = self.replay, self.position
        self.draw_skipped(iterator)
        step = self._step()
        kept = replay.kept.get(step)
        if kept is not None:
            epoch, index, _ = kept
            if index == 0:  # the first batch of an epoch: Keras reset the metrics before it
                self.model.reset_metrics()
            out = replay.again(step)
            where.record(epoch, index + 1)
            return out
        if iterator is None:
            raise _NoLiveInput(f"step {step}")
        t0 = time.perf_counter()
        out = replay.run(iterator)
        self.train_secs = time.perf_counter() - t0
        replay.keep(step, where.live_epoch, where.live_batch, out["data"])
        self.drew = True
        self.drawn = max(self.drawn, step)
        self.gap = None
        return out

    def draw_skipped(self, iterator: Any) -> None:
        """Before a step draws fit's next batch: if a skipped step's batches are not drawn yet (a restarted
        trainer met a step this run skipped before: :meth:`skipped`), they are, and discarded; raises
        :class:`SkippedBatch` (this call of fit's train function trains nothing: one call, one batch, as fit's
        loop counts them). ``iterator`` None (no live input): nothing."""
        where = self.position
        if not where.pending or iterator is None:
            return
        for _ in range(where.spe):
            next(iterator)
        where.drew_skipped()
        raise SkippedBatch(f"a skipped step's batch, at epoch {where.live_epoch + 1}, batch {where.live_batch}")

    def train(self, sess: ManagedSession, iterator: Any) -> Any:
        """Train in ``sess`` the batches a rollback restored before fit's next one (each its own step),
        then fit's next batch of ``iterator``: the logs of the last."""
        self.drew = False
        logs = None
        while not self.drew:
            logs = sess.run(self.kept_step, iterator)[LOGS]
        return logs

    def settle(self, sess: ManagedSession, checkpointed: bool) -> bool:
        """Check the losses kept since the last check (one read) and, if one is non-finite, roll back,
        replay, retry and skip now, as a snapshot's check would have later; True if it rolled back.
        At the end of an epoch (its logs are the epoch's) and of fit (its final checkpoint).
        ``checkpointed``: something is saved (else there is nothing to roll back to)."""
        rollback, replay, step = self._rollback, self.replay, self._step
        if replay.unsupported or not checkpointed:
            return False
        if not rollback.replays:
            return False
        last, moved = step(), False
        while True:
            if rollback.work():  # the retry's judgement or a skip, due at this step
                moved = True
                continue
            if step() < last:
                try:
                    sess.run(self.kept_step, None)
                except _NoLiveInput:
                    if step() < last:  # not kept (past the cap): fit goes on with its next batch, if it has one
                        return True
                    # else a skip at that boundary reached the last step: nothing more to replay
                continue
            bad = rollback.first_nonfinite()
            if bad is None:
                if rollback.rolls_back_spikes and rollback.spikes_refused(step()):  # a spike: as a snapshot's check
                    moved = True
                    continue
                return moved
            moved = True
            rollback.refuse(step(), bad)  # rolls back, or stops (exit 4)

    def restored(self, step: int) -> None:
        """A rollback restored ``step``: the position a snapshot records is the restored one. If
        not every batch between it and fit's newest is kept, the steps from the first one missing
        are not trained again: said, and the bad step's retry given up (its batch is not kept)."""
        self.position.record(unpack(int(self._epoch_var.numpy()))[1], int(self._batch_var.numpy()))
        self.position.pending = 0  # (a skipped step met again by the replay is skipped again)
        kept = self.replay.kept
        first = next((s for s in range(step + 1, self.drawn + 1) if s not in kept), None)
        if first is None:
            return
        bad = self._rollback.retrying
        self.gap = (first, self.drawn, bad if bad is not None else self.drawn)
        self._rollback.abandon(step, not_trained_again(first, self.drawn, PAST_CAP))

    def skipped(self, step: int) -> None:
        """Step ``step`` was skipped: the position moves past its batch; Keras' iteration counter does
        not count it (no update was applied: a learning rate schedule and Adam's bias correction go on
        as in a fit that never applied the batch, as a custom loop's skip leaves its optimizer). A step
        whose batch fit's loop has not drawn (a restarted trainer's skip of a step this run skipped before:
        the step count, not fit's position, says which batch it is) has its batch drawn by fit's loop's next
        call and discarded (:meth:`draw_skipped`), as a resumed fit draws the batches trained before."""
        where = self.position
        if step > self.drawn:
            where.skipped_ahead()
            return
        at = where.of(step)
        if at is not None:
            where.record(at[0], at[1] + where.spe)
