"""The configurable limits the watchdog's decisions depend on.

Runs in the watchdog. Plain data, no behaviour: :meth:`procsv.watchdog.config.LaunchConfig.limits`
builds one :class:`Limits` from the command line, and the decision function
(:func:`procsv.watchdog.rules.decide.decide`) and its rule modules read it. Imported by the pure rule
modules, so it imports only pure ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from procsv.watchdog.rules.chaos import ChaosPlan
from procsv.watchdog.rules.hang import HangLimits
from procsv.watchdog.rules.policy import RestartPolicy


@dataclass(frozen=True)
class Limits:
    """Everything configurable that the decisions depend on."""

    restart: RestartPolicy = RestartPolicy()
    hang: HangLimits = HangLimits(600.0, 1800.0)
    stop_grace_secs: float = 120.0
    hang_grace_secs: float = 10.0
    service_restart_limit: int = 5  # service deaths within the window before the run gives up
    service_restart_window: float = 60.0
    zygote_wait: float = 120.0  # how long the first trainer waits for the pre-warmed trainer
    zygote_retry_secs: float = 10.0  # a lost pre-warmed trainer is started again after this, doubled per loss
    zygote_retry_cap: float = 600.0  # ... at most this long
    zygote_retries: int = 5  # losses in a row after which it is not started again (observe.zygote_changed counts them)
    services_grace_secs: float = 30.0  # at the end, how long services may take to flush and exit
    # rules 2 and 6: a process that leaves foreign stops to the watchdog (state.LEAVES_STOPS) still live
    # this long after its SIGTERM gets it again. A job-wide SIGTERM it had not read yet swallows the
    # watchdog's: a standard signal already pending is not queued twice, and the one read names the job's sender
    stop_resend_secs: float = 2.0
    stall_factor: float = 3.0  # no commit for this many save intervals while steps complete: a stall
    stall_floor_secs: float = 10.0  # ... but never sooner than this (a commit takes time)
    loading_limit_secs: float = 900.0  # a service loading what it needs (TensorFlow) is stuck only after this
    checkpoint_failure_limit: int = 3  # consecutive failed commits that stop the run (0: never)
    # a trainer that fails before its first step with one of these (the type named in its error
    # file) cannot start this way however often it is restarted: give up at once
    permanent_errors: frozenset[str] = frozenset({"UsageError", "NoRestorableCheckpoint", "MismatchedCheckpoint",
                                                  "SyntaxError", "IndentationError", "TabError"})
    # a trainer that fails with one of these at any step failed as a program, not as a process: a
    # restart would resume from the last checkpoint and meet the same failure again
    program_errors: frozenset[str] = frozenset({"NanLossDuringTrainingError"})
    chaos: Optional[ChaosPlan] = None
    nproc: int = 1  # trainers in the group (--nproc): task 0 the chief (procsv.watchdog.rules.group)
    group_grace_secs: float = 0.5  # a group's survivors get SIGTERM, then SIGKILL after this (rule 11)
    nnodes: int = 1  # hosts of the job (--nnodes): each runs nproc of the group's trainers
    node_timeout: float = 15.0  # --node-timeout: a host whose agent is silent this long is lost (its members are dead)
    rejoin_timeout: float = 300.0  # a lost (or never joined) host may take this long to come back
    min_nodes: int = 0  # --min-nodes K: past rejoin_timeout the group trains on without a host while K are left (0: off)
    ps: int = 0  # --ps N: parameter-server tasks; > 0: nproc is --workers and each task restarts alone (rule 14)
    coordinator: bool = False  # --coordinator (with --ps): the workers are servers, TARGET runs once as the chief
    worker_give_up: str = "continue"  # --on-worker-give-up: a --ps worker given up on stops the run, or not (rule 14)

    @property
    def elastic(self) -> bool:
        """Whether a group over hosts trains on without a host that stays away (``--min-nodes``, rule 15)."""
        return self.nnodes > 1 and 0 < self.min_nodes < self.nnodes and not self.ps

    @property
    def world(self) -> int:
        """The group's size over every host (with ``--ps``: the workers, spread over the hosts)."""
        return self.nproc if self.ps else self.nproc * self.nnodes
