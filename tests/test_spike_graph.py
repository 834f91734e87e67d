"""Loss spikes (issue 68) in TF1 graph programs: ``--on-spike rollback`` under a graph
``procsv.train.MonitoredTrainingSession`` (under ``procsv launch``, its trainer SIGKILLed after the skip)
and a graph ``procsv.Supervisor`` (plain python) skips a spiking batch and ends bit-equal to a plain
``tf.compat.v1.Session`` loop that never applied it; a transient spike is kept; a graph whose input is
read inside it (a queue, an iterator) refuses ``rollback`` as the Supervisor starts; a loop fed from a
counter of its own trains on after a replay with other losses (a spike's, a NaN's retry), saying what it cost.

``tests/programs/spike_graph.py`` draws the batch of step s in the graph (a ``py_func`` of the global
step), the same batches as spike_train.py's; ``--spike-at N`` scales step N's 7-fold (its loss ~50x).
"""

from __future__ import annotations

import os
import pathlib
import re

import pytest
import tensorflow as tf

from conftest import (PROGRAMS, finish, launch, lifecycle, quiet_env, run_python, sigkill_where_it_says,
                      skipped_steps)
from plain_runs import run_plain_programs

SPIKE_GRAPH = os.path.join(PROGRAMS, "spike_graph.py")
KEYS = ("w", "w/Momentum", "global_step")


def _final(logdir: str, step: int) -> dict[str, bytes]:
    latest = tf.train.latest_checkpoint(logdir)
    assert latest is not None and latest.endswith(f"model.ckpt-{step}"), latest
    reader = tf.train.load_checkpoint(latest)
    return {k: reader.get_tensor(k).tobytes() for k in KEYS}


def _events(logdir: str, kind: str) -> list[dict]:
    return [e for e in lifecycle(logdir) if e["event"] == kind]


@pytest.mark.slow
def test_a_graph_monitored_sessions_spike_is_skipped_and_the_skip_survives_a_sigkill_bit_equal_to_a_plain_loop(
        logdir: str, tmp_path: pathlib.Path) -> None:
    # before: a TF1 graph program refused --on-spike rollback as it started (UsageError), and its fetched losses,
    # host floats, never reached the spike rule (a finite one was dropped at once: warn saw no spike either). Now a
    # graph MonitoredTrainingSession (the rule's defaults; checkpoints every 30 steps, no in-memory snapshot)
    # fetching [train_op, loss]: the check before the snapshot of step 180 flags step 165, restores model.ckpt-150,
    # replays 151-165, finds 165's loss again bit for bit, restores once more and skips it; the trainer is SIGKILLed
    # at step 175 (after the skip, before the next commit): the restarted one restores model.ckpt-150 again and
    # skips 165 again. Bit-equal to a plain Session loop that only advanced the global step at 165
    kill_file = os.path.join(tmp_path, "kill-me")
    proc = launch(logdir, "--mode", "monitored", "--spike-at", "165", "--steps", "190", "--save-steps", "30",
                  "--step-delay", "0.003", "--kill-at", "175", "--kill-after-skip", "165", "--kill-file", kill_file,
                  target=SPIKE_GRAPH, opts=("--on-spike", "rollback"), env=quiet_env(PROCSV_MEMORY_SNAPSHOTS="0"))
    code, out, err = sigkill_where_it_says(proc, logdir, kill_file, "step 175 after the skip")
    said = out + err
    assert code == 0, said
    (found,) = _events(logdir, "spike_detected")
    assert (found["step"], found["onset"], found["action"]) == (165, 165, "rollback"), found
    (replayed,) = _events(logdir, "spike_replayed")
    assert (replayed["step"], replayed["reproduced"]) == (165, True), replayed
    # (model.ckpt-150, or -151 where its save came a boundary late, at load)
    assert re.search(r"restored step (15\d) from model\.ckpt-\1, replaying to step 164, then skipping step 165", said), said
    # "restarted" where its death notice came before its reaping (the usual), "restarting in 0.0 s" where the
    # reaping came first (CI at load): both say the kill and the restart
    assert re.search(r"was killed by SIGKILL; restart(ed|ing in \d)", said), said
    assert "[trainer.2] procsv: skipping step 165 again (this run skipped it before)" in said, said
    assert skipped_steps(logdir) == [165], said
    plain = os.path.join(tmp_path, "plain")
    run_plain_programs([(SPIKE_GRAPH, ("--mode", "plain", "--logdir", plain, "--skip-at", "165", "--steps", "190"))],
                       env=quiet_env())
    assert _final(logdir, 190) == _final(plain, 190)  # bit-equal: w, its momentum slot, the global step


@pytest.mark.slow
def test_in_plain_python_a_graph_supervisors_spike_is_skipped_and_a_transient_one_kept_each_bit_equal(
        tmp_path: pathlib.Path) -> None:
    # a graph procsv.Supervisor(on_spike="rollback"), sess.run([train_op, loss]) with the batch drawn in the graph
    # from the global step (rule window 40, min history 30; checkpoints every 10 steps): step 65 scaled 7-fold is
    # replayed from the newest checkpoint before it, again bit for bit: skipped. A transient spike (step 65's batch scaled the first
    # time this process draws it only, as a miscomputed step would be) is replayed, not again: kept, and the run
    # ends bit-equal to one that never spiked (the spike's update undone, the batch trained once more)
    folder = {name: os.path.join(tmp_path, name) for name in ("rolled", "transient", "counted", "plain", "clean")}
    # (--wait-commit 60: the checkpoint a rollback restores is step 60's; before, a service that started after the
    # loop's 90 steps at load (seen beside a full suite) left only step 0's, and the spike was found by the final
    # checkpoint's check with no step left to replay: exit 4)
    waited = ("--wait-commit", "60")
    done = run_plain_programs([
        (SPIKE_GRAPH, ("--logdir", folder["rolled"], "--spike-at", "65", "--on-spike", "rollback", *waited)),
        (SPIKE_GRAPH, ("--logdir", folder["transient"], "--transient-at", "65", "--on-spike", "rollback", *waited)),
        (SPIKE_GRAPH, ("--logdir", folder["counted"], "--spike-at", "65", "--on-spike", "rollback", "--runs", "72",
                       *waited)),
        (SPIKE_GRAPH, ("--mode", "plain", "--logdir", folder["plain"], "--skip-at", "65")),
        (SPIKE_GRAPH, ("--mode", "plain", "--logdir", folder["clean"]))], env=quiet_env())
    said = done.stdout + done.stderr
    # a loop that counts its own runs (72) ends inside the replay: the steps lost are said as a spike's rollback's
    # (before: "after a non-finite rollback")
    # (the steps lost run to the spike's detection: at the check before the snapshot of step 70, or sooner at load)
    ended = re.search(r"the training loop ended at step \d+, inside the replay after a loss spike's rollback: steps "
                      r"(\d+)-(\d+), trained before the rollback, are lost", said)
    assert ended, said
    # the counted loop's 72 runs replay steps 61.. (restored: step 60, the checkpoint --wait-commit waited for) from
    # run detected + 1 on (the last step lost: the furthest trained); they reach step 65 again, whose spike comes back
    # bit for bit (a second rollback, skipping it), only where the spike was detected by step 67 (run H: lost 61-67,
    # ended at 60 after the second rollback; run N: lost 65-68, ended at 64, no second)
    detected = int(ended[2])
    counted_skips = 1 if 72 - detected >= 65 - 60 else 0
    restored = re.findall(r"restored step (\d+) from model\.ckpt-(\d+), replaying (step 65 to tell a transient fault|"
                          r"to step 64, then skipping step 65)", said)
    # rolled: tell, then skip; transient: tell; counted: tell (and its skip, above)
    assert len(restored) == 4 + counted_skips and all(a == b and int(a) < 65 for a, b, _ in restored), said
    assert [then for _, _, then in restored].count("to step 64, then skipping step 65") == 1 + counted_skips, said
    assert "procsv: the loss spike at step 65 did not come again when replayed" in said, said
    assert _final(folder["rolled"], 90) == _final(folder["plain"], 90)
    assert _final(folder["transient"], 90) == _final(folder["clean"], 90)
    assert _final(folder["rolled"], 90) != _final(folder["clean"], 90)  # (the skip made a difference)


@pytest.mark.slow
def test_a_graph_loop_fed_from_its_own_counter_trains_on_saying_what_a_replay_with_other_losses_cost(
        logdir: str, tmp_path: pathlib.Path) -> None:
    # a loop feeding the batch of its own run count (not of sv.step) replays other batches after a rollback to
    # model.ckpt-60: the replay's first step (61) gives another loss than the first run's. Before: the run stopped
    # with exit code 4 (diverging) at the spike's replay and at a NaN's finite retry (and before that, it trained on
    # silently: the spike taken for a transient fault of the machine, the NaN "finite when retried"). Now no verdict:
    # the replayed state is kept and the run trains on to its final checkpoint (step 90), with one line that says
    # what it cost; the spike's spike_replayed record has differs_at 61 and counts no transient fault of the host
    # (--suspect-after 1: one counted fault would make it suspect)
    def lost(first: int) -> str:  # (the checkpoint of step 60 is named 61 where its save came a boundary late, at load)
        return (rf"gave other losses than the first run \(step {first}: [\d.]+, then [\d.]+\): the program's input does "
                r"not come back with the restored step \(a counter or iterator of its own, or random numbers no "
                rf"checkpoint holds\): the batches of steps {first}-65 were not trained again; feed the batch of sv\.step "
                r"for an exact replay")

    # (--wait-commit 60: at step 60 the loop waits for its checkpoint, no step run meanwhile; before, the checkpoint
    # restored was left to the load: -55, -59, -64 and -0 (a plain run's service started late) in fresh clones, and
    # past step 61, -62)
    proc = launch(logdir, "--spike-at", "65", "--on-spike", "rollback", "--feed-counter", "--wait-commit", "60",
                  target=SPIKE_GRAPH, opts=("--suspect-after", "1", "--standby", "fork"))  # no restart: no standby
    code, out, err = finish(proc)
    said = out + err
    assert code == 0, said
    found = re.search(r"restored step (\d+) from model\.ckpt-(\d+), replaying step 65 to tell", said)
    # the newest checkpoint committed before the spike's onset, at its detection: model.ckpt-60 (the loop waited for it)
    assert found and found.group(1) == found.group(2) == "60", said
    first = int(found.group(1)) + 1
    assert len(re.findall(r"procsv: the loss spike at step 65 got no verdict: its replay " + lost(first) + r"; the "
                          r"replayed state is kept; training on\n", said)) == 1, said
    assert "a transient fault of this machine" not in said and "exit code 4" not in said, said
    (replayed,) = _events(logdir, "spike_replayed")
    assert (replayed["step"], replayed["reproduced"], replayed["differs_at"]) == (65, False, first), replayed
    assert not _events(logdir, "host_suspect"), said
    assert tf.train.latest_checkpoint(logdir).endswith("model.ckpt-90")
    nan = os.path.join(tmp_path, "nan")  # (plain python: no record of a NaN's retry to read)
    done = run_python([SPIKE_GRAPH, "--logdir", nan, "--nan-at", "65", "--feed-counter", "--wait-commit", "60"],
                      env=quiet_env(), timeout=180)
    said = done.stdout + done.stderr
    assert done.returncode == 0, said
    found = re.search(r"restored step (\d+) from model\.ckpt-(\d+), replaying to step 64, then retrying", said)
    # (as above: the newest checkpoint committed before step 65, the one of step 60, waited for)
    assert found and found.group(1) == found.group(2) == "60", said
    # steps replayed with other batches: what it cost is said
    assert len(re.findall(r"procsv: step 65 was finite when retried; the retry's replay " + lost(int(found.group(1)) + 1)
                          + r"; training on\n", said)) == 1, said
    assert tf.train.latest_checkpoint(nan).endswith("model.ckpt-90")


@pytest.mark.usefixtures("fresh_train_api")
def test_a_graph_whose_input_is_read_inside_it_refuses_spike_rollback_as_the_supervisor_starts() -> None:
    # a queue's, a reader's or a tf.data iterator's position is not in the checkpoint a rollback restores: a
    # replay would train other batches. Refused with one line naming the op (warn and stop still work there);
    # a graph whose batch is a function of the global step (spike_graph.py's py_func) or fed is not
    import procsv
    from procsv.common.errors import UsageError
    from procsv.trainer.graph.replayable import input_inside

    with tf.Graph().as_default() as graph:
        gs = tf.compat.v1.train.get_or_create_global_step()
        x = tf.compat.v1.placeholder(tf.float32, [4], name="x")
        w = tf.compat.v1.get_variable("w", initializer=tf.zeros([4]))
        tf.reduce_sum(w * x + tf.cast(gs, tf.float32), name="loss")
        assert input_inside(graph) == ""
    with tf.Graph().as_default() as graph:
        tf.compat.v1.data.make_one_shot_iterator(tf.data.Dataset.range(10)).get_next()
        assert input_inside(graph).startswith("its input is taken from a tf.data iterator inside the graph (op '")
    with tf.Graph().as_default() as graph:
        tf.compat.v1.train.get_or_create_global_step()
        queue = tf.queue.FIFOQueue(10, [tf.float32], shapes=[[4]])
        w = tf.compat.v1.get_variable("w", initializer=tf.zeros([4]))
        tf.reduce_sum(w * queue.dequeue(), name="loss")
        assert input_inside(graph) == "its input is dequeued from a queue inside the graph (op 'fifo_queue_Dequeue', " \
                                      "QueueDequeueV2)"
        with pytest.raises(UsageError) as refused:
            procsv.Supervisor(logdir=None, on_spike="rollback")
        line = str(refused.value)
        assert line.startswith("--on-spike rollback is not supported in a TF1 graph program whose input is read "
                               "inside its graph yet (its input is dequeued from a queue inside the graph (op "
                               "'fifo_queue_Dequeue', QueueDequeueV2), which no checkpoint restores") and "\n" not in line


def test_a_graph_runs_finite_host_loss_reaches_the_spike_rule() -> None:
    # before: a graph program's fetched loss (a NumPy float from session.run) was judged finite at once and
    # dropped, so the spike rule never saw a graph program's losses (no spike found under warn, stop or rollback)
    import numpy as np

    from procsv.trainer.graph.runplan import RunPlan, keep_losses
    from procsv.trainer.nonfinite.losses import LossWatch

    fed: list[tuple[list[int], list[float]]] = []
    watch = LossWatch(("loss",), sink=lambda steps, values: fed.append((list(steps), list(values))))
    plan = RunPlan(None, 1, (1,), watch)
    for step, value in ((1, np.float32(0.5)), (2, np.float32(0.25)), (3, 0.125)):
        keep_losses(plan, step, [None, value])
    assert watch.check() is None
    assert fed == [([1, 2, 3], [0.5, 0.25, 0.125])]
    plain = LossWatch(("loss",))  # no spike rule: a finite host loss is still judged and dropped at once
    keep_losses(RunPlan(None, 1, (1,), plain), 4, [None, np.float32(0.5)])
    assert plain.check() is None and not plain.feeds
