"""Trainer groups (``procsv launch --nproc 2``) with real processes, real TensorFlow collectives and real signals.

Each test launches ``procsv.examples.digits --strategy multiworker`` (MultiWorkerMirroredStrategy
across two trainer processes on this host), kills or stops a member with a real signal, and
reads the outcome back from the lifecycle log and the checkpoints (with plain TensorFlow). The
``logdir`` fixture fails a test that leaves any process of the run behind.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from typing import Any

from conftest import REPO, committed_steps, finish, launch, lifecycle, quiet_env, raw_status, wait_for, wait_role_pid

GROUP = ("--nproc", "2")
ARGS = ("--strategy", "multiworker", "--save-model-secs", "1", "--step-delay", "0.004", "--print-every-steps", "100000")


def events(logdir: str, name: str) -> list[dict[str, Any]]:
    return [r for r in lifecycle(logdir) if r.get("event") == name]


def at_step(logdir: str, step: int, timeout: float = 120) -> None:
    wait_for(lambda: (raw_status(logdir) or {}).get("step", 0) >= step, timeout, what=f"step {step}")


def group_started(logdir: str, attempt: int, timeout: float = 120) -> None:
    """The chief of ``attempt`` took its first step (its worker took it with it: a step is collective)."""
    wait_for(lambda: len(events(logdir, "first_step")) >= attempt, timeout, what=f"attempt {attempt}'s first step")


def restores_with_plain_tf(logdir: str) -> int:
    """Restore the newest checkpoint into a fresh digits model with plain TensorFlow; its step."""
    import tensorflow as tf

    from procsv.examples.digits import build_model

    model, optimizer, _ = build_model()
    step = tf.Variable(0, dtype=tf.int64)
    ckpt = tf.train.Checkpoint(model=model, optimizer=optimizer, global_step=step)
    ckpt.restore(tf.train.latest_checkpoint(logdir)).assert_existing_objects_matched()
    return int(step.numpy())


def test_a_killed_worker_then_a_killed_chief_each_restart_the_whole_group_which_finishes(logdir):
    proc = launch(logdir, *ARGS, "--steps", "600", opts=GROUP)
    try:
        group_started(logdir, 1)
        at_step(logdir, 150)
        st = wait_for(lambda: (lambda s: s if s and (s.get("group") or {}).get("state") == "running" else None)(
            raw_status(logdir)), 30, what="the group to be running in status.json")
        members = {p["role"]: p for p in st["processes"] if "rank" in p}
        assert set(members) == {"trainer", "worker1"} and st["group"]["nproc"] == 2
        assert members["worker1"]["rank"] == 1 and members["worker1"]["step"] > 0 and members["worker1"]["host"]
        os.kill(wait_role_pid(logdir, "worker1"), signal.SIGKILL)
        group_started(logdir, 2)
        at_step(logdir, (raw_status(logdir) or {}).get("step", 0) + 50)
        chief = wait_role_pid(logdir, "trainer")
        os.kill(chief, signal.SIGKILL)
    finally:
        code, out, err = finish(proc)
    assert code == 0, err
    restarting = events(logdir, "restarting")
    assert [r["attempt"] for r in restarting] == [2, 3], restarting
    # each group restarted on its member's death notice, which may come before the exit status (then
    # the restart's line says "died", and the exited event, once reaped, says how): both say SIGKILL
    assert restarting[0]["error"].startswith("worker1 attempt 1")
    assert restarting[1]["error"].startswith("trainer attempt 2")
    for role, attempt in (("worker1", 1), ("trainer", 2)):
        assert {"role": role, "attempt": attempt, "signal": "SIGKILL"}.items() <= \
            [r for r in events(logdir, "exited") if r["role"] == role and r["attempt"] == attempt][0].items()
    spawned = [(r["role"], r["attempt"]) for r in events(logdir, "spawned") if r["role"] in ("trainer", "worker1")]
    assert sorted(spawned) == [("trainer", 1), ("trainer", 2), ("trainer", 3),
                               ("worker1", 1), ("worker1", 2), ("worker1", 3)]
    # every group restored the chief's checkpoint and trained on from it, to the end
    restored = [r["step"] for r in events(logdir, "restored")]
    assert len(restored) == 2 and all(s > 0 for s in restored)
    assert "procsv: worker1 (pid" in err and "the whole group restarts together" in err
    assert committed_steps(logdir)[-1] == 600
    assert restores_with_plain_tf(logdir) == 600


def test_sigterm_to_the_launch_stops_the_group_at_a_committed_step_and_a_relaunch_resumes_exactly_there(logdir):
    proc = launch(logdir, *ARGS, "--steps", "5000", opts=GROUP)
    try:
        group_started(logdir, 1)
        at_step(logdir, 100)
        proc.send_signal(signal.SIGTERM)
    finally:
        code, out, err = finish(proc)
    assert code == 128 + signal.SIGTERM, err
    finished = events(logdir, "finished")[-1]
    preempted = [r for r in events(logdir, "checkpoint_committed") if r["reason"] == "preempted"]
    assert len(preempted) == 1 and preempted[0]["step"] == finished["step"] > 0  # steps lost: 0
    stopped_at = finished["step"]
    assert "while stopping, worker1" not in err  # the worker failing in its collective once the chief left is expected
    code, out, err = finish(launch(logdir, *ARGS, "--steps", str(stopped_at + 30), opts=GROUP))
    assert code == 0, err
    assert events(logdir, "restored")[-1]["step"] == stopped_at
    assert restores_with_plain_tf(logdir) == stopped_at + 30


def test_a_sigstopped_worker_is_found_hung_and_the_group_restarts_without_it(logdir):
    opts = GROUP + ("--hang-timeout", "3", "--hang-grace-secs", "1")
    proc = launch(logdir, *ARGS, "--steps", "400", opts=opts)
    try:
        group_started(logdir, 1)
        at_step(logdir, 100)
        frozen = wait_role_pid(logdir, "worker1")
        os.kill(frozen, signal.SIGSTOP)  # frozen: TF's own heartbeat is 6.5 s
        wait_for(lambda: events(logdir, "hang_detected"), 30, what="the hang to be detected")
    finally:
        code, out, err = finish(proc)
    assert code == 0, err
    # the stopped worker is the one found hung and blamed, not the chief blocked waiting for it
    assert [r["pid"] for r in events(logdir, "hang_detected")] == [frozen]
    restarting = events(logdir, "restarting")
    assert [r["attempt"] for r in restarting] == [2] and restarting[0]["error"].startswith("worker1 attempt 1")
    assert "procsv: worker1 attempt 1" in err and "is hung" in err
    assert restores_with_plain_tf(logdir) == 400


def test_a_worker_failing_at_import_fails_the_group_start_with_backoff_and_no_storm(logdir):
    target = os.path.join(REPO, "tests", "programs", "group_import_fail.py")
    code, out, err = finish(launch(logdir, *ARGS, "--steps", "50", target=target, opts=GROUP))
    assert code == 1, err
    restarting = events(logdir, "restarting")  # one retry, then the start-up failure rule gives up
    assert len(restarting) == 1
    assert "worker1 attempt 1" in restarting[0]["error"] and "ModuleNotFoundError" in restarting[0]["error"]
    gave_up = events(logdir, "gave_up")
    assert len(gave_up) == 1 and "before its first step 2 times in a row" in gave_up[0]["reason"]
    assert gave_up[0]["error"].startswith("worker1 attempt 2") and "ModuleNotFoundError" in gave_up[0]["error"]
    assert "procsv: giving up" in err and "procsv_no_such_module" in err
    assert not events(logdir, "first_step")


def test_bad_group_and_multi_host_options_are_one_line_usage_errors(tmp_path):
    cases = ((("--nproc", "0"), "--nproc must be >= 1"),
             (("--nproc", "2", "--standby", "hot"), "--standby hot needs a single trainer"),
             (("--nproc", "2", "--group-grace-secs", "-1"), "--group-grace-secs must be >= 0"),
             (("--nnodes", "2"), "--nnodes 2 needs --master-addr HOST:PORT"),
             (("--nnodes", "2", "--master-addr", "h:x"), "--nnodes 2 needs --master-addr HOST:PORT"),
             (("--nnodes", "2", "--node-rank", "2", "--master-addr", "h:1"), "--node-rank must be from 0 to"),
             (("--rejoin-timeout", "0"), "--rejoin-timeout must be > 0"))
    # the launches start at once (each with a logdir of its own), then each is judged
    procs = [subprocess.Popen([sys.executable, "-m", "procsv", "launch", "procsv.examples.digits", "--logdir",
                               str(tmp_path / f"run{i}"), *opts], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=quiet_env(), start_new_session=True) for i, (opts, _) in enumerate(cases)]
    try:
        done = [p.communicate(timeout=60) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for i, ((opts, words), p, (_, err)) in enumerate(zip(cases, procs, done)):
        assert p.returncode == 2, (opts, err)
        lines = err.strip().splitlines()
        assert len(lines) == 1 and words in lines[0], (opts, err)
        assert not os.path.exists(tmp_path / f"run{i}"), opts


def test_a_worker_that_claims_to_be_the_chief_is_a_usage_error_that_gives_up_at_once(logdir):
    target = os.path.join(REPO, "tests", "programs", "group_two_chiefs.py")
    code, out, err = finish(launch(logdir, target=target, opts=GROUP))
    assert code == 1, err
    assert not events(logdir, "restarting")  # a usage error before the first step: no restart
    gave_up = events(logdir, "gave_up")
    assert gave_up and "the trainer group's worker1 cannot start: UsageError" in gave_up[0]["reason"]
    assert "is_chief=True in trainer 1 of a group of 2" in err and "procsv.cluster.is_chief()" in err


def test_a_groups_chief_takes_no_in_memory_snapshot_so_none_is_persisted_behind_the_groups_restart(logdir):
    # before: the chief took in-memory snapshots like a lone trainer; killed with its group, its
    # snapshot was persisted by the checkpoint service on its own (no RecoverQuery, no GroupPin): a
    # commit of the dead attempt that could land after the next group pinned and restored an older one
    # steps of 20 ms: the seconds it needs, with fewer steps (each a collective that costs CPU in both)
    proc = launch(logdir, "--strategy", "multiworker", "--save-model-secs", "1000", "--step-delay", "0.02",
                  "--print-every-steps", "100000", "--steps", "100000", opts=GROUP)
    try:
        group_started(logdir, 1)
        at_step(logdir, 200, timeout=180)  # 4 s of steps at least: a lone trainer holds snapshots by now
        os.kill(wait_role_pid(logdir, "worker1"), signal.SIGKILL)
        group_started(logdir, 2)
        at_step(logdir, (raw_status(logdir) or {}).get("step", 0) + 50)
    finally:
        proc.send_signal(signal.SIGTERM)
        code, out, err = finish(proc)
    assert code == 143, err
    with open(os.path.join(logdir, ".procsv", "checkpoint_stats.json")) as fh:
        assert json.load(fh)["memory"]["held"] == 0
    with open(os.path.join(logdir, "logs", "checkpoint.1.log")) as fh:
        assert "in-memory" not in fh.read()
    # only emergency checkpoints of a SIGTERM: the stop's, and the chief's own when its group was
    # restarted if it committed within the group grace (on a loaded machine it may); none persisted
    # from memory behind the restart
    from procsv.common.layout import Layout
    from procsv.common.manifests import list_committed

    committed = list_committed(Layout(logdir))
    assert committed and {m.reason for m in committed} == {"preempted"}, [(m.step, m.reason) for m in committed]
    assert committed[-1].step == restores_with_plain_tf(logdir)


def test_a_group_sigkilled_at_random_ends_bit_equal_to_an_uninterrupted_group_and_says_where_each_start_went(
        logdir, tmp_path):
    # issue 54 points 3 and 6: a member (worker1 or the chief, drawn) SIGKILLed twice at a random step;
    # every restarted group's restored record breaks its start down (scripts/bench_group.py reads it)
    import random

    import numpy as np

    from conftest import final_weights

    rng = random.Random()
    steps = ("--steps", "500")
    clean = str(tmp_path / "clean")
    proc = launch(logdir, *ARGS, *steps, opts=GROUP)
    try:
        for attempt in (1, 2):
            group_started(logdir, attempt)
            at_step(logdir, (raw_status(logdir) or {}).get("step", 0) + rng.randint(40, 120))
            victim = rng.choice(("trainer", "worker1"))
            os.kill(wait_role_pid(logdir, victim), signal.SIGKILL)
            wait_for(lambda: len(events(logdir, "restarting")) >= attempt, 60, what=f"restart {attempt}")
    finally:
        code, out, err = finish(proc)
    assert code == 0, err
    assert [r["attempt"] for r in events(logdir, "restarting")] == [2, 3]
    code, out, err = finish(launch(clean, *ARGS, *steps, opts=GROUP))
    assert code == 0, err
    killed, whole = final_weights(logdir), final_weights(clean)
    assert killed.keys() == whole.keys() and killed
    for name in whole:
        assert np.array_equal(killed[name], whole[name]), name
    spawned = {r["pid"]: r["time"] for r in events(logdir, "spawned") if r["role"] == "trainer"}
    for r in events(logdir, "restored") + events(logdir, "initialized"):
        # the chief's start, in order: spawned, began preparing (its program's start-up done), warmed up,
        # restored (the watchdog's record of it comes after, on the same clock)
        assert spawned[r["pid"]] <= r["prepared_at"] <= r["prepared_at"] + r["warm_secs"] <= r["time"], r
        assert r["warm_secs"] > 0 and r["prepared_at"] + r["warm_secs"] + r["secs"] <= r["time"] + 0.01, r
