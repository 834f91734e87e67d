"""Which committed checkpoint the trainer restores, and when it refuses to start at all.

Runs in the trainer, at start (called by :meth:`procsv.trainer.checkpoint.agent.CheckpointAgent.restore_or_init`).
TensorFlow is not imported here: the caller passes ``attempt(manifest)``, which verifies and
restores one checkpoint and raises :class:`CorruptCheckpoint` or :class:`UnreadableCheckpoint`;
everything else it raises (a checkpoint that does not match the program) propagates unchanged.

The rules, newest checkpoint first:

* restored -> done.
* **corrupt** (a size or CRC-32C mismatch, a missing file, TF's ``DataLossError``) -> one line,
  and the next older one is tried. The checkpoint service later quarantines it.
* **unreadable** (an OSError other than ENOENT: EACCES, EIO, ESTALE, EISDIR) -> retried with
  backoff for :attr:`ReadRetry.total_secs`; still unreadable -> :class:`UnreadableCheckpoint`
  naming the file and errno. The walk stops there: an older checkpoint is not restored in its
  place (that would silently drop the progress it may well still hold), nothing is initialized,
  nothing is moved or deleted. The trainer exits non-zero and the watchdog may try again.
* every committed checkpoint corrupt -> :class:`NoRestorableCheckpoint` with one line per
  checkpoint, unless ``allow_reinit``: then the caller starts from scratch.
* a trainer group's rollback of step B walks only the checkpoints of a step below B; checkpoints
  committed but none below B (retention deleted the older ones) -> it refuses to start from
  scratch, one line (:func:`rollback_refusal`), and stops as diverging (exit code 4).

With nothing committed, a checkpoint procsv did not write (a plain ``tf.train.CheckpointManager``'s
``ckpt-3``) is restored at the step stored in it (:func:`foreign_step`): its root's ``global_step``
variable, else its ``step`` variable; never the number in its name, which counts saves. With
neither, :class:`MismatchedCheckpoint`, one line: procsv does not guess a step.

The clock and ``sleep`` are injected, so a test of the retry runs in no time.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Callable, Mapping, Optional, Sequence

from procsv.common.errors import CorruptCheckpoint, MismatchedCheckpoint, NoRestorableCheckpoint, UnreadableCheckpoint
from procsv.common.manifests import Manifest

# the variables of the checkpoint's root object read as the step of a checkpoint procsv did not
# write, first found wins (object-based checkpoints: "<name>/.ATTRIBUTES/VARIABLE_VALUE")
FOREIGN_STEP_NAMES = ("global_step", "step")


@dataclass(frozen=True)
class ReadRetry:
    """How long an unreadable checkpoint is retried: ``first_delay`` s, times ``factor`` per try,
    at most ``max_delay`` s apart, until ``total_secs`` have passed since the first try."""

    total_secs: float = 5.0
    first_delay: float = 0.1
    factor: float = 2.0
    max_delay: float = 1.0

    def delay(self, failures: int) -> float:
        """The wait after the ``failures``-th failed try (1, 2, ...)."""
        return min(self.max_delay, self.first_delay * self.factor ** (failures - 1))


@dataclass(frozen=True)
class Choice:
    """The outcome of :func:`choose`: the restored manifest (None: nothing committed, or every
    checkpoint corrupt and ``allow_reinit``) and the corrupt ones passed over, newest first."""

    restored: Optional[Manifest]
    corrupt: list[tuple[Manifest, str]]


def attempt_with_retry(attempt: Callable[[], None], retry: ReadRetry, clock: Callable[[], float],
                       sleep: Callable[[float], None]) -> None:
    """Call ``attempt`` until it does not raise :class:`UnreadableCheckpoint` or ``retry.total_secs``
    have passed; then re-raise the last one, saying how long it was tried."""
    start = clock()
    failures = 0
    while True:
        try:
            attempt()
            return
        except UnreadableCheckpoint as exc:
            failures += 1
            waited = clock() - start
            pause = retry.delay(failures)
            if waited + pause > retry.total_secs:
                raise UnreadableCheckpoint(f"{exc} (still after {failures} tries over {waited:.1f} s)",
                                           path=exc.path, errno=exc.errno) from None
            sleep(pause)


def choose(committed: Sequence[Manifest], attempt: Callable[[Manifest], None], *, allow_reinit: bool,
           retry: ReadRetry = ReadRetry(), clock: Callable[[], float] = time.monotonic,
           sleep: Callable[[float], None] = time.sleep,
           on_corrupt: Callable[[Manifest, str], None] = lambda m, why: None) -> Choice:
    """Restore the newest committed checkpoint ``attempt`` accepts (``committed`` is oldest first).

    Raises :class:`UnreadableCheckpoint` or :class:`NoRestorableCheckpoint` (see the module
    docstring); ``on_corrupt`` is called for each corrupt checkpoint as it is passed over.
    """
    corrupt: list[tuple[Manifest, str]] = []
    newest_first = list(reversed(committed))
    for i, manifest in enumerate(newest_first):
        try:
            attempt_with_retry(lambda: attempt(manifest), retry, clock, sleep)
            return Choice(manifest, corrupt)
        except CorruptCheckpoint as exc:
            why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            corrupt.append((manifest, why))
            on_corrupt(manifest, why)
        except UnreadableCheckpoint as exc:
            lines = [f"  {m.prefix} (step {m.step}): corrupt: {why}" for m, why in corrupt]
            lines.append(f"  {manifest.prefix} (step {manifest.step}): unreadable: {exc}")
            lines += [f"  {m.prefix} (step {m.step}): not tried (older than a checkpoint that may be intact)"
                      for m in newest_first[i + 1:]]
            raise UnreadableCheckpoint(
                f"cannot read checkpoint {manifest.prefix}; procsv neither falls back past a checkpoint that may "
                "be intact nor starts from scratch, and moved or deleted nothing:\n" + "\n".join(lines)
                + "\nmake the file readable again and launch again", path=exc.path, errno=exc.errno) from None
    if corrupt and not allow_reinit:
        lines = [f"  {m.prefix} (step {m.step}): corrupt: {why}" for m, why in corrupt]
        raise NoRestorableCheckpoint(
            f"refusing to start from step 0: none of the {len(corrupt)} committed checkpoints can be restored "
            "(nothing was moved or deleted):\n" + "\n".join(lines)
            + "\nto start from scratch anyway, launch with --allow-reinit (or Supervisor(allow_reinit=True)); "
            "the corrupt checkpoints are then moved to .procsv/quarantine/")
    return Choice(None, corrupt)


def rollback_refusal(steps: Sequence[int], before: Optional[int]) -> Optional[str]:
    """Why a trainer group's rollback of step ``before`` (None: no rollback) must stop rather than
    start from step 0, given the steps of the committed checkpoints: some are committed, and none is
    of a step below ``before`` (each holds that step's update; retention, ``max_to_keep``, deleted
    the older ones): one line, what happened and what to do. None: it may go on, restoring the
    newest checkpoint below ``before``, or initializing when nothing is committed at all (the
    initial state is then the newest state before the step)."""
    if before is None or not steps or any(s < before for s in steps):
        return None
    newest = max(steps)
    return (f"the trainer group rolls back step {before} (its loss was non-finite), but none of its {len(steps)} "
            f"committed checkpoint(s) (steps {min(steps)}..{newest}) is of a step before it (retention deleted the "
            f"older ones, if any); stopping with exit code 4 (diverging) rather than training again from step 0: keep more "
            f"checkpoints (the Supervisor's max_to_keep or keep_checkpoint_every_n_hours) so that one before the "
            f"rolled-back step survives, or launch again to go on from step {newest}, which holds step {before}'s update")


def from_step_0(before: int) -> str:
    """What a trainer group's rollback of step ``before`` says when it starts again from step 0: nothing
    is committed and no in-memory snapshot before the step is held (the initial state is then the newest
    state before it); never silent, since a step-0 start after a rollback may lose many steps."""
    return (f"the trainer group rolls back step {before}: no checkpoint is committed and no in-memory snapshot "
            f"before step {before} is held; training again from step 0, the newest state before it")


def foreign_step(path: str, stored: Mapping[str, int]) -> tuple[str, int]:
    """The step to resume a checkpoint procsv did not write at, and the name of the variable it was
    read from: ``stored`` maps the :data:`FOREIGN_STEP_NAMES` the checkpoint holds as integer
    scalars to their values. The number in ``path``'s name is never used: ``tf.train.CheckpointManager``
    numbers its saves (``ckpt-3`` may hold step 30,000). Raises :class:`MismatchedCheckpoint`
    (one line) when neither variable holds a step."""
    for name in FOREIGN_STEP_NAMES:
        if name in stored and stored[name] >= 0:
            return name, stored[name]
    base = os.path.basename(path)
    raise MismatchedCheckpoint(
        f"cannot tell which step {path} holds: procsv did not write it (no manifest), its root has no "
        f"integer {' or '.join(repr(n) for n in FOREIGN_STEP_NAMES)} variable, and the number in its name "
        f"({base!r}) counts saves, not steps; save the step in it as a variable named 'step' or "
        "'global_step' (tf.train.Checkpoint(..., step=step_variable)), or move it and the logdir's "
        "'checkpoint' file aside to start from step 0")
