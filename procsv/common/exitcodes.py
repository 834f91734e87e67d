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

# A member of a trainer group (``procsv launch --nproc N``) that found a non-finite loss under
# ``--on-nonfinite rollback``, with the skip within ``--max-skips``, exits with this code: "restart the
# group; every member restores the newest state before the step I reported and skips that step".
# The step travels in its NonfiniteDetected report; the watchdog records the skip and restarts the group.
EXIT_GROUP_ROLLBACK = 5

# A standby group's member (``--nproc N``, before its promotion) whose run of the step on shadows did
# not complete (refused, or failed on its warm-up arguments) exits with this code: "my peers may wait in
# the step's collective for good; replace the standby group, and let every later one skip the run".
# The watchdog kills the rest of the group and marks the run's next standby groups "without shadow run".
EXIT_NO_SHADOW_RUN = 6

# A hot standby (before its promotion) that could not start what only one process may hold -- the
# program's own ``tf.train.Server`` on a port the live trainer holds (TensorFlow's mnist_replica) --
# exits with this code: "this program can have no hot standby". The watchdog prepares none for the rest
# of the run, says why once, and restarts fork from the zygote (``--standby fork``).
EXIT_NO_STANDBY = 7

# The exception type name (in the trainer's error file) of that stop: a death noticed with it waits
# for the exit status instead of restarting early.
DIVERGING_ERROR = "TrainingDiverged"
GROUP_ROLLBACK_ERROR = "GroupRollback"  # ... and of a group member's exit with EXIT_GROUP_ROLLBACK
# What a TrainingDiverged message on a loss spike says (procsv.trainer.nonfinite.spike_response: "...; --on-spike
# stop: stopping in order with exit code 4 ..."); a non-finite stop's says --on-nonfinite instead
SPIKE_DIVERGED = "; --on-spike "

# The exit codes of ``procsv launch`` (node 0's watchdog, and a node agent, which exits with the
# job's), as docs/guarantees.md lists them: what a scheduler's exit-code policy may name (a
# Kubernetes podFailurePolicy, examples/kubernetes/). 128+N is a signal N: after an orderly stop
# for SIGHUP/SIGINT/SIGTERM and the --preempt-signal (SIGUSR2, 12, by default), which procsv handles, and only when the
# checkpoint of the last step committed (else 1: procsv.watchdog.rules.judge.stop_saved); without one for
# SIGKILL, which no process can handle.
LAUNCH_EXIT_CODES: dict[int, str] = {
    0: "the trainer finished",
    1: "the run failed (start-up failure, too many restarts, a service dying, the logdir lost, a stop by a signal "
       "whose checkpoint of the last step did not commit)",
    2: "bad input (usage, a TARGET that cannot be found, a logdir not writable or in use)",
    3: "checkpoints kept failing to commit: training was stopped in order",
    EXIT_DIVERGING: "diverging: the trainer stopped because its training diverged; never restarted",
    70: "procsv itself failed (an internal error of the watchdog); the run was stopped in order",
    128 + 1: "stopped in order on SIGHUP (a closed ssh session or terminal, a killed tmux pane)",
    128 + 2: "stopped in order on SIGINT",
    128 + 15: "stopped in order on SIGTERM",
    128 + 12: "stopped in order on --preempt-signal, USR2 by default (another SIG: 128+SIG); the last step committed",
    128 + 9: "killed by SIGKILL (the OOM killer, or a kubelet once the grace period ran out): no orderly stop",
}
