"""Supervisor.warm_up's instantiation (procsv/trainer/standby/warmup.py) against the TensorFlow installed:
the traced step is instantiated by a cancelled call that runs none of its ops."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from procsv.common.errors import UnsupportedState
from procsv.trainer.standby import warmup

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


# ------------------------------------------------------------------------------ shadow run
PLENTY = 1 << 40  # bytes of memory "available"


def test_a_call_that_goes_around_the_shadow_hook_is_an_error_not_a_silent_step() -> None:
    # no TensorFlow here calls a function other than through _call_flat; what procsv does if one
    # does: the step ran on the program's own variables, and the standby stops before its restore
    import tensorflow as tf

    ran: list[int] = []

    class BypassingConcrete:
        variables: list[Any] = []
        captured_inputs: list[Any] = []

        class graph:
            @staticmethod
            def as_graph_def() -> Any:
                return tf.compat.v1.GraphDef()

        def _call_flat(self, tensor_inputs: Any, captured_inputs: Any) -> None:
            raise AssertionError("not reached: the stand-in goes around it")

        def __call__(self, *args: Any) -> None:
            ran.append(1)

    class Step:
        __name__ = "step"

        def get_concrete_function(self, *args: Any) -> BypassingConcrete:
            return BypassingConcrete()

    with pytest.raises(UnsupportedState, match="ran 'step' without going through ConcreteFunction._call_flat"):
        warmup.run_on_shadows(Step(), (1,), {}, lambda: PLENTY)
    assert ran == [1]


def _dense_step() -> tuple[Any, Any, Any]:
    """A small Keras model's training step (dense layers, Adam): only variable ops are stateful."""
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(3)])
    optimizer = keras.optimizers.Adam(1e-2)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def body(x: Any, y: Any) -> Any:
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    rng = np.random.default_rng(0)
    batch = (rng.normal(size=(32, 8)).astype(np.float32), rng.integers(0, 3, size=32).astype(np.int64))
    return body, (model, optimizer), batch


def _values(model: Any, optimizer: Any) -> list[Any]:
    return [np.array(v.numpy()) for v in [*model.variables, *optimizer.variables]]


def test_a_shadow_run_leaves_every_variable_as_it_was_and_the_next_steps_exactly_as_without_it() -> None:
    import tensorflow as tf

    body, (model, optimizer), batch = _dense_step()
    before = _values(model, optimizer)
    warmed = tf.function(body)
    assert warmup.trace_and_instantiate(warmed, batch, {}, instantiate_too=True) is True
    traced = warmed.experimental_get_tracing_count()  # 2: Keras builds its optimizer at the first trace
    assert warmup.run_on_shadows(warmed, batch, {}, lambda: PLENTY) == ""
    assert all(a.tobytes() == b.tobytes() for a, b in zip(before, _values(model, optimizer)))
    losses = [warmed(*batch).numpy() for _ in range(3)]
    assert warmed.experimental_get_tracing_count() == traced  # the shadow run used the trace, made no other

    # the same model built again from the same seed, stepped without any shadow run
    plain_body, (plain_model, plain_optimizer), _ = _dense_step()
    assert all(a.tobytes() == b.tobytes() for a, b in zip(before, _values(plain_model, plain_optimizer)))
    plain = tf.function(plain_body)
    assert [plain(*batch).numpy() for _ in range(3)] == losses
    assert all(a.tobytes() == b.tobytes()
               for a, b in zip(_values(model, optimizer), _values(plain_model, plain_optimizer)))


def test_a_step_with_a_random_kernel_of_its_own_is_not_run() -> None:
    import tensorflow as tf

    body, (model, optimizer), batch = _dense_step()

    @tf.function  # type: ignore[untyped-decorator]
    def noisy(x: Any, y: Any) -> Any:
        return body(x + tf.random.uniform(tf.shape(x), seed=1), y)  # RandomUniform keeps its state in the kernel

    before = _values(model, optimizer)
    why = warmup.run_on_shadows(noisy, batch, {}, lambda: PLENTY)
    assert "RandomUniform" in why
    assert all(a.tobytes() == b.tobytes() for a, b in zip(before, _values(model, optimizer)))


def test_a_step_that_calls_python_is_not_run() -> None:
    step, counter, calls = _step_with_side_effects()
    why = warmup.run_on_shadows(step, (np.int64(5),), {}, lambda: PLENTY)
    assert "EagerPyFunc" in why and calls == [] and int(counter.numpy()) == 0


def test_a_captured_iterator_or_an_iterator_argument_is_not_advanced() -> None:
    import tensorflow as tf

    ds = tf.data.Dataset.range(10)
    captured = iter(ds)

    @tf.function  # type: ignore[untyped-decorator]
    def reads_captured(x: Any) -> Any:
        return x + next(captured)

    assert "IteratorGetNext" in warmup.run_on_shadows(reads_captured, (np.int64(1),), {}, lambda: PLENTY)
    assert int(next(captured)) == 0

    @tf.function  # type: ignore[untyped-decorator]
    def reads_argument(it: Any) -> Any:
        return next(it) + 1

    given = iter(ds)
    assert "IteratorGetNext" in warmup.run_on_shadows(reads_argument, (given,), {}, lambda: PLENTY)
    assert int(next(given)) == 0


def test_a_stand_in_iterator_procsv_made_may_be_read_by_the_shadow_run() -> None:
    """Keras' step takes an iterator: the stand-in procsv made for the warm-up (marked disposable)
    is read; the variables are not touched."""
    import tensorflow as tf

    total = tf.Variable(0, dtype=tf.int64)

    @tf.function  # type: ignore[untyped-decorator]
    def step(it: Any) -> Any:
        return total.assign_add(next(it))

    stand_in = warmup.disposable(iter(tf.data.Dataset.from_tensors(tf.constant(7, tf.int64))))
    assert warmup.run_on_shadows(step, (stand_in,), {}, lambda: PLENTY) == ""
    assert int(total.numpy()) == 0
    assert list(stand_in) == []  # its one element was read by the shadow run


def test_a_resource_argument_is_refused_at_the_call_before_anything_runs() -> None:
    """An argument that is a resource (here a variable's handle, read by allowed ops only) is
    refused where the call's inputs are known: a step's own argument is never stepped on."""
    import tensorflow as tf

    var = tf.Variable(5.0)

    @tf.function  # type: ignore[untyped-decorator]
    def bump(v: Any) -> Any:
        return v.assign_add(1.0)

    assert "an argument is a resource" in warmup.run_on_shadows(bump, (var,), {}, lambda: PLENTY)
    assert float(var.numpy()) == 5.0


def test_shadows_that_would_not_fit_in_memory_are_not_made() -> None:
    import tensorflow as tf

    body, (model, optimizer), batch = _dense_step()
    why = warmup.run_on_shadows(tf.function(body), batch, {}, lambda: 1000)
    assert "would not fit twice in the memory available" in why


def _checked_step() -> tuple[Any, Any, Any]:
    """The dense step with a check of its input (an Assert: no state of its own) and a batch that fails it."""
    import tensorflow as tf

    body, (model, optimizer), (x, y) = _dense_step()
    optimizer.build(model.trainable_variables)

    @tf.function  # type: ignore[untyped-decorator]
    def checked(x: Any, y: Any) -> Any:
        with tf.control_dependencies([tf.debugging.Assert(tf.reduce_all(tf.math.is_finite(x)), ["non-finite"])]):
            x = tf.identity(x)
        return body(x, y)

    x = x.copy()
    x[0, 0] = np.nan
    return checked, (model, optimizer), (x, y)


def test_a_standby_group_member_whose_shadow_run_fails_exits_with_its_code_instead_of_saying_ready(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # its peers may wait for good in the step's collective it never reached: it must not say ready (the
    # watchdog replaces the group); a standby alone has no peer and goes on to its promotion
    from procsv.common import env
    from procsv.common.exitcodes import EXIT_NO_SHADOW_RUN

    monkeypatch.delenv(env.SHADOW_RUN, raising=False)
    checked, (model, optimizer), batch = _checked_step()
    before = _values(model, optimizer)
    member = warmup.WarmUps()
    member.warm_up(checked, *batch)
    with pytest.raises(SystemExit) as exited:
        member.run(alone=False, standby=True)
    assert exited.value.code == EXIT_NO_SHADOW_RUN
    assert "did not run checked on shadows (it failed on the shadow copies (InvalidArgumentError" in capsys.readouterr().out
    assert all(a.tobytes() == b.tobytes() for a, b in zip(before, _values(model, optimizer)))
    alone = warmup.WarmUps()
    alone.warm_up(checked, *batch)
    alone.run(alone=True, standby=True)  # reported, not raised
    assert "standby did not run checked before its promotion" in capsys.readouterr().out


def test_a_standby_group_told_to_skip_the_shadow_run_only_traces_and_never_runs_the_step(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from procsv.common import env
    from procsv.common.bootstrap import ChildConfig

    told = ChildConfig.parse({env.SHADOW_RUN: "0"})  # the watchdog's, read by the member's Supervisor
    checked, (model, optimizer), batch = _checked_step()
    before = _values(model, optimizer)
    member = warmup.WarmUps()
    member.warm_up(checked, *batch)
    member.run(alone=False, standby=True, config=told)  # no exit: the step (which would fail) is not run
    assert checked.experimental_get_tracing_count() >= 1
    assert "skip the step's run on shadows" in capsys.readouterr().out
    assert all(a.tobytes() == b.tobytes() for a, b in zip(before, _values(model, optimizer)))


def test_a_standby_group_members_memory_rule_reads_the_one_figure_the_watchdog_gave_every_member(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # each member reading the memory available at its own moment could refuse while a peer runs the step (and
    # waits in its collective for good): the group's members compare against one figure, read at their fork
    import tensorflow as tf

    from procsv.common import env

    body, _, batch = _dense_step()
    step = tf.function(body)
    from procsv.common.bootstrap import ChildConfig

    told = ChildConfig.parse({env.SHADOW_MEMORY: "1000"}).shadow_memory  # bytes: far less than the shadows
    assert "would not fit twice in the memory available" in warmup.standby_run(step, batch, {}, warmup.COLLECTIVES,
                                                                              told)
    told = ChildConfig.parse({env.SHADOW_MEMORY: str(PLENTY)}).shadow_memory
    assert warmup.standby_run(step, batch, {}, warmup.COLLECTIVES, told) == ""
