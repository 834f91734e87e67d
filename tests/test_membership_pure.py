"""An elastic group's membership (``--nnodes M --min-nodes K``, rule 15), pure: which hosts the next group
starts on, when a host that stays away stops the run, when a host that came back is taken back, and how
that restart is judged. Driven with a fake clock through the watchdog's own observations
(``observe.node_hello``, ``observe.spawned``, ``observe.heard``), decision (``decide``) and bookkeeping
(``note``); the real two-host runs are in ``test_hosts_elastic.py``.
"""

from __future__ import annotations

import signal

from procsv.ipc.messages import NodeHello, Progress
from procsv.watchdog import observe
from procsv.watchdog.rules.actions import Cause, Kill, Restart, Signal, Spawn, StopFailing
from procsv.watchdog.rules.bookkeeping import note
from procsv.watchdog.rules.decide import decide
from procsv.watchdog.rules.failures import Failure
from procsv.watchdog.rules.hang import HangLimits
from procsv.watchdog.rules.hosts import host_actions
from procsv.watchdog.rules.limits import Limits
from procsv.watchdog.rules.membership import FLAP_WINDOW, hold_down, next_nodes, ranks_of, take_back
from procsv.watchdog.rules.state import TRAINER, WORKER, RunView

REJOIN = 30.0


def limits(min_nodes: int = 0, nnodes: int = 3) -> Limits:
    return Limits(hang=HangLimits(None, None), nproc=1, nnodes=nnodes, min_nodes=min_nodes, rejoin_timeout=REJOIN,
                  node_timeout=5.0)


def hello(view: RunView, node: int, now: float, live: tuple[str, ...] = (), ready: bool = True) -> None:
    observe.node_hello(view, NodeHello(node, 1, f"10.0.0.{node + 1}", 100 + node, [f"10.0.0.{node + 1}:4000"],
                                       list(live), 0, ready), now)


def lose(view: RunView, node: int, now: float, lim: Limits) -> None:
    """Node ``node`` went silent at ``now - node_timeout - 0.1``: rule 12 finds it lost now."""
    view.nodes[node].last_beat = now - lim.node_timeout - 0.1
    for action in host_actions(view, now, lim):
        note(view, action, now, lim)
    assert view.nodes[node].lost_at == now


def test_without_min_nodes_a_host_past_its_rejoin_timeout_stops_the_run_and_the_next_group_waits_for_every_host():
    lim = limits()
    view = RunView(launch_start=0.0)
    hello(view, 1, 1.0)
    hello(view, 2, 1.0)
    lose(view, 2, 10.0, lim)
    hello(view, 1, 10.0 + REJOIN + 1)  # node 1 beats on
    assert next_nodes(view, 10.0 + REJOIN + 1, lim) is None  # waits for it, however long
    stop = [a for a in host_actions(view, 10.0 + REJOIN + 1, lim) if isinstance(a, StopFailing)]
    assert [s.reason for s in stop] == [f"node 2 (10.0.0.3) was lost and did not come back within --rejoin-timeout "
                                        f"{REJOIN:g} s"]


def test_with_min_nodes_a_host_found_lost_is_not_waited_for_the_next_group_starts_at_once_on_the_hosts_left():
    """Issue 70: a host is found lost within 0.5 s of its silence and a slow one is not found lost, so a lost host
    is taken to be gone: the next group starts on the hosts left as soon as it is found lost, ranks dense. Before,
    it waited out --rejoin-timeout (300 s by default) first, the hosts left idle."""
    lim = limits(min_nodes=2)
    view = RunView(launch_start=0.0)
    hello(view, 1, 1.0)
    hello(view, 2, 1.0)
    assert next_nodes(view, 2.0, lim) == (0, 1, 2)
    hello(view, 2, 10.0)  # node 2 beats on
    lose(view, 1, 10.0, lim)
    assert next_nodes(view, 10.0, lim) == (0, 2)  # at once, not past 10 + REJOIN
    hello(view, 2, 10.0 + REJOIN + 1)
    assert not [a for a in host_actions(view, 10.0 + REJOIN + 1, lim) if isinstance(a, StopFailing)]
    assert ranks_of((0, 2), 2, 4) == [4, 5, 6, 7]  # node 2 takes the ranks after node 0's: none is left empty
    hello(view, 1, 50.0)  # back: in the next group again
    assert next_nodes(view, 51.0, lim) == (0, 1, 2)


def test_with_min_nodes_fewer_hosts_connected_than_k_wait_for_one_back_and_the_run_stops_past_the_rejoin_timeout():
    lim = limits(min_nodes=2)
    view = RunView(launch_start=0.0)
    hello(view, 1, 1.0)
    hello(view, 2, 10.0)
    lose(view, 1, 10.0, lim)
    lose(view, 2, 11.0, lim)
    assert next_nodes(view, 11.0, lim) is None  # node 0 alone is fewer than --min-nodes 2: wait
    assert not [a for a in host_actions(view, 10.0 + REJOIN, lim) if isinstance(a, StopFailing)]
    hello(view, 2, 20.0)  # one back within --rejoin-timeout: the group starts on two
    assert next_nodes(view, 20.0, lim) == (0, 2)
    hello(view, 2, 30.0)
    lose(view, 2, 30.0, lim)
    stop = [a for a in host_actions(view, 30.0 + REJOIN + 1, lim) if isinstance(a, StopFailing)]
    assert len(stop) == 1 and stop[0].reason.endswith("1 of 3 hosts left, fewer than --min-nodes 2")


def rounds(view: RunView, start: float, end: float, lim: Limits, step: float = 0.05) -> list[tuple[float, Spawn]]:
    """Drive ``decide`` every ``step`` s from ``start`` to ``end`` as the watchdog does (each action noted; a
    trainer signalled or killed is reaped in the same round); the trainer Spawns and when they came."""
    spawns: list[tuple[float, Spawn]] = []
    now = start
    while now <= end + 1e-9:
        for a in decide(view, now, lim, 0.0):
            note(view, a, now, lim)
            if isinstance(a, Spawn) and a.role == TRAINER:
                spawns.append((now, a))
                attempt = view.history.restarts + view.not_restarts() + 1
                observe.spawned(view, TRAINER, TRAINER, attempt, 100 + attempt, now, "fresh")
                for rank, node in enumerate(a.nodes[1:], start=1):
                    observe.spawned(view, f"worker{rank}", WORKER, attempt, 200 + attempt, now, f"node{node}")
                    view.children[f"worker{rank}"].node = node
            elif isinstance(a, (Kill, Signal)) and a.slot == TRAINER:
                c = view.children[TRAINER]
                observe.reaped(view, TRAINER, c.attempt, Failure(TRAINER, c.attempt, c.pid, -signal.SIGKILL, 0.0, ""),
                               now)
        now = round(now + step, 6)
    return spawns


def test_with_min_nodes_the_smaller_group_is_spawned_in_the_rounds_after_its_lost_host_is_found_lost():
    """The rounds: the loss (its member dead), the chief's stop and reaping, the restart, the spawn."""
    lim = limits(min_nodes=1, nnodes=2)
    view = running_group(lim, (0, 1), 1.0)
    view.nodes[1].last_beat = 50.0 - lim.node_timeout - 0.01  # silent: found lost at 50.0
    spawns = rounds(view, 50.0, 52.0, lim)
    assert view.nodes[1].lost_at is not None and view.nodes[1].lost_at <= 50.0 + 1e-9
    assert [s.nodes for _, s in spawns] == [(0,)] and spawns[0][0] - 50.0 <= 0.2, spawns


def test_without_min_nodes_the_group_of_every_host_is_spawned_in_the_round_its_lost_host_says_hello_again():
    """Issue 70: once the lost host's agent is back (its hello), the group of every host starts at once
    (its first step within 1 s of the hello: bench_host_loss.py)."""
    lim = limits(nnodes=2)
    view = running_group(lim, (0, 1), 1.0)
    view.nodes[1].last_beat = 50.0 - lim.node_timeout - 0.01
    assert rounds(view, 50.0, 60.0, lim) == []  # waits for it
    hello(view, 1, 60.02)
    assert [(round(t, 3), s.nodes) for t, s in rounds(view, 60.05, 62.0, lim)] == [(60.05, (0, 1))]


def test_a_flapping_host_must_stay_connected_longer_after_each_loss_before_a_group_starts_on_it_again():
    """A host lost and back every few seconds: each loss breaks the group and each take-back (or, without
    --min-nodes, each return) starts it again, so the group would restart twice a flap for as long as the
    host flaps (progress in between forgives each failure). Its first loss holds nothing; after that it must
    stay connected for the restart policy's backoff (1, 2, 4 ... 30 s) before it is in a group again."""
    for lim in (limits(min_nodes=1, nnodes=2), limits(nnodes=2)):
        view = RunView(launch_start=0.0)
        hello(view, 1, 1.0)
        now = 10.0
        for flap, hold in enumerate((0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0)):
            lose(view, 1, now, lim)
            hello(view, 1, now + 2.0)  # back 2 s later
            assert hold_down(view, 1, now + 2.0, lim) == hold, flap
            want = (0,) if lim.elastic else None  # held: not in the next group yet
            if hold:
                assert next_nodes(view, now + 2.0 + hold - 0.01, lim) == want, flap
            assert next_nodes(view, now + 2.0 + hold, lim) == (0, 1), flap
            now += 3.0
        assert hold_down(view, 1, now + FLAP_WINDOW + 1.0, lim) == 0.0  # losses out of the window are forgiven


def test_a_flapping_host_is_taken_back_only_at_a_commit_after_its_hold_down():
    lim = limits(min_nodes=1, nnodes=2)
    view = running_group(lim, (0,), REJOIN + 1)
    hello(view, 1, 40.0)
    lose(view, 1, 41.0, lim)
    hello(view, 1, 42.0)
    lose(view, 1, 43.0, lim)
    hello(view, 1, 44.0)
    lose(view, 1, 45.0, lim)
    hello(view, 1, 46.0)  # third loss: held 2 s, to 48.0
    view.last_commit_at = 47.0
    assert take_back(view, 47.5, lim) == []
    assert take_back(view, 48.5, lim) == []  # the commit came before the hold-down's end
    view.last_commit_at = 48.6
    assert [a.cause for a in take_back(view, 48.6, lim)] == [Cause.REGROUP]


def test_fewer_hosts_left_than_min_nodes_stop_the_run_and_say_how_many_are_left():
    lim = limits(min_nodes=2)
    view = RunView(launch_start=0.0)
    hello(view, 1, 1.0)  # node 2 never joins
    assert not [a for a in host_actions(view, REJOIN + 1, lim) if isinstance(a, StopFailing)]
    assert next_nodes(view, REJOIN + 1, lim) == (0, 1)  # absent at start: the group starts without it
    lose(view, 1, 40.0, lim)
    stop = [a for a in host_actions(view, 40.0 + REJOIN + 1, lim) if isinstance(a, StopFailing)]
    assert len(stop) == 1 and stop[0].cause == "nodes"
    assert "node 1 (10.0.0.2) was lost and did not come back" in stop[0].reason
    assert "node 2 did not join within --rejoin-timeout 30 s" in stop[0].reason
    assert stop[0].reason.endswith("1 of 3 hosts left, fewer than --min-nodes 2")


def running_group(lim: Limits, nodes: tuple[int, ...], now: float) -> RunView:
    """A group started on ``nodes`` (decided by ``decide``, noted), each member past its first step."""
    view = RunView(launch_start=0.0, restart_at=0.0)
    for node in nodes[1:]:
        hello(view, node, 0.5)
    spawn = [a for a in decide(view, now, lim, 0.0) if isinstance(a, Spawn) and a.role == TRAINER]
    assert [s.nodes for s in spawn] == [nodes]
    note(view, spawn[0], now, lim)
    observe.spawned(view, TRAINER, TRAINER, 1, 101, now, "fresh")
    for rank, node in enumerate(nodes[1:], start=1):
        observe.spawned(view, f"worker{rank}", WORKER, 1, 200 + rank, now, f"node{node}")
        view.children[f"worker{rank}"].node = node
        observe.heard(view, Progress(200 + rank, 5, 0.0, stepped=True), now + 1.0, slot=f"worker{rank}")
    observe.heard(view, Progress(101, 5, 0.0, stepped=True), now + 1.0)
    return view


def test_a_host_that_comes_back_is_taken_back_at_the_first_commit_after_it_joined_and_that_restart_is_no_failure():
    lim = limits(min_nodes=1, nnodes=2)
    view = RunView(launch_start=0.0)
    view = running_group(lim, (0,), REJOIN + 1)  # node 1 never came: the group runs on node 0 alone
    assert view.group_nodes == (0,) and view.membership_changes == 0
    view.last_commit_at, view.last_commit_step = 40.0, 50
    hello(view, 1, 41.0)  # node 1 joins after that commit
    assert take_back(view, 41.5, lim) == []
    assert not [a for a in decide(view, 41.5, lim, 0.0) if isinstance(a, (Kill, Spawn))]
    view.last_commit_at, view.last_commit_step = 42.0, 60  # the next checkpoint boundary
    kills = [a for a in decide(view, 42.1, lim, 0.0) if isinstance(a, Kill)]
    assert [(k.slot, k.cause) for k in kills] == [(TRAINER, Cause.REGROUP)]
    assert "from the checkpoint of step 60" in kills[0].reason
    history = view.history
    for k in kills:
        note(view, k, 42.1, lim)
    assert take_back(view, 42.1, lim) == []  # asked once
    chief = view.children[TRAINER]
    observe.reaped(view, TRAINER, 1, Failure(TRAINER, 1, 101, -signal.SIGKILL, 0.0, ""), 42.2)
    restart = [a for a in decide(view, 42.2, lim, 0.0) if isinstance(a, Restart)]
    assert len(restart) == 1 and restart[0].delay == 0.0 and restart[0].regroup
    assert restart[0].history == history  # not counted as a restart
    note(view, restart[0], 42.2, lim)
    spawn = [a for a in decide(view, 42.2, lim, 0.0) if isinstance(a, Spawn) and a.role == TRAINER]
    assert [s.nodes for s in spawn] == [(0, 1)]
    note(view, spawn[0], 42.2, lim)
    assert view.group_nodes == (0, 1) and view.membership_changes == 1
    assert view.not_restarts() == 1 and chief.regroup


def test_a_host_back_before_the_groups_first_step_waits_for_a_commit_after_that_step():
    lim = limits(min_nodes=1, nnodes=2)
    view = running_group(lim, (0,), REJOIN + 1)
    view.children[TRAINER].first_step_at = 50.0
    hello(view, 1, 45.0)
    view.last_commit_at = 48.0  # after the join, but a commit the running group did not make
    assert take_back(view, 51.0, lim) == []
    view.last_commit_at = 51.0
    assert [a.cause for a in take_back(view, 51.0, lim)] == [Cause.REGROUP]
    view.stop_signal = signal.SIGTERM  # never while the run stops
    assert take_back(view, 51.0, lim) == []


def test_a_host_back_is_taken_only_once_its_pre_warmed_trainer_is_ready_and_a_commit_follows_that():
    """Before: the group was ended at the first commit after the join, while the joiner's pre-warmed
    trainer still imported TensorFlow: its member started cold and the whole group waited for it
    (15 s without training, measured)."""
    lim = limits(min_nodes=1, nnodes=2)
    view = running_group(lim, (0,), REJOIN + 1)
    hello(view, 1, 40.0, ready=False)  # joined: its pre-warmed trainer warms up
    view.last_commit_at = 41.0
    assert take_back(view, 41.0, lim) == []
    hello(view, 1, 42.0, ready=False)
    view.last_commit_at = 43.0
    assert take_back(view, 43.0, lim) == []
    hello(view, 1, 44.0, ready=True)  # ready now: the next commit after it is the boundary
    assert take_back(view, 44.0, lim) == []
    view.last_commit_at = 45.0
    assert [a.cause for a in take_back(view, 45.0, lim)] == [Cause.REGROUP]


def test_a_joiner_whose_pre_warmed_trainer_never_gets_ready_is_taken_back_after_zygote_wait():
    lim = limits(min_nodes=1, nnodes=2)
    view = running_group(lim, (0,), REJOIN + 1)
    hello(view, 1, 40.0, ready=False)
    view.last_commit_at = 40.0 + lim.zygote_wait
    assert take_back(view, 40.0 + lim.zygote_wait, lim) == []
    view.last_commit_at = 40.5 + lim.zygote_wait
    assert [a.cause for a in take_back(view, 40.5 + lim.zygote_wait, lim)] == [Cause.REGROUP]


def test_min_nodes_is_refused_in_one_line_when_it_cannot_mean_anything():
    import pytest

    from procsv.common.errors import UsageError
    from procsv.launch_args import check_min_nodes

    check_min_nodes(None, 1, 0)
    check_min_nodes(1, 2, 0)
    check_min_nodes(2, 2, 0)
    for k in (0, -1, 3):
        with pytest.raises(UsageError, match=r"--min-nodes must be from 1 to --nnodes \(2\)"):
            check_min_nodes(k, 2, 0)
    with pytest.raises(UsageError, match="--ps tasks are placed on every host"):
        check_min_nodes(1, 2, 1)
    # one host (no --nnodes, or --nnodes 1): no host can leave the group; said, not silently ignored
    with pytest.raises(UsageError, match=r"--min-nodes needs --nnodes M > 1"):
        check_min_nodes(1, 1, 0)


def test_a_host_back_is_not_taken_back_at_the_trainers_final_commit():
    """The final commit (reason ``final``, seen by ``observe``) ends the training: the group exits on its own.
    Before, take_back SIGKILLed the group at it and restarted it on both hosts, to find nothing to do."""
    from procsv.ipc.messages import SaveResult
    from procsv.ipc.message_base import SaveReason

    lim = limits(min_nodes=1, nnodes=2)
    view = running_group(lim, (0,), REJOIN + 1)
    hello(view, 1, 45.0)
    observe.heard(view, SaveResult(80, SaveReason.FINAL, True, "/logdir/model.ckpt-80", None, 0.01), 46.0)
    assert view.last_commit_at == 46.0 and view.last_commit_final
    assert take_back(view, 47.0, lim) == []
    assert not [a for a in decide(view, 46.1, lim, 0.0) if isinstance(a, Kill)]
    observe.heard(view, SaveResult(90, SaveReason.PERIODIC, True, "/logdir/model.ckpt-90", None, 0.01), 47.0)
    assert [a.cause for a in take_back(view, 47.0, lim)] == [Cause.REGROUP]  # (a periodic commit: taken back)


def test_a_regroup_after_a_commit_starts_the_count_of_failures_without_a_new_checkpoint_again():
    """--max-restarts bounds failures in a row without a new checkpoint. A group that committed and was then
    ended to take a host back made progress: a host that flaps (lost before each new group's first commit)
    is a failure after progress each time, not one more in a row. Before, the regroup carried the count on,
    and three flaps with --max-restarts 2 gave the run up although node 0 committed between each."""
    from dataclasses import replace

    lim = limits(min_nodes=1, nnodes=2)
    view = running_group(lim, (0,), REJOIN + 1)
    view.history = replace(view.history, restarts=2, failures_without_progress=2)
    view.last_commit_at, view.last_commit_step = 40.0, 50
    view.children[TRAINER].commit_seen = 50  # the running group committed step 50
    hello(view, 1, 39.0)
    for k in take_back(view, 40.1, lim):
        note(view, k, 40.1, lim)
    observe.reaped(view, TRAINER, 1, Failure(TRAINER, 1, 101, -signal.SIGKILL, 0.0, ""), 40.2)
    restart = [a for a in decide(view, 40.2, lim, 0.0) if isinstance(a, Restart)]
    assert len(restart) == 1 and restart[0].regroup
    assert restart[0].history.restarts == 2  # not counted as a restart
    assert restart[0].history.failures_without_progress == 0
