"""--audit (issue 71) of a group over two "hosts" (``--nnodes 2``): the bit flipped in node 1's member.

Two hosts as in tests/test_hosts.py (network namespaces on a veth bridge, one logdir, real TensorFlow collectives
over the bridge). Needs root; skipped otherwise.

CPU: one digits launch of 300 steps, one member a host (``--nproc 1 --nnodes 2``), saved every 100, no standby
group; five replays of 100 steps, each by a group of two auditors on node 0; 100 steps of both members trained
again: about the one-host group audit's (tests/test_audit.py), plus node 1's agent. Its clean reference is the
uninterrupted group run the group tests share (``test_group._clean_group_run``, its checkpoint of step 300).
"""

from __future__ import annotations

import os

import pytest

from conftest import final_weights, finish, lifecycle, quiet_env, status_json
from hosts_helpers import two_hosts
from test_hosts import hosts  # noqa: F401 (the fixture)

pytestmark = pytest.mark.slow  # starts TensorFlow processes: not in the quick tier


def test_a_flipped_bit_in_node_1s_worker_is_caught_by_a_group_of_auditors_on_node_0_rolled_back_and_bit_equal(
        hosts, logdir, shared_result) -> None:  # noqa: F811
    """A group over two hosts: worker 1, node 1's member, flips a bit of its own copy of the weights after step 250.
    Each interval is replayed by a group of two auditors of its own on node 0 (forked from its zygote, localhost
    TF_CONFIG) from the chief's checkpoints (before: a group over hosts was not audited, the audit off for the
    launch): 100-200 matches, 200-300 differs twice; the verdict names the group (the chief's checkpoint cannot tell
    which member computed wrongly), both hosts' members train again from 200, and the run succeeds, bit-equal to the
    uninterrupted group's checkpoint of step 300."""
    from test_group import ARGS as GROUP_ARGS, NO_STANDBY, _clean_group_run

    args = (*GROUP_ARGS, "--steps", "300", "--save-model-secs", "1000", "--save-checkpoint-steps", "100")
    master, node1, _ = two_hosts(logdir, *args, env=quiet_env(), agent_env=quiet_env(PROCSV_FAULT="worker:bitflip:250"),
                                 opts=(*NO_STANDBY, "--audit", "every"))
    code, out, err = finish(master, timeout=300)
    acode, aout, aerr = finish(node1, timeout=30)
    assert code == 0, err[-3000:]
    assert acode == 0, aerr[-3000:]
    logs = {name: _log(logdir, name) for name in ("trainer.1", "worker1.1", "worker1.2")}
    assert "procsv: fault injected: bit 20 of" in logs["worker1.1"], logs["worker1.1"][-3000:]  # (node 1's member)
    assert "fault injected" not in logs["trainer.1"]
    events = lifecycle(logdir)
    audits = [(e["verdict"], e["start"], e["end"]) for e in events if e["event"] == "audit"]
    assert audits == [("match", 100, 200), ("mismatch", 200, 300), ("trainer", 200, 300), ("match", 200, 300)], audits
    wrong = next(e for e in events if e["event"] == "audit" and e["verdict"] == "trainer")
    assert wrong["host"] == GROUP_NAMED, wrong
    assert "the trainer group over 2 hosts (group of nodes 0-1: its chief's checkpoint cannot tell which member) " \
        "computed steps 200-300 wrongly" in err, err[-3000:]
    assert "the trainer had finished; it trains again from step 200" in err
    spawned = [(e["role"], e["via"]) for e in events if e["event"] == "spawned" and e["role"].startswith("auditor")]
    assert {r for r, _ in spawned} == {"auditor", "auditor1"} and {v for _, v in spawned} == {"zygote"}, spawned
    assert [q["steps"] for q in events if q["event"] == "audit_quarantine"] == [[300]]  # (the wrong timeline's)
    restored = [e["step"] for e in events if e["event"] == "restored" and e.get("role", "trainer") == "trainer"]
    assert restored == [200], restored
    assert "procsv: restored step 200" in logs["worker1.2"], logs["worker1.2"][-3000:]  # (node 1's: the group whole)
    st = status_json(logdir)
    assert st["state"] == "succeeded" and st["audit"]["miscomputed"] == {GROUP_NAMED: 1}, st["audit"]
    assert st["spikes"]["transient_faults"] == {}, st["spikes"]  # (no host told: none counted toward suspect)
    a, b = final_weights(_clean_group_run(shared_result), 300), final_weights(logdir)
    assert a.keys() == b.keys()
    for key in a:
        assert (a[key] == b[key]).all(), f"{key} differs after the audit's rollback"


GROUP_NAMED = "group of nodes 0-1"


def _log(logdir: str, name: str) -> str:
    """Member ``name``'s log (``logs/<name>.log``: node 1's members' too, the logdir shared); empty if none."""
    try:
        with open(os.path.join(logdir, "logs", f"{name}.log")) as fh:
            return fh.read()
    except FileNotFoundError:
        return ""
