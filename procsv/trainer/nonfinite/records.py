"""The steps a run skipped before, read from its records (issue 52: a skipped step stays skipped).

Runs in the trainer's main thread, once per session, when it begins (:meth:`NonfiniteRollback.resume
<procsv.trainer.nonfinite.rollback.NonfiniteRollback.resume>`). The watchdog writes a
``step_skipped`` record to the run's ``logs/lifecycle.jsonl`` for each step a trainer skipped; a
restarted trainer, or the trainer of a relaunch in the same logdir, reads them here so that a step
skipped before it began is skipped again when its replay reaches it, instead of being met, retried
and skipped once more (which spends ``--max-skips``). Only lines naming ``step_skipped`` are parsed:
the file may be long. A group's members also read :func:`from_env`: the watchdog hands them the
run's skipped steps when it starts the group (its record of a group rollback's skip is written by
its disk thread, which a new member's read may not wait for).
"""

from __future__ import annotations

import json
import os
from typing import Optional

from procsv.common import env

MARK = b'"step_skipped"'


def skipped_steps(path: Optional[str]) -> list[int]:
    """The steps of every ``step_skipped`` record in the lifecycle file ``path``, sorted, each once
    (none: no file, or None; a torn or foreign line is passed over)."""
    if path is None:
        return []
    steps: set[int] = set()
    try:
        with open(path, "rb") as fh:
            for line in fh:
                if MARK not in line or not line.endswith(b"\n"):
                    continue
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if isinstance(rec, dict) and rec.get("event") == "step_skipped" and isinstance(rec.get("step"), int):
                    steps.add(int(rec["step"]))
    except OSError:
        return []
    return sorted(steps)


def from_env() -> list[int]:
    """The steps in ``PROCSV_SKIP_STEPS`` (``"40,70"``; unset or empty: none; anything not a step is passed over)."""
    out = []
    for part in os.environ.get(env.SKIP_STEPS, "").split(","):
        part = part.strip()
        if part.isdigit():
            out.append(int(part))
    return sorted(set(out))

