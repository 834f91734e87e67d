"""The tensors of a session's ``NanTensorHook`` s, watched by procsv's non-finite rollback.

Runs in the trainer's main thread, around each ``MonitoredSession.run`` (an eager program's;
graph mode: :mod:`procsv.trainer.monitored.graph_session` picks the hooks with
:func:`watched_hooks`, :mod:`procsv.trainer.monitored.graph_hooked` skips them after a run that
made a step, and the Supervisor's graph session keeps their values as that step's losses). With
``--on-nonfinite rollback`` (the default) procsv watches what each
:class:`~procsv.trainer.monitored.observer_hooks.NanTensorHook` watches: its tensor (or, with none, what the step function returned, which procsv keeps anyway)
is kept with the step's losses (:class:`~procsv.trainer.nonfinite.losses.LossWatch`, checked in
bulk where procsv reads the state: no host read at each step), and the hook itself is not called,
so that a NaN procsv rolls back never reaches it. Under ``stop`` and ``continue``, and wherever this
trainer checks no loss it keeps (no logdir, ``checkpoint=None``, a replica's worker: nothing to roll back
with), the hook keeps TensorFlow's behaviour (it reads its tensor after every run, and raises or requests a stop).
Where the rollback gives a NaN of such a session up (the skip bound, nothing to roll back to, diverging),
the hook's error is raised instead of procsv's exit 4: the run raises TF's ``NanLossDuringTrainingError``
(:func:`nan_loss_gave_up`, which exits 4 if let escape).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Sequence

from procsv.trainer.monitored.hook_support import front_end_of

if TYPE_CHECKING:
    from procsv.trainer.monitored.observer_hooks import NanLossDuringTrainingError


@functools.lru_cache(maxsize=1)
def nan_loss_gave_up() -> type[NanLossDuringTrainingError]:
    """The class of the hook's error where procsv's ``--on-nonfinite rollback`` gave a NaN up (the skip
    bound, nothing to roll back to, diverging) in a session whose program chose
    ``NanTensorHook(fail_on_nan_loss=True)``: :func:`~procsv.trainer.monitored.observer_hooks.nan_loss_error`'s
    class, so that the program's ``except NanLossDuringTrainingError`` (TF's or procsv's) or ``except
    Exception`` catches it as under TF,
    and :class:`~procsv.common.errors.TrainingDiverged` too, a ``SystemExit`` with code 4: let escape, the
    process exits with code 4 (diverging: the watchdog never restarts it into the same NaN), with no
    traceback (the give-up line, naming the step, was printed when it was raised). Its ``message`` is that line."""
    from procsv.common.errors import TrainingDiverged
    from procsv.trainer.monitored.observer_hooks import NanLossDuringTrainingError, nan_loss_error

    def __init__(self: TrainingDiverged, message: str) -> None:
        TrainingDiverged.__init__(self, message)

    return type("NanLossDuringTrainingError", (nan_loss_error(), TrainingDiverged),
                {"__module__": __name__, "__doc__": NanLossDuringTrainingError.__doc__, "__init__": __init__})


def raise_gave_up(message: str) -> None:
    """Raise :func:`nan_loss_gave_up`'s error, ``message`` the give-up line (what procsv's rollback
    raises for the program's hook, through its port)."""
    raise nan_loss_gave_up()(message)


def watched_hooks(sv: Any, hooks: Sequence[Any]) -> frozenset[int]:
    """The indices of ``hooks`` whose tensor procsv watches instead of the hook (rollback only); where
    there are any, the rollback raises the hook's error where it gives a NaN up (see the module)."""
    from procsv.trainer.monitored.observer_hooks import NanTensorHook

    front = front_end_of(sv)  # (a procsv.Supervisor's)
    if front is None or not front.rollback.replaces_nan_hooks or not front.rollback.checks_losses:
        return frozenset()  # (nothing here checks what it would keep: the hook raises or stops, as TF's)
    # (fail_on_nan_loss=False: the program asked to stop on a NaN, not to train past it: the hook's to call)
    watched = frozenset(i for i, h in enumerate(hooks) if isinstance(h, NanTensorHook) and h.fail_on_nan_loss)
    if watched:
        front.rollback.program_fails_on_nan(raise_gave_up)
    return watched


def keep(sv: Any, fetches: Sequence[Any]) -> None:
    """Keep the watched hooks' tensors (``fetches``: each one's ``SessionRunArgs.fetches``) as the
    losses of the step that just ran; a variable is read on its device (a new tensor, not a host read)."""
    if not fetches:
        return
    import tensorflow as tf

    rollback = sv.front_end.rollback
    for fetch in fetches:
        for value in tf.nest.flatten(fetch):
            if callable(value) and not isinstance(value, (tf.Tensor, tf.Variable)):
                value = value()
            if isinstance(value, tf.Variable):
                value = value.read_value()
            rollback.keep_loss(value)
