"""The tests' silent data corruption (issue 71): ``PROCSV_FAULT=trainer:bitflip:<n>`` flips one bit of one
weight once, right after the n-th step this trainer runs (its first attempt only: :mod:`procsv.common.faults`).

Runs in the trainer (never in an auditor: its Supervisor replays before this is armed). Nothing fails, nothing
is said: the weight is simply wrong from then on, as a mercurial core would leave it, and every snapshot after
it holds the flipped bit; only an audit of the interval can tell (``scripts/bench_audit.py``, the tests).
"""

from __future__ import annotations

import sys
from typing import Any, Callable

import numpy as np

from procsv.common import faults
from procsv.common.bootstrap import read_faults

BIT = 20  # a float32 mantissa bit: the value changes (by about 1e-1 of itself at most), stays finite


def victim(checkpoint: Any) -> Any:
    """The first trainable float32 variable of the state (by TF's traversal order; a ``tf.Variable`` or a Keras 3
    variable): a weight, not a step, a counter or a learning rate."""
    import tensorflow as tf

    for obj in tf.train.TrackableView(checkpoint).descendants():
        if (getattr(obj, "trainable", False) and hasattr(obj, "assign") and "float32" in str(getattr(obj, "dtype", ""))
                and int(np.prod(obj.shape)) > 0):
            return obj
    return None


def flip(variable: Any, bit: int = BIT) -> None:
    """Flip ``bit`` of the first element of ``variable`` (in place)."""
    value = np.array(variable.numpy(), copy=True)
    value.reshape(-1).view(np.uint32)[0] ^= np.uint32(1 << bit)
    variable.assign(value)


def arm(session: Any, checkpoint: Any) -> None:
    """Wrap ``session.run`` so that the step :mod:`procsv.common.faults` names flips one bit (when
    ``PROCSV_FAULT`` names this point; else nothing is wrapped and the step path is unchanged)."""
    if not read_faults().spec.startswith("trainer:bitflip") or checkpoint is None:
        return
    run: Callable[..., Any] = session.run

    def run_then_flip(step_fn: Any, *args: Any, **kwargs: Any) -> Any:
        out = run(step_fn, *args, **kwargs)
        if callable(step_fn) and faults.fires("trainer", "bitflip"):
            target = victim(checkpoint)
            if target is not None:
                flip(target)
                print(f"procsv: fault injected: bit {BIT} of {getattr(target, 'path', target.name)}[0] flipped after a step", file=sys.stderr,
                      flush=True)
        return out

    session.run = run_then_flip
