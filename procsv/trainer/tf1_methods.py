"""The Supervisor's methods that only keep ``tf.compat.v1.train.Supervisor``'s surface (a mixin).

Runs in the trainer process. Stop coordination is the Supervisor's :class:`Coordinator`
(``request_stop``, ``should_stop``, ``stop_on_exception``, ``wait_for_stop``, ``loop``); TF's
thread starters: ``start_standard_services`` (procsv's services are processes running since the
session was prepared; the call lets the trainer's periodic work begin, see there) and
``start_queue_runners`` (the graph's queue runners); and the TF1 path
properties (``save_path``, ``logdir``). The Supervisor's own behaviour is not here: its session
lifecycle is :mod:`procsv.trainer.supervisor`, the TF1 constructor arguments and properties
:mod:`procsv.trainer.tf1_args`.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Optional

from procsv.common.layout import Layout
from procsv.trainer.coordinator import Coordinator, LooperThread
from procsv.trainer.once import warn_once


def warn_ignored_prepare_args(master: str, config: Any, graph_mode: bool = False) -> None:
    """Warn once about ``prepare_or_wait_for_session``'s arguments that mean nothing in TF2 (in
    graph mode ``master`` and ``config`` are the session's)."""
    if (master or config is not None) and not graph_mode:
        warn_once("Supervisor.prepare", "master and config have no TF2 meaning and are ignored (the newest "
                                        "checkpoint, if any, is restored)")


class _QueueCoord:
    """The Supervisor's Coordinator as a queue runner sees it: the error of an enqueue that the
    stop cancelled (the runner closes its queue then) is no error, as with TF's Coordinator, which
    keeps no error raised after a stop."""

    def __init__(self, coord: Coordinator) -> None:
        self._coord = coord

    def request_stop(self, ex: Any = None) -> None:
        self._coord.request_stop(None if self._coord.should_stop() else ex)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._coord, name)


class Tf1Methods:
    """TF's Supervisor methods that delegate to the Supervisor's coordinator or do nothing in TF2:
    a mixin that owns no state (it reads the Supervisor's ``coord`` and ``layout``)."""

    coord: Coordinator
    layout: Optional[Layout]  # None: no logdir in plain python (TF's meaning: nothing saved, no summaries)
    checkpoint_basename: str
    is_chief: bool
    _open_halves: Callable[[], None]
    _standard_started: bool  # False: a session prepared with start_standard_services=False, not yet started

    @property
    def save_path(self) -> Optional[str]:
        """Where checkpoints go (``<logdir>/<checkpoint_basename>``), None without a logdir, as TF."""
        return os.path.join(self.layout.logdir, self.checkpoint_basename) if self.layout is not None else None

    @property
    def logdir(self) -> Optional[str]:
        """The logdir (the launch's under ``procsv launch``), None without one, as TF."""
        return self.layout.logdir if self.layout is not None else None

    def start_standard_services(self, sess: Any = None) -> Optional[list[Any]]:
        """Start the periodic checkpoints and summaries of a session prepared with
        ``start_standard_services=False``, as TF started its checkpoint, summary and step-counter
        threads here. procsv's services are processes running since the session was prepared; what
        waits for this call is the trainer's part: until then it hands the checkpoint service no
        snapshot on its schedule (``save_model_secs``, ``save_checkpoint_steps``, the in-memory tier)
        and computes no periodic summary (``summary_op``, ``summary_fn``). From the next step
        boundary on, both run. No thread to return: ``[]``. As TF: a non-chief raises
        ``RuntimeError``; without a logdir it warns and returns None (TF's docstring says
        ``ValueError``; its code warns)."""
        if not self.is_chief:
            raise RuntimeError("Only chief supervisor can start standard services. "
                               "Because only chief supervisors can write events.")
        if self.layout is None:
            warn_once("Supervisor.start_standard_services.logdir",
                      "Standard services need a 'logdir' passed to the SessionManager")
            return None
        if not self._standard_started:
            self._standard_started = True
            self._open_halves()  # the next step boundary does the checkpoint and summary work
        return []

    def start_queue_runners(self, sess: Any = None, queue_runners: Any = None) -> list[Any]:
        """Graph mode: start the threads of ``queue_runners`` (default: the graph's
        ``QUEUE_RUNNERS`` collection) on ``sess`` under the Supervisor's Coordinator, as TF; the
        threads (joined at ``stop()``). Eager: TF's ``RuntimeError`` (queues are not compatible with
        eager execution; feed the steps from a ``tf.data.Dataset``)."""
        setup = getattr(self, "_tf1").graph
        if setup is not None:
            import tensorflow as tf

            if queue_runners is None:
                queue_runners = setup.graph.get_collection(tf.compat.v1.GraphKeys.QUEUE_RUNNERS)
            session = getattr(sess if sess is not None else setup.session, "raw", sess)
            threads: list[Any] = []
            for qr in queue_runners:
                threads.extend(qr.create_threads(session, coord=_QueueCoord(self.coord), daemon=True, start=True))
            return threads
        raise RuntimeError("Queues are not compatible with eager execution.")

    def request_stop(self, ex: Any = None) -> None:
        """Ask for a stop; ``ex`` (an exception or a ``sys.exc_info()`` tuple) is re-raised at the end."""
        self.coord.request_stop(ex)

    def should_stop(self) -> bool:
        return self.coord.should_stop()

    def stop_on_exception(self) -> Any:
        return self.coord.stop_on_exception()

    def wait_for_stop(self) -> None:
        self.coord.wait_for_stop()

    def loop(self, timer_interval_secs: Optional[float], target: Callable[..., Any], args: Any = None,
             kwargs: Any = None) -> LooperThread:
        """Start a thread calling ``target`` every ``timer_interval_secs`` until a stop is requested.
        An exception from ``target`` stops everyone and is re-raised at ``stop()``; ``sys.exit(0)``
        or ``sys.exit()`` is a clean stop (final checkpoint, then the program exits 0), ``sys.exit(N)``
        any other code the program's failure (:mod:`procsv.trainer.coordinator`)."""
        looper = LooperThread(self.coord, timer_interval_secs, target, args, kwargs)
        looper.start()
        return looper
