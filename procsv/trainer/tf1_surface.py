"""The Supervisor's TF1 surface: ``tf.compat.v1.train.Supervisor``'s properties and methods that only
translate to procsv's collaborators (:class:`Tf1Surface`; the Supervisor shows them with the
descriptors of :mod:`procsv.trainer.settings`).

Runs in the trainer process. Nothing here owns training state: the TF1 properties return what the
constructor's TF1 arguments decided (:class:`~procsv.trainer.tf1_args.Tf1Choices`) or the graph's
pieces in graph mode; ``saver`` and ``summary_writer`` are :mod:`procsv.trainer.tf1_objects`'s
shims over the checkpoint and summary services (one of each per Supervisor, made when first
asked); TF's thread starters are ``loop``, ``start_standard_services`` (procsv's services are processes
running since the session was prepared; the call lets the step boundary's periodic work begin)
and ``start_queue_runners`` (the graph's queue runners); stop coordination is the Supervisor's
:class:`~procsv.trainer.coordinator.Coordinator`'s.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from procsv.trainer.coordinator import Coordinator, LooperThread
from procsv.trainer.once import warn_once
from procsv.trainer.tf1_args import USE_DEFAULT, Tf1Choices
from procsv.trainer.tf1_objects import SaverShim, SummaryWriterShim, Tf1Parts

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


def warn_ignored_prepare_args(master: str, config: Any, graph_mode: bool = False) -> None:
    """Warn once about ``prepare_or_wait_for_session``'s arguments that mean nothing in TF2 (in
    graph mode ``master`` and ``config`` are the session's)."""
    if (master or config is not None) and not graph_mode:
        warn_once("Supervisor.prepare", "master and config have no TF2 meaning and are ignored (the newest "
                                        "checkpoint, if any, is restored)")


class Tf1Surface:
    """TF's Supervisor properties and methods in procsv's terms, over ``parts``: the TF1 choices
    (``tf1``), the coordinator and the collaborators the shims translate to (``parts``). Owns the
    ``sv.saver`` and ``sv.summary_writer`` shims (made when first asked)."""

    def __init__(self, tf1: Tf1Choices, coord: Coordinator, parts: Tf1Parts) -> None:
        self._tf1 = tf1
        self._coord = coord
        self._parts = parts
        self._saver: Optional[SaverShim] = None
        self._writer: Optional[SummaryWriterShim] = None

    # ----------------------------------------------------------------- TF1 properties
    @property
    def graph(self) -> Any:
        """The program's ``tf.Graph`` in graph mode; None in eager mode."""
        return self._tf1.graph.graph if self._tf1.graph is not None else None

    @property
    def init_op(self) -> Any:
        return self._tf1.given.get("init_op")

    @property
    def init_feed_dict(self) -> Any:
        return self._tf1.given.get("init_feed_dict")

    @property
    def ready_op(self) -> Any:
        return self._tf1.given.get("ready_op")

    @property
    def ready_for_local_init_op(self) -> Any:
        return self._tf1.given.get("ready_for_local_init_op")

    @property
    def local_init_op(self) -> Any:
        return self._tf1.given.get("local_init_op")

    @property
    def session_manager(self) -> Any:
        """What was passed as ``session_manager`` (ignored: the Supervisor restores itself), or None."""
        value = self._tf1.given.get("session_manager")
        return None if value is USE_DEFAULT else value

    @property
    def summary_op(self) -> Any:
        """Graph mode: the summary op (None for ``summary_op=None`` or a default turned off; without a
        writer TF's op, which nothing runs). Eager: the TF2 summary callable
        (``summary_fn``), or None when automatic summaries are off."""
        if self._tf1.graph is not None:
            return self._tf1.graph.summary_op
        return self._tf1.summary_fn

    @property
    def saver(self) -> Optional[SaverShim]:
        """TF1's ``Saver`` over the checkpoint service (``save``, ``restore``, ``last_checkpoints``...;
        its other attributes are the saved ``tf.train.Checkpoint``'s), or None when checkpoints are off."""
        if self._parts.checkpoint is None:
            return None
        if self._saver is None:
            self._saver = SaverShim(self._parts)
        return self._saver

    @property
    def summary_writer(self) -> Optional[SummaryWriterShim]:
        """None with ``summary_writer=None``, without a logdir or on a non-chief (as TF's); else TF's
        ``FileWriter`` methods over the summary service (one object per Supervisor: ``close`` holds until ``reopen``)."""
        if not self._tf1.writer or not self._parts.chief:
            return None
        if self._writer is None:
            self._writer = SummaryWriterShim(self._parts)
        return self._writer

    @property
    def save_path(self) -> Optional[str]:
        """Where checkpoints go (``<logdir>/<checkpoint_basename>``), None without a logdir or on a
        non-chief (only the chief saves), as TF."""
        return self._parts.save_path if self._parts.chief else None

    @property
    def logdir(self) -> Optional[str]:
        """The logdir (the launch's under ``procsv launch``), None without one, as TF."""
        return self._parts.layout.logdir if self._parts.layout is not None else None

    # ----------------------------------------------------------------- TF1 methods
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
        if not self._parts.chief:
            raise RuntimeError("Only chief supervisor can start standard services. "
                               "Because only chief supervisors can write events.")
        if self._parts.layout is None:
            warn_once("Supervisor.start_standard_services.logdir",
                      "Standard services need a 'logdir' passed to the SessionManager")
            return None
        self._parts.boundary.start_standard_services()  # the next step boundary does the periodic work
        return []

    def start_queue_runners(self, sess: Any = None, queue_runners: Any = None) -> list[Any]:
        """Graph mode: start the threads of ``queue_runners`` (default: the graph's
        ``QUEUE_RUNNERS`` collection) on ``sess`` under the Supervisor's Coordinator, as TF; the
        threads (joined at ``stop()``). Eager: TF's ``RuntimeError`` (queues are not compatible with
        eager execution; feed the steps from a ``tf.data.Dataset``)."""
        setup = self._tf1.graph
        if setup is not None:
            import tensorflow as tf

            if queue_runners is None:
                queue_runners = setup.graph.get_collection(tf.compat.v1.GraphKeys.QUEUE_RUNNERS)
            session = getattr(sess if sess is not None else setup.session, "raw", sess)
            threads: list[Any] = []
            for qr in queue_runners:
                threads.extend(qr.create_threads(session, coord=_QueueCoord(self._coord), daemon=True, start=True))
            return threads
        raise RuntimeError("Queues are not compatible with eager execution.")

    def loop(self, timer_interval_secs: Optional[float], target: Callable[..., Any], args: Any = None,
             kwargs: Any = None) -> LooperThread:
        """Start a thread calling ``target`` every ``timer_interval_secs`` until a stop is requested.
        An exception from ``target`` stops everyone and is re-raised at ``stop()``; ``sys.exit(0)``
        or ``sys.exit()`` is a clean stop (final checkpoint, then the program exits 0), ``sys.exit(N)``
        any other code the program's failure (:mod:`procsv.trainer.coordinator`)."""
        looper = LooperThread(self._coord, timer_interval_secs, target, args, kwargs)
        looper.start()
        return looper
