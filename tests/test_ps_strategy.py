"""Issue 43: ``procsv launch --ps N --workers M --coordinator``, TF2 ``ParameterServerStrategy``.

Real ``tf.distribute.Server`` processes (one parameter server, two workers) that procsv starts, the
example ``procsv.examples.ps_strategy`` as the coordinator (task ``chief/0``), real gRPC. Its step
``s`` is a function of ``s`` alone, scheduled on a worker and joined, so the variables a checkpoint
at step ``s`` holds are :func:`procsv.examples.ps_strategy.replay`'s, whichever worker ran it.
"""

from __future__ import annotations

import json
import os
import re
import signal
from typing import Any

import numpy as np
import pytest

from conftest import committed_steps, finish, launch, lifecycle, wait_for
from ps_helpers import entry, log_of

pytestmark = pytest.mark.slow

TARGET = "procsv.examples.ps_strategy"
OPTS = ("--ps", "1", "--workers", "2", "--coordinator")


def restored(path: str) -> dict[str, np.ndarray]:
    """The model's variables in the checkpoint at ``path``, read back with ``tf.train.Checkpoint.restore``."""
    import tensorflow as tf

    from procsv.examples.ps_strategy import build

    m = build(tf)
    tf.train.Checkpoint(model=m).restore(path).expect_partial().assert_existing_objects_matched()
    return {"w": m.w.numpy(), "b": m.b.numpy()}


def test_the_coordinator_trains_to_the_end_and_its_checkpoint_holds_the_trained_variables(short_tmp: str) -> None:
    import tensorflow as tf

    from procsv.examples.ps_strategy import replay

    logdir = os.path.join(short_tmp, "run")
    proc = launch(logdir, "--steps", "40", "--save-model-secs", "60", target=TARGET, opts=OPTS)
    try:
        code, out, err = finish(proc, 300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            finish(proc, 120)
    assert code == 0, err[-3000:]
    chief = log_of(logdir, "trainer.1.log")
    assert "variables on /job:ps/replica:0/task:0" in chief, chief[-2000:]  # the strategy put them on the ps
    for task in ("worker0", "worker1", "ps0"):  # the servers procsv started, each its job's task
        assert f"procsv ps: task {task} serving at grpc://127.0.0.1:" in log_of(logdir, f"{task}.1.log")
    latest = tf.train.latest_checkpoint(logdir)
    assert latest == os.path.join(logdir, "model.ckpt-40")  # the final checkpoint, through the service
    got, want = restored(latest), replay(40)
    np.testing.assert_allclose(got["w"], want["w"], rtol=0, atol=1e-6)
    np.testing.assert_allclose(got["b"], want["b"], rtol=0, atol=1e-6)
    assert not np.allclose(got["w"], replay(39)["w"], rtol=0, atol=1e-6)  # the comparison tells a step apart


def _what_each_said(logdir: str) -> str:
    """The last lifecycle records (but the periodic commits, which fill a stepping run's tail), the
    coordinator's status entry and the tail of every task's log, for a failure's message."""
    records = "\n".join(json.dumps(e) for e in [e for e in lifecycle(logdir)
                                                if e.get("event") != "checkpoint_committed"][-25:])
    records += f"\nstatus.json's trainer entry: {entry(logdir, 'trainer')}"
    tails = []
    folder = os.path.join(logdir, "logs")
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        tails.append(f"--- {name}\n{log_of(logdir, name)[-1500:]}")
    return "\n".join(tails) + f"\nlifecycle (last 25):\n{records}"  # last: a cut output keeps its tail


def stepping(logdir: str, attempt: int, past: int) -> dict[str, Any]:
    """The coordinator's entry once its attempt ``attempt`` reported a step beyond ``past`` (else ``{}``)."""
    e = entry(logdir, "trainer")
    return e if e.get("attempt") == attempt and e.get("state") == "running" and e.get("step", 0) > past else {}


def flat(v: dict[str, np.ndarray]) -> np.ndarray:
    return np.concatenate([v["w"].ravel(), v["b"].ravel()]).astype(np.float64)


def reapplied_bound(path: list[dict[str, np.ndarray]], first: int, step: int, k: int) -> float:
    """How far (L2, over ``w`` and ``b``) the run's variables at ``step`` may be from the plain run's
    (``path``: :func:`replay_path`'s) when ``k`` of the steps ``first .. step`` were applied twice.

    ``ClusterCoordinator`` runs a function at least once, by TensorFlow's own contract ("a function
    may be executed more than once"): a worker killed after it applied a step's update (all of it, or
    its first assign) but before the coordinator fetched the step's result has that closure run again
    on another worker. On the state ``v`` the step met, that adds ``(I - 2 LR A_s) P u_s(v)`` (``u_s``:
    the step's update, ``P`` the part that had landed, ``A_s`` the batch's ``Z^T Z / BATCH``, ``Z``
    its inputs with a column of ones): at most ``|u_s|``, which is the plain run's
    ``|path[s] - path[s - 1]|`` while no step was repeated before. Every later step maps a difference
    ``e`` to ``(I - 2 LR A_t) e``, never larger (``2 LR |A_t| < 2``: LR 0.002, ``|A_t|`` about 5), and a
    restore copies it exactly. So ``k`` repeats stay within ``k`` times the largest such update of a
    step that could have been the repeated one; 1e-5 for float noise (the clean run is within 1e-6)."""
    updates = [float(np.linalg.norm(flat(path[s]) - flat(path[s - 1]))) for s in range(max(first, 1), step + 1)]
    return k * max(updates) + 1e-5


def test_the_reapplied_step_bound_holds_the_ci_runs_state_and_no_more() -> None:
    """The bound of :func:`reapplied_bound` on states computed in this process: the fresh-clone CI run's
    (step 10 applied twice, then steps to 127: ``w[2]`` 0.83613 where the plain run has 0.82111, outside
    the 0.01 the test allowed before) is within it; step 10 applied three times (two repeats where the
    launch kills one worker) and the run that trained zeroed variables from step 100 on are not."""
    import tensorflow as tf

    from procsv.examples.ps_strategy import build, replay_path, step_function

    def run(times: int, at: int, steps: int) -> dict[str, np.ndarray]:
        m = build(tf)
        per_step = step_function(tf, m)
        for s in range(1, steps + 1):
            for _ in range(times if s == at else 1):
                per_step(tf.constant(s, tf.int64))
        return {"w": m.w.numpy(), "b": m.b.numpy()}

    path = replay_path(127)
    bound = reapplied_bound(path, 1, 127, 1)  # any step of the CI run's may have been the one
    ci = run(2, 10, 127)
    assert abs(float(ci["w"][2, 0]) - 0.83613) < 2e-5 and abs(float(path[127]["w"][2, 0]) - 0.82111) < 2e-5
    assert np.linalg.norm(flat(ci) - flat(path[127])) <= bound
    assert np.linalg.norm(flat(run(3, 10, 127)) - flat(path[127])) > bound
    assert np.linalg.norm(flat(path[27]) - flat(path[127])) > bound  # zeroed at step 100, 27 steps since


def restored_step(text: str) -> int:
    return int(text.split("procsv: restored step ")[1].split()[0])


def test_each_task_of_the_coordinators_cluster_is_restarted_alone(short_tmp: str) -> None:
    """One launch, asserting after each SIGKILL: a worker server (restarted alone; the coordinator's
    ClusterCoordinator runs its steps on the other worker meanwhile and steps on after it is back),
    the coordinator (restarted, it restores the newest checkpoint into the parameter server before it
    dispatches again), the parameter server (restarted; procsv ends the coordinator, whose strategy
    cannot outlive it, and the next one restores); then SIGTERM to the launch: the coordinator
    commits its last step and every task stops (exit 143)."""
    from procsv.examples.ps_strategy import replay_path

    logdir = os.path.join(short_tmp, "run")
    proc = launch(logdir, "--steps", "100000", "--save-model-secs", "1", "--step-delay", "0.05",
                  target=TARGET, opts=OPTS)
    try:
        wait_for(lambda: proc.poll() is not None or [s for s in committed_steps(logdir) if s > 0], 180,
                 what="a committed checkpoint")
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        chief = wait_for(lambda: stepping(logdir, 1, 0), 60, what="the coordinator stepping")
        servers = {r: entry(logdir, r) for r in ("worker0", "worker1", "ps0")}
        assert all(e.get("attempt") == 1 for e in servers.values()), servers
        wait_for(lambda: all(entry(logdir, r).get("state") == "running" for r in servers), 30,
                 what="every server running in status.json (its Hello)")

        # 1. a worker server killed: the coordinator steps on (on worker0) while it is down and after
        # it is back; procsv restarts it alone, on the same address
        down = entry(logdir, "trainer").get("step", 0)
        os.kill(servers["worker1"]["pid"], signal.SIGKILL)
        wait_for(lambda: entry(logdir, "trainer").get("step", 0) > down + 5, 60, what="the coordinator stepping on")
        assert "serving" not in log_of(logdir, "worker1.2.log")  # ... while worker1 was not back yet
        wait_for(lambda: "serving at grpc://" in log_of(logdir, "worker1.2.log"), 120, what="worker1 serving again")
        back = entry(logdir, "trainer").get("step", 0)
        wait_for(lambda: entry(logdir, "trainer").get("step", 0) > back + 10, 60, what="the coordinator stepping after")
        w1 = entry(logdir, "worker1")
        assert w1["attempt"] == 2 and w1["pid"] != servers["worker1"]["pid"]
        now = entry(logdir, "trainer")
        assert (now["pid"], now["attempt"]) == (chief["pid"], 1)  # the coordinator was never restarted ...
        assert [entry(logdir, r)["pid"] for r in ("worker0", "ps0")] == [servers[r]["pid"] for r in ("worker0", "ps0")]
        addr = log_of(logdir, "worker1.1.log").split("serving at ")[1].split()[0]
        assert f"serving at {addr}" in log_of(logdir, "worker1.2.log")  # ... and worker1 is back where it was

        # 2. the coordinator killed: restarted, it restores the newest checkpoint before it dispatches
        newest = committed_steps(logdir)[-1]
        os.kill(chief["pid"], signal.SIGKILL)
        c2 = wait_for(lambda: stepping(logdir, 2, 0), 120, what="the coordinator's restart stepping")
        text = log_of(logdir, "trainer.2.log")
        assert restored_step(text) >= newest, text[-2000:]
        assert text.index("procsv: restored step") < text.index("ps_strategy: coordinator at step")
        wait_for(lambda: committed_steps(logdir)[-1] > max(newest, c2["step"]), 60, what="a newer checkpoint")
        assert [entry(logdir, r)["pid"] for r in ("worker0", "worker1", "ps0")] == \
            [servers["worker0"]["pid"], w1["pid"], servers["ps0"]["pid"]]  # the servers untouched

        # 3. the parameter server killed (the variables with it): restarted; the coordinator ended by
        # procsv and restarted, restoring the newest checkpoint into the new parameter server
        before = committed_steps(logdir)[-1]
        os.kill(servers["ps0"]["pid"], signal.SIGKILL)
        wait_for(lambda: entry(logdir, "ps0").get("attempt") == 2, 60, what="ps0 restarted")
        try:
            c3 = wait_for(lambda: stepping(logdir, 3, 0), 180, what="the coordinator stepping after the ps")
        except AssertionError as timed_out:  # (was: attempt 3 forked before ps0 served: tasks.ps_not_serving)
            raise AssertionError(f"{timed_out}\n{_what_each_said(logdir)}") from None
        text = log_of(logdir, "trainer.3.log")
        r3 = restored_step(text)
        assert r3 >= before and text.index("procsv: restored step") < text.index("ps_strategy: coordinator at step")
        assert [entry(logdir, r)["pid"] for r in ("worker0", "worker1")] == [servers["worker0"]["pid"], w1["pid"]]
        wait_for(lambda: entry(logdir, "trainer").get("step", 0) > c3["step"] + 10, 60,
                 what="the coordinator stepping on")

        # 4. SIGTERM to the launch: the coordinator commits its last step, every task stops
        os.killpg(proc.pid, signal.SIGTERM)
        code, out, err = finish(proc, 180)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            finish(proc, 120)
    assert code == 128 + signal.SIGTERM, err[-3000:]
    # 3's coordinator did not outlive the parameter server: procsv ended it (rule 14, the usual order;
    # the decision itself: test_ps_strategy_pure.py), or, when gRPC told it before the watchdog had
    # reaped ps0 (seen once at load 12), its own step failed first with the server's connection gone
    # (the error's message may span lines, TensorFlow's gRPC errors do: the watchdog's line goes on to its
    # "; restarted", or "; restarting in" where its reaping came before its death notice, with no other "procsv:" line between)
    said = out + err
    own = re.search(r"trainer attempt 2 \(pid \d+\) [^\n]*(UnavailableError|Connection reset|Socket closed|"
                    r"failed to connect)(?:(?!\nprocsv: ).)*; restart(ed|ing in)", said, re.DOTALL)
    assert "a parameter server died and its variables with it; killing the trainer task" in said or own, said[-3000:]
    for task in ("worker0", "worker1", "ps0"):
        assert "stopping (SIGTERM)" in log_of(logdir, f"{task}.{entry(logdir, task)['attempt']}.log"), task
    import tensorflow as tf

    latest = tf.train.latest_checkpoint(logdir)
    assert latest is not None
    step = int(os.path.basename(latest)[len("model.ckpt-"):])
    assert step > c3["step"] and step == committed_steps(logdir)[-1]
    path = replay_path(step)
    got, want = restored(latest), path[step]
    # near the plain run's variables at that step, not bit-equal: the step in flight when worker1 was
    # killed (`down`, the step status.json had before the kill, or a later one) may have been applied
    # twice (ClusterCoordinator's at-least-once closures: reapplied_bound); k = 1, the one worker kill.
    # The coordinator's kill and the parameter server's add none: each ends in a restore of a
    # checkpoint taken between joined steps, and a killed coordinator's closure, should it still run,
    # updates that coordinator's variables, not the ones its successor restored into
    # (docs/parameter-servers.md). Seen once in 8 CI runs: w[2] 0.015 ahead at step 127, step 10
    # applied twice (test_the_reapplied_step_bound_holds_the_ci_runs_state_and_no_more). A coordinator
    # that trained the parameter server's lost (zero) variables from step r3 on would hold
    # replay(step - r3)'s
    bound = reapplied_bound(path, down, step, 1)
    assert np.linalg.norm(flat(got) - flat(want)) <= bound, (got, want, bound)
    assert not np.allclose(got["w"], path[step - r3]["w"], rtol=0, atol=0.01)
    assert np.linalg.norm(flat(got) - flat(path[step - r3])) > bound  # the bound tells the two apart
