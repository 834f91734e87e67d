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
"""

from __future__ import annotations

from typing import Any, Sequence

from procsv.trainer.monitored.hook_support import front_end_of


def watched_hooks(sv: Any, hooks: Sequence[Any]) -> frozenset[int]:
    """The indices of ``hooks`` whose tensor procsv watches instead of the hook (rollback only)."""
    from procsv.trainer.monitored.observer_hooks import NanTensorHook

    front = front_end_of(sv)  # (a procsv.Supervisor's)
    if front is None or not front.rollback.replaces_nan_hooks or not front.rollback.checks_losses:
        return frozenset()  # (nothing here checks what it would keep: the hook raises or stops, as TF's)
    # (fail_on_nan_loss=False: the program asked to stop on a NaN, not to train past it: the hook's to call)
    return frozenset(i for i, h in enumerate(hooks) if isinstance(h, NanTensorHook) and h.fail_on_nan_loss)


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
