"""The watchdog's restart decision, as a pure function of what happened and a random draw.

Runs in the watchdog, but reads no clock and touches no process: :func:`decide` takes the
history so far and the facts of one trainer exit, and returns what to do and the new history.
Tests drive it with plain values.

Rules:

* exit code 0 -> finished; any exit while a stop was requested -> stopped.
* a preemption -> restart at once; it is not a failure. A preemption is exit code 42
  (:data:`procsv.common.exitcodes.EXIT_PREEMPTED`) *with* the trainer's exit report saying that a
  SIGTERM/SIGINT stopped it and its checkpoint committed (``TrainerExit.preempted``). A 42 the
  program returns itself is a failure like any other exit code.
* exit code 4 (:data:`procsv.common.exitcodes.EXIT_DIVERGING`): the trainer stopped because its
  training diverged (non-finite values it could not roll back past, or a loss spike it stopped on:
  ``TrainerExit.spiked``, and the line says which): give up, no restart (one would resume from the newest
  good checkpoint and meet the same numbers again); the launch exits 4.
* exit code 5 (:data:`procsv.common.exitcodes.EXIT_GROUP_ROLLBACK`) with the step a member of the
  group reported non-finite (``TrainerExit.rollback_step``): the group's rollback under
  ``--on-nonfinite rollback`` (the member checked ``--max-skips``): restart at once, skipping that
  step; not a failure, and not counted in ``History.restarts`` (the run counts it as a rollback). Without the step (its report lost) it is a failure like any other; with a
  step the run skipped before (``TrainerExit.skipped``: the group met it again, so its program does
  not skip) it gives up as diverging, since a restart would meet it again.
* a trainer that fails *on its own* (an exception, a non-zero exit, SIGSEGV/SIGABRT/SIGBUS) before
  completing its first step is a *startup failure*; two in a row mean the program cannot start
  (bad import, bad arguments): give up, no restart storm. A death by a signal from outside
  (``TrainerExit.killed_from_outside``: SIGKILL, SIGTERM, ... from the OOM killer, a flapping node,
  a user) says nothing about whether the program can start: it leaves that count as it was and goes
  through the rest of the policy (backoff, ``max_restarts``).
* otherwise restart. The first failure after progress restarts at once; each further failure
  without progress waits ``base * factor**(n-2)`` seconds (capped, with +-``jitter`` spread).
* progress -- a checkpoint committed since the last (re)start (a group's: or an in-memory snapshot
  of every member held by the checkpoint service, which the next group restores) -- resets the
  failure count, so a run that crashes often but keeps checkpointing goes on for as long as it needs.
* more than ``max_restarts`` failures without progress: give up.
* the same failure again: a trainer that fails on its own with the exception, message and place of
  the failure before it, after as many steps of its attempt (``TrainerExit.fingerprint``: a
  deterministic error, such as one after training in a program that counts its epochs, not the global
  step), ``same_failure_limit`` times in a row (a kill from outside in between leaves the count as it
  was; any other end resets it): give up at once. Progress does not reset this count: such an attempt
  "progresses" (its in-memory snapshot is persisted after its death) and restarted at once, dozens of
  times a minute. A failure at another step of the attempt, or another one, starts the count again:
  a run that crashes at varying steps goes on for as long as it commits. The checkpoints are kept;
  the line names the failure.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace
from typing import Optional

from procsv.common.exitcodes import EXIT_DIVERGING, EXIT_GROUP_ROLLBACK, EXIT_PREEMPTED


class Action(str, enum.Enum):
    """What the restart policy says about a trainer that ended."""

    FINISH = "finish"
    STOPPED = "stopped"
    RESTART = "restart"
    GIVE_UP = "give_up"


@dataclass(frozen=True)
class RestartPolicy:
    """The restart policy's limits: restarts without progress, backoff, start-up failures."""

    max_restarts: int = 10
    backoff_base: float = 1.0
    backoff_factor: float = 2.0
    backoff_cap: float = 30.0
    jitter: float = 0.1
    startup_failure_limit: int = 2
    same_failure_limit: int = 3


@dataclass(frozen=True)
class History:
    """The restart counts the policy carries from one trainer exit to the next."""

    restarts: int = 0  # every restart of the run, for reporting (a group's rollback is none: a rollback)
    failures_without_progress: int = 0
    startup_failures_in_a_row: int = 0
    same_failures_in_a_row: int = 0  # the same failure (fingerprint) in a row
    last_fingerprint: Optional[tuple[str, str, str, int]] = None  # the failure those were


@dataclass(frozen=True)
class TrainerExit:
    """What the policy is told about a trainer that ended: its status and what it achieved."""

    code: int  # >= 0 exit status, < 0 killed by signal -code (subprocess's convention)
    completed_a_step: bool
    made_progress: bool  # a checkpoint committed since this attempt started (a group's: or held in memory whole)
    stop_requested: bool
    preempted: bool = False  # code 42 and its exit report: stopped by SIGTERM/SIGINT, checkpoint committed
    killed_from_outside: bool = False  # killed by SIGKILL/SIGTERM/... from another process (not a hang kill)
    rollback_step: Optional[int] = None  # the first step a member of its group reported non-finite
    skipped: tuple[int, ...] = ()  # the steps the run skipped so far
    # its exception's type, message, place and the steps of the attempt before it (None: no error file, or no steps said)
    fingerprint: Optional[tuple[str, str, str, int]] = None
    spiked: bool = False  # exit 4 on a loss spike (--on-spike stop, or a rollback that could not be), not non-finite values


@dataclass(frozen=True)
class Decision:
    """The policy's verdict: the action, the delay before a restart, the reason, the new history."""

    action: Action
    delay: float
    reason: str
    history: History
    skip: Optional[int] = None  # a group's rollback: the restarted group skips this step


def backoff(policy: RestartPolicy, failures: int, draw: float) -> float:
    """Delay before restart number ``failures`` (1-based) without progress; ``draw`` in [0, 1)."""
    if failures <= 1:
        return 0.0
    exponent = min(failures - 2, 64)  # beyond 2**64 every delay is the cap anyway; no float overflow
    raw = min(policy.backoff_cap, policy.backoff_base * policy.backoff_factor ** exponent)
    return max(0.0, raw * (1.0 + policy.jitter * (2.0 * draw - 1.0)))


def decide(policy: RestartPolicy, history: History, ex: TrainerExit, draw: float) -> Decision:
    if ex.stop_requested:
        return Decision(Action.STOPPED, 0.0, "stop requested", history)
    if ex.code == 0:
        return Decision(Action.FINISH, 0.0, "trainer finished", history)
    if ex.code == EXIT_DIVERGING:
        return Decision(Action.GIVE_UP, 0.0,
                        f"the trainer is diverging: it stopped with exit code {EXIT_DIVERGING} on "
                        + ("a loss spike (a restart would resume from the newest checkpoint before it and meet it again)"
                           if ex.spiked else "non-finite values (a restart would resume from the newest finite "
                           "checkpoint and meet them again)"), history)
    if ex.code == EXIT_GROUP_ROLLBACK and ex.rollback_step in ex.skipped:
        return Decision(Action.GIVE_UP, 0.0, f"the trainer group is diverging: it found the loss of step "
                        f"{ex.rollback_step} non-finite again after a rollback that was to skip it (its program does "
                        "not skip a step: a restart would meet it again)", history)
    if ex.code == EXIT_GROUP_ROLLBACK and ex.rollback_step is not None:
        return Decision(Action.RESTART, 0.0, f"the trainer group rolls back: a member found the loss of step "
                        f"{ex.rollback_step} non-finite (or spiking, from that step on); every member restores the newest state before it and skips it",
                        history, skip=ex.rollback_step)
    if ex.preempted and ex.code == EXIT_PREEMPTED:
        return Decision(Action.RESTART, 0.0, "trainer was preempted after saving its state",
                        History(history.restarts + 1, 0, 0))
    failures = 1 if ex.made_progress else history.failures_without_progress + 1
    if ex.completed_a_step:
        startup = 0
    elif ex.killed_from_outside:
        startup = history.startup_failures_in_a_row  # not the program's failure: the count neither grows nor resets
    else:
        startup = history.startup_failures_in_a_row + 1
    same, fingerprint = same_failure(history, ex)
    new = History(history.restarts, failures, startup, same, fingerprint)
    if not ex.killed_from_outside and startup >= policy.startup_failure_limit:
        return Decision(Action.GIVE_UP, 0.0,
                        f"the start-up failure rule: the trainer failed on its own before its first step {startup} "
                        "times in a row (start-up failure)", new)
    if fingerprint is not None and same >= policy.same_failure_limit:
        kind, message, place, steps = fingerprint
        return Decision(Action.GIVE_UP, 0.0,
                        f"the trainer failed the same way {same} times in a row ({kind}: {message}"
                        f"{f' at {place}' if place else ''}, {steps} steps after each start): a restart would fail "
                        "again; fix the program and relaunch (its checkpoints are kept)", new)
    if failures > policy.max_restarts:
        return Decision(Action.GIVE_UP, 0.0,
                        f"the restart limit: {failures - 1} restarts without a new checkpoint "
                        f"(--max-restarts {policy.max_restarts})", new)
    return Decision(Action.RESTART, backoff(policy, failures, draw), "trainer failed", replace(new, restarts=history.restarts + 1))


def same_failure(history: History, ex: TrainerExit) -> tuple[int, Optional[tuple[str, str, str, int]]]:
    """The same-failure count and fingerprint after ``ex`` (pure): one more if it failed on its own as the
    failure before it did; as they were after a kill from outside; else a new count (1 with a fingerprint,
    0 without)."""
    if ex.killed_from_outside:
        return history.same_failures_in_a_row, history.last_fingerprint
    if ex.fingerprint is None:
        return 0, None
    if ex.fingerprint == history.last_fingerprint:
        return history.same_failures_in_a_row + 1, ex.fingerprint
    return 1, ex.fingerprint
