"""Supervisor.warm_up's instantiation (procsv/trainer/warmup.py) against the TensorFlow installed:
the traced step is instantiated by a cancelled call that runs none of its ops."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from procsv.common.errors import UnsupportedState
from procsv.trainer import warmup

pytestmark = pytest.mark.slow  # imports TensorFlow


def _step_with_side_effects() -> tuple[Any, Any, list[int]]:
    """A step that changes a variable and calls back into Python: either shows that it ran."""
    import tensorflow as tf

    counter = tf.Variable(0, dtype=tf.int64)
    calls: list[int] = []

    def note(x: Any) -> Any:
        calls.append(int(x))
        return x

    @tf.function  # type: ignore[untyped-decorator]
    def step(x: Any) -> Any:
        counter.assign_add(1)
        return tf.py_function(note, [x + tf.cast(counter, x.dtype)], x.dtype)

    return step, counter, calls


def test_a_warmed_up_step_is_instantiated_without_running_any_of_its_ops() -> None:
    step, counter, calls = _step_with_side_effects()
    example = np.int64(5)
    assert warmup.trace_and_instantiate(step, (example,), {}, instantiate_too=True) is True
    assert int(counter.numpy()) == 0 and calls == []  # no op ran: no assign, no Python callback
    step(np.int64(7))  # the loop's first step runs the step once, with what it was traced for
    assert int(counter.numpy()) == 1 and calls == [8]
    assert step.experimental_get_tracing_count() == 1


def test_only_traced_when_instantiation_is_not_asked_for() -> None:
    step, counter, calls = _step_with_side_effects()
    assert warmup.trace_and_instantiate(step, (np.int64(5),), {}, instantiate_too=False) is False
    assert step.experimental_get_tracing_count() == 1 and int(counter.numpy()) == 0 and calls == []


def test_a_function_that_runs_although_cancelled_is_an_error_not_a_silent_step() -> None:
    # no TensorFlow here runs a cancelled call; what procsv does if one does: stop before the restore
    ran: list[int] = []

    class IgnoresCancellation:
        name = "step"

        def __call__(self, *args: Any) -> None:
            ran.append(1)

    with pytest.raises(UnsupportedState, match="ran 'step' although its call was cancelled"):
        warmup.instantiate(IgnoresCancellation(), (1,), {})
    assert ran == [1]
