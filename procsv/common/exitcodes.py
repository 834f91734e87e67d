"""Exit codes that one process gives and another reads: plain constants, no I/O.

Imported by the trainer (which exits with them) and by the watchdog's pure rules
(:mod:`procsv.watchdog.rules`), which may import nothing that does I/O: this module imports nothing.
"""

from __future__ import annotations

# A trainer that a SIGTERM/SIGINT stopped after committing its emergency checkpoint exits with
# this code: "my state is saved, restart me" (TensorFlow's PreemptionCheckpointHandler uses 42 too).
EXIT_PREEMPTED = 42

# A trainer that stopped because its training diverged (non-finite loss or weights that procsv's
# --on-nonfinite policy could not roll back and skip past) exits with this code: "a restart would
# resume from the last finite checkpoint and meet the same numbers again": final, never restarted.
EXIT_DIVERGING = 4

# The exception type name (in the trainer's error file) of that stop: a death noticed with it waits
# for the exit status instead of restarting early.
DIVERGING_ERROR = "TrainingDiverged"
