"""``procsv.keras.BackupAndRestore``: Keras ``model.fit`` under procsv, resumed mid-epoch exactly.

Runs in the trainer process, inside ``model.fit``. A drop-in for ``keras.callbacks.BackupAndRestore``
(same arguments, same meaning) built on the :class:`~procsv.trainer.supervisor.Supervisor`: the
state -- model, optimizer, the epoch's metric accumulators, the epoch and the batches done in it --
is checkpointed by procsv's checkpoint service (asynchronous, atomic, verified), and the logs go
to the summary service as TensorBoard scalars.

How a resumed ``fit`` lands on the next batch of the interrupted epoch: ``on_train_begin`` restores
the newest committed checkpoint, replays the input of the epochs before the interrupted one
(:func:`procsv.trainer.keras.input_position.replay_epochs`: for a seeded ``tf.data`` shuffle, only its
per-epoch seeds), and starts ``fit`` at that epoch. The model's
train function is wrapped: its first calls in that epoch draw their batches and train on none
(the batches already trained), the others run one step each through the Supervisor's step
boundary (snapshots, progress, stop requests). Keras' train step is traced and instantiated
before the restore (:mod:`procsv.trainer.keras.step_warmup`), so a promoted hot standby does not pay
for it at its first batch. A stop (SIGTERM, ``procsv stop``) is honoured at
the next batch: nothing more is trained, ``fit`` ends, and the position reached is committed.

Each batch is trained by :class:`procsv.trainer.keras.replay.BatchReplay`'s step (Keras' own, which
also returns the batch and its own loss), so that ``--on-nonfinite rollback`` and ``--on-spike rollback``
can restore an earlier state in place and train the batches since then again (:mod:`procsv.trainer.keras.rollback`;
a spike's replay, verdict and skips are the custom loop's, :mod:`procsv.trainer.nonfinite.spike_response`).
A ``fit`` that raised never reaches ``on_train_end``: the next ``fit`` of its thread ends its session
(:meth:`BackupAndRestore.end_interrupted`) before it begins, as Keras' own callback would find its backup.
A program's several fits of one directory: each position names the fit it is in, and where each fit
begins after a restore is :func:`procsv.trainer.keras.resume.begin`'s decision.

One concern: Keras' ``fit`` as a procsv session, from its restore to its last commit.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any, Callable, Optional, Union

import keras
import numpy as np

from procsv.common import bootstrap
from procsv.common.clock.watched import process_clock
from procsv.common.errors import MismatchedCheckpoint, TrainingStopped, UsageError
from procsv.ipc.messages import Busy
from procsv.trainer.keras import input_position
from procsv.trainer.keras import restore_target
from procsv.trainer.keras import resume
from procsv.trainer.keras import step_warmup
from procsv.trainer.keras.replay import BatchReplay, default_cap, keras_tested, untested_keras_line
from procsv.trainer.keras.rollback import (PAST_CAP, UNTESTED, FitPosition, FitRollback, SkippedBatch, not_trained_again,
                                          stop_untrained)
from procsv.trainer.once import warn_once
from procsv.trainer.managed import ManagedSession, follows_moves
from procsv.trainer.nonfinite.spike import SpikeThresholds
from procsv.trainer.supervisor import Supervisor

SaveFreq = Union[str, int, bool]


# the callback whose fit last began, by thread: the next fit of that thread ends its session if that fit
# raised (BackupAndRestore.on_train_begin), whatever directory either backs up
_LIVE: dict[int, "BackupAndRestore"] = {}
# the fits this process completed, by backup directory (its real path): the number the positions of its next
# fit record, and where a restarted program's fits begin (procsv.trainer.keras.resume)
_COMPLETED: dict[str, int] = {}
# the directories whose last fit completed in this process and trained (or resumed) its state here: the next
# fit of that directory, of whatever model, restores nothing (procsv.trainer.keras.restore_target), as after
# Keras' own callback, which deletes its backup when fit completes (the next fit begins from the model it is given)
_HELD: set[str] = set()


class BackupAndRestore(keras.callbacks.Callback):  # type: ignore[misc]  # keras ships no type information
    """Back up ``fit``'s state through procsv and resume it at the next batch after any interruption.

    Keras' arguments: ``backup_dir`` (default: the launch's ``--logdir``), ``save_freq``
    (``"epoch"``, every N batches, or ``False``: only at the end and on preemption),
    ``double_checkpoint`` (accepted: procsv keeps ``max_to_keep`` verified checkpoints and falls
    back to an older one on its own), ``delete_checkpoint`` (remove procsv's checkpoints of this
    directory when ``fit`` completes; default False, unlike Keras: the directory is also the run's
    logdir, and a program killed after one fit completed, before the next fit's first checkpoint,
    would begin that fit again from its first batch. Kept or not, a fit after a completed one begins
    at its own first epoch (from the model it is given, nothing restored, as after Keras' own), and a restarted
    program's fits that completed train nothing:
    :mod:`procsv.trainer.keras.resume`), ``save_before_preemption`` (commit the position on SIGTERM; always on:
    ``False`` is accepted, so that switching from Keras' callback is a one-word change, and
    warned about once, since procsv always commits the position reached when asked to stop).

    procsv's: ``save_secs`` (also checkpoint every N seconds), ``save_summaries_secs`` (batch-level
    scalars at most this often; epoch scalars at every epoch end; ``None``: epoch scalars only),
    ``max_to_keep``, ``allow_reinit``, ``on_spike`` and ``spike_thresholds`` (loss spikes: ``--on-spike``'s
    policy, the program's own winning, and the rule's settings), ``clock`` (the monotonic clock of its timers; not given,
    the process's watched clock, which leaves out the time the process was stopped: see
    :class:`~procsv.trainer.supervisor.Supervisor`).
    """

    def __init__(self, backup_dir: Optional[str] = None, save_freq: SaveFreq = "epoch",
                 double_checkpoint: bool = False, delete_checkpoint: bool = False,
                 save_before_preemption: bool = True, *, save_secs: Optional[float] = None,
                 save_summaries_secs: Optional[float] = 10.0, max_to_keep: int = 5,
                 allow_reinit: bool = False, replay_memory_bytes: Optional[int] = None,
                 on_spike: Optional[str] = None, spike_thresholds: Optional[SpikeThresholds] = None,
                 clock: Optional[Callable[[], float]] = None) -> None:
        super().__init__()
        if save_freq is not False and save_freq != "epoch" and (
                isinstance(save_freq, bool) or not isinstance(save_freq, int) or save_freq < 1):
            raise UsageError(f"save_freq must be 'epoch', a number of batches >= 1, or False; not {save_freq!r}")
        if not save_before_preemption:
            warn_once("keras-save-before-preemption",
                      "BackupAndRestore(save_before_preemption=False) has no effect: procsv always commits the "
                      "position reached when it is asked to stop (it is how nothing is lost)")
        if save_secs is not None and save_secs <= 0:
            raise UsageError(f"save_secs must be > 0, not {save_secs!r}")
        if replay_memory_bytes is not None and replay_memory_bytes < 0:
            raise UsageError(f"replay_memory_bytes must be >= 0, not {replay_memory_bytes!r}")
        self.replay_memory_bytes = replay_memory_bytes  # the cap on fit's batches kept for a rollback (None: a share of host memory)
        self.backup_dir = backup_dir
        self.save_freq = save_freq
        self.double_checkpoint = double_checkpoint
        self.delete_checkpoint = delete_checkpoint
        self.save_before_preemption = save_before_preemption
        self.save_summaries_secs = save_summaries_secs
        # procsv's settings its Supervisor is made with at each fit's start (save_secs, max_to_keep, ...)
        self._settings: dict[str, Any] = dict(
            save_model_secs=save_secs, max_to_keep=max_to_keep, allow_reinit=allow_reinit, on_spike=on_spike,
            spike_thresholds=spike_thresholds)
        self.clock = process_clock() if clock is None else clock
        self.sv: Optional[Supervisor] = None
        self.resumed_at: Optional[tuple[int, int]] = None  # (epoch, batch) restored, None if fresh
        self.replayed_batches = 0  # drawn without training to put the input back (whole epochs + skip)
        self._sess: Optional[ManagedSession] = None
        self._original_train: Any = None
        self._at = FitPosition()  # where this fit is (the position a snapshot records, and fit's own loop)
        self._rollback: Optional[FitRollback] = None  # the replay of fit's batches after a rollback
        self._each_batch = False  # check each batch's loss at once (a TerminateOnNaN reads it anyway)
        self._fallback = False  # an untested Keras under rollback: no replay (restore, continue with the next batch)
        self._drawn = -1  # (the fallback) the newest step trained, and a rollback's steps not trained again
        self._gap: Optional[tuple[int, int, int]] = None
        self._skip = 0
        self._skip_epoch = -1
        self._saved_metrics: list[Any] = []
        self._last_logs: Any = None
        self._next_batch_log = 0.0
        self._stopped_mid_epoch = False  # fit ends at a stop request: the epoch's logs are partial
        self.loop_secs = 0.0  # time the training loop spent in procsv (step boundaries, snapshots), this fit
        self._train_secs = 0.0

    # ------------------------------------------------------------------ keras callback API
    def on_train_begin(self, logs: Any = None) -> None:
        import tensorflow as tf

        model = self.model
        # a fit of this thread that raised (another callback, the program's own code) never reached
        # on_train_end: its session still holds its logdir and services. End it, committing the position
        # it reached (Keras' own callback had written its epoch-end backup), whichever directory it backs up
        thread = threading.get_ident()  # (a thread runs one fit at a time: an open one of its raised)
        previous = _LIVE.get(thread)
        if previous is not None and previous is not self and previous.sv is not None:
            previous.end_interrupted()
        if self.sv is not None:
            self.end_interrupted()
        _LIVE[thread] = self
        self.resumed_at, self.replayed_batches, self._skip, self._skip_epoch = None, 0, 0, -1
        self._saved_metrics, self._last_logs, self._next_batch_log, self._stopped_mid_epoch = [], None, 0.0, False
        self.loop_secs = 0.0
        inp = input_position.fit_frame()
        input_position.check_finite(inp, self.params.get("steps"))
        if not model.built:
            raise UsageError(f"procsv.keras.BackupAndRestore: model {model.name!r} is not built; build it before "
                             "fit() (give it a keras.Input, or call it on a batch)")
        if model.optimizer is None:
            raise UsageError(f"procsv.keras.BackupAndRestore: model {model.name!r} is not compiled; call "
                             "model.compile(optimizer=..., loss=...) before fit()")
        if self.backup_dir is None and bootstrap.ChildContext.from_env() is None:  # Keras' own needs a backup_dir too
            raise UsageError("procsv.keras.BackupAndRestore() outside procsv launch needs backup_dir=...: without "
                             "one nothing would be backed up")
        input_position.build_state(model, inp)  # every variable must exist to be restored into
        # the position lives in Python while fit runs (no TF op per batch) and is written into
        # these variables right before each snapshot (CheckpointAgent.hooks.prepare)
        self.epoch_var = tf.Variable(0, dtype=tf.int64, trainable=False, name="fit_epoch")
        self.batch_var = tf.Variable(0, dtype=tf.int64, trainable=False, name="fit_batch")
        metrics = {f"v{i}": v.value for i, v in enumerate(model.metrics_variables)}
        # no global_step here: the Supervisor creates it (saved as ``global_step``, as before) and,
        # since nobody else holds it, advances it in Python between snapshots, not with an op per batch
        parts = dict(model=model, optimizer=model.optimizer,
                     fit=tf.train.Checkpoint(epoch=self.epoch_var, batch=self.batch_var),
                     metrics=tf.train.Checkpoint(**metrics))
        # the random numbers' state of Dropout-like layers (Keras keeps it apart from the weights): saved, so that a
        # resume draws what the uninterrupted fit would have (restore_target.seed_states)
        states = restore_target.seed_states(model)
        seeds = tf.train.Checkpoint(**states) if states else None
        checkpoint = tf.train.Checkpoint(**parts, **({"seeds": seeds} if seeds is not None else {}))
        restore_parts = (tf.train.Checkpoint(**parts), tf.train.Checkpoint(seeds=seeds) if seeds else None)
        self._at = at = FitPosition(spe=int(getattr(model, "steps_per_execution", 1) or 1))
        every = None
        if isinstance(self.save_freq, int) and not isinstance(self.save_freq, bool):
            every = max(1, -(-self.save_freq // at.spe))  # global steps are train-function calls
        self.sv = Supervisor(
            logdir=self.backup_dir, checkpoint=checkpoint,
            save_summaries_secs=None, save_checkpoint_steps=every, increment_global_step=True, clock=self.clock,
            **self._settings)
        sv = self.sv
        front = sv.front_end
        front.before_each_snapshot(self._write_position)
        rollback = front.rollback
        rollback.locate_steps(at.of)  # non-finite events name (epoch, batch)
        train = model.train_function
        stale = getattr(train, "__self__", None)
        if isinstance(stale, BackupAndRestore):  # left wrapped by a fit that raised: unwrap it
            train = stale._original_train
        self._original_train = train
        dataset = getattr(inp.epoch_iterator, "_distributed_dataset", None)
        rolling = rollback.replays  # a non-finite step's or a loss spike's rollback can come: fit's batches are kept
        untested = not keras_tested(keras.__version__)
        if untested:  # (a spike's replay must train the same batches again to tell whose it is)
            rollback.refuse_spike_rollback(f"Keras fit with Keras {keras.__version__} (a version procsv's replay of "
                                           "fit's batches is not tested with: no batch is kept)")
        self._fallback = untested and rolling  # Keras' own train function; a rollback continues with fit's next batch
        if self._fallback:
            print(untested_keras_line(keras.__version__), file=sys.stderr, flush=True)
            rollback.on_restored(self._fallback_restored)
        self._rollback = None
        batches = BatchReplay(model, train, dataset.element_spec if isinstance(dataset, tf.data.Dataset)
                              else None, at.spe, replay_cap(self.replay_memory_bytes), untested)
        if not batches.off:
            self._rollback = FitRollback(model, batches, at, self.epoch_var, self.batch_var, lambda: sv.step, rollback)
        rollback.cannot_replay(batches.unsupported)
        batches.keeping = rolling
        # keras.callbacks.TerminateOnNaN reads each batch's logs["loss"]: checked (that one read) and
        # rolled back before it sees a NaN procsv rolls back
        self._each_batch = batches.keeping and any(
            isinstance(c, keras.callbacks.TerminateOnNaN) for c in getattr(inp.callbacks, "callbacks", None) or ())
        warm = step_warmup.train_step_warm_up(train, inp.epoch_iterator)
        if warm is not None and batches.traced is not None:
            warm = (batches.traced, warm[1])  # the step fit runs here: Keras' own, its batch kept
        if warm is not None:  # traced and instantiated now: in a hot standby, before it waits
            sv.warm_up(*warm)
        directory = _directory(sv)
        # a fit after one of this directory this process completed: the model it is given is the state (the same
        # model, changed or not since: unfrozen layers, a new optimizer; or another: a new one, one loaded from a
        # file), nothing is restored; its checkpoints continue the step count. Any other: the whole state, or only
        # the position when it does not match
        in_memory = directory in _HELD
        _HELD.discard(directory)  # (a fit that raises holds nothing: the next one restores the position it committed)
        whole, seeded = restore_parts  # (the seeds apart: a checkpoint written before they were saved has none)
        target = restore_target.WholeOrPosition(whole, tf.train.Checkpoint(fit=checkpoint.fit), seeded)
        front.restore_into(restore_target.Nothing() if in_memory else target)
        self._sess = sv.prepare_or_wait_for_session()
        done = _COMPLETED.get(directory, 0)
        fits, epoch = resume.unpack(int(self.epoch_var.numpy()))
        restored = sv.restored_from is not None and not in_memory
        where = resume.begin(done, (fits, epoch, int(self.batch_var.numpy())) if restored else None,
                             self.params.get("steps"))
        if target.mismatch is not None and not where.passed:  # (a completed fit's: its later fit restores it)
            self.sv = None
            front.release()
            raise MismatchedCheckpoint(f"checkpoint {sv.restored_from} does not match this program's state "
                                       f"({target.mismatch}); restore it with the program that wrote it, or use a "
                                       "new --logdir")
        at.restored(where.epoch or 0, where.batch, where.fits, where.passed, inp.initial_epoch)
        if in_memory:
            print(f"procsv: fit {done + 1} begins from the model it is given, after fit {done}'s end (step {sv.step}): "
                  "nothing is restored", flush=True)
        # the epoch fit's loop begins at (None: its own initial_epoch; Keras' own leaves the last one it restored,
        # so that a later fit began there too); a fit that completed before the restart: none of its epochs
        model._initial_epoch = max(int(self.params.get("epochs") or 0), at.epoch) if where.passed else where.epoch
        if where.passed:
            held = (f"at epoch {at.epoch + 1}, batch {at.batch + 1}" if (at.epoch, at.batch) != (0, 0)
                    else "at its beginning")
            state = (f"the state restored is fit {where.fits + 1}'s, {held}" if target.mismatch is None else
                     f"fit {where.fits + 1}'s state, {held}, does not match this fit's model and optimizer: not "
                     f"restored here, fit {where.fits + 1} restores it")
            print(f"procsv: fit {done + 1} of this program completed before the restart: it trains nothing ({state}); "
                  f"its History lists its epochs {at.first + 1}-{self.params.get('epochs')}, without their logs",
                  flush=True)
        random_reason = (["the checkpoint restored holds no state of the random numbers of its Dropout-like layers "
                          "(written by an earlier procsv): this resume draws other numbers"]
                         if where.resumes and target.unseeded and target.mismatch is None else [])
        random_reason += (["the checkpoint restored holds the random numbers' state of other Dropout-like layers than "
                           "this model's (one added or moved, or saved by another procsv): those of this model it "
                           "lacks draw other numbers"]
                          if where.resumes and target.unmatched_seeds and target.mismatch is None else [])
        for reason in input_position.inexact_reasons(inp) + random_reason:
            print(f"procsv: warning: a resumed fit will not be bit-exact: {reason}", file=sys.stderr, flush=True)
        if where.resumes:
            epoch, batch = at.epoch, at.batch
            self.resumed_at = (epoch, batch)
            # the epoch's metrics so far, put back at its start (none at an epoch's first batch: they begin anew)
            self._saved_metrics = [np.array(v.numpy()) for v in model.metrics_variables] if batch else []
            replay = input_position.replay_epochs(inp, epoch, report=self._report_replay)
            self.replayed_batches = replay.drawn + batch
            self._skip, self._skip_epoch = batch, epoch
            replayed = ""
            if epoch:
                how = (f"{replay.drawn} batches drawn: {replay.draw_reason}" if replay.draw_reason is not None
                       else "no batch drawn: only the shuffle seeds put back")
                replayed = f"; input of {epoch} epoch(s) put back in {replay.secs:.2f} s, {how}"
            print(f"procsv: fit resumes at epoch {epoch + 1}, batch {batch + 1} ({sv.step * at.spe} "
                  f"batches trained{replayed})", flush=True)
        model.train_function = self._train_function

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        self._at.begin_epoch(epoch)
        if epoch == self._skip_epoch and self._saved_metrics:
            # fit reset the metrics for this epoch: put back the part of it trained before the stop
            for var, value in zip(self.model.metrics_variables, self._saved_metrics):
                var.assign(value)
            self._saved_metrics = []

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        sv = self.sv
        assert sv is not None
        if self.params.get("steps") is None and self._settle() and logs is not None:  # (else settled at its last batch)
            logs.update(_scalars(dict(self.model.get_metrics_result())))  # the epoch without the poisoned batch
        if logs and not self._stopped_mid_epoch:
            values = dict(logs)
            values.setdefault("learning_rate", self._learning_rate())
            sv.log_scalars({f"epoch_{k}": v for k, v in _scalars(values).items()}, step=epoch)
        if self.save_freq == "epoch" and not self._stopped_mid_epoch:
            sv.front_end.request_checkpoint()  # taken at the next batch boundary, or by the final commit
        if not self._stopped_mid_epoch:
            self._at.end_epoch()

    def end_interrupted(self) -> None:
        """This callback's fit raised before its end (a later fit of its thread found its session open):
        stop that session, committing the position reached."""
        sv, self.sv = self.sv, None
        assert sv is not None
        if self.model is not None:
            self.model.train_function = self._original_train
        self._at.past_epoch_end()
        print("procsv: the previous fit() ended by an exception; committing the position it reached before "
              "this fit() begins", file=sys.stderr, flush=True)
        sv.stop()

    def on_train_end(self, logs: Any = None) -> None:
        sv, model = self.sv, self.model
        if sv is None:
            return
        model.train_function = self._original_train
        if not self._stopped_mid_epoch:
            self._settle()  # a non-finite loss since the last check: rolled back now, not refused at the end
            fit_rollback = self._rollback  # steps a rollback did not train again, and no batch left: exit 4
            stop_untrained(sv.front_end.rollback, fit_rollback.gap if fit_rollback is not None else self._gap,
                           PAST_CAP if fit_rollback is not None else UNTESTED)
            # completed: the position committed now is past its last epoch, its epochs' even when a callback
            # ended it early (a restarted program's run of it trains nothing), and the next fit, counted after
            # it, begins at its own first epoch
            where = _directory(sv)
            _COMPLETED[where] = _COMPLETED.get(where, 0) + 1
            epochs = int(self.params.get("epochs") or 0)
            if self._at.passed:  # the state is a later fit's, which that fit restores
                _HELD.discard(where)
            else:
                _HELD.add(where)
            if self._at.passed or self._at.epoch >= epochs and self.resumed_at is not None:
                # (or its own final commit restored: killed after it completed, before a later fit's first checkpoint)
                _passed_history(self._at.first, epochs)
            self._at.completed(epochs)
        self.sv = None
        if self._stopped_mid_epoch and self._saved_metrics:  # the epoch's training metrics at the stop, not the
            for var, value in zip(model.metrics_variables, self._saved_metrics):  # validation's: the position
                var.assign(value)  # committed holds what a resume puts back at the epoch's start, and an audit's
            self._saved_metrics = []  # replay to that step computes (it compared the validation's: a mismatch)
        if self.delete_checkpoint and not self._stopped_mid_epoch and not self._at.passed:  # (a later fit's: kept)
            sv.commit_checkpoint()  # the position reached, as stop() would (stop() then has nothing left to commit)
            _delete_own_checkpoints(sv)  # while the checkpoint service is still connected
        sv.stop()  # commits the position reached (re-raises a recorded failure, as the Supervisor does)

    # ------------------------------------------------------------------ the wrapped train function
    def _train_function(self, iterator: Any) -> Any:
        """What ``fit`` calls for each batch (each ``steps_per_execution`` batches)."""
        sv, sess, at = self.sv, self._sess, self._at
        spe = at.spe
        assert sv is not None and sess is not None
        if self._skip > 0:  # trained before the interruption: draw the batches, train on none
            n = min(spe, self._skip)
            for _ in range(n):
                next(iterator)
            self._skip -= n
            at.drawn_untrained(n)
            return self._logs()
        if sv.should_stop():
            return self._stop_here()  # a stop was asked for: train no further batch
        at.epoch_starts.setdefault(at.live_epoch, sv.step + 1 - at.live_batch // spe - at.pending)
        t0 = time.perf_counter()
        rollback = self._rollback
        replay = rollback.replay if rollback is not None else None
        self._train_secs = 0.0
        try:
            if rollback is None or replay is None or replay.unsupported:
                logs = sess.run(self._timed_train, iterator)
            else:  # the batches a rollback restored before are trained again first (see FitRollback.kept_step)
                logs = rollback.train(sess, iterator)
                self._train_secs = rollback.train_secs
        except TrainingStopped:
            return self._stop_here()
        except SkippedBatch:  # a step skipped before, met again after a restart: its batch drawn, not trained
            return self._logs()
        at.trained()
        if replay is not None and not replay.unsupported:
            replay.forget_through(sv.front_end.newest_restorable(sv.step))
            if (self._each_batch or at.live_batch == self.params.get("steps")) and self._settle():  # epoch's end
                logs = self._epoch_logs()  # the epoch's logs without the poisoned batch
        elif self._fallback and at.live_batch == self.params.get("steps") and self._settle():  # epoch's end:
            logs = self._epoch_logs()  # a NaN of the epoch is rolled back in it (not at fit's end)
        self._last_logs = logs
        if self.save_summaries_secs:
            now = self.clock()
            if now >= self._next_batch_log:  # batch-level scalars, at most every save_summaries_secs
                self._next_batch_log = now + self.save_summaries_secs
                values = dict(logs)
                values.setdefault("learning_rate", self._learning_rate())  # one read, this rarely
                sv.log_scalars({f"batch_{k}": v for k, v in _scalars(values).items()})
        self.loop_secs += time.perf_counter() - t0 - self._train_secs
        return logs

    def _epoch_logs(self) -> Any:
        """The metrics after a rollback in this epoch; none (no ``loss``: EarlyStopping, ModelCheckpoint and
        ReduceLROnPlateau pass the epoch by) when the state restored is older than the epoch's first batch,
        whose metrics (reset by fit) would read 0.0, a loss no batch had."""
        at = self._at
        trained = self.sv is not None and self.sv.step >= at.epoch_starts.get(at.live_epoch, 0)
        return self.model.get_metrics_result() if trained else {}

    @follows_moves
    def _timed_train(self, iterator: Any) -> Any:
        if self._rollback is not None:  # (replay unsupported: a group's member) a skipped step's batch, drawn
            self._rollback.draw_skipped(iterator)
        t0 = time.perf_counter()
        logs = self._original_train(iterator)
        if self.sv is not None:
            self._drawn, self._gap = self.sv.step, None
        self._train_secs = time.perf_counter() - t0
        return logs

    def _report_replay(self) -> None:
        """Tell the watchdog the resumed fit is still reading its earlier epochs (before its first
        step: the watchdog gives each report ``--startup-timeout``, not the whole replay)."""
        if self.sv is not None:
            self.sv.front_end.report_busy(Busy.INPUT)

    def _fallback_restored(self, step: int) -> None:
        """The fallback restored ``step``: the steps fit trained after it are not trained again (said)."""
        if self.sv is not None and self._drawn > step:
            rollback = self.sv.front_end.rollback
            bad = rollback.retrying
            self._gap = (step + 1, self._drawn, bad if bad is not None else self._drawn)
            rollback.abandon(step, not_trained_again(step + 1, self._drawn, UNTESTED))

    def _settle(self) -> bool:
        """A non-finite loss since the last check rolled back now (:meth:`FitRollback.settle`); True if so."""
        sv, sess, rollback = self.sv, self._sess, self._rollback
        if sv is None or sess is None:
            return False
        front = sv.front_end
        if rollback is None:
            if not self._fallback or not front.saves:
                return False
            bad = front.rollback.first_nonfinite()  # no batch to train again: restored, fit goes on (or ends) from there
            if bad is not None:
                front.rollback.refuse(sv.step, bad)
            return bad is not None
        return rollback.settle(sess, front.saves)

    def _write_position(self) -> None:
        self.epoch_var.assign(resume.pack(self._at.fits, self._at.epoch))
        self.batch_var.assign(self._at.batch)

    def _stop_here(self) -> Any:
        self.model.stop_training = True
        self._stopped_mid_epoch = True
        # the epoch's metrics at the stop, put back before its commit (on_train_end): fit's validation at the epoch's
        # end, which runs after a stop too, resets and fills the same variables with the validation data's
        self._saved_metrics = [np.array(v.numpy()) for v in self.model.metrics_variables]
        return self._logs()

    def _logs(self) -> Any:
        if self._last_logs is not None:
            return self._last_logs
        return self.model.get_metrics_result()

    def _learning_rate(self) -> Optional[float]:
        try:
            return float(np.asarray(self.model.optimizer.learning_rate))
        except (TypeError, ValueError, AttributeError):
            return None


def _directory(sv: Supervisor) -> str:
    """The directory a fit backs up, as ``_COMPLETED`` names it (its real path; "": none)."""
    return os.path.realpath(sv.layout.logdir) if sv.layout is not None else ""


def _passed_history(first: int, epochs: int) -> None:
    """A fit that completed before the restart trained nothing: its History (what ``fit`` returns) lists the
    epochs it ran then, ``first`` to ``epochs`` - 1 (``history.epoch[-1]`` names its last, as in the run
    before the restart), with no logs: they are not known in this process (TensorBoard's have them)."""
    callbacks = input_position.fit_frame().callbacks
    for callback in getattr(callbacks, "callbacks", None) or ():
        if isinstance(callback, keras.callbacks.History) and getattr(callback, "epoch", None) == []:
            callback.epoch.extend(range(first, epochs))  # (History.on_train_begin made the list)


def replay_cap(given: Optional[int]) -> int:
    return default_cap() if given is None else given


def _scalars(logs: dict[str, Any]) -> dict[str, float]:
    out: dict[str, float] = {}
    for key, value in logs.items():
        try:
            arr = np.asarray(value)
        except (TypeError, ValueError):
            continue
        if arr.size == 1 and arr.dtype.kind in "fiub":
            out[key] = float(arr.reshape(()))
    return out


def _delete_own_checkpoints(sv: Supervisor) -> None:
    """``delete_checkpoint=True``: Keras removes its backup when ``fit`` completes. Here the checkpoint
    service, the one writer of checkpoints (invariant 1), deletes procsv's checkpoints of this run
    (data, index, manifests, the state file) once no trainer restores; the user's own files and the
    event files stay. Waits for its answer up to ``stop_grace_secs``; a failure is said, not raised."""
    if not sv.front_end.saves or not sv.is_chief:
        return
    why = sv.front_end.delete_checkpoints(sv.stop_grace_secs)
    if why:
        print(f"procsv: the checkpoints were not deleted: {why}", file=sys.stderr, flush=True)
