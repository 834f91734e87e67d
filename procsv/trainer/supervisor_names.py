"""The public methods of ``procsv.Supervisor`` that are a collaborator's.

Runs in the trainer process: :class:`SupervisorNames` is the base of
:class:`procsv.trainer.supervisor.Supervisor` and holds only :class:`procsv.trainer.settings.Forward`
declarations: each public method that belongs to a collaborator (the summary log, the coordinator,
the TF1 surface, the step boundary, the warm-ups) is that collaborator's, with its signature and
docstring; and the few values that are a collaborator's and that TF's Supervisor does not have
(:class:`procsv.trainer.settings.ForwardValue`: a subclass may shadow them, as on TF's). The
Supervisor owns the collaborators and the session's lifecycle; its values in TF's surface and its
live settings are plain properties of its own. This table owns which public name is whose.
"""

from __future__ import annotations

from typing import Any, Optional

from procsv.trainer.boundary import StepBoundary
from procsv.trainer.coordinator import Coordinator
from procsv.trainer.settings import Forward, ForwardValue
from procsv.trainer.standby.warmup import WarmUps
from procsv.trainer.summaries.log import SummaryLog
from procsv.trainer.tf1_args import USE_DEFAULT
from procsv.trainer.tf1_surface import Tf1Surface


class SupervisorNames:
    """The Supervisor's forwarded methods and procsv's own forwarded values (see the module)."""

    USE_DEFAULT: Any = USE_DEFAULT  # TF's: build the default piece (None turns that service off)

    # the collaborators' methods (SummaryLog, Coordinator, Tf1Surface, StepBoundary, WarmUps)
    log_scalar = Forward(SummaryLog.log_scalar, "_summaries")
    log_scalars = Forward(SummaryLog.log_scalars, "_summaries")
    log_histogram = Forward(SummaryLog.log_histogram, "_summaries")
    log_image = Forward(SummaryLog.log_image, "_summaries")
    log_text = Forward(SummaryLog.log_text, "_summaries")
    summary_computed = Forward(SummaryLog.summary_computed, "_summaries")
    request_stop = Forward(Coordinator.request_stop, "coord")
    should_stop = Forward(Coordinator.should_stop, "coord")
    stop_on_exception = Forward(Coordinator.stop_on_exception, "coord")
    wait_for_stop = Forward(Coordinator.wait_for_stop, "coord")
    start_standard_services = Forward(Tf1Surface.start_standard_services, "_surface")
    start_queue_runners = Forward(Tf1Surface.start_queue_runners, "_surface")
    loop = Forward(Tf1Surface.loop, "_surface")
    commit_checkpoint = Forward(StepBoundary.commit_checkpoint, "_boundary")
    waiting = Forward(StepBoundary.waiting, "_boundary")
    warm_up = Forward(WarmUps.warm_up, "_warm_ups")
    # the collaborators' values that TF's Supervisor does not have (a subclass may shadow them)
    graph: ForwardValue[Any] = ForwardValue("_surface", "The program's tf.Graph in graph mode; None in eager mode.")
    local_init_op: ForwardValue[Any] = ForwardValue("_surface", "The local init op (graph mode: the one given or the default built).")
    logdir: ForwardValue[Optional[str]] = ForwardValue("_surface", "The logdir (the launch's under procsv launch), or None without one.")
    summaries_dropped: ForwardValue[int] = ForwardValue("_summaries", "Summaries this process had to drop so far.")
