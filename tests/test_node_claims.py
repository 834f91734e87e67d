"""Which agent speaks for a node rank of a job that spans hosts: :func:`claim_node`, pure.

The master binds a node rank to the first CURVE key that claims it in a launch; another key's
claim is refused while the holder's host is connected, and wins once the decision function has
found that host lost (a relaunched agent makes a new key pair). Driven here with a fake clock
through the same observation (``observe.node_hello``), rule (``host_actions``) and bookkeeping
(``note``) the watchdog uses; the multi-host tests with real processes are in ``test_hosts.py``.
"""

from __future__ import annotations

from procsv.ipc.messages import NodeHello
from procsv.watchdog import observe
from procsv.watchdog.rules.bookkeeping import note
from procsv.watchdog.rules.hang import HangLimits
from procsv.watchdog.rules.hosts import Claim, claim_node, host_actions
from procsv.watchdog.rules.lifecycle import RunState
from procsv.watchdog.rules.limits import Limits
from procsv.watchdog.rules.state import RunView

LIMITS = Limits(hang=HangLimits(None, None), nnodes=3)
A, B, C = "A" * 40, "B" * 40, "C" * 40


class Master:
    """The master's side as data: the view, the holders, a fake clock."""

    def __init__(self) -> None:
        self.view = RunView(launch_start=0.0)
        self.holders: dict[int, str] = {}
        self.now = 0.0

    def hello(self, node: int, key: str, host: str = "10.0.0.2", pid: int = 100) -> tuple[Claim, str]:
        verdict, reason = claim_node(self.view, LIMITS, node, self.holders, key)
        if verdict is not Claim.REFUSED:
            self.holders[node] = key
            observe.node_hello(self.view, NodeHello(node, 1, host, pid, [f"{host}:1"]), self.now)
        return verdict, reason

    def tick(self, secs: float) -> None:
        self.now += secs
        for action in host_actions(self.view, self.now, LIMITS):
            note(self.view, action, self.now, LIMITS)


def test_the_first_key_that_claims_a_node_holds_it_and_its_own_claims_go_on():
    m = Master()
    assert m.hello(1, A)[0] is Claim.BOUND
    assert m.hello(1, A)[0] is Claim.HELD
    m.tick(1.0)
    assert m.hello(1, A)[0] is Claim.HELD
    assert m.holders == {1: A}


def test_a_second_key_is_refused_while_the_holder_is_connected_and_the_reason_names_the_holder():
    m = Master()
    m.hello(1, A, host="10.0.0.2", pid=100)
    m.tick(2.0)
    verdict, reason = m.hello(1, B, host="10.0.0.3", pid=200)
    assert verdict is Claim.REFUSED
    assert "node 1 is held by another agent in this launch (at 10.0.0.2, pid 100)" in reason
    assert m.holders == {1: A}


def test_a_new_key_takes_the_node_once_the_holders_host_was_found_lost_and_the_old_key_is_then_refused():
    m = Master()
    m.hello(1, A)
    m.tick(LIMITS.node_timeout - 0.5)
    assert m.hello(1, B)[0] is Claim.REFUSED  # silent, but not lost yet: it may still come back
    m.tick(1.0)  # now silent past node_timeout: the rule finds it lost
    assert m.view.nodes[1].lost_at is not None
    assert m.hello(1, B) == (Claim.BOUND, "node 1's earlier agent was lost")
    assert m.view.nodes[1].lost_at is None  # the relaunched agent joined
    assert m.hello(1, A)[0] is Claim.REFUSED  # the old key, back from a cut network, no longer speaks for it


def test_a_key_speaks_for_one_node_and_a_node_outside_the_job_is_refused():
    m = Master()
    m.hello(1, A)
    verdict, reason = m.hello(2, A)
    assert verdict is Claim.REFUSED and reason == "this agent already speaks for node 1 in this launch"
    assert m.hello(2, C)[0] is Claim.BOUND
    for node in (0, 3, -1):
        verdict, reason = m.hello(node, B)
        assert verdict is Claim.REFUSED and f"this job has no node {node}" in reason
    assert m.holders == {1: A, 2: C}


def test_a_host_silent_while_the_run_finishes_is_still_found_lost_but_nothing_is_given_up():
    """Rule 12 during the orderly stop: a silent host is lost (the launch waits for no member of it);
    a host that never joined or stays away is no reason to give up a run that is ending anyway."""
    from procsv.watchdog.rules.actions import NodeLost

    m = Master()
    m.hello(1, A)
    m.tick(1.0)
    m.view.run = RunState.STOPPED  # the outcome is decided (RunView.finishing)
    late = LIMITS.rejoin_timeout + 100.0  # node 2 never joined: past the rejoin timeout too
    actions = host_actions(m.view, late, LIMITS)
    assert [type(a) for a in actions] == [NodeLost] and actions[0].node == 1
