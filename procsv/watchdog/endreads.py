"""What the watchdog reads at a child's end, read by the logdir reader thread, never by the loop.

Runs in the watchdog (``procsv launch``). At a child's death notice or exit the loop hands
:func:`read_end` to the reader thread (:class:`~procsv.watchdog.diskjobs.DiskJobs`) with the data it
needs, and goes on: the child's error file (``logs/<role>.<attempt>.error.json``, or the one it
spilled into the runtime directory), a trainer's exit report (read once, then removed) and, for a
trainer, the newest checkpoint committed since its attempt began that the watchdog has not heard
of (:func:`procsv.common.manifests.newest_committed_since`). The loop turns the death into its
observation when the reads are done, or once :data:`READ_WAIT` has passed without them: then it
decides with what it knows, and the failure record says what could not be read
(:data:`UNREAD`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional, Sequence

from procsv.common.layout import Layout, read_json
from procsv.common.manifests import newest_committed_since
from procsv.watchdog.children import read_child_error
from procsv.watchdog.diskjobs import Job
from procsv.watchdog.rules.failures import ChildError, ExitReport

READ_WAIT = 3.0  # seconds the loop waits for the reads at a child's end before it decides without them
UNREAD = (f"its error file and exit report could not be read within {READ_WAIT:g} s: the logdir's filesystem "
          "stalls; decided without them")  # the failure record's note when the reads did not return in time


@dataclass(frozen=True)
class EndReads:
    """What was read at a child's end (None: not there, not its own, or not asked for)."""

    error: Optional[ChildError] = None
    report: Optional[ExitReport] = None
    committed: Optional[int] = None  # a commit of its attempt on disk the watchdog has not heard of


def read_end(layout: Layout, error_paths: Sequence[str], pid: int, report_path: Optional[str] = None,
             since: Optional[tuple[float, int]] = None) -> EndReads:
    """The reads at a child's end (in the reader thread). ``since``: (when its attempt began on the
    wall clock, the step above which a commit is unheard), for a trainer; ``report_path``: its exit
    report, removed once read (the runtime directory would gather one per preemption of a
    month-long run)."""
    committed = newest_committed_since(layout, *since) if since is not None else None
    error = read_child_error(error_paths, pid)
    report = None
    if report_path is not None:
        report = ExitReport.from_record(read_json(report_path), pid)
        try:
            os.unlink(report_path)
        except OSError:
            pass
    return EndReads(error, report, committed)


def taken(job: "Job[EndReads]") -> tuple[Optional[EndReads], str]:
    """The reads of a job that is done or past its bound, and the note for the failure record if
    they are missing."""
    if job.done and job.error is None and job.result is not None:
        return job.result, ""
    if job.done:
        return None, f"its error file could not be read: {type(job.error).__name__}: {job.error}"
    return None, UNREAD
