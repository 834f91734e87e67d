"""Exit codes that one process gives and another reads: plain constants, no I/O.

Imported by the trainer (which exits with them) and by the watchdog's pure rules
(:mod:`procsv.watchdog.rules`), which may import nothing that does I/O: this module imports nothing.
"""

from __future__ import annotations

# A trainer that a SIGTERM/SIGINT stopped after committing its emergency checkpoint exits with
# this code: "my state is saved, restart me" (TensorFlow's PreemptionCheckpointHandler uses 42 too).
EXIT_PREEMPTED = 42
