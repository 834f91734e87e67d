"""One warning per process for each kind of thing a program does that procsv keeps but cannot honour.

Runs in the trainer process, wherever a TF1 argument or call has no TF2 meaning (the Supervisor's
arguments, the hooks, the shims of ``sv.saver``). The warning goes to the ``procsv.train`` logger
once per ``key`` per process. A low room: it imports nothing of procsv, so every room of the
trainer can use it.
"""

from __future__ import annotations

import logging

logger = logging.getLogger("procsv.train")

_warned: set[str] = set()


def warn_once(key: str, message: str) -> None:
    """Log ``message`` as a warning the first time ``key`` is seen in this process."""
    if key in _warned:
        return
    _warned.add(key)
    logger.warning("procsv.train: %s", message)
