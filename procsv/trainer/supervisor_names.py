"""The public names of ``procsv.Supervisor`` that are a collaborator's, and its live settings.

Runs in the trainer process: :class:`SupervisorNames` is the base of
:class:`procsv.trainer.supervisor.Supervisor` and holds only descriptors
(:mod:`procsv.trainer.settings`): each public method or value that belongs to a collaborator
(the summary log, the coordinator, the TF1 surface, the step boundary, the warm-ups) forwards to
the Supervisor's attribute that holds it, and each setting a program may change after construction
is read and written in the Supervisor's ``_settings``. The Supervisor owns the collaborators and
the session's lifecycle; this table owns which public name is whose.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Optional

from procsv.trainer.boundary import StepBoundary
from procsv.trainer.coordinator import Coordinator
from procsv.trainer.settings import Forward, ForwardValue, Setting
from procsv.trainer.standby.warmup import WarmUps
from procsv.trainer.summaries.log import SummaryLog
from procsv.trainer.tf1_args import USE_DEFAULT
from procsv.trainer.tf1_objects import SaverShim, SummaryWriterShim
from procsv.trainer.tf1_surface import Tf1Surface


class SupervisorNames:
    """The Supervisor's forwarded names and settings (see the module)."""

    USE_DEFAULT: Any = USE_DEFAULT  # TF's: build the default piece (None turns that service off)

    # the collaborators' methods and values (SummaryLog, Coordinator, Tf1Surface, StepBoundary, WarmUps)
    log_scalar = Forward(SummaryLog.log_scalar, "_summaries")
    log_scalars = Forward(SummaryLog.log_scalars, "_summaries")
    log_histogram = Forward(SummaryLog.log_histogram, "_summaries")
    log_image = Forward(SummaryLog.log_image, "_summaries")
    log_text = Forward(SummaryLog.log_text, "_summaries")
    summary_computed = Forward(SummaryLog.summary_computed, "_summaries")
    summaries_dropped: ForwardValue[int] = ForwardValue("_summaries", "Summaries this process had to drop so far.")
    request_stop = Forward(Coordinator.request_stop, "coord")
    should_stop = Forward(Coordinator.should_stop, "coord")
    stop_on_exception = Forward(Coordinator.stop_on_exception, "coord")
    wait_for_stop = Forward(Coordinator.wait_for_stop, "coord")
    start_standard_services = Forward(Tf1Surface.start_standard_services, "_surface")
    start_queue_runners = Forward(Tf1Surface.start_queue_runners, "_surface")
    loop = Forward(Tf1Surface.loop, "_surface")
    commit_checkpoint = Forward(StepBoundary.commit_checkpoint, "_boundary")
    warm_up = Forward(WarmUps.warm_up, "_warm_ups")
    graph: ForwardValue[Any] = ForwardValue("_surface", "The program's tf.Graph in graph mode; None in eager mode.")
    init_op: ForwardValue[Any] = ForwardValue("_surface")
    init_feed_dict: ForwardValue[Any] = ForwardValue("_surface")
    ready_op: ForwardValue[Any] = ForwardValue("_surface")
    ready_for_local_init_op: ForwardValue[Any] = ForwardValue("_surface")
    local_init_op: ForwardValue[Any] = ForwardValue("_surface")
    session_manager: ForwardValue[Any] = ForwardValue("_surface")
    summary_op: ForwardValue[Any] = ForwardValue("_surface")
    saver: ForwardValue[Optional[SaverShim]] = ForwardValue("_surface", "TF1's Saver over the checkpoint service.")
    summary_writer: ForwardValue[Optional[SummaryWriterShim]] = ForwardValue("_surface", "TF's FileWriter methods.")
    save_path: ForwardValue[Optional[str]] = ForwardValue("_surface", "<logdir>/<checkpoint_basename>, or None.")
    logdir: ForwardValue[Optional[str]] = ForwardValue("_surface", "The logdir, or None without one.")
    # settings a program may change after construction (read live by the collaborators)
    save_summaries_secs: Setting[Optional[float]] = Setting()
    summary_fn: Setting[Optional[Callable[[], Mapping[str, Any]]]] = Setting()
    stop_grace_secs: Setting[float] = Setting()
    recovery_wait_secs: Setting[float] = Setting()
    init_fn: Setting[Optional[Callable[[Any], None]]] = Setting()
    checkpoint_basename: Setting[str] = Setting()
