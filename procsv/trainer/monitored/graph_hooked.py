"""The hooked run of a graph session: TensorFlow's ``_HookedSession`` for TF1 graph programs.

Runs in the trainer process, in the thread that calls ``run`` (the program's main thread under a
MonitoredSession). :class:`GraphHookedSession` wraps a session with TF1's ``run(fetches,
feed_dict, options, run_metadata)`` (a raw ``tf.compat.v1.Session`` or the Supervisor's graph
session) and makes every ``run`` one ``session.run`` with the hooks around it, as TF does:

* ``before_run(run_context)`` on every hook, in order; each may return ``SessionRunArgs(fetches,
  feed_dict, options)`` (procsv's or TensorFlow's own: anything with those three fields);
* one ``run`` of ``{"caller": fetches, <hook i>: its fetches}``; the feeds are the caller's and
  every hook's (a tensor fed by two hooks, or by a hook and the caller, is a ``RuntimeError``
  naming it); the options are the caller's (copied, never changed in place) merged with every
  hook's as TF merges them (numbers: the larger; flags: or; debug watches: appended); a
  ``RunMetadata`` is always passed (the caller's if given);
* ``after_run(run_context, SessionRunValues(results, options, run_metadata))`` on every hook,
  ``results`` being the values of that hook's own fetches (None if it asked for none);
* a hook's ``run_context.request_stop()`` makes ``should_stop()`` True after the run; a ``run``
  after that is a ``RuntimeError``, as TF's. ``should_stop()`` is also True when the wrapped
  session has one that says so (the Supervisor's stop); a run then is left to the MonitoredSession
  to refuse (:class:`procsv.TrainingStopped` after a signal).

It needs no Supervisor and calls no ``begin``/``after_create_session``/``end``: the
MonitoredSession around it does. The hooks at the indices in ``watched`` (a MonitoredSession's
``NanTensorHook`` s under ``--on-nonfinite rollback``, :mod:`procsv.trainer.monitored.nan_watch`)
are asked for their fetches but not called after a run that made a step: the values of their
fetches go to the Supervisor's graph session as the step's watched losses
(``GraphSession.watch_keys``), so that a NaN procsv rolls back never reaches them; after a run that
made no step (nothing procsv would roll back) they are called, as TF's.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

from procsv.trainer.monitored import hooks as api

CALLER = "caller"


def merge_run_options(options: Any, incoming: Any) -> None:
    """Merge the ``RunOptions`` ``incoming`` into ``options`` (in place), as TensorFlow does."""
    options.trace_level = max(options.trace_level, incoming.trace_level)
    options.timeout_in_ms = max(options.timeout_in_ms, incoming.timeout_in_ms)
    options.inter_op_thread_pool = max(options.inter_op_thread_pool, incoming.inter_op_thread_pool)
    options.output_partition_graphs = max(options.output_partition_graphs, incoming.output_partition_graphs)
    options.debug_options.debug_tensor_watch_opts.extend(incoming.debug_options.debug_tensor_watch_opts)
    options.debug_options.reset_disk_byte_usage = (options.debug_options.reset_disk_byte_usage
                                                   or incoming.debug_options.reset_disk_byte_usage)
    options.report_tensor_allocations_upon_oom = (options.report_tensor_allocations_upon_oom
                                                  or incoming.report_tensor_allocations_upon_oom)


def _raise_if_intersects(feeds1: Mapping[Any, Any], feeds2: Mapping[Any, Any], message: str) -> None:
    both = set(feeds1) & set(feeds2)
    if both:
        raise RuntimeError(f"{message} Conflict(s): {list(both)}")


class GraphHookedSession:
    """A graph session whose ``run`` calls the hooks around it (see the module docstring)."""

    def __init__(self, sess: Any, hooks: Sequence[Any], watched: frozenset[int] = frozenset()) -> None:
        self._sess = sess
        self._hooks = list(hooks)
        self._should_stop = False
        self._watched = watched
        # the Supervisor's graph session inside (the MonitoredSession's raw session holds it): it keeps
        # the watched hooks' values as the losses of the step the run makes
        self._keeper: Any = getattr(sess, "session", None) if watched else None

    @property
    def session(self) -> Any:
        """The wrapped session (what ``run_context.session`` is)."""
        return self._sess

    @property
    def graph(self) -> Any:
        return self._sess.graph

    @property
    def sess_str(self) -> Any:
        return self._sess.sess_str

    def should_stop(self) -> bool:
        """True once a hook requested a stop, or when the wrapped session says so."""
        if self._should_stop:
            return True
        inner = getattr(self._sess, "should_stop", None)
        return bool(inner()) if callable(inner) else False

    def run(self, fetches: Any, feed_dict: Optional[Mapping[Any, Any]] = None, options: Any = None,
            run_metadata: Any = None) -> Any:
        """One ``session.run`` of ``fetches`` with every hook's requests merged in; returns the
        values of ``fetches`` (the caller's only)."""
        from tensorflow.core.protobuf import config_pb2

        if self._should_stop:  # a hook's stop (the wrapped session's own is its owner's to judge)
            raise RuntimeError("Run called even after should_stop requested.")
        run_context = api.SessionRunContext(api.SessionRunArgs(fetches, dict(feed_dict) if feed_dict is not None else None),
                                           self._sess)
        merged_options = config_pb2.RunOptions()
        if options is not None:
            merged_options.CopyFrom(options)
        actual_fetches: dict[Any, Any] = {CALLER: fetches}
        feeds = self._before_run(run_context, actual_fetches, feed_dict, merged_options)
        metadata = run_metadata if run_metadata is not None else config_pb2.RunMetadata()
        keys = tuple(i for i in self._watched if i in actual_fetches) if self._keeper is not None else ()
        if keys:
            self._keeper.watch_keys = keys
        try:
            outputs = self._sess.run(actual_fetches, feed_dict=feeds, options=merged_options, run_metadata=metadata)
            kept = bool(keys) and not self._keeper.watch_keys  # the run made a step, which kept them
        finally:
            if keys:
                self._keeper.watch_keys = ()
        for i, hook in enumerate(self._hooks):
            if kept and i in self._watched:
                continue  # procsv watches its tensor (rollback): a NaN it rolls back never reaches the hook
            hook.after_run(run_context, api.SessionRunValues(outputs.get(i), merged_options, metadata))
        self._should_stop = self._should_stop or run_context.stop_requested
        return outputs[CALLER]

    def _before_run(self, run_context: api.SessionRunContext, fetch_dict: dict[Any, Any],
                    user_feeds: Optional[Mapping[Any, Any]], options: Any) -> Optional[Mapping[Any, Any]]:
        hook_feeds: dict[Any, Any] = {}
        for i, hook in enumerate(self._hooks):
            request = hook.before_run(run_context)
            if request is None:
                continue
            if request.fetches is not None:
                fetch_dict[i] = request.fetches
            if request.feed_dict:
                _raise_if_intersects(hook_feeds, request.feed_dict, "Same tensor is fed by two hooks.")
                hook_feeds.update(request.feed_dict)
            if request.options:
                merge_run_options(options, request.options)
        if not hook_feeds:
            return user_feeds
        if not user_feeds:
            return hook_feeds
        _raise_if_intersects(user_feeds, hook_feeds, "Same tensor is fed by a SessionRunHook and user.")
        hook_feeds.update(user_feeds)
        return hook_feeds


__all__ = ["GraphHookedSession", "merge_run_options", "CALLER"]
