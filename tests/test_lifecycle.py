"""procsv.watchdog.rules.lifecycle.transition: the legal state changes of a process and of a run."""

from __future__ import annotations

import itertools

import pytest

from procsv.common.errors import ProcsvError
from procsv.watchdog.rules.lifecycle import IllegalTransition, ProcState, RunState, transition

P, R = ProcState, RunState

PROC_LEGAL = {
    (P.STARTING, P.RUNNING), (P.STARTING, P.STOPPING), (P.STARTING, P.EXITED), (P.STARTING, P.FAILED),
    (P.RUNNING, P.STOPPING), (P.RUNNING, P.EXITED), (P.RUNNING, P.FAILED),
    (P.STOPPING, P.EXITED), (P.STOPPING, P.FAILED),
    (P.EXITED, P.RESTARTING), (P.EXITED, P.STARTING),
    (P.FAILED, P.RESTARTING), (P.FAILED, P.STARTING),
    (P.RESTARTING, P.STARTING), (P.RESTARTING, P.EXITED), (P.RESTARTING, P.FAILED),
    # a hot standby: promoted (starting), or stopped, or ended
    (P.STANDBY, P.STARTING), (P.STANDBY, P.STOPPING), (P.STANDBY, P.EXITED), (P.STANDBY, P.FAILED),
}
RUN_LEGAL = {(R.RUNNING, R.SUCCEEDED), (R.RUNNING, R.FAILED), (R.RUNNING, R.STOPPED)}

PROC_ILLEGAL = sorted(
    (a, b) for a, b in itertools.product(P, P) if a != b and (a, b) not in PROC_LEGAL
)
RUN_ILLEGAL = sorted(
    (a, b) for a, b in itertools.product(R, R) if a != b and (a, b) not in RUN_LEGAL
)


def _id(edge):
    return f"{edge[0].value}->{edge[1].value}"


@pytest.mark.parametrize("edge", sorted(PROC_LEGAL | RUN_LEGAL), ids=_id)
def test_legal_edge_returns_the_new_state(edge):
    current, new = edge
    assert transition(current, new) is new


@pytest.mark.parametrize("edge", PROC_ILLEGAL + RUN_ILLEGAL, ids=_id)
def test_illegal_edge_raises(edge):
    current, new = edge
    with pytest.raises(IllegalTransition):
        transition(current, new)


@pytest.mark.parametrize(
    "edge",
    [(P.EXITED, P.RUNNING), (P.FAILED, P.RUNNING), (P.STOPPING, P.RUNNING), (P.RUNNING, P.STARTING),
     (P.RESTARTING, P.RUNNING), (P.STOPPING, P.STARTING),
     (R.SUCCEEDED, R.RUNNING), (R.FAILED, R.RUNNING), (R.STOPPED, R.RUNNING), (R.SUCCEEDED, R.FAILED)],
    ids=_id,
)
def test_notable_illegal_edges_raise_naming_both_states(edge):
    current, new = edge
    with pytest.raises(IllegalTransition) as info:
        transition(current, new)
    assert current.value in str(info.value) and new.value in str(info.value)


@pytest.mark.parametrize("state", list(P) + list(R), ids=lambda s: f"{type(s).__name__}.{s.value}")
def test_same_state_is_a_no_op(state):
    assert transition(state, state) is state


@pytest.mark.parametrize("state", [R.SUCCEEDED, R.FAILED, R.STOPPED])
def test_finished_run_states_are_terminal(state):
    for other in R:
        if other is not state:
            with pytest.raises(IllegalTransition):
                transition(state, other)


def test_a_full_restart_cycle_is_legal():
    path = [P.STARTING, P.RUNNING, P.FAILED, P.RESTARTING, P.STARTING, P.RUNNING, P.STOPPING, P.EXITED]
    state = path[0]
    for nxt in path[1:]:
        state = transition(state, nxt)
    assert state is P.EXITED


def test_illegal_transition_is_a_procsv_error():
    assert issubclass(IllegalTransition, ProcsvError)


def test_states_serialize_as_their_plain_names():
    assert [s.value for s in P] == ["starting", "running", "stopping", "exited", "failed", "restarting", "standby"]
    assert [s.value for s in R] == ["running", "succeeded", "failed", "stopped"]
    assert P.RUNNING == "running"
