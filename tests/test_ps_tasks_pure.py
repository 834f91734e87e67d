"""Issue 43, pure: ``--ps N --workers M``'s argument checks and rule 14 (each task restarted alone).

No process runs: the argument checks are :func:`procsv.watchdog.config.check_ps` and the launch's
``main`` returning before anything starts; rule 14 runs in the simulator of
``test_watchdog_decide`` (a fake clock and a fake executor around the real view, observations and
decisions), with the tasks of a parameter-server launch: the chief in ``trainer``, ``worker1`` and
``ps0``, each started alone.
"""

from __future__ import annotations

from typing import Any

import pytest

from procsv.cli import EXIT_USAGE, main
from procsv.common.errors import UsageError
from procsv.ipc.messages import Progress, TrainerReady
from procsv.watchdog import observe
from procsv.launch_args import check_coordinator
from procsv.watchdog.config import check_ps
from procsv.watchdog.rules.actions import Action, Cause, Finish, GiveUp, GiveUpTask, Kill, Restart, RestartTask, Settle, Signal, Spawn
from procsv.watchdog.rules.decide import Limits
from procsv.watchdog.rules.failures import Failure
from procsv.watchdog.rules.hang import HangLimits
from procsv.watchdog.rules.lifecycle import RunState
from procsv.watchdog.rules.policy import RestartPolicy
from procsv.watchdog.rules.state import PS, TRAINER, WORKER

from test_watchdog_decide import KILLED, Sim, of


# ------------------------------------------------------------------ the arguments
@pytest.mark.parametrize("ps,workers,nproc,nnodes,standby,words", [
    (1, 2, 2, 1, "auto", "--nproc 2 with --ps"),
    (1, 0, 1, 1, "auto", "go together"),
    (0, 2, 1, 1, "auto", "go together"),
    (-1, 2, 1, 1, "auto", "must be >= 1"),
    (1, 1, 1, 2, "auto", "every host runs at least one worker"),
    (1, 2, 1, 1, "hot", "--standby hot"),
])
def test_wrong_ps_arguments_are_usage_errors(ps: int, workers: int, nproc: int, nnodes: int, standby: str,
                                              words: str) -> None:
    with pytest.raises(UsageError, match=words):
        check_ps(ps, workers, nproc, nnodes, standby)


@pytest.fixture(autouse=True)
def preempt_signal_taken_back(monkeypatch):  # type: ignore[no-untyped-def]
    """The launch's configuration, built in this process by some tests here, sets PROCSV_PREEMPT_SIGNAL
    for the children it would start: taken away after each test (conftest.procsv_environment_unchanged)."""
    monkeypatch.setenv("PROCSV_PREEMPT_SIGNAL", "")
    monkeypatch.delenv("PROCSV_PREEMPT_SIGNAL")



def test_on_worker_give_up_without_ps_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="--on-worker-give-up stop goes with --ps"):
        check_ps(0, 0, 1, 1, "auto", "stop")
    check_ps(1, 2, 1, 1, "auto", "stop")


@pytest.mark.parametrize("ps,workers", [(0, 0), (1, 1), (2, 3)])
def test_right_ps_arguments_pass(ps: int, workers: int) -> None:
    check_ps(ps, workers, 1, 1, "auto")


def test_coordinator_without_ps_is_a_usage_error_and_with_ps_passes() -> None:
    with pytest.raises(UsageError, match="--coordinator needs --ps N --workers M"):
        check_coordinator(True, 0)
    check_coordinator(True, 1)
    check_coordinator(False, 0)


def test_launch_with_coordinator_and_no_ps_exits_2_with_one_line_and_starts_nothing(tmp_path, capsys) -> None:
    logdir = tmp_path / "run"
    code = main(["launch", "procsv.examples.ps_strategy", "--logdir", str(logdir), "--coordinator"])
    err = capsys.readouterr().err
    assert code == EXIT_USAGE == 2
    assert err.count("\n") == 1 and err.startswith("procsv: error: --coordinator needs --ps N --workers M")
    assert not logdir.exists()


def test_launch_with_nproc_and_ps_exits_2_with_one_line_and_starts_nothing(tmp_path, capsys) -> None:
    logdir = tmp_path / "run"
    code = main(["launch", "procsv.examples.seeds_tf1.replicas", "--logdir", str(logdir), "--nproc", "2",
                 "--ps", "1", "--workers", "2"])
    err = capsys.readouterr().err
    assert code == EXIT_USAGE == 2
    assert err.count("\n") == 1 and err.startswith("procsv: error: --nproc 2 with --ps")
    assert not logdir.exists()  # refused before the logdir was made


# ------------------------------------------------------------------ rule 14
class PsSim(Sim):
    """A parameter-server launch: the first trainer start starts ``ps0``, ``worker1`` and the chief."""

    def __init__(self, limits: Limits) -> None:
        super().__init__(limits)
        self.view.tasks_alone = True

    def spawn(self, slot: str, role: str) -> None:
        first = role == TRAINER and TRAINER not in self.view.children
        if first:
            super().spawn("ps0", PS)
            super().spawn("worker1", WORKER)
        super().spawn(slot, role)

    def reaps(self, slot: str, code: int) -> None:
        c = self.view.children[slot]
        observe.reaped(self.view, slot, c.attempt, Failure(c.slot, c.attempt, c.pid, code, 0.0, "log", None), self.now)

    def steps(self, slot: str, step: int) -> None:
        c = self.view.children[slot]
        if c.ready_at is None:
            observe.heard(self.view, TrainerReady(c.pid, c.attempt, 0, None, 0.1, [], None, None), self.now)
        observe.heard(self.view, Progress(c.pid, step, 0.0, "", True), self.now)


def ps_launch(max_restarts: int = 10, worker_give_up: str = "continue") -> PsSim:
    sim = PsSim(Limits(hang=HangLimits(None, None), nproc=2, ps=1, restart=RestartPolicy(max_restarts=max_restarts),
                       worker_give_up=worker_give_up))
    assert sim.tick() == [Spawn(TRAINER, TRAINER)]
    for slot in (TRAINER, "worker1"):
        sim.steps(slot, 5)
    return sim


def test_a_killed_worker_is_restarted_alone_and_nobody_else_is_touched() -> None:
    sim = ps_launch()
    chief, ps0 = sim.view.children[TRAINER], sim.view.children["ps0"]
    sim.reaps("worker1", KILLED)
    acts = sim.tick(1.0)
    assert acts == [RestartTask("worker1", 1, 0.0, acts[0].history)]  # type: ignore[attr-defined]
    assert sim.tick(0.01) == [Spawn("worker1", WORKER)]  # due at once: it had stepped
    assert sim.view.children["worker1"].attempt == 2
    assert sim.tick(1.0) == []
    assert not of(sim.log, Signal) and not of(sim.log, Kill) and not of(sim.log, Restart)
    assert sim.view.children[TRAINER] is chief and sim.view.children["ps0"] is ps0 and chief.live and ps0.live
    assert sim.view.history.restarts == 0  # the chief's own count is untouched


def test_a_killed_parameter_server_is_restarted_and_every_worker_is_ended_and_restarted_alone() -> None:
    sim = ps_launch()
    sim.reaps("ps0", KILLED)
    acts = sim.tick(1.0)
    assert [type(a) for a in acts] == [RestartTask, Kill, Kill] and acts[0].slot == "ps0"
    assert sorted((a.slot, a.cause) for a in of(acts, Kill)) == [(TRAINER, Cause.PS_LOST), ("worker1", Cause.PS_LOST)]
    assert sim.tick(0.01) == [Spawn("ps0", PS)]
    assert sim.view.children["ps0"].attempt == 2 and sim.view.children["ps0"].role == PS
    sim.reaps(TRAINER, KILLED)
    sim.reaps("worker1", KILLED)
    acts = sim.tick(0.01)
    assert [type(a) for a in acts] == [Restart, RestartTask]
    assert acts[1].delay == 0.0 and acts[1].history.restarts == 0  # type: ignore[attr-defined]  # not counted
    sim.tick(0.01)  # each started again alone
    assert sim.view.children[TRAINER].attempt == 2 and sim.view.children["worker1"].attempt == 2


def test_a_chief_whose_death_was_noticed_is_started_again_only_once_reaped_its_port_is_free() -> None:
    """A real run: after a parameter server's SIGKILL, the chief (SIGKILLed with ps_lost) was noticed
    dead and the next one forked 0.1 s before the old one was reaped; it failed with "Could not start
    gRPC server" (the old one still held the chief's port) and cost one more restart."""
    sim = ps_launch()
    sim.reaps("ps0", KILLED)
    sim.tick(1.0)  # ps0 restarted; the chief and worker1 are SIGKILLed (ps_lost)
    sim.tick(0.01)
    chief = sim.view.children[TRAINER]
    observe.death_noticed(sim.view, TRAINER, chief.attempt, sim.now, 0.0)  # its death notice, before the reap
    sim.reaps("worker1", KILLED)
    for _ in range(5):
        assert not [a for a in sim.tick(0.02) if isinstance(a, Spawn) and a.slot == TRAINER]
    assert sim.view.children[TRAINER] is chief
    sim.reaps(TRAINER, KILLED)
    acts = sim.tick(0.01) + sim.tick(0.01)
    assert Spawn(TRAINER, TRAINER) in acts and sim.view.children[TRAINER].attempt == 2


def test_a_killed_chief_is_restarted_alone_by_the_restart_policy() -> None:
    sim = ps_launch()
    worker = sim.view.children["worker1"]
    sim.reaps(TRAINER, KILLED)
    acts = sim.tick(1.0)
    assert [type(a) for a in acts] == [Restart]
    assert sim.tick(0.01) == [Spawn(TRAINER, TRAINER)]
    assert sim.view.children[TRAINER].attempt == 2
    assert sim.view.children["worker1"] is worker and worker.live and not of(sim.log, Signal)


def test_a_worker_that_finished_is_settled_and_not_restarted() -> None:
    sim = ps_launch()
    sim.reaps("worker1", 0)
    assert sim.tick(1.0) == [Settle("worker1", 1)]
    assert sim.tick(5.0) == [] and sim.view.children["worker1"].attempt == 1


def crash_loop(sim: PsSim) -> list[Action]:
    """worker1 fails three times in a row without a new checkpoint (--max-restarts 2); the last decision."""
    for n in range(2):  # two restarts without a checkpoint (the backoff delays the second)
        sim.reaps("worker1", 1)
        assert of(sim.tick(0.5), RestartTask)
        assert sim.tick(60.0) == [Spawn("worker1", WORKER)]  # after the backoff
        assert sim.view.children["worker1"].attempt == n + 2
        sim.steps("worker1", 10 + n)  # it steps again (no start-up failure) ...
        sim.steps(TRAINER, 10 + n)  # ... and the chief keeps stepping meanwhile
    sim.reaps("worker1", 1)
    return sim.tick(0.5)


def test_max_restarts_counts_per_task_a_crash_looping_worker_is_given_up_on_and_stop_fails_the_run() -> None:
    # --on-worker-give-up stop (this test asserted the GiveUp before the option existed; it now names it)
    sim = ps_launch(max_restarts=2, worker_give_up="stop")
    acts = crash_loop(sim)
    assert [type(a) for a in acts] == [GiveUp] and "worker1" in acts[0].reason  # type: ignore[attr-defined]
    assert "--max-restarts 2" in acts[0].reason  # type: ignore[attr-defined]
    assert sim.view.history.restarts == 0  # the chief was never restarted: the count was worker1's alone


def test_a_worker_given_up_on_under_continue_leaves_the_others_training() -> None:
    sim = ps_launch(max_restarts=2)  # --on-worker-give-up continue, the default
    chief, ps0 = sim.view.children[TRAINER], sim.view.children["ps0"]
    acts = crash_loop(sim)
    assert [type(a) for a in acts] == [GiveUpTask] and acts[0].slot == "worker1"  # type: ignore[attr-defined]
    assert "--max-restarts 2" in acts[0].reason  # type: ignore[attr-defined]
    assert not sim.view.finishing and sim.view.run == RunState.RUNNING
    assert sim.view.task_history["worker1"].restarts == 2
    sim.steps(TRAINER, 40)
    assert sim.tick(600.0) == []  # never started again, nobody signalled
    assert sim.view.children["worker1"].attempt == 3 and sim.view.children["worker1"].settled
    assert sim.view.children[TRAINER] is chief and sim.view.children["ps0"] is ps0 and chief.live and ps0.live
    assert not of(sim.log, Signal) and not of(sim.log, Kill)


def test_a_parameter_server_given_up_on_fails_the_run_whatever_the_worker_option() -> None:
    sim = ps_launch(max_restarts=0)
    sim.reaps("ps0", 1)
    acts = sim.tick(0.5)
    assert [type(a) for a in acts] == [GiveUp] and "ps0" in acts[0].reason  # type: ignore[attr-defined]


def test_a_chief_given_up_on_fails_the_run_whatever_the_worker_option() -> None:
    sim = ps_launch(max_restarts=0)
    sim.reaps(TRAINER, 1)
    assert [type(a) for a in sim.tick(0.5)] == [GiveUp]


def test_a_task_that_ends_during_a_stop_is_not_restarted() -> None:
    sim = ps_launch()
    sim.view.stop_signal = 15
    sim.reaps("worker1", KILLED)
    acts = sim.tick(1.0)
    assert of(acts, Settle) == [Settle("worker1", 1)] and not of(acts, RestartTask)
    assert not of(sim.tick(60.0), Spawn)


def test_logs_role_takes_a_parameter_server(tmp_path, capsys) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "ps0.1.log").write_text("procsv ps: task ps0 serving at grpc://127.0.0.1:1\n")
    (logs / "ps0.2.log").write_text("procsv ps: task ps0 serving at grpc://127.0.0.1:1 again\n")
    assert main(["logs", str(tmp_path), "--role", "ps0", "--attempt", "last"]) == 0
    out = capsys.readouterr().out
    assert "ps0 attempt 2" in out and "again" in out and "ps0.1.log" not in out


def test_a_stop_goes_to_the_other_workers_first_then_the_chief_commits_then_the_parameter_servers_stop() -> None:
    # before: the chief was signalled first and committed while worker1 still stepped (its steps
    # after the commit were lost), and ps0 was stopped together with worker1, which then blocked on it
    from procsv.watchdog.rules.bookkeeping import request_stop
    from procsv.watchdog.rules.lifecycle import RunState

    sim = ps_launch()
    request_stop(sim.view, 15, sim.now, sim.limits.stop_grace_secs)
    acts = sim.tick(0.1)
    assert [(a.slot, a.sig) for a in of(acts, Signal)] == [("worker1", 15)]  # not the chief yet
    assert not of(sim.tick(0.1), Signal)  # the chief waits while worker1 is live
    sim.reaps("worker1", 42)
    acts = sim.tick(0.1)
    assert of(acts, Settle) == [Settle("worker1", 1)] and not of(acts, RestartTask)
    assert [(a.slot, a.sig) for a in of(acts, Signal)] == [(TRAINER, 15)]  # now the chief commits
    sim.reaps(TRAINER, 42)
    acts = sim.tick(0.1)
    assert [type(a) for a in acts] == [Finish] and acts[0].run == RunState.STOPPED  # type: ignore[attr-defined]
    acts = sim.tick(0.1)  # rule 6: the parameter server is stopped now, its workers all ended
    assert "ps0" in {a.slot for a in of(acts, Signal)}
    assert not of(sim.log, RestartTask) and not of(sim.log, Restart) and not of(sim.log, Kill)


def test_a_parameter_server_still_live_after_its_shutdown_sigterm_gets_it_again_until_its_kill() -> None:
    # before: rule 6 sent ps0 one SIGTERM. A job-wide SIGTERM (scancel) still pending in ps0, not read
    # yet at load, swallows the watchdog's (a pending standard signal is not queued twice, and the one
    # read names the job's sender): ps0 left it to the watchdog and served on until its SIGKILL
    from procsv.watchdog.rules.bookkeeping import request_stop

    sim = ps_launch()
    request_stop(sim.view, 15, sim.now, sim.limits.stop_grace_secs)
    sim.tick(0.1)
    sim.reaps("worker1", 42)
    sim.tick(0.1)
    sim.reaps(TRAINER, 42)
    sim.tick(0.1)  # Finish
    assert ("ps0", 15) in [(a.slot, a.sig) for a in of(sim.tick(0.1), Signal)]  # (and the services)
    for service in ("summary", "checkpoint"):
        sim.reaps(service, 0)
    resend = sim.limits.stop_resend_secs
    assert not of(sim.tick(resend - 0.5), Signal)  # the first is given its time to be read
    assert [(a.slot, a.sig, a.cause) for a in of(sim.tick(0.5), Signal)] == [("ps0", 15, Cause.SHUTDOWN)]
    assert not of(sim.tick(resend - 0.5), Signal)
    assert [a.slot for a in of(sim.tick(0.5), Signal)] == ["ps0"]  # again, every stop_resend_secs
    assert [(a.slot, a.cause) for a in of(sim.tick(sim.limits.services_grace_secs), Kill)] == [("ps0", Cause.SHUTDOWN)]
    assert not of(sim.tick(resend), Signal)  # killed: no more SIGTERMs
    sim.reaps("ps0", 0)
    assert not sim.view.live_children()


def test_a_worker_and_the_services_still_live_after_their_stopping_sigterm_get_it_again() -> None:
    # before: only a server task's SIGTERM was sent again. A worker (rule 14's stop of the workers first)
    # and the services leave a foreign SIGTERM to the watchdog just as a server task does, and the
    # watchdog's, sent in the same millisecond as a job-wide one, merged into it: the worker trained on
    # until its SIGKILL at half the grace (CI), a service until the services' grace
    from procsv.watchdog.rules.bookkeeping import request_stop

    sim = ps_launch()
    resend = sim.limits.stop_resend_secs
    request_stop(sim.view, 15, sim.now, sim.limits.stop_grace_secs)
    assert [(a.slot, a.cause) for a in of(sim.tick(0.1), Signal)] == [("worker1", Cause.STOP)]
    assert not of(sim.tick(resend - 0.5), Signal)  # the first is given its time to be read
    assert [(a.slot, a.cause) for a in of(sim.tick(0.5), Signal)] == [("worker1", Cause.STOP)]
    sim.reaps("worker1", 42)
    assert [a.slot for a in of(sim.tick(0.1), Signal)] == [TRAINER]
    sim.reaps(TRAINER, 42)
    sim.tick(0.1)  # Finish
    assert {"ps0", "summary", "checkpoint"} <= {a.slot for a in of(sim.tick(0.1), Signal)}
    sim.reaps("ps0", 0)
    assert not of(sim.tick(resend - 0.5), Signal)
    assert sorted(a.slot for a in of(sim.tick(0.5), Signal)) == ["checkpoint", "summary"]
    sim.reaps("summary", 0)
    sim.reaps("checkpoint", 0)
    assert not of(sim.tick(resend), Signal)


def test_a_worker_that_does_not_stop_is_killed_at_half_the_grace_and_the_chief_is_signalled_after_it() -> None:
    from procsv.watchdog.rules.bookkeeping import request_stop

    sim = ps_launch()
    grace = sim.limits.stop_grace_secs
    request_stop(sim.view, 15, sim.now, grace)
    assert [a.slot for a in of(sim.tick(0.1), Signal)] == ["worker1"]
    assert not of(sim.tick(grace / 2 - 0.5), Kill)
    assert [(a.slot, a.cause) for a in of(sim.tick(0.5), Kill)] == [("worker1", Cause.STOP_GRACE)]
    assert not of(sim.tick(0.1), Signal)
    sim.reaps("worker1", KILLED)
    assert [a.slot for a in of(sim.tick(0.1), Signal)] == [TRAINER]
    # the worker's kill left the chief's own deadline: a chief that does not stop is killed at the grace's end
    assert not of(sim.tick(grace / 2 - 1.0), Kill)
    assert [(a.slot, a.cause) for a in of(sim.tick(1.0), Kill)] == [(TRAINER, Cause.STOP_GRACE)]


def test_a_shutdown_holds_the_parameter_servers_until_every_worker_ended() -> None:
    sim = ps_launch(max_restarts=0)
    sim.reaps(TRAINER, 1)  # given up on the chief: the run fails and shuts down
    assert of(sim.tick(0.5), GiveUp)
    acts = sim.tick(0.1)
    assert "worker1" in (sent := {a.slot for a in of(acts, Signal)}) and "ps0" not in sent  # held: worker1 runs
    sim.reaps("worker1", 1)
    assert "ps0" in {a.slot for a in of(sim.tick(0.1), Signal)}


def test_status_says_workers_and_parameter_servers_not_a_trainer_group() -> None:
    from procsv.status import render

    ps = {"state": "running", "step": 7, "restarts": 0, "group": {"nproc": 2, "state": "running", "ps": 1},
          "processes": [{"role": "ps0", "pid": 11, "state": "starting", "restarts": 1}]}
    text = render(ps, "/run")
    assert "2 worker(s) and 1 parameter server(s), each restarted alone" in text and "trainer group" not in text
    assert "ps0" in text
    group = {**ps, "group": {"nproc": 2, "state": "running", "ps": 0}}
    assert "trainer group of 2: running" in render(group, "/run")


@pytest.mark.parametrize("workers,coordinator", [(1, False), (2, False), (2, True)])
def test_ps_launch_config_has_no_hot_standby_and_its_workers_as_nproc(workers: int, coordinator: bool, tmp_path,
                                                                      monkeypatch) -> None:
    # a hot standby runs the program up to its restore: under --ps it would start a second server on
    # the chief's port; --ps forks each task from the pre-warmed trainer instead (even with one worker)
    import procsv.watchdog.launcher as launcher

    seen = []

    class Captured:
        def __init__(self, cfg, born=None, seed=None):  # type: ignore[no-untyped-def]  # born: when the launch began
            seen.append(cfg)

        def run(self) -> int:
            return 0

    monkeypatch.setattr(launcher, "Watchdog", Captured)
    assert main(["launch", "procsv.examples.seeds_tf1.replicas", "--logdir", str(tmp_path), "--ps", "1",
                 "--workers", str(workers), *(["--coordinator"] if coordinator else [])]) == 0
    (cfg,) = seen
    assert (cfg.standby, cfg.ps, cfg.nproc, cfg.coordinator) == ("fork", 1, workers, coordinator)
    assert (cfg.limits().ps, cfg.limits().nproc, cfg.limits().coordinator) == (1, workers, coordinator)
    assert cfg.limits().worker_give_up == "continue"  # the default


@pytest.mark.parametrize("give_up", ["continue", "stop"])
def test_a_coordinators_worker_server_given_up_on_follows_the_option(give_up: str) -> None:
    # --coordinator: the worker servers (role server) are workers too; ClusterCoordinator runs their
    # functions on the others, so continue trains on without one, stop fails the run
    from test_ps_strategy_pure import CoordinatorSim

    sim = CoordinatorSim(Limits(hang=HangLimits(None, None), nproc=2, ps=1, coordinator=True,
                                restart=RestartPolicy(max_restarts=0), worker_give_up=give_up))
    assert sim.tick() == [Spawn(TRAINER, TRAINER)]
    sim.steps(TRAINER, 5)
    sim.reaps("worker1", KILLED)
    acts = sim.tick(1.0)
    assert [type(a) for a in acts] == [GiveUpTask if give_up == "continue" else GiveUp]
    assert acts[0].slot == "worker1"  # type: ignore[attr-defined]
    assert sim.view.finishing == (give_up == "stop")
    if give_up == "continue":
        assert sim.view.tasks_given_up == ["worker1"] and sim.tick(60.0) == []


def test_a_coordinators_tasks_are_counted_per_task_with_the_server_role() -> None:
    from test_ps_strategy_pure import CoordinatorSim
    from procsv.watchdog.publish.runmetrics import task_rows

    sim = CoordinatorSim(Limits(hang=HangLimits(None, None), nproc=2, ps=1, coordinator=True))
    sim.tick()
    sim.reaps("worker1", KILLED)
    sim.tick(1.0)
    sim.tick(0.01)
    assert task_rows(sim.view) == (("chief", "chief", 0), ("ps0", "ps", 0), ("worker0", "server", 0),
                                   ("worker1", "server", 1))


def test_a_ps_worker_is_stuck_when_quiet_while_the_others_step_or_every_task_is_quiet_not_while_a_ps_works() -> None:
    """Issue 69 with --ps: each task is judged alone. A worker quiet while the other workers complete
    steps is stuck (the parameter servers serve them: it waits on no busy one; helper-74's attack: before,
    the busy ps0 hid it until --hang-timeout). A worker quiet while no task steps and ps0 computes waits on a
    slow parameter server: not stuck. Once every task is quiet, stuck."""
    from test_watchdog_decide import _looks
    from procsv.watchdog.rules.actions import TakeStacks

    def launch() -> PsSim:
        sim = PsSim(Limits(hang=HangLimits(600.0, 1800.0, stuck_secs=10.0), nproc=2, ps=1))
        assert sim.tick() == [Spawn(TRAINER, TRAINER)]
        for slot in (TRAINER, "worker1"):
            sim.steps(slot, 5)
        return sim

    def second(sim: PsSim, looks: tuple[tuple[str, float], ...], chief_steps: bool) -> list[Any]:
        for slot, cpu in looks:
            _looks(sim, slot, 1.0, cpu=cpu)
            sim.now -= 1.0
        sim.now += 1.0
        if chief_steps:
            sim.steps(TRAINER, 6)
        return sim.tick()

    sim = launch()  # worker1 quiet, the chief stepping (ps0 busy with its updates): stuck at 10 s
    acts = [second(sim, (("worker1", 0.0), ("ps0", 0.5), (TRAINER, 0.4)), True) for _ in range(11)]
    assert [a.slot for tick in acts for a in of(tick, TakeStacks)] == ["worker1"]
    assert [i for i, tick in enumerate(acts) if of(tick, TakeStacks)] == [9]  # (its 10th second)

    sim = launch()  # no task steps, ps0 computes: worker1 and the chief wait on it
    for _ in range(30):
        assert not of(second(sim, (("worker1", 0.0), ("ps0", 0.6), (TRAINER, 0.0)), False), TakeStacks)
    acts = [second(sim, (("worker1", 0.0), ("ps0", 0.0), (TRAINER, 0.0)), False) for _ in range(11)]  # all quiet
    assert "worker1" in {a.slot for tick in acts for a in of(tick, TakeStacks)}
    assert not any(of(tick, TakeStacks) for tick in acts[:9])  # (not before 10 s of it)
