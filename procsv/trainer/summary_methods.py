"""The Supervisor's summary methods (a mixin): ``log_scalar`` ... ``summary_computed``.

Runs in the trainer process. Every call validates here (TypeError/ValueError in the caller's
frame) and only appends to a bounded buffer; the hand-off to the summary service happens at step
boundaries. ``step`` defaults to the current step (the one running inside ``session.run``, else
the last completed).
"""

from __future__ import annotations

import time
from typing import Any, Mapping, Optional

from procsv.trainer.summaries import SummaryBuffer
from procsv.trainer.tf1_args import Tf1Choices


class SummaryMethods:
    _summaries: SummaryBuffer
    _step: int
    _tf1: Tf1Choices

    def log_scalar(self, tag: str, value: Any, step: Optional[int] = None) -> None:
        """Log one scalar (non-blocking). Raises TypeError/ValueError here for a bad tag or value."""
        self._summaries.scalar(tag, value, self._step if step is None else step, time.time())

    def log_scalars(self, values: Mapping[str, Any], step: Optional[int] = None) -> None:
        """Log several scalars of one step; if any is invalid, none is logged."""
        self._summaries.scalars(values, self._step if step is None else step, time.time())

    def log_histogram(self, tag: str, values: Any, step: Optional[int] = None, buckets: Optional[int] = None,
                      description: str = "") -> None:
        """Log the distribution of ``values`` (any shape), as ``tf.summary.histogram`` (30 buckets)."""
        self._summaries.histogram(tag, values, self._step if step is None else step, time.time(), buckets,
                                  description)

    def log_image(self, tag: str, images: Any, step: Optional[int] = None, max_outputs: int = 3,
                  description: str = "") -> None:
        """Log images: ``[k, h, w, c]`` (or one ``[h, w, c]``), c in 1-4, uint8 or floats in [0, 1]."""
        self._summaries.image(tag, images, self._step if step is None else step, time.time(), max_outputs,
                              description)

    def log_text(self, tag: str, text: Any, step: Optional[int] = None, description: str = "") -> None:
        """Log a string (or an array of strings), shown by TensorBoard's Text dashboard."""
        self._summaries.text(tag, text, self._step if step is None else step, time.time(), description)

    def summary_computed(self, sess: Any, summary: Any, global_step: Optional[int] = None) -> None:
        """Log a ``Summary`` proto (or its bytes, or a mapping of scalar tags to values).
        ``RuntimeError`` with ``summary_writer=None``, as TF."""
        if not self._tf1.writer:
            raise RuntimeError("Writing a summary requires a summary writer (Supervisor(summary_writer=None)).")
        step = self._step if global_step is None else global_step
        if isinstance(summary, Mapping):
            self.log_scalars(summary, step)
        else:
            self._summaries.proto(summary, step, time.time())

    @property
    def summaries_dropped(self) -> int:
        """Summaries this process had to drop so far (its bounded buffer overflowed while the service lagged)."""
        return self._summaries.dropped_total
