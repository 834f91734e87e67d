"""The tests' silent data corruption (issue 71): ``PROCSV_FAULT=trainer:bitflip:<n>`` flips one bit of one
weight once, right after the n-th step this trainer runs (its first attempt only: :mod:`procsv.common.faults`); in a
group, ``trainer:`` is its chief's, ``worker:bitflip:<n>`` each worker's (a fault in one member of two, as the
field has it: only that member's copy of the weights is wrong, and its gradients spread it through the all-reduce).

Runs in the trainer (never in an auditor: its Supervisor replays before this is armed). Nothing fails, nothing
is said: the weight is simply wrong from then on, as a mercurial core would leave it, and every snapshot after
it holds the flipped bit; only an audit of the interval can tell (``scripts/bench_audit.py``, the tests).
An eager step is a ``session.run(step_fn)``; a TF1 graph program's is a ``session.run`` that advanced the step
(its variable is then the first trainable float32 one the graph's checkpoint saves, written back through the
session with its initializer fed: the finalized graph takes no new op).
"""

from __future__ import annotations

import sys
from typing import Any, Callable

import numpy as np

from procsv.common import faults
from procsv.common.bootstrap import read_faults
from procsv.trainer.checkpoint.name_based import NameBasedCheckpoint

BIT = 20  # a float32 mantissa bit: the value changes (by about 1e-1 of itself at most), stays finite


def victim(checkpoint: Any) -> Any:
    """The last trainable float32 variable of the state (by TF's traversal order; a ``tf.Variable`` or a Keras 3
    variable): a weight, not a step, a counter or a learning rate; the last, usually the output layer's, which
    every step's loss depends on (the first, a first layer's kernel, may hold weights no input ever reaches:
    the digits' corner pixels are always 0, and a flip there never spreads). A graph program's: of its
    checkpoint's variables, in their order (the Saver's)."""
    import tensorflow as tf

    found = getattr(checkpoint, "var_list", {}).values() if isinstance(checkpoint, NameBasedCheckpoint) \
        else tf.train.TrackableView(checkpoint).descendants()
    last = None
    for obj in found:
        if (getattr(obj, "trainable", False) and hasattr(obj, "assign") and "float32" in str(getattr(obj, "dtype", ""))
                and int(np.prod(obj.shape)) > 0):
            last = obj
    return last


def element(size: int) -> int:
    """The element a flip hits in a variable of ``size`` elements: the middle one (in C order)."""
    return size // 2


def flipped(value: Any, bit: int = BIT) -> np.ndarray:
    """``value`` with ``bit`` of its :func:`element` flipped (a copy)."""
    out = np.array(value, copy=True)
    out.reshape(-1).view(np.uint32)[element(out.size)] ^= np.uint32(1 << bit)
    return out


def flip(variable: Any, bit: int = BIT) -> None:
    """Flip ``bit`` of the :func:`element` of ``variable`` (in place)."""
    variable.assign(flipped(variable.numpy(), bit))


def flip_in_graph(variable: Any, session: Any, bit: int = BIT) -> None:
    """Flip ``bit`` of the :func:`element` of the graph variable ``variable``, through ``session`` (a raw
    ``tf.compat.v1.Session``): its initializer run with the flipped value fed (``Variable.load``'s way)."""
    init = variable.initializer
    session.run(init, {init.inputs[1]: flipped(session.run(variable), bit)})


def arm(session: Any, checkpoint: Any, step: Callable[[], int], process: str = "trainer") -> None:
    """Wrap ``session.run`` so that the step :mod:`procsv.common.faults` names flips one bit (when
    ``PROCSV_FAULT`` names this point; else nothing is wrapped and the step path is unchanged). ``step``: the
    session's step now (a graph program's run is a step when it moved it). ``process``: ``trainer``, or ``worker``
    for a group's worker."""
    if not any((s.process, s.point) == (process, "bitflip") for s in faults.parse(read_faults().spec)) \
            or checkpoint is None:
        return
    run: Callable[..., Any] = session.run
    graph = isinstance(checkpoint, NameBasedCheckpoint)

    def run_then_flip(fetches: Any, *args: Any, **kwargs: Any) -> Any:
        before = step()
        out = run(fetches, *args, **kwargs)
        stepped = step() != before if graph else callable(fetches)
        if stepped and faults.fires(process, "bitflip"):
            target = victim(checkpoint)
            if target is not None:
                if graph:
                    flip_in_graph(target, session.raw)
                else:
                    flip(target)
                print(f"procsv: fault injected: bit {BIT} of {getattr(target, 'path', target.name)}"
                      f"[{element(int(np.prod(target.shape)))}] flipped after "
                      f"step {step()}", file=sys.stderr, flush=True)
        return out

    session.run = run_then_flip
