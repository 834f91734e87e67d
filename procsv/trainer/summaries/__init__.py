"""The trainer's summaries: call-site validation, a bounded buffer, and the hand-off to the summary service.

Runs in the trainer (any thread may log; the main thread sends at step boundaries). A bad tag or
value raises in the caller's frame (:mod:`.values`), so the summary service never sees garbage.
Logging only validates, reads eager values and appends to a bounded buffer (:mod:`.buffer`); the sender
(:mod:`.sender`) hands batches to the summary service at step boundaries without ever blocking,
keeps what the service has not yet acknowledged as written (its acks come back as messages on
the same ZeroMQ connection), and restates it when the service asks (after a restart); see
``services/summary/sessions.py`` for the rules on the other side. Histograms, images and text
travel as raw values: the service builds their TensorBoard summaries.
"""

from __future__ import annotations

from procsv.trainer.summaries.buffer import (BATCH_MAX, BUFFER_MAX, FLUSH_EVERY, ITEM_BYTES_MAX, ITEMS_MAX, Chunk,
                                             SummaryBuffer)
from procsv.trainer.summaries.sender import SummarySender, encode_chunk
from procsv.trainer.summaries.values import as_float, as_step, check_tag

__all__ = [
    "BATCH_MAX", "BUFFER_MAX", "FLUSH_EVERY", "ITEM_BYTES_MAX", "ITEMS_MAX", "Chunk", "SummaryBuffer", "SummarySender",
    "as_float", "as_step", "check_tag", "encode_chunk",
]
