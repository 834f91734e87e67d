"""--audit (issue 71) with real processes: a launch whose trainer has one bit of one weight flipped, eager and
TF1 graph (a ``MonitoredTrainingSession`` loop).

CPU: the graph one: a 600-step launch of the seeds' ``MonitoredTrainingSession`` example (checkpoints every 200 steps,
5 ms a step), six auditors of 200 steps of a two-variable graph, 200 steps trained again: about 10 CPU-s, with its
clean reference trained in the test process (a plain ``tf.compat.v1.Session`` loop, 600 steps). The time-based one:
the seeds' ``Supervisor`` loop, 600 steps saved every second (5 ms a step), the bit flipped in the first interval, all
600 steps trained again: about 10 CPU-s (measured: see the commit). The Keras one: the example ``fit`` (4 epochs of 45
batches, 20 ms a batch, checkpoints at each epoch's end), no hot standby, six auditors of 45 batches, 45 batches
trained again: about 12 CPU-s; its clean reference is the plain ``fit`` the Keras tests share
(``test_keras_fit.reference``). The group one: digits ``--nproc 2`` (``--strategy multiworker``), 300 steps saved
every 100, no standby group; five replays of 100 steps, each by a group of two auditors; 100 steps of both members
trained again; its clean reference is the uninterrupted group run the group tests share
(``test_group._clean_group_run``, its checkpoint of step 300). The stopped one: two digits launches of 600 steps saved
every 200 (6 ms a step, a hot standby, six or more auditors at SCHED_IDLE, each a fork of the zygote replaying 200
steps), the first SIGTERMed as checkpoint 400 commits, the second replaying what the first left unjudged, then 400
steps trained again after its rollback to 200, in which a second bit flips in the last interval (400-600), caught
after the trainer finished and 200 steps trained again: the last interval's fault had a 600-step launch of its own (20
ms a step) before; compared with the clean run the digits tests share (``conftest.clean_weights``).
"""

from __future__ import annotations

import os
import re

import pytest

from conftest import final_weights, finish, launch, lifecycle, quiet_env, run_python, status_json
from test_keras_fit import EXAMPLE, NO_STANDBY, _bit_identical, _weights, reference  # noqa: F401 (the fixture)

pytestmark = pytest.mark.slow


def rolled_back_when_finished(logdir: str, err: str, start: int, end: int,
                              who: str = "trainer") -> dict:  # type: ignore[type-arg]
    """What a caught fault in a launch's last interval ``start``-``end`` leaves, asserted: one trainer verdict, on that
    interval, naming a host; the trainer, finished, trains again from ``start`` (the restart's cause the audit's, one
    restore, of ``start``: a group's chief's); the run succeeded, the host counted once. ``who``: how the line names
    the trainer (``trainer group``: a group's). Returns the verdict's record."""
    events = lifecycle(logdir)
    audits = [(e["verdict"], e["start"], e["end"]) for e in events if e["event"] == "audit"]
    wrong = [e for e in events if e["event"] == "audit" and e["verdict"] == "trainer"]
    assert len(wrong) == 1 and (wrong[0]["start"], wrong[0]["end"]) == (start, end), audits
    host = wrong[0]["host"]
    assert host, wrong
    assert f"the {who} on host {host} computed steps {start}-{end} wrongly" in err
    assert f"the trainer had finished; it trains again from step {start}" in err
    restarting = [e for e in events if e["event"] == "restarting"]
    assert [e["error"] for e in restarting] == [f"audit: host {host} computed steps {start}-{end} wrongly"], restarting
    assert [e["step"] for e in events if e["event"] == "restored"] == [start]
    st = status_json(logdir)
    assert st["state"] == "succeeded" and st["audit"]["miscomputed"] == {host: 1}, st["audit"]
    return wrong[0]


def test_a_fault_whose_verdict_a_stop_cut_off_and_one_in_the_last_interval_are_caught_rolled_back_and_bit_equal(
        logdir, clean_weights) -> None:
    """The field's preemption: the bit flips after step 250 and the launch is stopped (SIGTERM, as Slurm or
    Kubernetes stop it) as soon as checkpoint 400 commits, long before the two replays of 200-400 can agree. Before,
    the next launch resumed the stop's checkpoint, the wrong state, and audited only its own commits: the fault
    passed for good. Now the stopped launch leaves its unjudged intervals to the next (``.procsv/audit.json``): the
    next launch replays them first, finds 200-400 computed wrongly, rolls its trainer back to step 200, quarantines
    every checkpoint after it (the stopped launch's among them).

    Then (one launch for both: before, the last interval's fault had a 600-step launch of its own) the trainer
    rolled back to 200 flips a bit after step 500, in the launch's last interval (400-600): its verdict can only come
    after the trainer's final checkpoint. Under --audit every the run does not end before it: two replays agree with
    each other, not with the trainer; the trainer on this host is named (the audit record, its restart's cause,
    status.json, procsv status and report) and trains again from step 400 (200-400 matching after the first rollback
    shows the program replays); the run ends succeeded, its weights bit-equal to a clean run's."""
    import signal

    from conftest import wait_for

    args = ("--steps", "600", "--save-model-secs", "1000", "--save-checkpoint-steps", "200", "--step-delay", "0.006")
    proc = launch(logdir, *args, opts=("--audit", "every"), env=quiet_env(PROCSV_FAULT="trainer:bitflip:250"))
    wait_for(lambda: any(e["event"] == "checkpoint_committed" and e["step"] == 400 for e in lifecycle(logdir)),
             timeout=240, what="checkpoint 400 committed")
    proc.send_signal(signal.SIGTERM)
    code, out, err = finish(proc, timeout=240)
    assert "fault injected: bit 20" in out + err, (out + err)[-3000:]  # (the premise)
    first = lifecycle(logdir)
    assert not [e for e in first if e["event"] == "audit" and e["verdict"] == "trainer"], first  # (no verdict yet)
    stopped = {e["step"] for e in first if e["event"] == "checkpoint_committed" and e["step"] > 200}
    assert 400 in stopped, stopped

    # the next launch's attempt 2 (the trainer rolled back to 200) flips a bit after its 300th step: step 500
    code, out, err = finish(launch(logdir, *args, opts=("--audit", "every"),
                                   env=quiet_env(PROCSV_FAULT="trainer:bitflip:300@2")), timeout=300)
    assert code == 0, err[-3000:]
    assert re.search(r"procsv: audit: steps [0-9, -]*200-400[0-9, -]*, committed by an earlier launch and not audited "
                     r"yet: replayed first", err), err[-3000:]
    events = lifecycle(logdir)[len(first):]
    wrong = [e for e in events if e["event"] == "audit" and e["verdict"] == "trainer"]
    assert [(e["start"], e["end"]) for e in wrong] == [(200, 400), (400, 600)], \
        [e for e in events if e["event"] == "audit"]
    quarantined = [e for e in events if e["event"] == "audit_quarantine"]
    rolled = {s for e in quarantined if e["after"] == 200 for s in e["steps"]}
    assert stopped <= rolled and min(rolled) > 200, (stopped, rolled)
    restored = [e["step"] for e in events if e["event"] == "restored"]
    assert 200 in restored
    assert status_json(logdir)["state"] == "succeeded"

    # the last interval's fault, after the first rollback (what a launch of its own asserted before)
    said = out + err
    assert "fault injected: bit 20" in said and "flipped after step 500" in said, said[-3000:]  # (the premise)
    host = wrong[1]["host"]
    assert host and wrong[0]["host"] == host, wrong
    assert f"the trainer on host {host} computed steps 400-600 wrongly" in err
    assert "the trainer had finished; it trains again from step 400" in err
    restarting = [e for e in events if e["event"] == "restarting"]
    assert [e["error"] for e in restarting][-1:] == [f"audit: host {host} computed steps 400-600 wrongly"], restarting
    assert len(restarting) == 2, restarting  # (the first: 200-400's)
    assert restored[-2:] == [200, 400], restored  # (after the resumed step, 200 then 400)
    audits = [(e["verdict"], e["start"], e["end"]) for e in events if e["event"] == "audit"]
    last = [a for a in audits if a[0] in ("mismatch", "trainer") and a[1:] == (400, 600)]
    assert last[:2] == [("mismatch", 400, 600), ("trainer", 400, 600)], audits  # the first replay said at once
    assert "procsv: audit: a replay of steps 400-600 differs from the trainer's checkpoint" in err
    after = audits[audits.index(("trainer", 200, 400)) + 1:]
    assert ("match", 200, 400) in after and ("match", 400, 600) in after, audits  # ... and again after it
    assert any("kernel" in d or "_trainable_variables" in d for d in wrong[1]["differ"]), wrong
    st = status_json(logdir)
    assert st["state"] == "succeeded" and st["audit"]["miscomputed"] == {host: 2}, st["audit"]  # (both faults)
    assert st["audit"]["verdicts"]["trainer"] == 2 and st["spikes"]["transient_faults"] == {host: 2}, st
    shown = run_python(["-m", "procsv", "status", logdir], env=quiet_env(), timeout=120)
    assert re.search(rf"audit \(every\): .*computed wrongly \(rolled back\), by host: {re.escape(host)} 2",
                     shown.stdout), shown.stdout
    shown = run_python(["-m", "procsv", "report", logdir], env=quiet_env(), timeout=120)
    assert "2 rollback(s) by an audit" in shown.stdout and f"audit: host {host} computed" in shown.stdout, shown.stdout
    a, b = clean_weights, final_weights(logdir)  # (conftest's uninterrupted run of 600 steps)
    assert a.keys() == b.keys()
    for key in a:
        assert (a[key] == b[key]).all(), f"{key} differs after the audit's rollbacks"


def test_a_flipped_bit_in_one_workers_weights_is_caught_by_a_group_of_auditors_rolled_back_and_bit_equal(
        logdir, shared_result) -> None:
    """The field's case for a group (--nproc 2 on one host): one member's core flips a bit of its own copy of the
    weights, after step 250 in worker 1. The chief's checkpoints never hold that bit, only what worker 1's gradients
    spread through the all-reduce. Each interval is replayed by a group of two auditors of its own (before: a group was
    not audited at all): 100-200 matches, 200-300 differs twice; the trainer group on this host is named, trains again
    from 200 (it had finished: its end waited for the verdict) and the run succeeds, bit-equal to the uninterrupted
    group's checkpoint of step 300."""
    from test_group import ARGS as GROUP_ARGS, _clean_group_run

    env = quiet_env(PROCSV_FAULT="worker:bitflip:250")
    code, out, err = finish(launch(logdir, *GROUP_ARGS, "--steps", "300", "--save-model-secs", "1000",
                                   "--save-checkpoint-steps", "100", env=env,
                                   opts=("--nproc", "2", "--standby", "fork", "--audit", "every")), timeout=300)
    assert code == 0, err[-3000:]
    said = out + err  # (the members' lines: the launch's stdout)
    assert "[worker1.1] procsv: fault injected: bit 20 of" in said and "[trainer.1] procsv: fault injected" not in said
    rolled_back_when_finished(logdir, err, 200, 300, who="trainer group")
    events = lifecycle(logdir)
    audits = [(e["verdict"], e["start"], e["end"]) for e in events if e["event"] == "audit"]
    assert audits == [("match", 100, 200), ("mismatch", 200, 300), ("trainer", 200, 300), ("match", 200, 300)], audits
    roles = sorted({e["role"] for e in events if e["event"] == "spawned" and e["role"].startswith("auditor")})
    assert roles == ["auditor", "auditor1"], roles  # (each replay: a group of two)
    assert [e["step"] for e in events if e["event"] == "restored" and e.get("role", "trainer") == "trainer"] == [200]
    assert "[worker1.2] procsv: restored step 200" in said  # (the worker too: the group restarted whole)
    a, b = final_weights(_clean_group_run(shared_result), 300), final_weights(logdir)
    assert a.keys() == b.keys()
    for key in a:
        assert (a[key] == b[key]).all(), f"{key} differs after the audit's rollback"


def test_a_flipped_bit_in_a_graph_programs_last_interval_is_caught_rolled_back_and_bit_equal(logdir) -> None:
    """The TF1 graph program users write most, a ``MonitoredTrainingSession`` loop (the seeds' example, TF's own
    guide's): the bit flips after step 500, in the launch's last interval (400-600; the first, 0-200, begins where
    the trainer began, a checkpoint taken as its session started: replayed, it proves nothing; 200-400 matching
    does). Each auditor replays in a graph session of its own from checkpoint S1; two replays agree with each
    other, not with the trainer: the trainer on this host is named and trains again from step 400; the run ends
    succeeded, its variables (restored by TF's own Saver) bit-equal to a plain session loop's."""
    from procsv.examples.seeds_tf1.model import checkpoint_variables, variables_after

    code, out, err = finish(launch(logdir, "--steps", "600", "--save-checkpoint-steps", "200", "--step-delay", "0.005",
                                   target="procsv.examples.seeds_tf1.monitored_training", opts=("--audit", "every"),
                                   env=quiet_env(PROCSV_FAULT="trainer:bitflip:500")), timeout=300)
    assert code == 0, err[-3000:]
    said = out + err
    assert "fault injected: bit 20 of b:0[0] flipped after step 500" in said, said[-3000:]  # (the premise)
    wrong = rolled_back_when_finished(logdir, err, 400, 600)
    audits = [(e["verdict"], e["start"], e["end"]) for e in lifecycle(logdir) if e["event"] == "audit"]
    assert [a for a in audits if a[0] in ("mismatch", "trainer")][:2] == [("mismatch", 400, 600), ("trainer", 400, 600)]
    assert {("match", 0, 200), ("match", 200, 400), ("match", 400, 600)} <= set(audits), audits  # 400-600 again
    assert "b" in wrong["differ"], wrong  # (the variable flipped: the last, b)
    assert "auditor restored step 400; replaying to step 600" in said, said[-3000:]
    clean, got = variables_after(600), checkpoint_variables(f"{logdir}/model.ckpt-600")
    assert clean.keys() == got.keys()
    for key in clean:
        assert (clean[key] == got[key]).all(), f"{key} differs after the audit's rollback"


def test_an_audit_rollback_quarantines_every_checkpoint_of_the_wrong_timeline_under_time_based_saves(logdir) -> None:
    """Time-based saves (TF Supervisor's ``save_model_secs``, the common case) land on other steps after a rollback,
    so the wrong timeline's checkpoints are not rewritten in place: the bit flips after step 100, in the launch's
    first interval when the machine is quiet (from the checkpoint the session took at step 0: a fresh start, as its
    replays are, so two replays that agree and miss the trainer are its fault at once); on a loaded one a 1 s save
    may land before step 100 (seen: at step 82, the suite under --cpu-log), and the verdict names the interval the
    bit flipped in, whose start then matched once already. Every checkpoint the trainer committed after
    that interval's start (its end S2 and every later one, late ones too) is quarantined, never S1; the logdir and
    the ``checkpoint`` state file hold only the new timeline's (by their manifests' attempt), whose intervals are
    all audited (none retired before the auditor read it); the latest is the new step 600, bit-equal to a plain
    session loop's."""
    import tensorflow as tf

    from procsv.common.layout import Layout
    from procsv.common.manifests import list_committed
    from procsv.examples.seeds_tf1.model import checkpoint_variables, variables_after

    code, out, err = finish(launch(logdir, "--steps", "600", "--save-model-secs", "1", "--step-delay", "0.005",
                                   "--loop-secs", "1000", target="procsv.examples.seeds_tf1.loop",
                                   opts=("--audit", "every"), env=quiet_env(PROCSV_FAULT="trainer:bitflip:100")),
                            timeout=300)
    assert code == 0, err[-3000:]
    said = out + err
    assert "fault injected: bit 20 of b:0[0] flipped after step 100" in said, said[-3000:]  # (the premise)
    events = lifecycle(logdir)
    audits = [(e["verdict"], e["start"], e["end"]) for e in events if e["event"] == "audit"]
    wrong = [e for e in events if e["event"] == "audit" and e["verdict"] == "trainer"]
    assert len(wrong) == 1, audits
    s1, s2 = wrong[0]["start"], wrong[0]["end"]
    assert s1 <= 100 <= s2, audits  # the interval the bit flipped in (the first but under load: see the docstring)
    quarantines = [e for e in events if e["event"] == "audit_quarantine"]
    assert quarantines and {q["after"] for q in quarantines} == {s1}, quarantines
    rolled = {s for q in quarantines for s in q["steps"]}
    attempt = quarantines[0]["attempt"]
    assert s2 in rolled and min(rolled) > s1, quarantines
    assert all(q["reason"] == f"audit: host {wrong[0]['host']} computed steps {s1}-{s2} wrongly" for q in quarantines)
    restart = next(i for i, e in enumerate(events) if e["event"] == "restarting")
    committed_before = {e["step"] for e in events[:restart] if e["event"] == "checkpoint_committed" and e["step"] > s1}
    assert committed_before and committed_before <= rolled, (committed_before, quarantines)

    layout = Layout(logdir)
    kept = {m.step: m for m in list_committed(layout)}
    assert s1 in kept, sorted(kept)  # never S1
    stray = {s: m.attempt for s, m in kept.items() if s > s1 and m.attempt <= attempt}
    assert not stray, f"checkpoints of the wrong timeline left in the logdir: {stray}"
    moved = os.path.join(layout.quarantined(f"model.ckpt-{s2}"), f"model.ckpt-{s2}.json")
    assert os.path.exists(moved), os.listdir(layout.quarantine)
    on_disk = {int(n[len("model.ckpt-"):-len(".index")]) for n in os.listdir(logdir)
               if n.startswith("model.ckpt-") and n.endswith(".index")}
    assert on_disk == set(kept), (sorted(on_disk), sorted(kept))
    assert f"committed after step {s1} by the timeline rolled back" in err
    assert "by a timeline an audit rolled back" in said and "retired before the auditor read it" not in said
    state = tf.train.get_checkpoint_state(logdir)
    listed = {int(p.rsplit("-", 1)[1]) for p in state.all_model_checkpoint_paths}
    assert listed <= set(kept), (sorted(listed), sorted(kept))
    # the new timeline's intervals, from S1 to its final step, all audited (merged or not) after the verdict
    after = audits[audits.index(("trainer", s1, s2)) + 1:]
    matched = sorted((a, b) for v, a, b in after if v == "match")
    assert [v for v, _, _ in after if v != "match"] == [], after
    assert matched and matched[0][0] == s1 and matched[-1][1] == 600, after
    assert all(x[1] == y[0] for x, y in zip(matched, matched[1:])), after
    latest = tf.train.latest_checkpoint(logdir)
    assert latest is not None and latest.endswith("model.ckpt-600") and kept[600].attempt > attempt, latest
    clean, got = variables_after(600), checkpoint_variables(latest)
    assert clean.keys() == got.keys()
    for key in clean:
        assert (clean[key] == got[key]).all(), f"{key} differs after the audit's rollback"


def test_a_flipped_bit_in_a_keras_fit_is_caught_rolled_back_and_bit_equal(short_tmp, reference) -> None:
    """Keras ``fit`` under ``procsv.keras.BackupAndRestore`` (the example: a seeded ``tf.data`` shuffle, checkpoints
    at each epoch's end, 45, 90, 135 and the final 180): an auditor resumes ``fit`` from checkpoint S1 as a restarted
    trainer does, at its epoch and batch, and compares at S2 with the position written as a snapshot writes it; the
    first intervals match, so the program is known to replay. The bit flips after step 170, in the last interval
    (135-180): two replays agree with each other, not with the trainer; the trainer on this host is named and
    trains again from step 135; the run ends succeeded, its weights bit-equal to a plain ``fit``'s."""
    logdir, out_path = f"{short_tmp}/run", f"{short_tmp}/w.npz"
    code, out, err = finish(launch(logdir, "--epochs", "4", "--batch-delay", "0.02", "--weights-out", out_path,
                                   target=EXAMPLE, opts=("--audit", "every", *NO_STANDBY),
                                   env=quiet_env(PROCSV_FAULT="trainer:bitflip:170")), timeout=300)
    assert code == 0, err[-3000:]
    said = out + err
    assert "fault injected: bit 20 of sequential/dense_1/bias[5] flipped after step 170" in said, said[-3000:]
    wrong = rolled_back_when_finished(logdir, err, 135, 180)
    audits = [(e["verdict"], e["start"], e["end"]) for e in lifecycle(logdir) if e["event"] == "audit"]
    # the intervals before it replayed as the trainer ran them (the program is known to replay), and 135-180 again
    assert {("match", 45, 90), ("match", 90, 135), ("match", 135, 180)} <= set(audits), audits
    assert any("_trainable_variables/0/" in d for d in wrong["differ"]), wrong
    assert "auditor restored step 135; replaying to step 180" in said, said[-3000:]
    assert "fit resumes at epoch 4, batch 1 (135 batches trained" in said, said[-3000:]  # (an auditor's, a restart's)
    assert _bit_identical(_weights(out_path), reference("tfdata", 4))


def test_a_checkpoint_holding_a_tf_data_iterator_is_digested_its_iterator_by_dtype_alone(tmp_path) -> None:
    """A program that checkpoints its ``tf.data`` iterator (for an exact resume: ``tf.train.Checkpoint(iterator=it,
    ...)``) holds a ``variant`` tensor no checkpoint reader can give. Before, every auditor of such a program crashed
    reading the trainer's checkpoint (``InternalError: Tensorflow type 21 not convertible to numpy dtype``), three
    deaths and no verdict on every interval: by hand, a custom loop with a seeded shuffle+map+batch+prefetch pipeline
    and a bit flipped at 700 ended uncaught. Now its key is digested by its dtype alone (its shape holds what the
    prefetch had buffered: not the same in two replays) and the variables as ever."""
    import tensorflow as tf

    from procsv.trainer.audit.replay import digest, opaque, read_digests

    it = iter(tf.data.Dataset.range(100).shuffle(10, seed=1).batch(4).prefetch(2))
    next(it)
    v = tf.Variable([1.0, 2.0])
    got = read_digests(tf.train.Checkpoint(iterator=it, v=v).write(str(tmp_path / "state")))
    assert got == {"iterator/.ATTRIBUTES/ITERATOR_STATE": opaque(),
                   "v/.ATTRIBUTES/VARIABLE_VALUE": digest(v.numpy())}, got
