"""The hook API of ``procsv.train``: ``SessionRunHook`` and the values it sees, in TF2 terms.

Runs in the trainer process, in its main thread (hooks are called from ``MonitoredSession.run``,
at the step boundary). The names and call order are TensorFlow's
(``tf.compat.v1.train.SessionRunHook``); what changes is what a *run* is. In TF2 there is no graph:
``MonitoredSession.run(step_fn, *args)`` runs one training step, and a hook's
``SessionRunArgs(fetches)`` names what to read *right after the step*: tensors, variables,
callables (called with no arguments), or any nested structure of them (``tf.nest``). The values
arrive in ``after_run`` as ``run_values.results``; ``run_values.step_result`` is what the step
function returned.

Also here: :class:`SecondOrStepTimer` (TF's "every N steps or N seconds" rule, on an injectable
clock that defaults to TF's, :func:`wall_clock`), :func:`tf_logging` (where the hooks' lines go, as
TF's: ``tf.compat.v1.logging``), the process-wide global step
(:func:`get_or_create_global_step`, TF2's stand-in for the graph's global step; in graph mode,
:func:`graph_mode`, the graph's own). (``evaluate`` is :mod:`procsv.trainer.managed`'s and
``warn_once`` :mod:`procsv.trainer.once`'s, named here too for the hooks.) In graph mode a run is a ``session.run``: see :mod:`procsv.trainer.monitored.graph_hooked`.
"""

from __future__ import annotations

import inspect
import logging
import sys
import time
from typing import Any, Callable, NamedTuple, Optional

from procsv.trainer.managed import evaluate
from procsv.trainer.once import warn_once

logger = logging.getLogger("procsv.train")  # procsv's own warnings (warn_once); the hooks' lines: tf_logging()


def tf_logging() -> Any:
    """TensorFlow's logging module, where the standard hooks log their lines as TF's do
    (``tf.compat.v1.logging``: the ``tensorflow`` logger, its verbosity and handlers). Looked up at
    each call, so a program (or test) that replaces one of its functions sees the hooks' calls."""
    from tensorflow.python.platform import tf_logging as tf_log

    return tf_log


def wall_clock() -> float:
    """TF's clock for the hooks' timers: ``time.time()``, read at each call (a program that mocks
    ``time.time`` moves the hooks' timers, as TF's)."""
    return time.time()



# ---------------------------------------------------------------------------- the global step
_global_step: Any = None


def graph_mode() -> bool:
    """True in a TF1 graph program: TensorFlow imported and not executing eagerly (eager execution
    disabled, or inside ``with tf.Graph().as_default()``), and not tracing a ``tf.function``."""
    tf = sys.modules.get("tensorflow")
    if tf is None or tf.executing_eagerly():
        return False
    return not getattr(tf.compat.v1.get_default_graph(), "building_function", False)


def _graph_tf(graph: Any) -> Any:
    """TensorFlow if the global step is a graph's (``graph`` given, or graph mode), else None."""
    if graph is None and not graph_mode():
        return None
    import tensorflow as tf

    return tf


def get_global_step(graph: Any = None) -> Any:
    """The process's global step variable (int64), or None before one exists.

    In eager mode a process has one global step, created by :func:`get_or_create_global_step` or
    adopted from the Supervisor a session creator builds, and ``graph`` is ignored. In graph mode
    (``graph`` given, or TensorFlow not executing eagerly) it is TF's: the graph's (default: the
    default graph's) global step, as ``tf.compat.v1.train.get_global_step``.
    """
    tf = _graph_tf(graph)
    if tf is not None:
        return tf.compat.v1.train.get_global_step(graph)
    return _global_step


def get_or_create_global_step(graph: Any = None) -> Any:
    """The process's global step variable, created (int64, 0, not trainable) if there is none; in
    graph mode the graph's, as ``tf.compat.v1.train.get_or_create_global_step``."""
    global _global_step
    graph_tf = _graph_tf(graph)
    if graph_tf is not None:
        return graph_tf.compat.v1.train.get_or_create_global_step(graph)
    if _global_step is None:
        import tensorflow as tf

        _global_step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
    return _global_step


def set_global_step(variable: Any) -> None:
    """Make ``variable`` the process's global step (what hooks read)."""
    global _global_step
    _global_step = variable


def read_step(variable: Any) -> int:
    return int(variable.numpy())


# ---------------------------------------------------------------------------- run values
class SessionRunArgs(NamedTuple):
    """What a hook's ``before_run`` asks for: ``fetches`` read right after the step, and
    ``feed_dict``: a mapping handed to the step function as its ``feed_dict`` keyword argument if
    it has one (TF2 has no placeholders; a step function without it gets a warning, once).
    ``options`` is accepted and ignored (TF2 has no RunOptions)."""

    fetches: Any
    feed_dict: Optional[dict[Any, Any]] = None
    options: Any = None


class SessionRunValues(NamedTuple):
    """What ``after_run`` gets: ``results`` (the values of the hook's fetches, None if it asked for
    none), ``options`` and ``run_metadata`` (always None in TF2) and ``step_result`` (what the step
    function returned; a procsv addition)."""

    results: Any
    options: Any = None
    run_metadata: Any = None
    step_result: Any = None


class SessionRunContext:
    """The run being made: ``original_args`` (the step function and the caller's feeds as
    ``SessionRunArgs``), ``session`` (the raw session) and ``request_stop()``."""

    def __init__(self, original_args: SessionRunArgs, session: Any) -> None:
        self._original_args = original_args
        self._session = session
        self._stop_requested = False

    @property
    def original_args(self) -> SessionRunArgs:
        return self._original_args

    @property
    def session(self) -> Any:
        return self._session

    @property
    def stop_requested(self) -> bool:
        return self._stop_requested

    def request_stop(self) -> None:
        """End the loop: the session's ``should_stop()`` becomes True after this run."""
        self._stop_requested = True


class SessionRunHook:
    """Base of every hook; each method is a no-op here. Called in this order by a MonitoredSession:
    ``begin()`` (before the session exists), ``after_create_session(session, coord)`` (after
    restore or init), then per run ``before_run(run_context)`` -> step -> ``after_run(run_context,
    run_values)``, and ``end(session)`` on a clean exit only."""

    def begin(self) -> None:
        pass

    def after_create_session(self, session: Any, coord: Any) -> None:
        pass

    def before_run(self, run_context: SessionRunContext) -> Optional[SessionRunArgs]:
        return None

    def after_run(self, run_context: SessionRunContext, run_values: SessionRunValues) -> None:
        pass

    def end(self, session: Any) -> None:
        pass


# ---------------------------------------------------------------------------- timer
class SecondOrStepTimer:
    """Triggers every ``every_secs`` seconds or every ``every_steps`` steps (exactly one of them).

    The first call always triggers; never twice for the same step. ``clock`` is TF's,
    :func:`wall_clock` (``time.time``: an interval between hook triggers, never a timeout); tests
    pass a fake one, and a Supervisor's injected clock replaces it (:func:`hook_support.clock_of`).
    """

    def __init__(self, every_secs: Optional[float] = None, every_steps: Optional[int] = None,
                 clock: Callable[[], float] = wall_clock) -> None:
        if every_secs is None and every_steps is None:
            raise ValueError("Either every_secs or every_steps should be provided.")
        if every_secs is not None and every_steps is not None:
            raise ValueError("Can not provide both every_secs and every_steps.")
        self._every_secs = every_secs
        self._every_steps = every_steps
        self.clock = clock
        self._last_time: Optional[float] = None
        self._last_step: Optional[int] = None

    def reset(self) -> None:
        self._last_time = None
        self._last_step = None

    def should_trigger_for_step(self, step: int) -> bool:
        if self._last_step is None:
            return True
        if self._last_step == step:
            return False
        if self._every_secs is not None:
            assert self._last_time is not None
            return self.clock() >= self._last_time + self._every_secs
        assert self._every_steps is not None
        return step >= self._last_step + self._every_steps

    def update_last_triggered_step(self, step: int) -> tuple[Optional[float], Optional[int]]:
        """Record a trigger at ``step``; return (seconds, steps) since the previous one (None, None first)."""
        now = self.clock()
        elapsed: tuple[Optional[float], Optional[int]] = (None, None)
        if self._last_time is not None and self._last_step is not None:
            elapsed = (now - self._last_time, step - self._last_step)
        self._last_time = now
        self._last_step = step
        return elapsed

    def last_triggered_step(self) -> Optional[int]:
        return self._last_step


class NeverTriggerTimer(SecondOrStepTimer):
    """A timer that never triggers."""

    def __init__(self) -> None:
        super().__init__(every_steps=1)

    def should_trigger_for_step(self, step: int) -> bool:
        return False


__all__ = [
    "SessionRunArgs", "SessionRunContext", "SessionRunHook", "SessionRunValues", "SecondOrStepTimer",
    "NeverTriggerTimer", "evaluate", "get_global_step", "graph_mode", "get_or_create_global_step", "set_global_step",
    "warn_once", "tf_logging", "wall_clock",
]


def takes_keyword(fn: Any, name: str) -> bool:
    """Whether ``fn`` accepts ``name`` as a keyword argument (a step function's ``feed_dict``...)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    p = params.get(name)
    return p is not None and p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
