"""Graph mode: TF1 graph programs under ``procsv.Supervisor`` with only the import changed.

Every graph program runs in its own process (``tests/programs/tf1_*.py``): eager execution is never
disabled in the pytest process. Where TensorFlow's own class can run the same program, the test
runs it too and compares: procsv must do what TF does (``--tf`` selects TF's classes).
"""

from __future__ import annotations

import json
import os
import subprocess

import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from conftest import PROGRAMS, REPO, case_results, quiet_env, run_python

pytestmark = pytest.mark.slow  # starts TensorFlow processes: not in the quick tier

TRAIN = os.path.join(PROGRAMS, "tf1_train.py")
CASES = os.path.join(PROGRAMS, "tf1_cases.py")


def _run(argv: list[str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """A twin or reference run, or a plain run that is a test's subject (``python *argv``), forked from
    the fork server: the same run as a fresh process's (tests/pyfork.py)."""
    return run_python(argv, env=quiet_env(), cwd=REPO, timeout=timeout)


def _case(name: str, logdir: str, tf_own: bool = False) -> dict:
    done = _run([CASES, name, logdir] + (["--tf"] if tf_own else []))
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith("result ")]
    assert len(lines) == 1, done.stdout + done.stderr[-3000:]
    return json.loads(lines[0][len("result "):])


def _outs(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if line.startswith(("out ", "start ", "done "))]


def test_a_tf1_program_gets_what_a_plain_session_returns_and_its_merge_all_summaries_are_written(tmp_path):
    """The same program under TF's own Supervisor (summary_op=None: TF's fails with merge_all on
    this graph, whose summaries need the fed placeholders) and under procsv's with the default
    summary_op: every run returns the same values in the same structure (op, list, dict, tuple,
    nested with a namedtuple), and the merge_all summaries reach the event file."""
    theirs = _run([TRAIN, "--logdir", str(tmp_path / "tf"), "--steps", "12", "--tf", "--no-summary-op"])
    assert theirs.returncode == 0, theirs.stderr[-3000:]
    ours = _run([TRAIN, "--logdir", str(tmp_path / "ours"), "--steps", "12", "--step-delay", "0.02"])
    assert ours.returncode == 0, ours.stderr[-3000:]
    assert _outs(ours.stdout) == _outs(theirs.stdout)
    assert len([line for line in _outs(ours.stdout) if line.startswith("out ")]) == 10
    acc = EventAccumulator(str(tmp_path / "ours"), size_guidance={"scalars": 0, "histograms": 0})
    acc.Reload()
    losses = acc.Scalars("loss")
    assert losses and all(1 <= e.step <= 12 for e in losses)
    assert acc.Tags()["histograms"]  # merge_all's histogram of w2 too
    assert "cannot run" not in ours.stderr


FRESH_STARTS = ["defaults", "no_init_op", "nothing_to_init", "init_fn_only", "not_ready_for_local_init",
                "queue_runners", "session_manager"]


# Every tf1_cases.py case of this module, each side's in one process (one TensorFlow import a side):
# each case in its own graph, with BASE/<side>/<case> as its logdir; made once per test session.
OURS = FRESH_STARTS + ["restore", "steps", "no_global_step", "summary_placeholder", "standard_services",
                       "save_model_secs_zero"]
THEIRS = FRESH_STARTS + ["restore", "no_global_step", "save_model_secs_zero"]


def _run_cases(folder: str) -> None:
    for side, names, extra in (("ours", OURS, []), ("tf", THEIRS, ["--tf"])):
        done = _run([CASES, ",".join(names), os.path.join(folder, side), *extra])
        assert done.returncode == 0, done.stderr[-3000:]
        for stream in ("stdout", "stderr"):
            with open(os.path.join(folder, f"{side}.{stream}"), "w") as fh:
                fh.write(getattr(done, stream))


@pytest.fixture(scope="module")
def cases(shared_result) -> tuple[str, dict[str, dict[str, dict]], str]:  # type: ignore[no-untyped-def]
    """The cases' folder, each side's results (side "ours" or "tf" -> case -> result), and the
    stderr of our side's process."""
    folder = shared_result("graph-supervisor-cases", _run_cases)
    found = case_results(folder, (("ours", list(OURS)), ("tf", list(THEIRS))))
    with open(os.path.join(folder, "ours.stderr")) as fh:
        return folder, found, fh.read()


@pytest.mark.parametrize("case", FRESH_STARTS)
def test_the_tf1_arguments_and_session_manager_do_what_tensorflows_do_on_a_fresh_start(case, cases):
    """init_op with init_feed_dict, init_fn, local_init_op, ready_op, ready_for_local_init_op (TF's
    RuntimeErrors), the queue runners started with the session and by start_queue_runners, and
    SessionManager's prepare_session/recover_session/wait_for_session: the same results as
    TensorFlow's own Supervisor and SessionManager. (Each case in its own graph and logdir; the
    cases of each side run one after another in one process, shared by this module's cases.)"""
    ours, theirs = cases[1]["ours"][case], cases[1]["tf"][case]
    assert ours == theirs
    expected = {
        "defaults": lambda r: r == {"v": 10.0, "local": 5.0, "v_end": 13.0, "step": 3, "log": ["init_fn v=10.0"],
                                    "session_graph": True, "global_step": True,
                                    "init_feed_dict": True, "finalized": True, "tf_session": True},
        "no_init_op": lambda r: r["error"] == "Init operations did not make model ready",
        "nothing_to_init": lambda r: r["error"].startswith("Model is not initialized and no init_op"),
        "init_fn_only": lambda r: r == {"v": 1.0, "log": ["init_fn"]},
        "not_ready_for_local_init": lambda r: "ready for local_init" in r["error"] and "never" in r["error"],
        "queue_runners": lambda r: r["first"] == [2, 3, 4] and r["seven"] == 7,
        "session_manager": lambda r: (r["recover_empty"] is False and r["prepared"] == 4.0
                                      and r["init_fn_saw"] == [3.0] and r["restored"] == 4.0
                                      and r["init_fn_on_restore"] == [] and r["recovered"] == [True, 4.0]
                                      and "not ready" in r["wait_deadline"] and r["wait_ready"] == "Session"
                                      and r["prepare_nothing"].startswith("Model is not initialized and no init_op")),
    }[case]
    assert expected(ours), ours


def test_a_default_summary_op_that_cannot_run_is_said_once_and_turned_off_and_training_goes_on(cases):
    """merge_all over a placeholder no run feeds: TF's summary thread failed the training; procsv
    says so once, turns the default summary_op off, and sv.summary_computed still writes."""
    folder, found, stderr = cases
    logdir = os.path.join(folder, "ours", "summary_placeholder")
    # (said once in the whole process that ran every case of ours)
    assert stderr.count("default summary_op (merge_all) cannot run") == 1, stderr[-3000:]
    assert found["ours"]["summary_placeholder"] == {"summary_op_off": True, "step": 20}
    acc = EventAccumulator(logdir, size_guidance={"scalars": 0})
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("hand")] == [(s, 2.0 * s) for s in range(1, 21)]


def _plain_restore(prefix: str) -> dict[str, np.ndarray]:
    """Every variable of a checkpoint, restored by a plain tf.compat.v1.train.Saver in a fresh graph
    of the same model (built in this process, in a ``tf.Graph().as_default()`` block: eager
    execution stays on outside it)."""
    import importlib.util

    import tensorflow as tf

    spec = importlib.util.spec_from_file_location("tf1_mlp", os.path.join(PROGRAMS, "tf1_mlp.py"))
    assert spec is not None and spec.loader is not None
    tf1_mlp = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tf1_mlp)
    with tf.Graph().as_default():
        tf1_mlp.build(tf)
        with tf.compat.v1.Session() as sess:
            tf.compat.v1.train.Saver().restore(sess, prefix)
            return dict(tf1_mlp.variables(tf, sess))


def _npz(path: str) -> dict[str, np.ndarray]:
    with np.load(path) as data:
        return {k: data[k] for k in data.files}


def _bit_equal(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return sorted(a) == sorted(b) and all(a[k].dtype == b[k].dtype and a[k].tobytes() == b[k].tobytes() for k in a)


def test_its_checkpoints_are_tf1_checkpoints_and_a_second_run_resumes_without_init(tmp_path):
    """The checkpoints a plain run leaves are found by tf.train.latest_checkpoint and restored by a
    plain Saver in a fresh graph (every variable: weights, momentum slots, global_step), and each
    has its <prefix>.meta, which imports and restores them, as TF's Saver writes it; run again,
    the program resumes at the saved step, and init_fn ran on the fresh start only."""
    logdir, init_log = str(tmp_path / "run"), str(tmp_path / "init.log")
    first = _run([TRAIN, "--logdir", logdir, "--steps", "30", "--save-model-secs", "0.2", "--step-delay", "0.02",
                  "--init-fn-log", init_log, "--out", str(tmp_path / "first.npz")])
    assert first.returncode == 0, first.stderr[-3000:]
    import tensorflow as tf

    latest = tf.train.latest_checkpoint(logdir)
    assert latest == os.path.join(logdir, "model.ckpt-30")
    restored = _plain_restore(latest)
    assert sorted(restored) == ["b1", "b1/Momentum", "b2", "b2/Momentum", "global_step", "w1", "w1/Momentum",
                                "w2", "w2/Momentum"]
    assert _bit_equal(restored, _npz(str(tmp_path / "first.npz")))
    _meta_files_are_the_kept_checkpoints(tf, logdir, restored)
    second = _run([TRAIN, "--logdir", logdir, "--steps", "40", "--init-fn-log", init_log])
    assert second.returncode == 0, second.stderr[-3000:]
    assert "start 30" in second.stdout and "done 40" in second.stdout
    with open(init_log) as fh:
        assert fh.read().splitlines() == ["init_fn at step 0"]
    assert tf.train.latest_checkpoint(logdir) == os.path.join(logdir, "model.ckpt-40")
    _meta_files_are_the_kept_checkpoints(tf, logdir)


def _meta_files_are_the_kept_checkpoints(tf, logdir: str, values=None) -> None:  # type: ignore[no-untyped-def]
    """As TF's Saver.save(write_meta_graph=True): every checkpoint the state file keeps has its
    <prefix>.meta and no other .meta is left (retention removed them with their checkpoints); the
    newest one's meta graph, imported into a fresh graph, restores the checkpoint (``values``)."""
    state = tf.train.get_checkpoint_state(logdir)
    kept = {os.path.basename(p) for p in state.all_model_checkpoint_paths}
    assert {n[:-len(".meta")] for n in os.listdir(logdir) if n.endswith(".meta")} == kept
    if values is not None:
        latest = tf.train.latest_checkpoint(logdir)
        with tf.Graph().as_default():
            saver = tf.compat.v1.train.import_meta_graph(latest + ".meta")
            with tf.compat.v1.Session() as sess:
                saver.restore(sess, latest)
                got = {v.op.name: sess.run(v) for v in tf.compat.v1.global_variables()}
        assert _bit_equal(got, values)


def test_a_graph_mlp_killed_at_random_moments_ends_bit_equal_to_a_plain_session_loop(short_tmp):
    """Under procsv launch, the graph MLP (feed_dict batches chosen by the global step, deterministic
    ops) is SIGKILLed three times at random moments after a commit; it ends with every global
    variable bit-equal to the same graph trained uninterrupted in a plain tf.compat.v1.Session loop,
    in the program and in its last checkpoint read by a plain Saver."""
    import random

    from conftest import finish, launch, lifecycle, sigkill_attempts_after_their_commits

    steps = 300
    reference = os.path.join(short_tmp, "plain.npz")
    done = _run([os.path.join(PROGRAMS, "tf1_mlp.py"), "--steps", str(steps), "--out", reference])
    assert done.returncode == 0, done.stderr[-3000:]
    logdir, out = os.path.join(short_tmp, "run"), os.path.join(short_tmp, "sv.npz")
    proc = launch(logdir, "--steps", str(steps), "--step-delay", "0.01", "--save-model-secs", "0.3", "--out", out,
                  target=TRAIN)
    try:
        sigkill_attempts_after_their_commits(logdir, 3, random.Random(40), 0.4)  # each at a random moment
    finally:
        code, stdout, stderr = finish(proc, 300)
    assert code == 0, stderr[-3000:]
    deaths = [e for e in lifecycle(logdir) if e["event"] == "exited" and e["role"] == "trainer"
              and e.get("signal") == "SIGKILL"]
    assert len(deaths) == 3
    starts = []
    for attempt in (1, 2, 3, 4):
        with open(os.path.join(logdir, "logs", f"trainer.{attempt}.log")) as fh:
            starts += [int(line.split()[1]) for line in fh if line.startswith("start ")]
    assert len(starts) == 4 and all(0 < s < steps for s in starts[1:]), starts  # each kill landed mid-run
    plain = _npz(reference)
    assert _bit_equal(_npz(out), plain)
    import tensorflow as tf

    latest = tf.train.latest_checkpoint(logdir)
    assert latest == os.path.join(logdir, f"model.ckpt-{steps}")
    assert _bit_equal(_plain_restore(latest), plain)


def test_the_checkpoint_committed_from_memory_at_a_kill_has_the_meta_graph_that_restores_it(short_tmp):
    """Under procsv launch with the in-memory tier on (its default share, said explicitly), the
    graph MLP saves to disk only every 600 s; SIGKILLed once the checkpoint service has held two
    in-memory snapshots (the second sent without the MetaGraphDef, which the first carried), the
    service commits the newest: it is the newest checkpoint (tf.train.latest_checkpoint), of reason
    memory, with its <prefix>.meta as TF's Saver writes it, whose meta graph, imported into a fresh
    graph, restores it (its global step) with its Saver."""
    import signal

    from conftest import finish, launch, quiet_env, wait_for, wait_role_pid
    from procsv.common.layout import Layout, read_json

    logdir = os.path.join(short_tmp, "run")
    stats = Layout(logdir).checkpoint_stats
    proc = launch(logdir, "--steps", "100000", "--step-delay", "0.01", target=TRAIN,
                  env=quiet_env(PROCSV_MEMORY_SNAPSHOTS="0.01"), opts=("--standby", "fork"))  # (no standby wanted)
    try:
        wait_for(lambda: ((read_json(stats) or {}).get("memory") or {}).get("held", 0) >= 2, 120,
                 what="two in-memory snapshots held by the checkpoint service")
        import tensorflow as tf

        before = tf.train.latest_checkpoint(logdir)  # (none: no disk checkpoint within 600 s)
        os.kill(wait_role_pid(logdir, "trainer"), signal.SIGKILL)
        latest = wait_for(lambda: tf.train.latest_checkpoint(logdir) not in (None, before) and
                          tf.train.latest_checkpoint(logdir), 120, what="the held snapshot's commit")
    finally:
        proc.send_signal(signal.SIGTERM)
        code, _, err = finish(proc)
    step = int(latest.rsplit("-", 1)[1])
    manifest = read_json(os.path.join(logdir, ".procsv", "checkpoints", f"model.ckpt-{step}.json"))
    assert manifest["reason"] == "memory", err[-3000:]
    assert os.path.basename(latest) + ".meta" in manifest["files"]
    with tf.Graph().as_default():
        saver = tf.compat.v1.train.import_meta_graph(latest + ".meta")
        with tf.compat.v1.Session() as sess:
            saver.restore(sess, latest)
            assert int(sess.run(tf.compat.v1.train.get_global_step())) == step > 0
    assert code == 128 + signal.SIGTERM, err[-3000:]


def test_a_run_is_a_step_when_it_writes_the_global_step_on_the_sessions_thread(cases):
    """sv.step after each run: reads (loss, the global step, a variable) are no steps; the train op
    fetched alone, in a list, a dict, by name or inside a group is; a step made by another thread is
    counted at once, in that thread (issue 50's threads that train); a writer that sets it (an assign), one that adds 2, and
    one whose constant is fed move sv.step by what they wrote; over 250 steps of the train op (whose
    steps are inferred, the variable read only every 100 or at a due boundary) sv.step equals the
    variable after each; after a stop request a run that would be a step raises
    TrainingStopped (a clean stop, as an eager step), a read still runs. A graph without a global
    step gets none (as TF's Supervisor: sv.global_step None, init_op built before the Supervisor or
    an init_fn make it ready, an empty Saver runs with and without a logdir, the same results as
    TF's), and every run is a step, counted in Python.

    The per-run cost (issue 40): what depends only on a run's structure is worked out once. Over 51
    more steps of [train op, a watched loss] (a new list and feed dict each time) the probe is not
    asked which writer the run reaches, the fetches are not walked for watched losses, and the
    session runs nothing else (at the 5 boundaries made due among them, the global step's exact
    value comes fetched with the step's own run, not read by a run of its own); the
    watched loss is still handed to the LossWatch when it is NaN (a finite one is judged on the
    spot: nothing to keep), at the step it came with; a list changed in place is planned anew (a
    step once it holds the train op); a boundary whose time comes during a step's run (a 0.2 s
    step, the progress half due 0.05 s after it began) is made right after that run, at its step,
    not put off to the next step."""
    result = cases[1]["ours"]["steps"]
    seen = result["seen"]
    assert seen == [["loss", 0], ["op", 1], ["list", 2], ["dict", 3], ["by name", 4], ["group", 5],
                    ["global step", 5], ["w", 5], ["other thread", 6, 6], ["after", 7],
                    ["assign", 20], ["add 2", 22], ["add 2 fed 5", 27], ["250 more", 277, []],
                    ["read after the stop", seen[14][1]], ["step after the stop", "TrainingStopped", 333]]
    assert result["plans"] == {"list changed in place": 1, "boundaries made due were made": True,
                               "boundary made right after the slow run": True,
                               "worked out again in 51 runs": {"plan": 0, "keep_watched": 0, "other runs": 0},
                               "kept": [[331, "nan"]], "nan step": 1}
    ours, theirs = cases[1]["ours"]["no_global_step"], cases[1]["tf"]["no_global_step"]
    assert ours.pop("steps") == [1, 2, 3]  # counted in Python: no op of procsv's in the graph
    assert ours == theirs == {"global_step": None, "w": 4.0, "variables": ["w"], "init_op_before": 2.0,
                              "init_fn": 3.0, "empty_saver_no_logdir": 5.0, "empty_saver": 5.0}


def test_save_model_secs_zero_saves_nothing_as_tensorflows_supervisor(cases):
    """save_model_secs=0: no checkpoint at all, as TF's Supervisor (no timed one, none at the stop of
    a managed session, none at sess.close() before sv.stop()), so a second Supervisor on the logdir
    starts at step 0 again; the same results as TF's own (was: a final checkpoint of step 3, and the
    second started at 3)."""
    ours, theirs = cases[1]["ours"]["save_model_secs_zero"], cases[1]["tf"]["save_model_secs_zero"]
    assert ours == theirs == {"managed 1 first step": 0, "managed 2 first step": 0, "managed files": [],
                              "close_then_stop 1 first step": 0, "close_then_stop 2 first step": 0,
                              "close_then_stop files": []}


def test_a_restore_runs_neither_init_op_nor_init_fn_as_tf_and_saver_save_commits_through_the_service(cases):
    """A first Supervisor trains 4 steps and calls sv.saver.save; a second on the same logdir
    restores (v and the global step), runs neither init_op nor init_fn, so that a variable outside
    the saver is not ready (TF's RuntimeError); a third initializes it with its local_init_op. The
    same results as TF's own Supervisor, and procsv's checkpoint is a committed one (a manifest)."""
    from conftest import committed_steps

    folder, found, _ = cases
    ours, theirs = found["ours"]["restore"], found["tf"]["restore"]
    assert ours == theirs
    assert ours == {"first": [1.0, 0], "saved": "model.ckpt-4", "second": "Init operations did not make model ready",
                    "third": [5.0, 4], "log": ["init_fn first"]}
    assert 4 in committed_steps(os.path.join(folder, "ours", "restore"))


def test_start_standard_services_raises_as_tensorflows_and_starts_what_start_standard_services_false_held_back(
        cases):
    """TF's start_standard_services: RuntimeError for a worker, a warning and None without a logdir
    (TensorFlow's Supervisor.start_standard_services code, its message). With
    managed_session(start_standard_services=False) nothing of the session's checkpoint (every 3
    steps) and summary_op schedules is taken in its first 10 steps; after
    sv.start_standard_services(sess) both run (the last checkpoint is the stop's). In the same run,
    sv.summary_writer.add_meta_graph writes a MetaGraphDef into the event file, as TF's writer."""
    logdir = os.path.join(cases[0], "ours", "standard_services")
    seen = cases[1]["ours"]["standard_services"]
    assert seen["worker"] == {"error": "Only chief supervisor can start standard services"}
    assert seen["no_logdir"] == {"returned": None}
    assert seen["started"] == []
    steps = seen["checkpoint_steps"]
    assert steps[-1] == 20 and min(steps) > 10 and len(steps) >= 2, steps  # one on the schedule, after the start
    acc = EventAccumulator(logdir, size_guidance={"scalars": 0})
    acc.Reload()
    summarized = [e.step for e in acc.Scalars("value")]
    assert summarized and min(summarized) > 10, summarized
    # the session's GraphDef (the Supervisor's add_graph) and sv.summary_writer.add_meta_graph's MetaGraphDef
    assert acc.Tags()["graph"] and acc.Tags()["meta_graph"]
    assert "global_step" in {node.name for node in acc.MetaGraph().graph_def.node}
