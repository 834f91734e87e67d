"""The session a graph-mode ``Supervisor.managed_session()`` yields: a ``tf.compat.v1.Session`` with step boundaries.

Runs in the trainer process (graph mode). :class:`GraphSession` wraps a real
``tf.compat.v1.Session`` of the program's graph: ``run(fetches, feed_dict, options,
run_metadata)`` returns what the plain session returns, for any fetch structure. A run that writes
the global step (:mod:`procsv.trainer.graph.steps`) is a step: the step it made is inferred (the
step before plus the constant its writer adds) or, where the exact value matters, the global
step's value after it is fetched in the same call; the step boundary runs right after the run
returns, before its results go back to the program: progress to the watchdog, the snapshot for
the checkpoint service when one is due, the summaries' hand-off (``summary_op`` with this run's
``feed_dict``). So a checkpoint is always a state the program had between two runs. What a run
needs of its fetch structure (its writer, the watched losses among its fetches) is worked out the
first time and found again by identity (:mod:`procsv.trainer.graph.runplan`): a step that is no
boundary costs a few lookups and comparisons beside ``Session.run``.

A run from another thread that writes the global step (TF1's ``coord.join(threads)`` pattern: the
training loop in threads, the main one waiting) is a step too: the global step's value is fetched
with it and, when it is newer than the last step counted, that step is counted and its boundary
runs in that thread, under the session's lock (one boundary at a time, whichever thread makes it;
the session's own thread takes the lock for its boundaries too). Other runs from other threads (a
queue runner, an ``sv.loop`` thread) are plain runs. ``partial_run`` is a plain run too; a callable
from ``make_callable`` runs through this session's ``run``.

The Supervisor makes it with :func:`procsv.trainer.session_type.make`: an instance of a
``tf.compat.v1.Session`` subclass (``isinstance`` holds, TF's own code takes it) that is no second
TensorFlow session; ``as_default()`` is TF's (this session becomes the default one, so ``eval()``
and ``op.run()`` inside it run here).
"""

from __future__ import annotations

from threading import RLock, get_ident
from typing import Any, Callable, Optional

from procsv.common.errors import TrainingStopped
from procsv.trainer import session_type
from procsv.trainer.graph.fastrun import MISS, fast_run
from procsv.trainer.graph.runplan import CACHE_MAX, RunPlan, keep_losses, make_plan, plan_key
from procsv.trainer.graph.steps import VERIFY_EVERY, StepProbe
from procsv.trainer.step_boundary import StepState


BETWEEN_EVERY = 0.02  # seconds: a run that makes no step does the step boundary's work at most this often

class GraphSession:
    """What a graph-mode ``managed_session()`` / ``prepare_or_wait_for_session()`` returns."""

    def __init__(self, state: StepState, should_stop: Callable[[], bool], session: Any, probe: StepProbe,
                 observe: Optional[Callable[[int], None]] = None,
                 before_close: Optional[Callable[[], None]] = None, fast_runs: bool = True) -> None:
        self._should_stop = should_stop  # the Supervisor's
        self._fast_runs = fast_runs  # runs through callables (fastrun); False: PROCSV_GRAPH_FAST_RUN=0, all Session.run
        self._before_close = before_close  # what must read the state through this session before it closes
        self._state = state  # what each step reads and advances (the Supervisor's step state)
        self._sess = session
        self._probe = probe
        self._observe = observe
        self.owner_thread = get_ident()  # the thread that prepared it (read by the Supervisor)
        self._lock = RLock()  # one step boundary at a time, from whichever thread made the step
        self.live = False  # the Supervisor sets it once the session is prepared: boundaries from then on
        self.step_feed: Any = None  # the feed_dict of the run that made the last step (summary_op runs with it)
        # inferred steps since the global step was last read; VERIFY_EVERY forces a read (another
        # thread's run that wrote it, a session with a remote target, where others may write it)
        self._unread = VERIFY_EVERY  # (the first step reads it: where the session started)
        self._between_next = float("-inf")  # when a run that makes no step may next do the boundary's work
        self._infer = not probe.counts_every_run and not getattr(session, "sess_str", "")
        # keys of a run's dict of fetches whose values are kept as the step's losses whatever their
        # names (a MonitoredSession's watched NanTensorHooks' fetches; set around that run only,
        # emptied when a step kept them)
        self.watch_keys: tuple[Any, ...] = ()
        self._plans: dict[Any, RunPlan] = {}  # fetch structure (procsv.trainer.graph.runplan.plan_key) -> its plan

    @property
    def raw(self) -> Any:
        """The ``tf.compat.v1.Session`` inside (for procsv's own runs: restore, snapshots, summaries)."""
        return self._sess

    def run(self, fetches: Any, feed_dict: Any = None, options: Any = None, run_metadata: Any = None) -> Any:
        """``tf.compat.v1.Session.run``; a run that advanced the global step is a step, and its
        boundary runs before this returns. Raises :class:`TrainingStopped` (a clean stop) for a run
        that would write the global step after a stop was requested, as an eager step does."""
        if not self.live or get_ident() != self.owner_thread:
            found = self._probe.plan(fetches, feed_dict) if self.live and not self._probe.counts_every_run else None
            if found is None:
                return self._sess.run(fetches, feed_dict, options, run_metadata)
            self._unread = VERIFY_EVERY  # another thread advanced it: the session's thread reads it at its next step
            out, value = self._sess.run((fetches, found.read), feed_dict, options, run_metadata)
            self._stepped(self._state, int(value), feed_dict, fetches, out, newer_only=True)
            return out
        state = self._state
        if self._probe.variable is None:  # the graph has no global step: every run is a step, counted here
            if state.coord.asked and state.coord.should_stop() and state.coord.ends_steps:
                raise TrainingStopped("a stop was requested; the training loop should end")
            out = self._sess.run(fetches, feed_dict, options, run_metadata)
            self._stepped(state, state.step + 1, feed_dict, fetches, out)
            return out
        key = plan_key(fetches, feed_dict)
        plan = self._plans.get(key) if key is not None else None
        if plan is None or plan.losses is not state.losses:
            plan = self._plan(fetches, feed_dict, key)
        plain = options is None and run_metadata is None
        read = plan.read
        if read is None:  # writes no global step: no step
            out = plan.fast(feed_dict) if plain and plan.fast is not None else MISS
            if out is MISS:
                out = self._sess.run(fetches, feed_dict, options, run_metadata)
            if plan.writes:  # but it trained: the step's checkpoint is older than the state now
                state.changed = True
            self._between(state)  # what is due comes whether the step moves or not
            return out
        if state.coord.asked and state.coord.should_stop() and state.coord.ends_steps:
            raise TrainingStopped("a stop was requested; the training loop should end")
        add = plan.add
        if add is not None and self._unread < VERIFY_EVERY:
            step = state.step + add
            if step < state.ckpt_step and step < state.end_step and state.clock() < state.at:
                # no boundary due at the step this run makes: inferred, its bookkeeping (as _stepped's) inline
                out = plan.fast(feed_dict) if plain and plan.fast is not None else MISS
                if out is MISS:
                    out = self._sess.run(fetches, feed_dict, options, run_metadata)
                if state.clock() >= state.at:  # its time came during the run: the boundary now, at the exact step
                    self._unread = 0
                    exact = int(self._sess.run(self._probe.read))
                    if exact != state.step:
                        self._stepped(state, exact, feed_dict, fetches, out, plan)
                    return out
                self._unread += 1
                state.counter.completed += 1
                if self._observe is not None:
                    self._observe(step)
                state.step = step
                self.step_feed = feed_dict
                if plan.watch:
                    keep_losses(plan, step, out)
                elif plan.watch is None:
                    self._keep_walked(state, step, fetches, out)
                return out
        # the exact value (a boundary may be due, or it is time to verify, or no constant is known):
        # the read after the run's writer, fetched with it
        both = plan.fast_read(feed_dict) if plain and plan.fast_read is not None else MISS
        if both is MISS:
            both = self._sess.run((fetches, read), feed_dict, options, run_metadata)
        out, value = both
        step = int(value)
        self._unread = 0
        if step != state.step:
            self._stepped(state, step, feed_dict, fetches, out, plan)
        else:  # a run that read the step and left it (an evaluation beside a hook's step read): as one without a read
            self._between(state)
        return out

    def _between(self, state: StepState) -> None:
        """After a run that made no step: what is due at the step that stands
        (:meth:`~procsv.trainer.boundary.StepBoundary.between_steps`), at most every :data:`BETWEEN_EVERY`
        s. A bound that means "at the next step" (a save pending, a snapshot in flight: the checkpoint half's
        time is now) is passed at every run that makes none: an evaluation loop ran the boundary's work on 7
        of 10 runs, about 11 us each (helper-59's measurement), where it had none to do."""
        now = state.clock()
        if now >= self._between_next and (now >= state.at or now >= state.between_at):
            self._between_next = now + BETWEEN_EVERY
            with self._lock:
                state.between_steps()

    def _plan(self, fetches: Any, feed_dict: Any, key: Any) -> RunPlan:
        """The plan of a structure not seen (or seen with other watched losses): made, and cached
        when it has a ``key``."""
        if self._infer:
            found = self._probe.plan(fetches, feed_dict)
            step = (None, None) if found is None else (found.read, found.add)
        else:
            step = (self._probe.extra_fetch(fetches, feed_dict), None)
        plan = make_plan(fetches, feed_dict, step, self._state.losses, key)
        plan.writes = plan.read is None and self._probe.variable is not None and self._probe.writes(fetches, feed_dict)
        if plan.held is not None:
            plan.fast = fast_run(self._sess, fetches, feed_dict) if self._fast_runs else None
            if plan.read is not None and self._fast_runs:
                plan.fast_read = fast_run(self._sess, fetches, feed_dict, plan.read)
            if len(self._plans) >= CACHE_MAX:
                self._plans.clear()
            self._plans[key] = plan
        return plan

    def _stepped(self, state: StepState, step: int, feed_dict: Any, fetches: Any = None, out: Any = None,
                 plan: Optional[RunPlan] = None, newer_only: bool = False) -> None:
        """The run just returned made ``step``: the boundary, with the state of that step (under the
        lock; ``newer_only``: another thread's run, counted only when newer than the last step)."""
        with self._lock:
            if newer_only and step <= state.step:
                return
            state.counter.completed += 1
            if self._observe is not None:
                self._observe(step)
            state.step = step
            self.step_feed = feed_dict
            if plan is not None and plan.watch is not None and not self.watch_keys:
                keep_losses(plan, step, out)  # the run's watched losses: host values already
            else:
                self._keep_walked(state, step, fetches, out)
            if newer_only and state.coord.asked and state.coord.should_stop():
                return  # counted; the stop (perhaps releasing the channels now) takes the final checkpoint
            if step >= state.ckpt_step or state.clock() >= state.at:
                state.boundary(step)
            if state.step >= state.end_step:
                state.after_step()

    def _keep_walked(self, state: StepState, step: int, fetches: Any, out: Any) -> None:
        """The watched losses of a run whose structure has no plan of its own (a dict, a nested
        list): found by walking it, and a watched NanTensorHook's fetches (``watch_keys``)."""
        losses = state.losses
        if losses is not None:  # host values already
            if losses.tags:
                keep_watched(losses, step, fetches, out)
            for key in self.watch_keys:
                keep_all(losses, step, out[key])
            self.watch_keys = ()  # kept: the hooked run sees that its watched values were taken

    # ------------------------------------------------------------------ the rest of tf.compat.v1.Session
    # (every public name of TF's BaseSession/Session: procsv.trainer.session_type.OWN; ``as_default``
    # is TF's own, which makes this session the default: ``tensor.eval()`` inside it runs here)
    def partial_run_setup(self, fetches: Any, feeds: Any = None) -> Any:
        return self._sess.partial_run_setup(fetches, feeds)

    def partial_run(self, handle: Any, fetches: Any, feed_dict: Any = None) -> Any:
        return self._sess.partial_run(handle, fetches, feed_dict)

    def make_callable(self, fetches: Any, feed_list: Any = None, accept_options: bool = False) -> Any:
        """``Session.make_callable``, whose calls are runs of this session (steps and boundaries, the
        callable road of :mod:`procsv.trainer.graph.fastrun`): TF's own would train unseen. Checked
        as TF checks it, when it is made."""
        self._sess.make_callable(fetches, feed_list, accept_options)  # TF's errors, at the same moment
        run = self.run
        if feed_list is not None:  # as TF 2.21's: a feed dict from the arguments, options passed on
            def generic(*feed_args: Any, **kwargs: Any) -> Any:
                return run(fetches, dict(zip(feed_list, feed_args)), **kwargs)
            return generic
        if accept_options:
            def with_options(options: Any = None, run_metadata: Any = None) -> Any:
                return run(fetches, None, options, run_metadata)
            return with_options

        def plain() -> Any:
            return run(fetches)
        return plain

    @property
    def graph(self) -> Any:
        return self._sess.graph

    @property
    def graph_def(self) -> Any:
        return self._sess.graph_def

    @property
    def sess_str(self) -> Any:
        return self._sess.sess_str  # as TF: the target as given (bytes for a tf.distribute.Server's)

    def list_devices(self) -> Any:
        return self._sess.list_devices()

    def should_stop(self) -> bool:
        return self._should_stop()

    def close(self) -> None:
        """Close the session (``managed_session`` does at the end of its block, as TF). A live session
        closed by the program first (TF's documented ``sess.close(); sv.stop()``) has the Supervisor's
        final checkpoint taken now, while the state can still be read through it."""
        if self.live and self._before_close is not None:
            self._before_close()
        self.live = False
        self._sess.close()

    def __enter__(self) -> "GraphSession":
        """As TF's session: the default session (and its graph the default graph) inside the block."""
        return session_type.enter(self)  # type: ignore[no-any-return]

    def __exit__(self, *exc: Any) -> None:
        session_type.leave(self, *exc)


def keep_watched(losses: Any, step: int, fetch: Any, value: Any, key: Any = None) -> None:
    """Keep, as the loss of ``step``, each value a run returned for a fetch under a watched name
    (``nonfinite_tags``): a dict entry of that key, or a tensor whose op's name ends in it (``loss``,
    ``model/loss``); ``value`` has ``fetch``'s structure, as ``Session.run`` returns it. Nothing is
    read: a run's values are on the host."""
    if isinstance(fetch, dict):
        for k, f in fetch.items():
            keep_watched(losses, step, f, value[k], k)
    elif isinstance(fetch, (list, tuple)):
        for f, v in zip(fetch, value):
            keep_watched(losses, step, f, v)
    else:
        name = fetch.split(":")[0] if isinstance(fetch, str) else getattr(getattr(fetch, "op", None), "name", "")
        if key in losses.tags or (name and name.rsplit("/", 1)[-1] in losses.tags):
            losses.keep(step, value)


def keep_all(losses: Any, step: int, value: Any) -> None:
    """Keep every value of a run's result (a structure of host values: a watched ``NanTensorHook``'s
    fetches) as a loss of ``step``; an array counts as non-finite when any element is."""
    import numpy as np

    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        for item in value:
            keep_all(losses, step, item)
        return
    try:
        array = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        return  # not a number (an op's None): nothing to judge
    losses.keep(step, array if array.ndim == 0 else np.float64(0.0 if np.isfinite(array).all() else np.nan))
