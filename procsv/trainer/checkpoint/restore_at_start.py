"""Restore at start: the newest committed checkpoint that verifies and restores, else ``init``.

Runs in the trainer's main thread, once per session, called by
:meth:`procsv.trainer.checkpoint.agent.CheckpointAgent.restore_or_init` before the first step. The
rules of the walk (skip a corrupt checkpoint, retry then fail on an unreadable one, refuse to start
from step 0 when checkpoints exist but none restores) are :mod:`procsv.trainer.checkpoint.restore`'s; this
module applies them to a logdir with TensorFlow: damaged manifests are reported (and refused when
nothing else is committed), each checkpoint is verified against its manifest then restored (TF's
read errors become :class:`CorruptCheckpoint` or :class:`UnreadableCheckpoint`, a checkpoint that
does not match the program a :class:`MismatchedCheckpoint`), and with nothing committed a plain-TF
checkpoint of the logdir is restored, at the step stored in it (:func:`restore_foreign`). Before that, a restarted trainer asks the checkpoint service
to persist the in-memory snapshot it held for the dead one (:func:`recover_memory`).
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from procsv.ipc.messages import RecoverQuery
from procsv.ipc.transport import NoReply
from procsv.common.errors import (CorruptCheckpoint, MismatchedCheckpoint, NoRestorableCheckpoint, TrainingDiverged,
                                  UnreadableCheckpoint)
from procsv.common.layout import Layout
from procsv.common.manifests import (Manifest, damaged_manifests, list_committed, manifest_path, restoring,
                                     unreadable_file, verify)
from procsv.trainer.checkpoint import restore
from procsv.trainer.checkpoint.name_based import NameBasedCheckpoint
from procsv.trainer.channels import TrainerChannels
from procsv.trainer.checkpoint.restore import ReadRetry

RECOVER_WAIT = 15.0  # seconds a restarted trainer waits for the service to persist a held in-memory snapshot
RELIST_MAX = 3  # walks started again from a new listing when a checkpoint is retired under the restore


@dataclass(frozen=True)
class Restored:
    """What :func:`restore_or_init` did: the checkpoint path it restored (None: it initialized)
    and the corrupt prefixes it passed over, newest first."""

    path: Optional[str]
    corrupt: list[str]
    passed: list[Manifest] = field(default_factory=list)  # committed after the step a group rolls back (``before``)
    status: Any = None  # TF's restore status of ``path`` (object-based), for :func:`unassigned` once the program built its model


def rolled_back_over(committed: list[Manifest], before: Optional[int]) -> list[Manifest]:
    """The committed checkpoints a group's rollback of step ``before`` passes over: those of ``before``
    or later hold its update (empty: no rollback)."""
    return [m for m in committed if before is not None and m.step >= before]


def say_passed_over(before: Optional[int], later: list[Manifest], group: bool = False) -> None:
    """The line of a rollback's restore (a group's of a non-finite step; a single trainer's: the watchdog's, an
    audit's verdict, which it says itself)."""
    who = "the group rolls back step" if group else "rolling back to the newest checkpoint before step"
    print(f"procsv: {who} {before}: passing over the checkpoint(s) committed after it "
          f"({', '.join(m.prefix for m in later)})", file=sys.stderr, flush=True)


def restore_or_init(checkpoint: Any, global_step: Any, layout: Layout, init: Callable[[], None], *,
                    allow_reinit: bool, read_retry: ReadRetry, clock: Callable[[], float],
                    sleep: Callable[[float], None], pinned: Optional[Pinned] = None,
                    before: Optional[int] = None) -> Restored:
    """Restore the newest committed checkpoint that verifies and restores. With none committed: a
    plain-TF checkpoint of the logdir, else ``init``.

    Raises :class:`UnreadableCheckpoint` (a file stayed unreadable for ``read_retry.total_secs``)
    and :class:`NoRestorableCheckpoint` (every committed checkpoint is corrupt and not
    ``allow_reinit``): the rules are in :mod:`procsv.trainer.checkpoint.restore`.

    ``pinned``: a group's worker restores exactly what its chief restored (:class:`Pinned`).
    ``before``: a group restarted for its rollback of that step restores the newest checkpoint of a step
    below it (one committed after it holds the step's update; with none committed at all, ``init``).
    With checkpoints committed but none below it, it raises :class:`TrainingDiverged` (exit code 4,
    one line: :func:`restore.rollback_refusal`) rather than start from step 0.

    ``init`` runs after the restore lock is released: it runs the program's ``init_fn``, and a
    process forked there (a data loader's worker, ``multiprocessing``) would inherit the lock's
    descriptor (close-on-exec is not close-on-fork) and hold the shared lock for as long as it
    lives, so that retention never deleted a checkpoint again and a long run filled its disk.
    """
    wanted: list[bool] = []
    with restoring(layout):  # retention deletes none of these checkpoints meanwhile
        if pinned is not None:
            done = _restore_pinned(checkpoint, global_step, layout, lambda: wanted.append(True), pinned.path)
        else:
            done = _restore_newest(checkpoint, global_step, layout, lambda: wanted.append(True),
                                   allow_reinit=allow_reinit, read_retry=read_retry, clock=clock, sleep=sleep,
                                   before=before)
    if wanted:  # nothing restored: initialize, outside the lock (nothing it guards is read from now on)
        init()
    return done


class _Retired(Exception):
    """A checkpoint's file went missing because the checkpoint left the committed list meanwhile
    (retention or the quarantine renamed its manifest away): not corrupt, list again."""


def _restore_newest(checkpoint: Any, global_step: Any, layout: Layout, init: Callable[[], None], *,
                    allow_reinit: bool, read_retry: ReadRetry, clock: Callable[[], float],
                    sleep: Callable[[float], None], before: Optional[int] = None) -> Restored:
    """:func:`restore_or_init` without a pin, under the restore lock (or without it, where it
    cannot be taken: then a checkpoint retired mid-restore makes the walk start again from a new
    listing, at most :data:`RELIST_MAX` times)."""
    for _ in range(RELIST_MAX):
        try:
            return _walk(checkpoint, global_step, layout, init, allow_reinit=allow_reinit,
                         read_retry=read_retry, clock=clock, sleep=sleep, before=before)
        except _Retired as gone:
            print(f"procsv: checkpoint {gone} was retired while being read; listing the committed "
                  "checkpoints again", file=sys.stderr, flush=True)
    return _walk(checkpoint, global_step, layout, init, allow_reinit=allow_reinit, read_retry=read_retry,
                 clock=clock, sleep=sleep, relist=False, before=before)


def _walk(checkpoint: Any, global_step: Any, layout: Layout, init: Callable[[], None], *,
          allow_reinit: bool, read_retry: ReadRetry, clock: Callable[[], float],
          sleep: Callable[[float], None], relist: bool = True, before: Optional[int] = None) -> Restored:
    """One listing of the committed checkpoints, then the walk of :func:`restore.choose` over it
    (``before``: over those of a step below it)."""
    committed = list_committed(layout)
    refused = restore.rollback_refusal([m.step for m in committed], before)
    if refused is not None:  # checkpoints, none before the step rolled back: never a silent start from step 0
        print(f"procsv: {refused}", file=sys.stderr, flush=True)
        raise TrainingDiverged(refused)
    import tensorflow as tf

    later = rolled_back_over(committed, before)
    if later:  # a group's rollback of step ``before``: these hold its update
        committed = [m for m in committed if m.step < before]  # type: ignore[operator]
        say_passed_over(before, later)
    damaged = damaged_manifests(layout)
    for name in damaged:
        print(f"procsv: ignoring damaged manifest {os.path.join(layout.manifests, name)} (not a valid "
              "manifest: truncated or edited?); its checkpoint is not restored; move the file aside once you "
              "have looked at it", file=sys.stderr, flush=True)
    if damaged and not committed and not allow_reinit:
        raise NoRestorableCheckpoint(
            f"refusing to start from step 0: the {len(damaged)} checkpoint manifest(s) in "
            f"{layout.manifests} are damaged and no other checkpoint is committed; restore them, or "
            "launch with --allow-reinit to start from scratch")

    def on_corrupt(manifest: Manifest, why: str) -> None:
        print(f"procsv: skipping corrupt checkpoint {manifest.prefix} ({why}); trying an older one",
              file=sys.stderr, flush=True)

    statuses: list[Any] = []

    def attempt(manifest: Manifest) -> None:
        try:
            statuses.append(verify_and_restore(checkpoint, global_step, layout, manifest))
        except CorruptCheckpoint:
            if relist and not os.path.exists(manifest_path(layout, manifest.prefix)):
                raise _Retired(manifest.prefix) from None
            raise

    choice = restore.choose(committed, attempt, allow_reinit=allow_reinit, retry=read_retry, clock=clock, sleep=sleep,
                            on_corrupt=on_corrupt)
    path = choice.restored.path(layout.logdir) if choice.restored is not None else None
    if choice.restored is None:
        legacy = tf.train.latest_checkpoint(layout.logdir) if not committed and not damaged and not later else None
        if legacy:
            statuses.append(restore_foreign(checkpoint, global_step, legacy))
            path = legacy
        else:
            if committed:
                print(f"procsv: none of the {len(committed)} committed checkpoints can be restored; "
                      "starting from scratch as allowed (allow_reinit)", file=sys.stderr, flush=True)
            elif before is not None and not damaged:  # never silently from step 0
                print(f"procsv: {restore.from_step_0(before)}", file=sys.stderr, flush=True)
            init()
    if choice.corrupt:
        names = ", ".join(m.prefix for m, _ in choice.corrupt)
        print(f"procsv: the checkpoint service moves the corrupt {names} to {layout.quarantine}/ "
              "(not deleted: look at them there)", file=sys.stderr, flush=True)
    return Restored(path, [m.prefix for m, _ in choice.corrupt], later, statuses[-1] if path and statuses else None)


@dataclass(frozen=True)
class RestoreRules:
    """How a restore at start treats what it finds: ``allow_reinit`` (every committed checkpoint corrupt:
    start from step 0 instead of failing), how long an unreadable file is retried (``read_retry``) and
    how it waits between tries (``sleep``)."""

    allow_reinit: bool = False
    read_retry: ReadRetry = field(default_factory=ReadRetry)
    sleep: Callable[[float], None] = field(default=time.sleep, repr=False)


@dataclass(frozen=True)
class Pinned:
    """The one checkpoint to restore (``path``; ``None``: initialize): what a group's chief restored."""

    path: Optional[str]


def _restore_pinned(checkpoint: Any, global_step: Any, layout: Layout, init: Callable[[], None],
                    path: Optional[str]) -> Restored:
    """Restore ``path`` (verified against its manifest when it has one), or ``init`` for ``None``."""
    if path is None:
        init()
        return Restored(None, [])
    manifest = next((m for m in list_committed(layout) if m.path(layout.logdir) == path), None)
    if manifest is not None:
        status = verify_and_restore(checkpoint, global_step, layout, manifest)
    else:  # a plain-TF checkpoint of the logdir, as the chief found it
        status = restore_foreign(checkpoint, global_step, path)
    return Restored(path, [], status=status)


def verify_and_restore(checkpoint: Any, global_step: Any, layout: Layout, manifest: Manifest) -> Any:
    """Verify then restore one committed checkpoint (returned: TF's restore status); TF's read errors
    become :class:`CorruptCheckpoint` (data loss, not found) or :class:`UnreadableCheckpoint`."""
    import tensorflow as tf

    verify(layout, manifest)
    try:
        return restore_path(checkpoint, global_step, manifest.path(layout.logdir), manifest.step)
    except (tf.errors.DataLossError, tf.errors.NotFoundError) as exc:
        raise CorruptCheckpoint(f"{manifest.prefix}: {str(exc).splitlines()[0]}") from None
    except (tf.errors.PermissionDeniedError, tf.errors.UnavailableError) as exc:
        raise UnreadableCheckpoint(f"{manifest.prefix}: {str(exc).splitlines()[0]}") from None
    except FileNotFoundError as exc:
        raise CorruptCheckpoint(f"{manifest.prefix}: {exc}") from None
    except OSError as exc:
        raise unreadable_file(manifest.prefix, exc.filename or "?", exc) from None


def restore_path(checkpoint: Any, global_step: Any, path: str, step: int) -> Any:
    """Restore ``path`` and set ``global_step`` to ``step`` (a manifest's, or what
    :func:`restore_foreign` read) unless the restore itself set it; a checkpoint that does not
    match the program (a variable missing, or of another shape: a changed layer size) is a
    :class:`MismatchedCheckpoint` naming the variable. A name-based checkpoint that restored its
    global step (its ``step_key``, not left out) keeps the value stored in it: a restore never moves
    the global step (the step is read again from the variable); one that did not (no global step
    saved, or left out: a foreign checkpoint without one) gets ``step`` assigned. Returns TF's restore
    status (see :func:`unassigned`)."""
    try:
        status = checkpoint.restore(path)
        status.assert_existing_objects_matched()
    except (AssertionError, ValueError) as exc:  # ValueError: "incompatible tensor with shape ... name ..."
        raise MismatchedCheckpoint(
            f"checkpoint {path} does not match this program's state ({str(exc).splitlines()[0]}); "
            "restore it with the program that wrote it, or use a new --logdir"
        ) from None
    if isinstance(checkpoint, NameBasedCheckpoint):
        if checkpoint.step_key is not None and checkpoint.step_key not in checkpoint.left_out:
            forget = getattr(global_step, "forget", None)
            if forget is not None:
                forget()  # the session's variable holds the stored step; what was observed before is stale
            return status
        global_step.assign(step)
    elif int(global_step.numpy()) != step:
        global_step.assign(step)
    return status


def unassigned(status: Any) -> list[str]:
    """The checkpoint keys of variables the program created after the restore whose values the restore
    never assigned (none: ``[]``), read from TF's restore ``status`` once the program has built them (its
    first step). TF restores a value it has no variable for yet when the variable is created (its deferred
    restoration); a Keras 3 layer built after the restore escapes it (its ``Dense`` kernel is created and
    tracked again and keeps its initial value: TF's checkpoint guide's program, restored by
    ``tf.train.CheckpointManager`` too, resumes with a fresh kernel). TF's own check of the objects that
    exist (``assert_existing_objects_matched``) names them. Variables the checkpoint holds no value for
    (its other finding, "Python objects that were not bound to checkpointed values": a checkpoint
    committed before the program first built them, as a preemption before the first step commits
    step 0) are not the restore's miss: they start from their initial values as in any run."""
    import re

    try:
        status.assert_existing_objects_matched()
    except AssertionError as exc:
        said = str(exc)
        keys = re.findall(r'checkpoint_key: "([^"]+)"', said)
        if keys or "not bound to checkpointed values" in said:
            return keys
        return [said.splitlines()[0]]
    return []


def restore_foreign(checkpoint: Any, global_step: Any, path: str) -> Any:
    """Restore a checkpoint procsv did not write (a plain ``tf.train.CheckpointManager``'s
    ``ckpt-3``, found through the logdir's ``checkpoint`` file when nothing is committed) at the step
    stored in it: its root's ``global_step`` variable, else its ``step`` variable
    (:func:`procsv.trainer.checkpoint.restore.foreign_step`; never the number in its name).
    Neither: :class:`MismatchedCheckpoint`, before anything is restored. Without a ``global_step``
    in the file, the program's ``global_step`` is left out of the restore's match (it is set from
    the step read) and put back after it. A TF1 ``Saver``'s ``model.ckpt-N`` is read by name
    (:func:`_restore_foreign_by_name`)."""
    import tensorflow as tf

    if isinstance(checkpoint, NameBasedCheckpoint):
        _restore_foreign_by_name(checkpoint, global_step, path)
        return None
    reader = tf.train.load_checkpoint(path)
    dtypes = reader.get_variable_to_dtype_map()
    shapes = reader.get_variable_to_shape_map()
    stored: dict[str, int] = {}
    for name in restore.FOREIGN_STEP_NAMES:
        key = f"{name}/.ATTRIBUTES/VARIABLE_VALUE"
        if key in dtypes and dtypes[key].is_integer and list(shapes[key]) == []:
            stored[name] = int(reader.get_tensor(key))
    name, step = restore.foreign_step(path, stored)
    print(f"procsv: {os.path.basename(path)} was not written by procsv: resuming at the step stored in its "
          f"{name!r} variable, {step}", flush=True)
    held = getattr(checkpoint, "global_step", None) if "global_step" not in stored else None
    if held is not None:
        delattr(checkpoint, "global_step")  # not in the file: no object to match it to
    try:
        return restore_path(checkpoint, global_step, path, step)
    finally:
        if held is not None:
            checkpoint.global_step = held


def _restore_foreign_by_name(checkpoint: NameBasedCheckpoint, global_step: Any, path: str) -> None:
    """:func:`restore_foreign` for a TF1 graph program: the step is the file's value of the program's
    global step variable (under its own key, ``global_step`` as TF1 makes it), else of a ``step``
    key; without the program's key in the file, that variable is left out of the restore and set
    from the step read."""
    import tensorflow as tf

    reader = tf.train.load_checkpoint(path)
    dtypes = reader.get_variable_to_dtype_map()
    shapes = reader.get_variable_to_shape_map()
    own = checkpoint.key_of(getattr(global_step, "var", None))
    stored: dict[str, int] = {}
    for name in restore.FOREIGN_STEP_NAMES:
        key = own if name == "global_step" and own is not None and own in dtypes else name
        if key in dtypes and dtypes[key].is_integer and list(shapes[key]) == []:
            stored[name] = int(reader.get_tensor(key))
    name, step = restore.foreign_step(path, stored)
    print(f"procsv: {os.path.basename(path)} was not written by procsv: resuming at the step stored in its "
          f"{name!r} variable, {step}", flush=True)
    with checkpoint.leaving_out({own} if own is not None and own not in dtypes else set()):
        restore_path(checkpoint, global_step, path, step)


def recover_memory(ch: TrainerChannels, wait_secs: float = RECOVER_WAIT) -> None:
    """At a restart with the in-memory tier on, before restoring: ask the checkpoint service to
    persist the in-memory snapshot it held for the dead trainer (if newer than every checkpoint)
    and wait for that; the restore then finds it on disk like any checkpoint."""
    if ch.ckpt is None:
        return
    t0 = ch.clock()
    try:
        reply = ch.recover(RecoverQuery(os.getpid()), t0 + wait_secs)
    except NoReply:
        print(f"procsv: no answer from the checkpoint service within {wait_secs:g} s about an in-memory "
              "snapshot; restoring the newest checkpoint on disk", file=sys.stderr, flush=True)
        return
    if reply.step >= 0:
        print(f"procsv: the checkpoint service persisted the in-memory snapshot of step {reply.step} "
              f"(waited {ch.clock() - t0:.2f} s)", flush=True)
