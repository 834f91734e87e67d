"""The session ``Supervisor.managed_session()`` yields, and the ``with`` block around it.

Runs in the trainer process. ``sess.run(step_fn, *args)`` on the thread that prepared the session
is one training step. ``sess.run(fetches)`` with tensors, variables or a structure of them (and
``sess.evaluate(...)``) only reads values, from any thread: it is no step and touches none of the
trainer's sockets. Any other fetch (a structure holding a step function, ``run([step_fn, loss])``;
a string, a number) is refused with :class:`procsv.UsageError` naming the form that works
(:func:`readable_fetches`): an eager session cannot run it as a step, and reading it would call
the function outside the step accounting or hand the fetch back unrun. A step function run from
another thread (TF1 programs ran a train op from
``sv.loop`` threads) is refused with :class:`procsv.UsageError`: the step boundary (checkpoint
snapshots, progress, summaries) belongs to one thread.

A step function handed its input (``sess.run(step_fn, x, y)``: "fed") has its boundary right after
it, not before it: the program took that input before the call (``x, y = next(it)`` from a
``tf.data`` iterator the checkpoint tracks), so a snapshot taken before the step would hold the
iterator one element past the step it is named by (a restore, a restart or a rollback's replay
would then train every later step on the next step's batch, and a rollback skip a healthy step).
After the step, the state, the step count and the data position agree, as they do at the boundary
before a step function that takes its input itself. A fed run whose boundary moved the step
(``--on-nonfinite rollback`` restored an earlier state, or skipped the next step:
:mod:`procsv.trainer.nonfinite.rollback`) returns None: its step was undone, or the step after it
is skipped and its input consumed where procsv sees it. Any other run whose boundary moved the
step returns None without calling its step function (the loop's next run reads ``sv.step``
again), except procsv's own step functions that read the step themselves (Keras ``fit``'s), which
are marked :func:`follows_moves`, keep their boundary before the step and are called.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Optional, Protocol

from procsv.common.errors import TrainingStopped, UsageError
from procsv.trainer.coordinator import Coordinator, clean_stop_types
from procsv.trainer.step_boundary import StepState


RUN_FORMS = ("sess.run(step_fn, *args) runs one training step (return the loss from step_fn to get it); "
             "sess.run(tensor_or_variable) or sess.run([tensors/variables]) reads values")


_FOLLOWS = "_procsv_follows_moves"


def follows_moves(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Mark a step function that reads the step itself and takes its own input for it: a run is
    called even when its boundary moved the step (see the module)."""
    setattr(fn, _FOLLOWS, True)
    return fn


def _readable(leaf: Any) -> bool:
    """A fetch an eager session can read: None, a tensor (a composite one too), a variable (Keras'
    too: it has ``numpy``)."""
    import tensorflow as tf

    if leaf is None or isinstance(leaf, (tf.Tensor, tf.Variable)) or tf.is_tensor(leaf):  # sparse, ragged too
        return True
    return not callable(leaf) and callable(getattr(leaf, "numpy", None))


def evaluate(fetches: Any) -> Any:
    """The current values of ``fetches``: a tensor or variable becomes a numpy value, a callable is
    called (no arguments) and its result converted, None stays None; structures keep their shape."""
    import tensorflow as tf

    def one(x: Any) -> Any:
        if x is None:
            return None
        if callable(x) and not isinstance(x, (tf.Tensor, tf.Variable)):
            x = x()
        if isinstance(x, (tf.Tensor, tf.Variable)):
            return x.numpy()
        return x

    if fetches is None:
        return None
    return tf.nest.map_structure(one, fetches)


def readable_fetches(fetches: Any, where: str = "sess.run") -> None:
    """Raise :class:`UsageError` unless every leaf of ``fetches`` is something to read (see
    :func:`_readable`). A step function inside a structure (``run([step_fn, loss])``) would be
    called with no arguments outside the step accounting; a string (TF1's ``"loss:0"``) or a
    number would come back unrun: TF1's graph ran them, an eager session cannot."""
    import tensorflow as tf

    for leaf in tf.nest.flatten(fetches):
        if _readable(leaf):
            continue
        what = (f"a step function, {getattr(leaf, '__name__', type(leaf).__name__)}" if callable(leaf)
                else f"{type(leaf).__name__} {leaf!r:.40}")
        inside = "" if leaf is fetches else f" inside a {type(fetches).__name__}"
        raise UsageError(f"{where}() got {what}{inside}, which an eager session can neither run as a step nor "
                         f"read; {RUN_FORMS}")


class SessionOwner(Protocol):
    """What the ``with`` block needs of the :class:`procsv.Supervisor` that made it (named here, not
    imported: the Supervisor imports this module)."""

    @property
    def coord(self) -> Coordinator: ...

    def should_stop(self) -> bool: ...

    def request_stop(self, ex: Any = None) -> None: ...

    def prepare_or_wait_for_session(self, master: str = "", config: Any = None, *,
                                    start_standard_services: bool = True) -> Any: ...

    def stop(self, *, close_summary_writer: bool = True) -> None: ...

    def settle_at_end(self) -> None: ...


class ManagedSession:
    """What ``managed_session()`` yields. ``run(step_fn, *args)`` runs one training step."""

    def __init__(self, state: StepState, should_stop: Callable[[], bool]) -> None:
        self._should_stop = should_stop  # the Supervisor's coordinator's
        self._state = state  # what each step reads and advances (the Supervisor's step state)
        self.owner_thread = threading.get_ident()  # the thread that prepared it (read by the Supervisor)
        self._step_types: set[type] = set()  # types of step functions seen: callable, not a tensor or variable
        # the last step function run, if it took no arguments (it reads its step itself): what a rollback
        # at the loop's end replays with (see replay_last); None: there is none, or it was handed its input
        self.last_replayable: Optional[Callable[[], Any]] = None
        self.moved = False  # the last run's boundary moved the step: it returned None, its step function not called

    def run(self, step_fn: Any, *args: Any, **kwargs: Any) -> Any:
        """Run ``step_fn(*args, **kwargs)`` as one step, then advance ``global_step`` by one
        (unless the program advanced it itself: see ``Supervisor(increment_global_step=...)``).

        ``run(tensors/variables/structure)`` returns their values and is no step, from any thread.
        Any other fetch (``run([step_fn, loss])``, a string) raises :class:`UsageError`. Raises
        :class:`TrainingStopped` (a clean stop) if a stop was already requested, and
        :class:`UsageError` for a step function from a thread other than the session's.

        The step and its boundary are in this one frame (see :class:`StepState` for why): the stop
        check; the Supervisor's boundary work if a bound has passed (the completed step's
        checkpoint work, before the next step runs); the step; the advance of ``global_step``; the
        progress-and-summaries half at once if this step must not wait for the next boundary. A
        step handed its input (``args``) has the boundary work after it instead (see the module).
        """
        if type(step_fn) not in self._step_types:  # the check depends on the type alone: once per type
            import tensorflow as tf

            if not callable(step_fn) or isinstance(step_fn, (tf.Tensor, tf.Variable)):
                readable_fetches(step_fn)
                return evaluate(step_fn)
            self._step_types.add(type(step_fn))
        if threading.get_ident() != self.owner_thread:
            raise UsageError(
                f"sess.run({getattr(step_fn, '__name__', 'step_fn')}) from thread "
                f"{threading.current_thread().name!r}: training steps run only on the thread that entered "
                "managed_session(); from other threads (sv.loop) read values: sess.run(variable_or_tensor) "
                "or sess.evaluate(fn)")
        state = self._state
        if state.coord.asked and state.coord.should_stop() and state.coord.ends_steps:
            raise TrainingStopped("a stop was requested; the training loop should end")
        before = state.step
        fed = bool(args or kwargs) and not getattr(step_fn, _FOLLOWS, False)
        if not fed and (before >= state.ckpt_step or state.clock() >= state.at):
            state.boundary(before)
            self.moved = state.step != before and not getattr(step_fn, _FOLLOWS, False)
            if self.moved:
                return None  # a rollback or a skipped step moved it: this call was for another step (see the module)
            before = state.step  # (a step function that follows moves runs the step after the new one)
        self.moved = False
        self.last_replayable = step_fn if not (args or kwargs) or getattr(step_fn, _FOLLOWS, False) else None
        state.step = before + 1
        try:
            out = step_fn(*args, **kwargs)
        except BaseException:
            state.step = before
            raise
        counted = state.counter.advance(before)
        if counted is not None:
            state.step = counted
        if state.losses is not None:  # kept, not read: checked in bulk where procsv reads the state anyway
            state.losses.keep_step(state.step, out)
        if state.step >= state.end_step:
            state.after_step()
        if fed and (state.step >= state.ckpt_step or state.clock() >= state.at):
            done = state.step  # a fed step's boundary comes after it (see the module)
            state.boundary(done)
            self.moved = state.step != done
            if self.moved:
                return None
        return out

    def replay_last(self) -> Optional[Callable[[], bool]]:
        """One more run of the last step function, for a rollback after the loop ended (None: it
        took its input as arguments, which procsv cannot make for another step; False from a run: no
        more can be made, the input ran out or a stop was asked, a preemption's, which ``stop()`` follows)."""
        fn = self.last_replayable
        if fn is None:
            return None

        def again() -> bool:
            try:
                self.run(fn)
            except clean_stop_types():  # its iterator ran out (StopIteration, OutOfRangeError); a signal's stop
                return False
            return True
        return again

    def evaluate(self, fetches: Any) -> Any:
        """The current values of ``fetches`` (a callable is called); never a step; any thread."""
        return evaluate(fetches)

    def should_stop(self) -> bool:
        return self._should_stop()

    def close(self) -> None:
        """TF closed the session after ``stop()``; here the Supervisor's stop releases everything."""

    @property
    def graph(self) -> None:
        return None


class ManagedSessionContext:
    """The ``with sv.managed_session():`` block: prepare on entry; on exit ``stop()`` and re-raise
    as TF (the block's exception, else a service's or thread's; clean-stop types are swallowed).

    ``sys.exit(0)``/``sys.exit()`` from the block or from a thread is a clean stop: ``stop()``
    commits the final checkpoint of the last completed step, then the ``SystemExit`` leaves the
    block (the program exits 0, as it asked). ``sys.exit(N)``, N != 0, is an error like any other:
    no final checkpoint, re-raised (:mod:`procsv.trainer.coordinator` keeps the two apart).
    ``release``: the Supervisor's, for a prepare that failed (its channels, its own services)."""

    def __init__(self, sv: SessionOwner, start_standard_services: bool, close_summary_writer: bool,
                 master: str = "", config: Any = None, *, release: Callable[[], None]) -> None:
        self._sv = sv
        self._release = release
        self._start = start_standard_services
        self._close = close_summary_writer
        self._master, self._config = master, config  # (graph mode: the tf.compat.v1.Session's)
        self._session: Any = None

    def __enter__(self) -> Any:
        try:
            self._session = self._sv.prepare_or_wait_for_session(self._master, self._config,
                                                                 start_standard_services=self._start)
        except BaseException:
            self._release()
            raise
        return self._session

    def __exit__(self, exc_type: Any, exc: Optional[BaseException], tb: Any) -> bool:
        sv = self._sv
        settled: Optional[BaseException] = None
        if exc is None and not sv.coord.should_stop():  # the loop ended on its own: its last losses, judged
            try:
                sv.settle_at_end()
            except BaseException as err:  # its give-up (exit 4), or the replayed step's own error: stop() still runs
                settled = err
        if exc is not None or settled is not None:
            sv.request_stop(exc or settled)
        try:
            sv.stop(close_summary_writer=self._close)
        except BaseException as err:
            if err is exc:
                return False  # re-raised with its own traceback
            raise
        finally:
            self._session.close()  # as TF closed the session after stop() (graph mode; eager: nothing)
        if settled is not None:
            raise settled
        if exc is None:
            return False
        return sv.coord.exception is None  # clean-stop types are swallowed

