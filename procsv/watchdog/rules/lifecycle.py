"""Lifecycle states of a run and of each of its processes, with their legal transitions.

Run by the watchdog (and read by ``procsv status``). States are ``str`` enums so that they appear
verbatim in ``status.json``; every change goes through :func:`transition`, which refuses an
illegal one instead of silently recording it.
"""

from __future__ import annotations

import enum

from procsv.common.errors import ProcsvError


class ProcState(str, enum.Enum):
    """One child process (trainer, checkpoint or summary service).

    ``starting`` -> ``running`` (sent Hello / first step) -> ``stopping`` (asked to stop) ->
    ``exited`` (code 0) or ``failed`` (non-zero or signal). A restart makes a new attempt, which
    starts again at ``starting``; ``failed``/``exited`` -> ``restarting`` marks the wait between.
    A hot-standby trainer starts as ``standby`` and becomes ``starting`` when promoted.
    """

    STARTING = "starting"
    RUNNING = "running"
    STOPPING = "stopping"
    EXITED = "exited"
    FAILED = "failed"
    RESTARTING = "restarting"
    STANDBY = "standby"


class RunState(str, enum.Enum):
    """The whole run, as ``procsv status`` reports it."""

    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"


_PROC_EDGES: dict[ProcState, frozenset[ProcState]] = {
    ProcState.STARTING: frozenset({ProcState.RUNNING, ProcState.STOPPING, ProcState.EXITED, ProcState.FAILED}),
    ProcState.RUNNING: frozenset({ProcState.STOPPING, ProcState.EXITED, ProcState.FAILED}),
    ProcState.STOPPING: frozenset({ProcState.EXITED, ProcState.FAILED}),
    ProcState.EXITED: frozenset({ProcState.RESTARTING, ProcState.STARTING}),
    ProcState.FAILED: frozenset({ProcState.RESTARTING, ProcState.STARTING}),
    ProcState.RESTARTING: frozenset({ProcState.STARTING, ProcState.EXITED, ProcState.FAILED}),
    ProcState.STANDBY: frozenset({ProcState.STARTING, ProcState.STOPPING, ProcState.EXITED, ProcState.FAILED}),
}

_RUN_EDGES: dict[RunState, frozenset[RunState]] = {
    RunState.RUNNING: frozenset({RunState.SUCCEEDED, RunState.FAILED, RunState.STOPPED}),
    RunState.SUCCEEDED: frozenset(),
    RunState.FAILED: frozenset(),
    RunState.STOPPED: frozenset(),
}


class IllegalTransition(ProcsvError):
    """A state change that the lifecycle table does not allow."""


def transition(current: ProcState | RunState, new: ProcState | RunState) -> ProcState | RunState:
    """Return ``new`` if ``current -> new`` is legal (or a no-op), else raise IllegalTransition."""
    if type(current) is not type(new):
        raise IllegalTransition(f"{current!r} -> {new!r} mixes process and run states")
    if current == new:
        return new
    edges = _PROC_EDGES if isinstance(current, ProcState) else _RUN_EDGES
    if new not in edges[current]:  # type: ignore[index]
        raise IllegalTransition(f"{current.value} -> {new.value} is not a legal transition")
    return new
