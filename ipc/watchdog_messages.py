"""The messages of the watchdog's channel: what a child process reports to the watchdog.

Sent by the trainer, the standby trainer and the services (a PUSH socket each, to the watchdog's
PULL on ``watchdog.sock``); received by the watchdog. :class:`procsv.ipc.messages.SaveResult`, a
checkpoint message, travels this channel too (the checkpoint service pushes a copy).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Optional

from procsv.ipc.message_base import Busy, Message, RestoreSource, Role


@dataclass(frozen=True)
class Hello(Message):
    """A child process is up and connected."""

    KIND: ClassVar[str] = "hello"
    role: Role
    pid: int
    attempt: int
    slot: str = ""  # a --ps server task's slot (ps0, worker0, ...); "" for the others (their slot is their role)


@dataclass(frozen=True)
class TrainerReady(Message):
    """The trainer restored (or initialized) its state and is about to run its first step."""

    KIND: ClassVar[str] = "trainer_ready"
    pid: int
    attempt: int
    step: int
    restored_from: Optional[str]
    restore_secs: float
    skipped: list[str] = field(default_factory=list)  # corrupt checkpoints passed over
    save_secs: Optional[float] = None  # its checkpoint schedule (save_model_secs), if checkpointing
    save_steps: Optional[int] = None  # ... and save_checkpoint_steps: the watchdog notices a stall
    # where its start went (the group's MTTR breakdown, scripts/bench_group.py): the wall time it began
    # preparing its session (the program's start-up before it: data, tf.distribute, model, Supervisor),
    # and the seconds its warm-up (Supervisor.warm_up's tracing) took before the restore
    prepared_at: Optional[float] = None
    warm_secs: float = 0.0
    source: Optional[RestoreSource] = None  # where the restore read the state (None: initialized)


@dataclass(frozen=True)
class Progress(Message):
    """The trainer completed ``step`` (sent after the first step, then at most every 100 ms).

    ``busy`` names work the trainer does on purpose between steps (a ``snapshot``, the
    ``final_checkpoint``): the watchdog then measures the trainer against the longer busy limit
    (hang timeout + stop grace) until a Progress without it.
    ``Busy.NONE`` (the default) is the empty string, so ``bool(busy)`` is False when not busy.
    ``stepped``: the trainer's session has completed a step. A report before that (around the
    start-up checkpoint's snapshot that a TF1 Supervisor's standard services take as the session
    becomes ready, at a stop before any step) says False: the watchdog's first step is the first
    Progress that is stepped and not busy, and until then ``--startup-timeout`` applies. False by
    default: a sender that does not say it made no step.
    """

    KIND: ClassVar[str] = "progress"
    pid: int
    step: int
    wall_time: float
    busy: Busy = Busy.NONE
    stepped: bool = False


@dataclass(frozen=True)
class SaveOverdue(Message):
    """Trainer -> watchdog: the snapshot of ``step`` has had no :class:`SaveResult` for
    ``waited_secs``, past its deadline of ``deadline_secs`` (from the measured persist rate, with a
    floor). Sent once per deadline that passes; the watchdog replaces the checkpoint service.
    ``waited_secs`` is on the trainer's clock, which leaves out the time its process was stopped
    (SIGSTOP, then SIGCONT: a suspended job); ``stopped_secs``: the stops within the wait it left out
    (0 on a clock that leaves none out: one a program injected)."""

    KIND: ClassVar[str] = "save_overdue"
    pid: int
    step: int
    waited_secs: float
    deadline_secs: float
    stopped_secs: float = 0.0


@dataclass(frozen=True)
class ServiceLoading(Message):
    """Service -> watchdog: the service is loading ``what`` it needs (TensorFlow, for a snapshot with
    a variant tensor: a ``tf.data`` iterator's state), before its Hello at start or before a commit;
    ``done`` once loaded, after ``secs``. The stall rule never kills a service while it loads, and
    counts its window from when it is loaded (its readiness)."""

    KIND: ClassVar[str] = "service_loading"
    role: Role
    pid: int
    attempt: int
    what: str
    done: bool = False
    secs: float = 0.0


@dataclass(frozen=True)
class SummaryOverdue(Message):
    """Trainer -> watchdog: the summary service has confirmed none of the batches it was handed
    (the oldest holds rows from ``step``) for ``waited_secs``, past ``deadline_secs``: no
    :class:`SummaryAck` confirmed one since the oldest was sent or the last one was confirmed. Sent
    once per deadline that passes, then when the wait has tripled; the watchdog replaces the
    summary service (a live but stuck one: SIGSTOP, a hung disk), whose successor asks for what
    was not written. ``waited_secs`` and ``stopped_secs``: as :class:`SaveOverdue`'s."""

    KIND: ClassVar[str] = "summary_overdue"
    pid: int
    step: int
    waited_secs: float
    deadline_secs: float
    stopped_secs: float = 0.0


@dataclass(frozen=True)
class StandbyReady(Message):
    """Standby trainer -> watchdog: it has run the program up to restoring and waits to be promoted."""

    KIND: ClassVar[str] = "standby_ready"
    pid: int
    attempt: int
    prepare_secs: float


@dataclass(frozen=True)
class AuditResult(Message):
    """Auditor -> watchdog (issue 71): its replay of the committed interval ``start``-``end`` from checkpoint
    ``start``, compared tensor by tensor with checkpoint ``end`` read back from disk. ``differ``: the keys of
    the tensors whose digests differ (empty: bit-equal); ``digest``: one digest of the whole replayed
    state (two replays of the same interval compare by it); ``host``: the auditor's; ``error``: why it made
    no replay (a checkpoint retired before it read it, the program ended before ``end``; empty: it did)."""

    KIND: ClassVar[str] = "audit_result"
    pid: int
    attempt: int
    start: int
    end: int
    differ: list[str]
    digest: str
    host: str
    error: str = ""


@dataclass(frozen=True)
class NonfiniteDetected(Message):
    """Trainer -> watchdog: a watched loss, or the state a snapshot copied, was found NaN or
    infinite (issue 41), at the moment the trainer found it (the bulk check before a snapshot, or
    right after a retried step). ``step``: the first step known to be poisoned (the snapshot's own
    step when only its weights were); ``what``: one line on what was found; ``epoch``/``batch``: the
    input position of ``step`` where procsv knows it (Keras ``fit``), else None (the step is the position)."""

    KIND: ClassVar[str] = "nonfinite_detected"
    pid: int
    step: int
    wall_time: float
    what: str
    epoch: Optional[int] = None
    batch: Optional[int] = None


@dataclass(frozen=True)
class RolledBack(Message):
    """Trainer -> watchdog: ``--on-nonfinite rollback`` restored ``restored_step`` in place (no
    process restart) because step ``step`` was poisoned, from ``source`` (``path``), in
    ``restore_secs``; the program replays to ``step`` - 1 and then retries ``step`` once (``skip``
    False) or skips it (``skip`` True: it was non-finite again when retried); ``epoch``/``batch``:
    the input position of ``step`` as in :class:`NonfiniteDetected`; ``group``: a trainer group rolled back in
    place, every member (its chief says so, once: a rollback of the group, and its members' reports of the
    step are settled)."""

    KIND: ClassVar[str] = "rolled_back"
    pid: int
    step: int
    restored_step: int
    source: RestoreSource
    path: str
    skip: bool
    restore_secs: float
    wall_time: float
    epoch: Optional[int] = None
    batch: Optional[int] = None
    group: bool = False


@dataclass(frozen=True)
class StepSkipped(Message):
    """Trainer -> watchdog: step ``step`` was skipped (its loss was non-finite twice): its input is
    consumed, no variable changed, the global step moved past it. ``skipped``: the steps this
    trainer has skipped so far, this one included; ``epoch``/``batch`` as in :class:`NonfiniteDetected`."""

    KIND: ClassVar[str] = "step_skipped"
    pid: int
    step: int
    wall_time: float
    skipped: int
    epoch: Optional[int] = None
    batch: Optional[int] = None


@dataclass(frozen=True)
class SpikeDetected(Message):
    """Trainer -> watchdog: the loss spiked (issue 68): a finite loss far above its recent distribution
    (:mod:`procsv.trainer.nonfinite.spike`), found by the check before a snapshot. ``step``: the
    detection, the first step above the ``threshold`` (its ``loss``; ``median`` of the window
    before it); ``onset``: the first step of the rise to it; ``action``: what ``--on-spike`` does
    (``rollback``: restored and skips ``onset`` .. ``step``; ``stop``; ``warn``: trains on);
    ``epoch``/``batch``: as in :class:`NonfiniteDetected`."""

    KIND: ClassVar[str] = "spike_detected"
    pid: int
    step: int
    onset: int
    loss: float
    threshold: float
    median: float
    action: str
    wall_time: float
    epoch: Optional[int] = None
    batch: Optional[int] = None


@dataclass(frozen=True)
class SpikeReplayed(Message):
    """Trainer -> watchdog: under ``--on-spike rollback`` the loss spike of :class:`SpikeDetected`
    (``step``, ``onset``) was replayed from a snapshot before its onset, to tell the data's (or the
    model's) spike from a transient fault of the machine. ``reproduced``: the replay's losses of
    ``onset`` .. ``step`` equal the first ones bit for bit (its steps are then skipped); else the
    spike was this machine's (``host``), nothing is skipped. ``loss``: the first loss of ``step``;
    ``replay_loss``: the replay's (None: the replay did not reach it). ``differs_at``: the first replayed
    step before ``onset`` whose loss differs from the first run's (None: each equal bit for bit, or none
    replayed): the program's input did not come back with the restored state (a counter or an iterator of
    its own, random numbers no checkpoint holds), so the replay says nothing of whose the spike was: no
    transient fault of ``host``; the replayed state is kept and training goes on."""

    KIND: ClassVar[str] = "spike_replayed"
    pid: int
    step: int
    onset: int
    reproduced: bool
    loss: float
    replay_loss: Optional[float]
    host: str
    wall_time: float
    differs_at: Optional[int] = None


@dataclass(frozen=True)
class Promotion(Message):
    """Watchdog -> a standby it promotes: what a trainer spawned for ``attempt`` now would find in its
    environment and a standby forked earlier cannot (it was decided after the fork). Written whole
    (write and rename, no fsync: the runtime directory does not outlive the launch, and a crash of the
    machine ends the standby too) to the run's runtime directory before the watchdog's SIGUSR1, which carries no
    data (:func:`procsv.common.layout.promotion_file`). ``skip_steps``: the steps the group skips again
    (``PROCSV_SKIP_STEPS``); ``rollback_before``: B of a group restarted for its rollback of step B, whose
    chief restores a state before B (``PROCSV_ROLLBACK_BEFORE``), None if it is not one;
    ``launch_start_step``: the step the launch's first trainer began at (``PROCSV_LAUNCH_START_STEP``)."""

    KIND: ClassVar[str] = "promotion"
    attempt: int
    skip_steps: list[int]
    rollback_before: Optional[int] = None
    launch_start_step: Optional[int] = None


__all__ = ["Hello", "TrainerReady", "Progress", "SaveOverdue", "ServiceLoading", "SummaryOverdue", "StandbyReady", "NonfiniteDetected",
           "RolledBack", "StepSkipped", "SpikeDetected", "SpikeReplayed", "Promotion"]
