"""Every ``PROCSV_*`` environment variable, named once.

Imported by every process. The watchdog (or a Supervisor running without one) passes a child its
coordinates in these variables; the child reads them once, in :mod:`procsv.common.bootstrap`
(:class:`~procsv.common.bootstrap.ChildConfig`), and the helpers below validate the text of a few.
Nothing else in procsv spells a ``PROCSV_`` literal, and nothing else reads one from the
environment but :mod:`procsv.cli`, the launch's own entry, which hands the launch's environment to
pure functions (:func:`procsv.launch_args.group_snapshot_steps`, :mod:`procsv.watchdog.multihost.placement`).
"""

from __future__ import annotations

LOGDIR = "PROCSV_LOGDIR"  # the run's logdir (absolute)
RUNTIME_DIR = "PROCSV_RUNTIME_DIR"  # the run's private runtime directory (sockets, mutexes)
ROLE = "PROCSV_ROLE"  # trainer | checkpoint | summary | zygote | auditor
ATTEMPT = "PROCSV_ATTEMPT"  # 1, 2, ... per role
CONFIG_VERSION = "PROCSV_CONFIG_VERSION"  # the schema of these variables the parent wrote (bootstrap.CONFIG_VERSION)
PARENT_PID = "PROCSV_PARENT_PID"  # the process the child must die with
SUPERVISOR_PID = "PROCSV_SUPERVISOR_PID"  # the process that started the child (the watchdog, a node agent): its stops
WATCHDOG = "PROCSV_WATCHDOG"  # "1" when a watchdog supervises this child
DEATH_MUTEX = "PROCSV_DEATH_MUTEX"  # the trainer's death-notice mutex file
PREDECESSORS = "PROCSV_PREDECESSORS"  # "pid,pid": this host's earlier trainer processes not reaped yet (a trainer waits for their end)
ZYGOTE_FDS = "PROCSV_ZYGOTE_FDS"  # "read,write,say": the zygote's control pipe, its parent's stderr
PRELOAD = "PROCSV_PRELOAD"  # comma-separated modules the zygote imports too
CHECKPOINT_NICE = "PROCSV_CHECKPOINT_NICE"  # the checkpoint service's nice increment (default 10)
CHECKPOINT_FAILURE_LIMIT = "PROCSV_CHECKPOINT_FAILURE_LIMIT"  # failed commits in a row that stop training (0: never)
SAVE_DEADLINE = "PROCSV_SAVE_DEADLINE"  # seconds: the floor of a checkpoint's deadline (default 30)
SUMMARY_DEADLINE = "PROCSV_SUMMARY_DEADLINE"  # seconds the summary service may confirm nothing (default 30)
SUMMARY_CONTINUE = "PROCSV_SUMMARY_CONTINUE"  # plain python: the tag of the event file a summary service continues
ALLOW_REINIT = "PROCSV_ALLOW_REINIT"  # "1": start from step 0 if every committed checkpoint is corrupt
FAULT = "PROCSV_FAULT"  # tests only: "<process>:<point>[:<n>]" (procsv.common.faults), e.g. "checkpoint:before_rename" kills the service there
# once; "trainer:<point>[:<n>]" hangs the first trainer attempt there (snapshot, slot_complete: mid-copy)
FAULT_GATE = "PROCSV_FAULT_GATE"  # tests only: a file whose creation ends a stalling fault point's stall
AUDIT = "PROCSV_AUDIT"  # "S1:S2": this trainer is an auditor replaying the committed interval S1-S2 (issue 71)
STANDBY = "PROCSV_STANDBY"  # "1": this trainer is a hot standby (waits for SIGUSR1 before restoring)
SHADOW_RUN = "PROCSV_SHADOW_RUN"  # "0": a standby group's members skip the step's run on shadows (the watchdog's)
SHADOW_MEMORY = "PROCSV_SHADOW_MEMORY"  # bytes: the memory available at a standby group's fork (its members' one figure)
MEMORY_SNAPSHOTS = "PROCSV_MEMORY_SNAPSHOTS"  # the in-memory tier's share of loop time (default 0.01; 0: off)
RANK = "PROCSV_RANK"  # this trainer's task index in a group (procsv launch --nproc N): 0 is the chief
NPROC = "PROCSV_NPROC"  # the number of trainers in the group, over every host (1 without --nproc)
GROUP_HOSTS = "PROCSV_GROUP_HOSTS"  # the hosts the group runs on now (--nnodes; fewer with --min-nodes, rule 15)
PS = "PROCSV_PS"  # procsv launch --ps N --workers M: the parameter-server tasks (the workers are NPROC, RANK)
GROUP_PIN = "PROCSV_GROUP_PIN"  # a group's record of what its chief restored (procsv.trainer.replica.GroupPin)
GROUP_SNAPSHOT_STEPS = "PROCSV_GROUP_SNAPSHOT_STEPS"  # a group's in-memory snapshots every K steps (0: none)
GROUP_PEER_BIND = "PROCSV_GROUP_PEER_BIND"  # node 0's checkpoint service (--nnodes): the host its CURVE TCP ROUTER binds
GROUP_PEER_MAX_BYTES = "PROCSV_GROUP_PEER_MAX_BYTES"  # node 0's checkpoint service: the most it holds of one peer copy (default: its own members' snapshot memory)
GROUP_REMOTE = "PROCSV_GROUP_REMOTE"  # "1": a group member on host 1..M-1: its copies go to node 0's service over CURVE
ON_NONFINITE = "PROCSV_ON_NONFINITE"  # --on-nonfinite: rollback | stop | continue (procsv.trainer.nonfinite)
ON_SPIKE = "PROCSV_ON_SPIKE"  # --on-spike: rollback | stop | warn | off (procsv.trainer.nonfinite.spike)
MAX_SKIPS = "PROCSV_MAX_SKIPS"  # --max-skips: skipped steps allowed within --skip-window steps
SKIP_WINDOW = "PROCSV_SKIP_WINDOW"  # --skip-window
SKIP_STEPS = "PROCSV_SKIP_STEPS"  # a trainer: the steps the run skipped so far, every launch's, "40,70" (the watchdog's)
ROLLBACK_BEFORE = "PROCSV_ROLLBACK_BEFORE"  # a group restarted for its rollback of step B: "B" (its chief restores a state before B)
LAUNCH_START_STEP = "PROCSV_LAUNCH_START_STEP"  # a restarted trainer: the step the launch's first trainer began at
NONFINITE_CHECK = "PROCSV_NONFINITE_CHECK"  # "0": no non-finite detection at all (to measure what it costs)
GROUP_ROLLBACK = "PROCSV_GROUP_ROLLBACK"  # "restart": a trainer group's rollback always restarts every member (no
# verdict at its K-th steps; to compare and measure); else in place where it can be (procsv.trainer.nonfinite.group_verdict)
GRAPH_FAST_RUN = "PROCSV_GRAPH_FAST_RUN"  # "0": a graph session's runs all through Session.run (no callables)
MASTER_ADDR = "PROCSV_MASTER_ADDR"  # read by procsv launch: --master-addr when the flag is not given (Kubernetes)
PREEMPT_SIGNAL = "PROCSV_PREEMPT_SIGNAL"  # the number of --preempt-signal: every child of the run ignores it
# given to the --on-failure command (besides LOGDIR): how the run ended
EXIT_CODE = "PROCSV_EXIT_CODE"  # the launch's exit code
RUN_STATE = "PROCSV_RUN_STATE"  # failed
ROOT_CAUSE = "PROCSV_ROOT_CAUSE"  # one line: what ended the run (status.json's last_error)

ALL = (LOGDIR, RUNTIME_DIR, ROLE, ATTEMPT, CONFIG_VERSION, PARENT_PID, SUPERVISOR_PID, WATCHDOG, DEATH_MUTEX, PREDECESSORS, ZYGOTE_FDS, PRELOAD,
       CHECKPOINT_NICE, CHECKPOINT_FAILURE_LIMIT, SAVE_DEADLINE, SUMMARY_DEADLINE, ALLOW_REINIT, FAULT, EXIT_CODE,
       RUN_STATE, ROOT_CAUSE, MEMORY_SNAPSHOTS, STANDBY, AUDIT, SHADOW_RUN, SHADOW_MEMORY, RANK, NPROC, GROUP_HOSTS, GROUP_PIN, GROUP_SNAPSHOT_STEPS, GROUP_PEER_BIND, GROUP_PEER_MAX_BYTES, GROUP_REMOTE,
       ON_NONFINITE, ON_SPIKE, MAX_SKIPS, SKIP_WINDOW,
       SKIP_STEPS, ROLLBACK_BEFORE, LAUNCH_START_STEP, FAULT_GATE, NONFINITE_CHECK, GROUP_ROLLBACK, PS, MASTER_ADDR, PREEMPT_SIGNAL, SUMMARY_CONTINUE,
       GRAPH_FAST_RUN)


def memory_budget(text: str, default: float = 0.01) -> float:
    """The in-memory snapshot tier's share of the loop's time from ``text``, the value of
    :data:`MEMORY_SNAPSHOTS` (empty: unset; ``0`` or ``off``: the tier is off); a value that is not a
    fraction in [0, 0.5] is an error."""
    raw = text.strip().lower()
    if not raw:
        return default
    if raw in ("0", "off", "no", "false"):
        return 0.0
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0.0 <= value <= 0.5:
        raise ValueError(f"{MEMORY_SNAPSHOTS}={raw!r}: give the share of loop time in-memory snapshots may take, "
                         "a number from 0 (off) to 0.5, e.g. 0.01")
    return value


GROUP_SNAPSHOT_DEFAULT = 50  # steps between a group's in-memory snapshots unless PROCSV_GROUP_SNAPSHOT_STEPS says


def group_snapshot_steps(text: str, default: int = 0) -> int:
    """Every how many steps a trainer group's members take their in-memory snapshots, from ``text``, the
    value of :data:`GROUP_SNAPSHOT_STEPS` (``0``: none; empty: ``default``); not a whole number >= 0: an error."""
    raw = text.strip()
    if not raw:
        return default
    if not raw.isdigit():
        raise ValueError(f"{GROUP_SNAPSHOT_STEPS}={raw!r}: give the steps between a group's in-memory snapshots, "
                         "a whole number (0: none), e.g. 50")
    return int(raw)


def group_snapshot_steps_for(memory_snapshots: str, snapshot_steps: str) -> int:
    """The K the watchdog hands a group's members (:data:`GROUP_SNAPSHOT_STEPS`), from the launch's own
    :data:`MEMORY_SNAPSHOTS` and :data:`GROUP_SNAPSHOT_STEPS` (their text; empty: unset): the user's,
    else :data:`GROUP_SNAPSHOT_DEFAULT`; 0 with the in-memory tier off (:func:`memory_budget` 0). Over
    several hosts too: the members of hosts 1..M-1 hand theirs to node 0's checkpoint service over
    CURVE (:mod:`procsv.services.checkpoint.peers`, issue 54's point 2)."""
    if memory_budget(memory_snapshots) == 0:
        return 0
    return group_snapshot_steps(snapshot_steps, GROUP_SNAPSHOT_DEFAULT)
