"""``procsv launch``'s configuration: the parsed command line, checked, and the limits it sets.

Runs in the watchdog (and in the CLI, which builds it). :func:`check_target` refuses a TARGET
that cannot run before anything starts; :meth:`LaunchConfig.limits` is what the decision
function (:mod:`procsv.watchdog.rules.decide`) is given.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import sys
from dataclasses import dataclass, field
from typing import Optional

from procsv.common.env import GROUP_SNAPSHOT_DEFAULT, MAX_SKIPS, ON_NONFINITE, ON_SPIKE, SKIP_WINDOW
from procsv.common.errors import UsageError
from procsv.watchdog.rules.chaos import parse_chaos
from procsv.watchdog.rules.findings import SUSPECT_AFTER
from procsv.watchdog.rules.limits import Limits
from procsv.watchdog.rules.hang import HangLimits
from procsv.watchdog.logrotate import DEFAULT_KEEP
from procsv.watchdog.rules.policy import RestartPolicy


@dataclass(frozen=True)
class TrainerSettings:
    """What the launch tells every trainer besides its coordinates (each read by the trainer's
    :class:`procsv.common.bootstrap.ChildConfig`), and what the watchdog makes of their findings
    (``suspect_after``)."""

    on_nonfinite: Optional[str] = None  # --on-nonfinite: rollback | stop | continue (None: the Supervisor's)
    max_skips: int = 3  # --max-skips: skipped steps allowed within --skip-window steps
    skip_window: int = 1000  # --skip-window
    # K: a group's members' in-memory snapshots every K steps (0: none), from the launch's environment
    # (PROCSV_MEMORY_SNAPSHOTS, PROCSV_GROUP_SNAPSHOT_STEPS: procsv.launch_args.group_snapshot_steps)
    group_snapshot_steps: int = GROUP_SNAPSHOT_DEFAULT
    on_spike: Optional[str] = None  # --on-spike: rollback | stop | warn | off (None: the Supervisor's)
    # --suspect-after: a host's transient faults (loss spikes not again when replayed) in a launch that make it
    # reported as suspect (procsv.watchdog.rules.findings); the watchdog's own, not told to the trainers
    suspect_after: int = SUSPECT_AFTER
    audit: str = "off"  # --audit: off | sampled | every (issue 71: procsv.watchdog.audit); the watchdog's own

    def nonfinite_env(self) -> dict[str, str]:
        """What the trainer is told of --on-nonfinite, --on-spike, --max-skips and --skip-window
        (procsv.trainer.nonfinite)."""
        out = {MAX_SKIPS: str(self.max_skips), SKIP_WINDOW: str(self.skip_window)}
        if self.on_nonfinite is not None:
            out[ON_NONFINITE] = self.on_nonfinite
        if self.on_spike is not None:
            out[ON_SPIKE] = self.on_spike
        return out


@dataclass(frozen=True)
class HangSettings:
    """What the launch is told of hangs: ``--hang-timeout`` (a step's upper bound), ``--startup-timeout``,
    ``--hang-grace-secs`` (SIGTERM to SIGKILL) and ``--stuck-secs`` (no step and no activity: a hang)."""

    timeout: float = 600.0
    startup_timeout: float = 1800.0
    grace_secs: float = 10.0
    stuck_secs: float = 10.0


@dataclass
class LaunchConfig:
    """The launch's command line."""

    target: str
    args: list[str]
    logdir: str
    max_restarts: int = 10
    stop_grace_secs: float = 120.0
    quiet: bool = False
    hang: HangSettings = HangSettings()  # --hang-timeout, --startup-timeout, --hang-grace-secs, --stuck-secs
    chaos: Optional[str] = None
    prewarm: bool = True
    standby: str = "auto"  # --standby: auto | hot | fork | off (procsv.watchdog.rules.standby)
    preload: list[str] = field(default_factory=list)
    allow_reinit: bool = False  # --allow-reinit: passed to the trainer as PROCSV_ALLOW_REINIT
    cwd: str = field(default_factory=os.getcwd)
    on_checkpoint_failure: str = "stop"  # stop | continue
    trainer: TrainerSettings = TrainerSettings()  # --on-nonfinite, --on-spike, --max-skips, --skip-window, --suspect-after; a group's K
    keep_logs: int = DEFAULT_KEEP  # --keep-logs: per-attempt log files kept per role besides attempt 1's
    on_failure: Optional[str] = None  # --on-failure CMD: run once when the run ends failed
    metrics_port: Optional[int] = None  # --metrics-port: serve Prometheus metrics there
    metrics_host: str = "127.0.0.1"  # --metrics-host
    nproc: int = 1  # --nproc: trainers in the group (procsv.watchdog.rules.group)
    group_grace_secs: float = 0.5  # --group-grace-secs
    ps: int = 0  # --ps N (with --workers M, which sets nproc): parameter servers (procsv.watchdog.rules.tasks)
    coordinator: bool = False  # --coordinator: TF2 ParameterServerStrategy (the workers are servers too)
    worker_give_up: str = "continue"  # --on-worker-give-up: stop | continue (procsv.watchdog.rules.tasks)
    nnodes: int = 1  # --nnodes: hosts of the job (procsv.watchdog.rules.hosts)
    node_rank: int = 0  # --node-rank: 0 is the master (this Watchdog), others run a NodeAgent
    master_addr: Optional[str] = None  # --master-addr HOST:PORT: node 0 binds it, the others connect
    rejoin_timeout: float = 300.0  # --rejoin-timeout
    min_nodes: int = 0  # --min-nodes: an elastic group over hosts (procsv.watchdog.rules.membership); 0: every host
    logdir_timeout: float = 60.0  # --logdir-timeout: seconds of failed looks at the logdir that lose it
    node_timeout: float = 15.0  # --node-timeout: node 0's, for its agents and (sent to them) for itself
    preempt_signal: int = 12  # --preempt-signal (SIGUSR2): a stop like SIGTERM's, handled by the watchdog only
    job_id: Optional[str] = None  # the scheduler's job id (SLURM_JOB_ID): names the run in status and metrics

    @property
    def busy_timeout(self) -> Optional[float]:
        """How long a trainer may be busy on purpose (a snapshot, its final checkpoint) before it is
        hung: a step's limit plus the time the final checkpoint may take."""
        return self.hang.timeout + self.stop_grace_secs if self.hang.timeout > 0 else None

    def limits(self) -> Limits:
        return Limits(restart=RestartPolicy(max_restarts=self.max_restarts),
                      hang=HangLimits(self.hang.timeout, self.hang.startup_timeout, self.busy_timeout,
                                      stuck_secs=self.hang.stuck_secs),
                      stop_grace_secs=self.stop_grace_secs, hang_grace_secs=self.hang.grace_secs,
                      checkpoint_failure_limit=3 if self.on_checkpoint_failure == "stop" else 0,
                      chaos=parse_chaos(self.chaos) if self.chaos else None, nproc=self.nproc,
                      group_grace_secs=self.group_grace_secs, nnodes=self.nnodes,
                      rejoin_timeout=self.rejoin_timeout, node_timeout=self.node_timeout, ps=self.ps,
                      min_nodes=self.min_nodes,
                      coordinator=self.coordinator, worker_give_up=self.worker_give_up)


def check_ps(ps: int, workers: int, nproc: int, nnodes: int, standby: str, worker_give_up: Optional[str] = None) -> None:
    """Raise UsageError for ``--ps N --workers M`` (TF1 between-graph replication) combined wrongly:
    both or neither, N >= 1 and M >= 1, never with ``--nproc`` (a MultiWorkerMirroredStrategy group),
    fewer workers than ``--nnodes`` hosts, or ``--standby hot`` (a standby replaces one trainer)."""
    if ps == 0 and workers == 0:
        if worker_give_up is not None:
            raise UsageError(f"--on-worker-give-up {worker_give_up} goes with --ps N --workers M (a worker given "
                             "up on there may leave the others training); without --ps a give-up ends the run")
        return
    if ps < 0 or workers < 0:
        raise UsageError(f"--ps and --workers must be >= 1, not --ps {ps} --workers {workers}")
    if nproc != 1:
        raise UsageError(f"--nproc {nproc} with --ps/--workers: --nproc runs a MultiWorkerMirroredStrategy group, "
                         "--ps N --workers M parameter servers and workers; use one or the other")
    if ps == 0 or workers == 0:
        raise UsageError("--ps N and --workers M go together (N parameter servers, M workers running TARGET, "
                         f"worker 0 the chief), not --ps {ps} --workers {workers}")
    if workers < nnodes:
        raise UsageError(f"--workers {workers} over --nnodes {nnodes}: every host runs at least one worker "
                         "(the parameter servers and the chief run on node 0)")
    if standby == "hot":
        raise UsageError("--standby hot needs a single trainer; with --ps/--workers each task restarts alone "
                         "from the pre-warmed trainer (--standby fork, the default with --ps)")


def check_target(target: str, cwd: str) -> None:
    """Raise UsageError if TARGET is neither an existing .py file nor an importable module, or if
    its own source does not compile (a syntax error: nothing is started then)."""
    if target.endswith(".py") or os.sep in target:
        path = os.path.join(cwd, target)
        if not os.path.isfile(path):
            raise UsageError(f"training script {target!r} does not exist (looked in {cwd}); check the path, "
                             "or pass an importable module name (procsv launch my_pkg.train ...)")
        _check_syntax(target, path)
        return
    sys.path.insert(0, cwd)
    try:
        spec = importlib.util.find_spec(target)
    except (ImportError, ValueError) as exc:
        raise UsageError(f"cannot find training module {target!r}: {exc}") from None
    finally:
        sys.path.remove(cwd)
    if spec is None:
        raise UsageError(f"cannot find training module {target!r} (not importable from {cwd}); "
                         "pass an importable module name or a path to a .py file")
    if spec.origin and spec.origin.endswith(".py"):
        _check_syntax(target, spec.origin)


def program_fingerprint(target: str, args: list[str], cwd: str) -> str:
    """What the training program is, for the audit's intervals carried to the next launch (issue 71): TARGET, its
    arguments and a digest of its own source file (a module's as found from ``cwd``; empty when none is found). A
    replay by another program, or with other arguments, would differ from an earlier launch's checkpoints without a
    fault: such intervals are not carried in (:func:`procsv.watchdog.audit.carry.carry_in`)."""
    path: Optional[str] = os.path.join(cwd, target) if target.endswith(".py") or os.sep in target else None
    if path is None:
        sys.path.insert(0, cwd)
        try:
            spec = importlib.util.find_spec(target)
            path = spec.origin if spec is not None else None
        except (ImportError, ValueError):
            path = None
        finally:
            sys.path.remove(cwd)
    try:
        with open(path or "", "rb") as fh:
            source = hashlib.blake2b(fh.read(), digest_size=8).hexdigest()
    except OSError:
        source = ""
    return json.dumps([target, *args, source])


def platform_fingerprint() -> str:
    """What the program runs on, for the audit's intervals carried to the next launch (issue 71): TensorFlow's
    version, the CPU's model, a digest of its flags (the instruction sets the kernels are chosen by) and the CPUs
    this process may run on (the threads a kernel splits its work over). An interval committed on another kind of
    machine, or by another TensorFlow, could replay otherwise without a fault: a false verdict rolling the user's
    work back (:func:`procsv.watchdog.audit.carry.carry_in`); said in the line that leaves it unaudited."""
    try:
        tf = importlib.metadata.version("tensorflow")
    except importlib.metadata.PackageNotFoundError:
        tf = "?"
    model, flags = "", ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                key = key.strip()
                if key in ("model name", "Hardware", "CPU part") and not model:
                    model = value.strip()
                elif key in ("flags", "Features") and not flags:
                    flags = hashlib.blake2b(value.strip().encode(), digest_size=4).hexdigest()
                if model and flags:
                    break
    except OSError:
        pass
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 0
    return f"TensorFlow {tf}, {model or platform.machine()} ({cpus} CPUs, flags {flags or '?'})"


def _check_syntax(target: str, path: str) -> None:
    """UsageError naming the file, line and problem if the source at ``path`` does not compile."""
    try:
        with open(path, "rb") as fh:
            compile(fh.read(), path, "exec", dont_inherit=True)
    except SyntaxError as exc:
        raise UsageError(f"training module {target!r} has a syntax error: {exc.msg} ({path}, line {exc.lineno}); "
                         "fix it and launch again") from None
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read training module {target!r} ({path}): {exc}") from None
