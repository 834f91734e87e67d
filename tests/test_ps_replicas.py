"""Issue 43: ``procsv launch --ps N --workers M``, the Supervisor page's replicas example, each task restarted alone.

One launch of ``procsv.examples.seeds_tf1.replicas`` with one parameter server and two workers (real
``tf.distribute.Server`` processes, real gRPC, real SIGKILLs), asserting after each step:

1. a non-chief worker frozen (SIGSTOP) and then SIGKILLed: while it is down the chief keeps stepping
   (same pid, same attempt); procsv restarts the worker alone (the chief and the parameter server
   untouched), and it finds the model initialized (``ready_op``) and steps again;
2. the chief SIGKILLed: restarted alone, it restores the newest checkpoint and goes on, and
   checkpoints resume (a newer one commits); the worker and the parameter server untouched;
3. the parameter server SIGKILLed (its variables are lost): procsv restarts it (forked from the
   pre-warmed trainer, as at its first start) and ends the worker and the chief (their sessions lost
   its variables), each restarted alone; the chief restores the newest checkpoint into the parameter
   server and everyone steps again;
4. the run trains to ``--steps`` and exits 0; ``tf.train.latest_checkpoint`` is the chief's final one, and a
   fresh-graph ``tf.compat.v1.train.Saver`` restores from it variables that match the step it holds
   (an uninterrupted plain run's at that step, to the staleness of asynchronous updates): nobody
   trained on re-initialized variables, which would lag far behind the step.
"""

from __future__ import annotations

import json
import os
import signal
from typing import Any

import pytest

from conftest import committed_steps, finish, launch, raw_status, run_python, wait_for
from ps_helpers import entry, log_of

pytestmark = pytest.mark.slow

STEPS = 600
ARGS = ("--steps", str(STEPS), "--save-model-secs", "1", "--step-delay", "0.05")  # at most 40 steps/s in all


def stepping(logdir: str, role: str, attempt: int, past: int) -> dict[str, Any]:
    """``role``'s entry once its attempt ``attempt`` reported a step beyond ``past`` (else ``{}``)."""
    e = entry(logdir, role)
    return e if e.get("attempt") == attempt and e.get("state") == "running" and e.get("step", 0) > past else {}




def test_each_task_is_restarted_alone_and_the_replicas_example_trains_to_the_end(short_tmp: str) -> None:
    from procsv.examples.seeds_tf1.model import checkpoint_variables, variables_after

    from test_metrics import free_port, scrape, value

    logdir = os.path.join(short_tmp, "run")
    port = free_port()
    proc = launch(logdir, *ARGS, target="procsv.examples.seeds_tf1.replicas",
                  opts=("--ps", "1", "--workers", "2", "--metrics-port", str(port)))
    try:
        wait_for(lambda: proc.poll() is not None or [s for s in committed_steps(logdir) if s > 0], 180,
                 what="a committed checkpoint")
        assert proc.poll() is None, proc.communicate()[1][-2000:]  # the launch runs (--ps was accepted)
        # (the chief's start checkpoint, of the step it found when its services started, may be past 0 and
        # commit before status.json lists every task)
        wait_for(lambda: "attempt" in entry(logdir, "trainer") and "attempt" in entry(logdir, "ps0"), 60,
                 what="the chief and ps0 in status.json")
        chief, ps0 = entry(logdir, "trainer"), entry(logdir, "ps0")
        worker = wait_for(lambda: stepping(logdir, "worker1", 1, 0), 60, what="worker1 stepping")
        assert ps0["attempt"] == 1 and chief["attempt"] == 1
        wait_for(lambda: entry(logdir, "ps0").get("state") == "running", 30, what="ps0 running in status.json")

        # 1. a worker down: the chief steps on; the worker is restarted alone and steps again
        os.kill(worker["pid"], signal.SIGSTOP)
        down = entry(logdir, "trainer")["step"]
        wait_for(lambda: entry(logdir, "trainer")["step"] > down + 20, 60, what="the chief stepping on")
        os.kill(worker["pid"], signal.SIGKILL)
        w2 = wait_for(lambda: stepping(logdir, "worker1", 2, 0), 60, what="worker1's restart stepping")
        assert w2["pid"] != worker["pid"]
        now = entry(logdir, "trainer")
        assert (now["pid"], now["attempt"]) == (chief["pid"], 1)  # the chief was never restarted ...
        assert entry(logdir, "ps0")["pid"] == ps0["pid"]  # ... nor the parameter server
        assert "restored step" not in log_of(logdir, "worker1.2.log")  # only the chief restores

        # 2. the chief killed: restarted alone, it restores and checkpoints resume
        newest = committed_steps(logdir)[-1]
        os.kill(chief["pid"], signal.SIGKILL)
        c2 = wait_for(lambda: stepping(logdir, "trainer", 2, 0), 60, what="the chief's restart stepping")
        assert int(log_of(logdir, "trainer.2.log").split("restored step ")[1].split()[0]) >= newest
        wait_for(lambda: committed_steps(logdir)[-1] > max(newest, c2["step"]), 60, what="a newer checkpoint")
        assert entry(logdir, "worker1")["pid"] == w2["pid"] and entry(logdir, "ps0")["pid"] == ps0["pid"]

        # 3. the parameter server killed: restarted; the chief restores into it; everyone steps again
        before = committed_steps(logdir)[-1]
        os.kill(ps0["pid"], signal.SIGKILL)
        wait_for(lambda: entry(logdir, "ps0").get("attempt") == 2, 60, what="ps0 restarted")
        wait_for(lambda: stepping(logdir, "trainer", 3, 0), 120, what="the chief stepping again after the ps")
        restored = log_of(logdir, "trainer.3.log")
        assert "restored step" in restored, restored[-2000:]
        wait_for(lambda: stepping(logdir, "worker1", 3, 0), 120, what="worker1 stepping again after the ps")
        assert int(restored.split("restored step ")[1].split()[0]) >= before
        assert entry(logdir, "ps0")["attempt"] == 2
        wait_for(lambda: entry(logdir, "ps0").get("state") == "running", 30, what="ps0's restart running")
        # forked from the pre-warmed trainer, TensorFlow imported (fresh, it took seconds to serve again)
        from conftest import lifecycle
        assert [e["via"] for e in lifecycle(logdir) if e["event"] == "spawned" and e["role"] == "ps0"] == \
            ["zygote", "zygote"]
        got = wait_for(lambda: (s := scrape(port)) and value(s, "procsv_task_restarts_total", task="ps0",
                                                             role="ps") == 1.0 and s, 10, what="the ps restart scraped")
        assert value(got, "procsv_task_restarts_total", task="chief", role="chief") == 2.0  # killed, then ps_lost
        assert value(got, "procsv_task_restarts_total", task="worker1", role="worker") == 2.0
        code, out, err = finish(proc, 300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            finish(proc, 120)
    assert code == 0, err[-3000:]
    assert "a parameter server died and its variables with it; killing the worker task" in out + err
    with open(os.path.join(logdir, "logs", "report.json")) as fh:
        tasks = json.load(fh)["tasks"]
    assert tasks == {"chief": {"role": "chief", "restarts": 2, "given_up": False},
                     "worker1": {"role": "worker", "restarts": 2, "given_up": False},
                     "ps0": {"role": "ps", "restarts": 1, "given_up": False}}
    report = run_python(["-m", "procsv", "report", logdir], timeout=60)
    assert "tasks: chief 2 restart(s), ps0 1 restart(s), worker1 2 restart(s)" in report.stdout, report.stdout
    # where each task's time went (issue 53): the tasks that step (the chief, the worker; a parameter
    # server takes no step) each have a breakdown that sums to its wall time, and the costliest is named
    from procsv import goodput as gp

    events = lifecycle(logdir)
    assert gp.tasks(events) == ["trainer", "worker1"], gp.tasks(events)
    rows = []
    for task in ("trainer", "worker1"):
        _, b = gp.run_breakdown(gp.launches_from_events(events, task=task))
        assert abs(sum(b.secs.values()) - b.wall) <= 0.01 * b.wall, (task, b.secs)
        assert b.secs["productive"] > 0 and b.secs["restart"] + b.secs["startup"] > 0, (task, b.secs)
        rows.append((task, b))
    worst = gp.costliest(rows)
    assert worst is not None and f"costliest task: {worst[0]}, " in report.stdout, report.stdout
    import tensorflow as tf

    latest = tf.train.latest_checkpoint(logdir)
    assert latest is not None and os.path.dirname(latest) == logdir
    got = checkpoint_variables(latest)
    step = int(got["global_step"])
    # named by the chief's last step; the other worker may step while the chief reads the variables
    # (asynchronous updates, as under TF's own Saver), so the global step held can be a little past it
    named = int(os.path.basename(latest)[len("model.ckpt-"):])
    assert step >= STEPS and named <= step
    want = variables_after(step)
    assert got["w"] == pytest.approx(want["w"], abs=0.05) and got["b"] == pytest.approx(want["b"], abs=0.05)


def test_a_worker_given_up_on_leaves_the_others_training_then_sigterm_commits_the_last_step_and_every_task_ends(
        short_tmp: str) -> None:
    """One launch, ``--ps 1 --workers 3 --max-restarts 0``:

    1. worker2 SIGKILLed is given up on at once (``--on-worker-give-up continue``, the default): it is not
       started again, the run goes on (the chief and worker1 keep stepping, nobody restarted);
    2. SIGTERM to the launch: the chief's preempted checkpoint holds the last step any task completed
       (0 steps lost: before, worker1 stepped on after the chief's commit, and blocked on the stopped
       parameter server until it was SIGKILLed); every task stops in order, the launch exits 143 as
       without --ps, and no process of the run is left.
    """
    from procsv.examples.seeds_tf1.model import checkpoint_variables
    from conftest import lifecycle, run_processes

    logdir = os.path.join(short_tmp, "run")
    proc = launch(logdir, "--steps", "100000", "--save-model-secs", "1000", "--step-delay", "0.02",
                  target="procsv.examples.seeds_tf1.replicas",
                  opts=("--ps", "1", "--workers", "3", "--max-restarts", "0"))
    try:
        wait_for(lambda: proc.poll() is not None or all(stepping(logdir, r, 1, 10) for r in ("trainer", "worker1",
                                                                                              "worker2")), 180,
                 what="the chief, worker1 and worker2 stepping")
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        os.kill(entry(logdir, "worker2")["pid"], signal.SIGKILL)
        gave_up = wait_for(lambda: [e for e in lifecycle(logdir) if e["event"] == "task_gave_up"], 60,
                           what="worker2 given up on")
        assert gave_up[0]["role"] == "worker2" and "--max-restarts 0" in gave_up[0]["reason"], gave_up
        at = {r: entry(logdir, r)["step"] for r in ("trainer", "worker1")}
        wait_for(lambda: all(stepping(logdir, r, 1, at[r] + 10) for r in at), 60, what="the others stepping on")
        assert proc.poll() is None and entry(logdir, "worker2")["attempt"] == 1  # not restarted; the run goes on
        proc.send_signal(signal.SIGTERM)
        code, out, err = finish(proc, 120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            finish(proc, 60)
    assert code == 128 + signal.SIGTERM, err[-3000:]
    assert "giving up on worker2: " in err and "training on without it" in err, err[-3000:]
    assert not run_processes(logdir)
    events = lifecycle(logdir)
    assert not [e for e in events if e["event"] in ("restarted", "gave_up")]
    committed = [e for e in events if e["event"] == "checkpoint_committed"]
    # the chief's standard services' checkpoint of the step it initialized (TF's checkpoint thread saves once
    # as it starts; --save-model-secs 1000: no other periodic one), then the preempted one
    assert [e["reason"] for e in committed] == ["periodic", "preempted"], committed
    last = {e["role"]: e for e in raw_status(logdir)["processes"]}  # type: ignore[index]
    import tensorflow as tf

    latest = tf.train.latest_checkpoint(logdir)
    assert latest is not None
    held = int(checkpoint_variables(latest)["global_step"])
    # (a checkpoint is named by the global step stored in it, the start one too)
    assert int(checkpoint_variables(committed[0]["path"])["global_step"]) == committed[0]["step"], committed
    # the chief's last completed step is what it committed; no task completed a step past it
    assert held == committed[-1]["step"] == last["trainer"]["step"] >= last["worker1"]["step"] > 20, (held, last)
    exits = [(e["role"], e.get("code"), e.get("signal")) for e in events if e["event"] == "exited"]
    assert [x for x in exits if x[2] == "SIGKILL"] == [("worker2", None, "SIGKILL")], exits  # the rest in order
    assert ("trainer", 42, None) in exits
    ended = [r for r, _, _ in exits if r in ("trainer", "worker1", "ps")]
    assert ended.index("worker1") < ended.index("trainer") < ended.index("ps"), ended
    with open(os.path.join(logdir, "logs", "report.json")) as fh:
        tasks = json.load(fh)["tasks"]
    assert tasks["worker2"] == {"role": "worker", "restarts": 0, "given_up": True}, tasks
    assert [t["restarts"] for t in tasks.values()] == [0, 0, 0, 0]
