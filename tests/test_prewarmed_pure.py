"""``prewarm.Prewarmed.answered``: how the starts asked of the zygote end, for node 0's executor and a node
agent alike. The zygote here is a stand-in that answers from a table (the real fork path is tested with real
processes in test_zygote_parent, test_zygote_late_fork and test_fork_attacks): what is tested is which start
gets a process and which starts fresh."""

from __future__ import annotations

import subprocess
import sys
from typing import Optional, Union

from procsv.watchdog.prewarm import Adopted, PendingFork, Prewarmed, ZygoteSeed, ZygoteUnavailable
from procsv.watchdog.rules.state import WORKER

Answer = Union[Adopted, ZygoteUnavailable, None]


class TableZygote:
    """Answers each (attempt, rank) from ``answers``; once killed, a start without an answer read is lost."""

    ready = True

    def __init__(self, answers: dict[tuple[int, int], Answer]) -> None:
        self.answers = answers
        self.killed = False

    def request_fork(self, *args: object) -> float:
        return 0.0

    def answer(self, attempt: int, rank: int = 0) -> Optional[Adopted]:
        got = self.answers.pop((attempt, rank), None)
        if isinstance(got, ZygoteUnavailable):
            raise got
        if got is None and self.killed:
            raise ZygoteUnavailable("the zygote died")
        return got

    def kill(self) -> None:
        self.killed = True


def _pending(rank: int) -> PendingFork:
    return PendingFork(f"worker{rank}", 1, {}, f"/nonexistent/worker{rank}.1.log", None, WORKER, rank)


def test_a_start_the_zygote_answered_before_it_was_given_up_for_another_is_not_started_twice() -> None:
    # member 0's fork failed, member 1's was answered (its process runs): before, giving the zygote up for
    # member 0 made member 1 start fresh too, a second process on the same task and port
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        forked = Adopted(child.pid)
        zygote = TableZygote({(1, 0): ZygoteUnavailable("fork failed"), (1, 1): forked})
        pre = Prewarmed()
        pre.zygote = zygote  # type: ignore[assignment]
        first, second, third = _pending(0), _pending(1), _pending(2)
        assert all(pre.ask_zygote(p, "t.py", [], "/") for p in (first, second, third))
        done = pre.answered()
        assert [(p.rank, proc) for p, proc in done] == [(0, None), (1, forked), (2, None)]
        assert zygote.killed and pre.zygote is None and pre.dead_zygotes == [zygote]  # given up once
        assert pre.forks == {}
    finally:
        child.kill()
        child.wait()


def test_a_start_still_waiting_stays_pending_and_a_failed_one_gives_the_zygote_up() -> None:
    zygote = TableZygote({(1, 0): ZygoteUnavailable("it did not answer the fork request within 10 s")})
    pre = Prewarmed()
    pre.zygote = zygote  # type: ignore[assignment]
    waiting = _pending(1)
    zygote.answers[(1, 1)] = None
    assert pre.ask_zygote(waiting, "t.py", [], "/")
    assert pre.answered() == [] and pre.forks == {(1, 1): waiting}  # no answer yet: nothing done
    assert pre.ask_zygote(_pending(0), "t.py", [], "/")
    assert [(p.rank, proc) for p, proc in pre.answered()] == [(0, None)]  # failed: it starts fresh
    assert pre.zygote is None and pre.dead_zygotes == [zygote]  # and the zygote is given up
    assert [(p.rank, proc) for p, proc in pre.answered()] == [(1, None)]  # then the one waiting on it, fresh too
    assert pre.forks == {} and pre.dead_zygotes == [zygote]


def test_a_zygote_seed_suits_only_a_zygote_environment_with_the_import_defaults_the_launch_had() -> None:
    from procsv.common.spawn import IMPORT_DEFAULTS, child_env, import_defaults  # (the spawn side of the rule)

    launch_env = {"PATH": "/bin", "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONUNBUFFERED": "1"}
    seed = ZygoteSeed(1, -1, -1, "3,4,5", import_defaults(launch_env))
    zygote = child_env(role="zygote", attempt=1, logdir="/r", runtime_dir="/t", supervised=True, base=launch_env)
    assert seed.suits(zygote)  # the launch's own values kept: TensorFlow was imported with them
    bare = {"PATH": "/bin"}  # a spawn adds the defaults, which TensorFlow here was not imported with
    assert not ZygoteSeed(1, -1, -1, "3,4,5", import_defaults(bare)).suits(
        child_env(role="zygote", attempt=1, logdir="/r", runtime_dir="/t", supervised=True, base=bare))
    assert not seed.suits({**zygote, "TF_CPP_MIN_LOG_LEVEL": "0"})
    assert set(IMPORT_DEFAULTS) == {"TF_CPP_MIN_LOG_LEVEL", "PYTHONUNBUFFERED"}
