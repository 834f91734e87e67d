"""What a graph session's ``run`` needs of one fetch structure, worked out once and looked up by identity.

Runs in the trainer process (graph mode), on the thread that prepared the session: built and read
by :class:`procsv.trainer.graph.session.GraphSession` at every ``run`` of that thread.

Beside a small model's step (100-200 us for the digits MLP) every microsecond of Python around
``Session.run`` shows in the throughput. Most of it went to things that depend only on the
structure of the run (its fetches and fed keys), not on its values: which writer of the global
step it reaches and what it adds (:meth:`procsv.trainer.graph.steps.StepProbe.plan`, a key built
by walking the structure), which of its fetches are watched losses (a walk splitting op names).
:class:`RunPlan` holds all of that for one structure, and :func:`plan_key` finds it again with
two C-level passes: the identities of the fetches (a list or tuple of them, or one) and of the fed
keys.

Identity is enough because a plan holds its fetches and fed keys (``held``): while it is cached
they live, so no other object has their identities, and a key that matches is the very same
objects. A plan is only made for fetches that are graph elements (tensors, operations, variables)
or names; a structure with anything else in it (a dict, a nested list: objects made anew at each
call, or changed in place between calls) has no key and takes the general road (the probe's own
cache, the walk of :func:`procsv.trainer.graph.session.keep_watched`).
"""

from __future__ import annotations

from typing import Any, Hashable, Optional

from math import isfinite

import numpy as np

CACHE_MAX = 256  # structures remembered (a program uses a handful)
# a fetched float scalar comes back as one of these: judged at once (LossWatch.keep_host)
HOST_FLOATS: frozenset[Any] = frozenset({float, np.float16, np.float32, np.float64})


class RunPlan:
    """One fetch structure's run: ``read``, what to fetch beside it to learn the global step after
    it (None: the run writes no global step, it is no step); ``add``, the constant the run adds to
    the global step when that is known (then nothing is fetched beside it); ``watch``, the indices
    of the fetches that are watched losses (-1: the single fetch itself), or None when the
    structure must be walked (:func:`keep_watched`); ``losses``, the LossWatch ``watch`` was worked
    out for; ``held``, the fetches and fed keys whose identities key the plan; ``fast`` and
    ``fast_read``, its runs through a callable (:mod:`procsv.trainer.graph.fastrun`), without and
    with ``read`` fetched beside them, where a callable can do them as ``Session.run`` does; ``writes``,
    a run that is no step writes a variable all the same (:meth:`~procsv.trainer.graph.steps.StepProbe.writes`)."""

    __slots__ = ("read", "add", "watch", "losses", "held", "fast", "fast_read", "writes")

    def __init__(self, read: Any, add: Optional[int], watch: Optional[tuple[int, ...]], losses: Any,
                 held: Any = None) -> None:
        self.read = read
        self.add = add
        self.watch = watch
        self.losses = losses
        self.held = held
        self.fast: Any = None
        self.fast_read: Any = None
        self.writes = False


def plan_key(fetches: Any, feed_dict: Any) -> Optional[Hashable]:
    """The key of a run's structure in a session's plans (None: it has none, see the module
    docstring). Only the identities: a key that matches a cached plan's is the same objects."""
    kind = fetches.__class__
    if kind is list or kind is tuple:
        key: Hashable = tuple(map(id, fetches))
    elif kind is dict:
        return None
    else:
        key = id(fetches)
    if feed_dict:
        return (key, tuple(map(id, feed_dict)))  # (a tuple beside the fetches' ints: no clash)
    return key


def _leaves(fetches: Any) -> Optional[list[Any]]:
    """The fetches of a structure a plan can be made for, or None."""
    import tensorflow as tf

    kind = fetches.__class__
    leaves = list(fetches) if kind is list or kind is tuple else [fetches]
    if all(isinstance(f, (str, tf.Tensor, tf.Operation, tf.Variable)) for f in leaves):
        return leaves
    return None


def watched(losses: Any, leaves: list[Any], single: bool) -> tuple[int, ...]:
    """The indices of the fetches under a watched name (a tensor whose op's name ends in one of
    ``losses.tags``: ``loss``, ``model/loss``); -1 for a single fetch that is one."""
    if losses is None or not losses.tags:
        return ()
    out = []
    for i, fetch in enumerate(leaves):
        name = fetch.split(":")[0] if isinstance(fetch, str) else getattr(getattr(fetch, "op", None), "name", "")
        if name and name.rsplit("/", 1)[-1] in losses.tags:
            out.append(-1 if single else i)
    return tuple(out)


def make_plan(fetches: Any, feed_dict: Any, step: tuple[Any, Optional[int]], losses: Any,
              key: Optional[Hashable]) -> RunPlan:
    """The plan of a run of ``fetches``; ``step``: the probe's answer for it (read, add). With no
    ``key`` (or fetches a plan cannot hold) the plan walks the structure for its losses."""
    read, add = step
    leaves = _leaves(fetches) if key is not None else None
    if leaves is None:
        return RunPlan(read, add, None, losses)
    single = not (fetches.__class__ is list or fetches.__class__ is tuple)
    return RunPlan(read, add, watched(losses, leaves, single), losses, (leaves, list(feed_dict or ())))


def keep_losses(plan: RunPlan, step: int, out: Any) -> None:
    """Hand the watched losses of a run's values ``out`` to ``plan.losses`` as the loss of
    ``step``: a finite host float is judged here (:meth:`~procsv.trainer.nonfinite.losses.LossWatch.keep_host`:
    nothing is kept of it, unless the loss-spike rule is fed every value); anything else, a non-finite one
    included, is the LossWatch's to judge at its check, as before the spike rule saw graph losses (judged at
    once, a NaN's rollback came before a stop the program asked right after it: tf1_cases' steps case)."""
    for i in plan.watch or ():
        value: Any = out if i < 0 else out[i]
        if value.__class__ in HOST_FLOATS and isfinite(value):
            plan.losses.keep_host(step, float(value))
        else:
            plan.losses.keep(step, value)
