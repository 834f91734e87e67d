"""The steps a run skipped before, read from its records (issue 52: a skipped step stays skipped).

Runs in the trainer's main thread, once per session, when it begins (:meth:`NonfiniteRollback.resume
<procsv.trainer.nonfinite.rollback.NonfiniteRollback.resume>`). The watchdog writes a
``step_skipped`` record to the run's ``logs/lifecycle.jsonl`` for each step a trainer skipped; a
restarted trainer, or the trainer of a relaunch in the same logdir, reads them here so that a step
skipped before it began is skipped again when its replay reaches it, instead of being met, retried
and skipped once more (which spends ``--max-skips``). Only lines naming ``step_skipped`` are parsed:
the file may be long. A group's members also take the steps the watchdog hands them when it starts
the group (``ChildConfig.skip_steps``: its record of a group rollback's skip is written by its disk
thread, which a new member's read may not wait for).
"""

from __future__ import annotations

import json
from typing import Optional

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


