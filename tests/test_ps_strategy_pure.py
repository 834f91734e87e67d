"""Issue 43, pure: ``--ps N --workers M --coordinator`` (TF2 ``ParameterServerStrategy``).

No process runs. The cluster's start (:class:`procsv.watchdog.pstasks.PsCluster`) with a fake
executor: every ``TF_CONFIG`` it hands out (that TensorFlow's ``TFConfigClusterResolver`` reads it
is shown by the real launches of ``test_ps_strategy.py``); and rule 14 with the coordinator's tasks in the simulator of
``test_watchdog_decide`` (``ps0``, the worker servers ``worker0`` and ``worker1``, the coordinator in
``trainer``), each started alone.
"""

from __future__ import annotations

import json
from typing import Optional

from procsv.common.env import NPROC, PS as PS_ENV, RANK
from procsv.ipc.messages import Hello
from procsv.watchdog import observe
from procsv.watchdog.pstasks import PsCluster
from procsv.watchdog.rules.actions import Cause, Kill, Restart, RestartTask, Signal, Spawn
from procsv.watchdog.rules.decide import Limits
from procsv.watchdog.rules.hang import HangLimits
from procsv.watchdog.rules.state import PS, SERVER, TRAINER, RunView

from test_ps_tasks_pure import PsSim
from test_watchdog_decide import KILLED, of


class FakeStarter:
    """The executor as :class:`PsCluster` sees it: records each start (slot, role, how, env)."""

    def __init__(self) -> None:
        self.view = RunView(launch_start=0.0, tasks_alone=True)
        self.layout = None  # type: ignore[assignment]
        self.started: list[tuple[str, str, str, dict[str, str]]] = []

    def _env(self, role: str, attempt: int) -> dict[str, str]:
        return {"PROCSV_ROLE": role}

    def _spawn_member(self, slot: str, role: str, attempt: int, rank: int, extra: dict[str, str]) -> None:
        self.started.append((slot, role, "member", {**self._env(slot, attempt), **extra}))

    def _fresh(self, slot: str, role: str, attempt: int, env: dict[str, str], log_path: str, mutex: object) -> None:
        self.started.append((slot, role, "fresh", env))

    def fork(self, pending: object, target: str, args: object) -> bool:
        return False  # no pre-warmed trainer here: every task starts fresh


class Logs:
    def attempt_log(self, name: str, attempt: int) -> str:
        return f"logs/{name}.{attempt}.log"


def test_the_coordinator_is_the_chief_task_and_the_workers_are_servers() -> None:
    ex = FakeStarter()
    ex.layout = Logs()  # type: ignore[assignment]
    cluster = PsCluster(2, 2, coordinator=True)
    cluster.start(ex, TRAINER, TRAINER)  # type: ignore[arg-type]
    assert [(slot, role, how) for slot, role, how, _ in ex.started] == [
        ("ps0", PS, "fresh"), ("ps1", PS, "fresh"), ("worker0", SERVER, "fresh"), ("worker1", SERVER, "fresh"),
        (TRAINER, TRAINER, "member")]
    addresses: Optional[dict[str, list[str]]] = None
    for slot, role, _, env in ex.started:
        cfg = json.loads(env["TF_CONFIG"])
        addresses = addresses or cfg["cluster"]
        assert cfg["cluster"] == addresses  # one cluster, every task's
        want = {"ps0": ("ps", 0), "ps1": ("ps", 1), "worker0": ("worker", 0), "worker1": ("worker", 1),
                TRAINER: ("chief", 0)}[slot]
        assert (cfg["task"]["type"], cfg["task"]["index"]) == want
    assert addresses is not None and sorted(addresses) == ["chief", "ps", "worker"]
    assert (len(addresses["chief"]), len(addresses["worker"]), len(addresses["ps"])) == (1, 2, 2)
    assert len({a for job in addresses.values() for a in job}) == 5  # a port each
    chief_env = ex.started[-1][3]
    assert (chief_env[NPROC], chief_env[RANK]) == ("1", "0") and PS_ENV not in chief_env  # a lone trainer to procsv
    # a task restarted alone keeps its address; the coordinator's next attempt too
    ex.started.clear()
    cluster.start(ex, "worker1", SERVER)  # type: ignore[arg-type]
    assert [(s, r) for s, r, _, _ in ex.started] == [("worker1", SERVER)]
    assert json.loads(ex.started[0][3]["TF_CONFIG"])["cluster"] == addresses


class ReadyZygote(FakeStarter):
    """... with the pre-warmed trainer ready: records each fork asked of it (slot, role, rank), as asked."""

    def __init__(self) -> None:
        super().__init__()
        self.forks: list[tuple[str, str, int]] = []

    def fork(self, pending: object, target: str, args: object) -> bool:
        assert target == "procsv.ps_server" and list(args) == [], (target, args)  # type: ignore[call-overload]
        self.forks.append((pending.slot, pending.role, pending.rank))  # type: ignore[attr-defined]
        self.started.append((pending.slot, pending.role, "forked", pending.env))  # type: ignore[attr-defined]
        return True


def test_each_servers_first_start_is_forked_from_the_pre_warmed_trainer_and_its_restart_is_fresh() -> None:
    """Each server of a --coordinator cluster starts forked from the pre-warmed trainer when it is ready (it serves
    without importing TensorFlow, about 2.3 s of CPU less), answered under a rank of its own (a parameter server's
    1000 + i, a worker server's 1500 + i: the coordinator's is 0); a server restarted alone starts fresh (forked there,
    a parameter server's restart left the restarted coordinator stepping no more, a worker server's came back before
    the coordinator had stepped without it)."""
    from types import SimpleNamespace

    ex = ReadyZygote()
    ex.layout = Logs()  # type: ignore[assignment]
    cluster = PsCluster(2, 2, coordinator=True)
    cluster.start(ex, TRAINER, TRAINER)  # type: ignore[arg-type]
    assert [(slot, role, how) for slot, role, how, _ in ex.started] == [
        ("ps0", PS, "forked"), ("ps1", PS, "forked"), ("worker0", SERVER, "forked"), ("worker1", SERVER, "forked"),
        (TRAINER, TRAINER, "member")]
    assert ex.forks == [("ps0", PS, 1000), ("ps1", PS, 1001), ("worker0", SERVER, 1500), ("worker1", SERVER, 1501)]
    for slot in ("ps0", "worker1"):  # restarted alone: attempt 2, fresh
        ex.started.clear()
        ex.view.children[slot] = SimpleNamespace(attempt=1)  # type: ignore[assignment]
        cluster.start(ex, slot, PS if slot == "ps0" else SERVER)  # type: ignore[arg-type]
        assert [(s, r, how) for s, r, how, _ in ex.started] == [(slot, PS if slot == "ps0" else SERVER, "fresh")]
    assert len(ex.forks) == 4
    tf1 = ReadyZygote()  # TF1 mode (no --coordinator): a parameter server is forked at a restart too
    tf1.layout = Logs()  # type: ignore[assignment]
    tf1.view.children["ps0"] = SimpleNamespace(attempt=1)  # type: ignore[assignment]
    PsCluster(1, 2).start(tf1, "ps0", PS)  # type: ignore[arg-type]
    assert tf1.forks == [("ps0", PS, 1000)]


class CoordinatorSim(PsSim):
    """A --coordinator launch: the first trainer start starts ``ps0``, ``worker0`` and ``worker1``
    (servers) and the coordinator."""

    def __init__(self, limits: Limits) -> None:
        super(PsSim, self).__init__(limits)
        self.view.tasks_alone = True  # (--coordinator: the limits say it)

    def spawn(self, slot: str, role: str) -> None:
        if role == TRAINER and TRAINER not in self.view.children:
            for s, r in (("ps0", PS), ("worker0", SERVER), ("worker1", SERVER)):
                super(PsSim, self).spawn(s, r)
        super(PsSim, self).spawn(slot, role)


def coordinator_launch() -> CoordinatorSim:
    sim = CoordinatorSim(Limits(hang=HangLimits(None, None), nproc=2, ps=1, coordinator=True))
    assert sim.tick() == [Spawn(TRAINER, TRAINER)]
    sim.steps(TRAINER, 5)
    return sim


def test_a_killed_worker_server_is_restarted_alone_and_the_coordinator_is_not_touched() -> None:
    sim = coordinator_launch()
    chief, ps0, other = sim.view.children[TRAINER], sim.view.children["ps0"], sim.view.children["worker0"]
    sim.reaps("worker1", KILLED)
    acts = sim.tick(1.0)
    assert [type(a) for a in acts] == [RestartTask] and acts[0].slot == "worker1"  # type: ignore[attr-defined]
    assert sim.tick(0.01) == [Spawn("worker1", SERVER)]  # a server is due at once, as a parameter server
    assert sim.view.children["worker1"].attempt == 2 and sim.view.children["worker1"].role == SERVER
    assert sim.tick(1.0) == []
    assert not of(sim.log, Signal) and not of(sim.log, Kill) and not of(sim.log, Restart)
    assert all(sim.view.children[s] is c and c.live for s, c in ((TRAINER, chief), ("ps0", ps0), ("worker0", other)))


def test_a_killed_parameter_server_takes_the_coordinator_with_it_and_not_the_worker_servers() -> None:
    sim = coordinator_launch()
    sim.reaps("ps0", KILLED)
    acts = sim.tick(1.0)
    assert [type(a) for a in acts] == [RestartTask, Kill] and acts[0].slot == "ps0"  # type: ignore[attr-defined]
    assert [(a.slot, a.cause) for a in of(acts, Kill)] == [(TRAINER, Cause.PS_LOST)]
    assert sim.tick(0.01) == [Spawn("ps0", PS)]
    sim.reaps(TRAINER, KILLED)
    assert [type(a) for a in sim.tick(0.01)] == [Restart]  # judged by rule 1: it restores the newest checkpoint
    # before: the coordinator was forked at once and failed on the parameter server still starting
    # (UnavailableError, connection refused), a restart of its own; it now waits for ps0's Hello
    assert sim.tick(5.0) == [] and sim.view.children[TRAINER].attempt == 1
    ps0 = sim.view.children["ps0"]
    observe.heard(sim.view, Hello(PS, ps0.pid, ps0.attempt, slot="ps0"), sim.now)
    # ... and 1.5 s past it: before, the coordinator forked on the Hello failed its first step on a worker
    # server whose gRPC channel to ps0 was still in its reconnect backoff (UnavailableError from worker1)
    assert sim.tick(0.01) == [] and sim.tick(1.0) == [] and sim.view.children[TRAINER].attempt == 1
    assert sim.tick(0.5) == [Spawn(TRAINER, TRAINER)]
    assert sim.view.children[TRAINER].attempt == 2
    assert sim.view.children["worker0"].attempt == 1 and sim.view.children["worker1"].attempt == 1


def test_a_server_that_exits_0_before_the_end_is_a_loss_and_is_restarted() -> None:
    sim = coordinator_launch()
    sim.reaps("worker0", 0)
    assert [type(a) for a in sim.tick(1.0)] == [RestartTask]


def test_logs_role_takes_worker0_a_coordinators_worker_server(tmp_path, capsys) -> None:
    from procsv.cli import main

    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "worker0.1.log").write_text("procsv ps: task worker0 serving at grpc://127.0.0.1:1\n")
    assert main(["logs", str(tmp_path), "--role", "worker0"]) == 0
    assert "task worker0 serving" in capsys.readouterr().out


def test_a_parameter_server_that_never_serves_holds_the_coordinator_no_longer_than_the_startup_timeout() -> None:
    """A restarted ps0 that never says Hello (stopped at its start, an import that never returns): the
    coordinator's wait for it (tasks.ps_not_serving) ends at --startup-timeout, as the wait of a
    trainer's own start does; before, the run sat silent for ever (no hang rule watches a parameter
    server, and the coordinator it held was not live to be watched)."""
    sim = CoordinatorSim(Limits(hang=HangLimits(None, 60.0), nproc=2, ps=1, coordinator=True))
    assert sim.tick() == [Spawn(TRAINER, TRAINER)]
    sim.steps(TRAINER, 5)
    sim.reaps("ps0", KILLED)
    assert [type(a) for a in sim.tick(1.0)] == [RestartTask, Kill]
    assert sim.tick(0.01) == [Spawn("ps0", PS)]
    sim.reaps(TRAINER, KILLED)
    assert [type(a) for a in sim.tick(0.01)] == [Restart]
    assert sim.tick(30.0) == [] and sim.view.children[TRAINER].attempt == 1  # within the timeout: it waits
    acts: list[object] = []
    for _ in range(40):  # 40 s more: past the 60 s since ps0's start
        acts += sim.tick(1.0)
    assert Spawn(TRAINER, TRAINER) in acts and sim.view.children[TRAINER].attempt == 2
