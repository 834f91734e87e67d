"""procsv.train's MonitoredSession family in graph mode (a TF1 program): Scaffold, session creators,
MonitoredSession / SingularMonitoredSession / MonitoredTrainingSession on the graph-mode
Supervisor, in-process recovery, and exactness across SIGKILLs under ``procsv launch``.

In-process tests build their graph in ``with tf.Graph().as_default()`` (eager execution stays on
in the pytest process; the Supervisor's services run as child processes of the test); the
program tests run ``tests/programs/graph_monitored_train.py`` (eager execution disabled) as plain
python or under ``procsv launch``.
"""

from __future__ import annotations

import os
import random
import signal

import numpy as np
import pytest

from conftest import PROGRAMS, run_python, committed_steps, finish, launch, lifecycle, quiet_env, raw_status, wait_for
from conftest import restores, sigkill_attempts_after_their_commits

pytestmark = pytest.mark.usefixtures("fresh_train_api")

PROGRAM = os.path.join(PROGRAMS, "graph_monitored_train.py")
# for the launches whose trainer is never replaced (the aborted run recovers in its process, the SIGTERMed
# launch and its relaunch): no hot standby is made to wait unused (--standby fork: the pre-warmed trainer
# only); the SIGKILLed launch restarts its trainer and keeps the default, which is what users get: this program
# family's one test of a restart through a promoted standby (docs/testing.md, rule 3)
NO_STANDBY = ("--standby", "fork")


def _model(tf):
    gs = tf.compat.v1.train.get_or_create_global_step()
    w = tf.compat.v1.get_variable("w", initializer=1.0)
    loss = w * w
    tf.compat.v1.summary.scalar("loss", loss)
    train_op = tf.compat.v1.train.MomentumOptimizer(0.1, 0.9).minimize(loss, global_step=gs)
    return {"gs": gs, "w": w, "loss": loss, "train_op": train_op}


# ------------------------------------------------------------------ Scaffold (no session)
def test_scaffold_in_graph_mode_keeps_tensorflows_pieces_and_finalize_makes_the_defaults_and_freezes_the_graph():
    import tensorflow as tf

    from procsv import train

    with tf.Graph().as_default() as graph:
        _model(tf)
        start = tf.compat.v1.placeholder_with_default(1.0, [], name="start")
        v = tf.compat.v1.get_variable("v", initializer=start)
        calls = []
        fed = {start: 3.0}
        base = train.Scaffold(init_fn=lambda scaffold, session: calls.append(scaffold), init_feed_dict=fed)
        mine = tf.no_op(name="my_local_init")
        scaffold = train.Scaffold(copy_from_scaffold=base, local_init_op=mine)
        assert scaffold.init_feed_dict is fed and scaffold.local_init_op is mine and scaffold.init_op is None
        with pytest.raises(TypeError, match="copy_from_scaffold is not a Scaffold instance"):
            train.Scaffold(copy_from_scaffold=object())
        assert scaffold.finalize() is scaffold
        assert graph.finalized
        keys = tf.compat.v1.GraphKeys
        assert scaffold.init_op is tf.compat.v1.get_collection(keys.INIT_OP)[0]
        assert scaffold.ready_op is tf.compat.v1.get_collection(keys.READY_OP)[0]
        assert scaffold.ready_for_local_init_op is tf.compat.v1.get_collection(keys.READY_FOR_LOCAL_INIT_OP)[0]
        assert scaffold.local_init_op is mine and not tf.compat.v1.get_collection(keys.LOCAL_INIT_OP)
        assert scaffold.summary_op is tf.compat.v1.get_collection(keys.SUMMARY_OP)[0]
        assert isinstance(scaffold.saver, tf.compat.v1.train.Saver)
        assert scaffold.saver is tf.compat.v1.get_collection(keys.SAVERS)[0]
        with tf.compat.v1.Session(graph=graph) as sess:
            assert len(sess.run(scaffold.ready_op)) == 4  # global_step, w, w/Momentum, v
            sess.run(scaffold.init_op, feed_dict=scaffold.init_feed_dict)
            assert sess.run(scaffold.ready_op).size == 0 and sess.run(v) == 3.0
            scaffold.init_fn(sess)  # TF's init_fn(session), which calls the user's with the scaffold
            assert calls == [scaffold]
            tf.compat.v1.summary.FileWriterCache.clear()
        # a second finalize changes nothing; a collection holding two items is TF's error
        scaffold.finalize()
        graph._unsafe_unfinalize()
        tf.compat.v1.add_to_collection(keys.READY_OP, tf.constant([""]))
        with pytest.raises(RuntimeError, match='More than one item in the collection "ready_op"'):
            train.Scaffold().finalize()


# ------------------------------------------------------------------ programs: plain python, procsv launch
def _run_program(*args: str, timeout: float = 300) -> str:
    out = run_python([PROGRAM, *args], env=quiet_env(), timeout=timeout)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def _load(path: str) -> dict[str, np.ndarray]:
    with np.load(path) as data:
        return {k: data[k] for k in data.files}


def _bit_equal(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return a.keys() == b.keys() and all(a[k].dtype == b[k].dtype and a[k].shape == b[k].shape
                                        and a[k].tobytes() == b[k].tobytes() for k in a)


PLAIN_STEPS = (120, 150, 300)  # every step count a test below compares with


def _plain_references(folder: str) -> None:
    out = run_python([PROGRAM, "--mode", "plain", "--plain-at", ",".join(map(str, PLAIN_STEPS)),
                      "--out", os.path.join(folder, "plain{steps}.npz")], env=quiet_env(), timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    # the program under TensorFlow's own MonitoredTrainingSession and hooks, uninterrupted, to the last step
    out = run_python([PROGRAM, "--mode", "tf", "--steps", str(PLAIN_STEPS[-1]), "--logdir", os.path.join(folder, "tf"),
                      "--out", os.path.join(folder, "tf.npz")], env=quiet_env(), timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]


def _tf_run(folder: str) -> tuple[dict[str, np.ndarray], str]:
    """TensorFlow's own run of the program to ``PLAIN_STEPS[-1]``: its final variables and its checkpoint_dir."""
    return _load(os.path.join(folder, "tf.npz")), os.path.join(folder, "tf")


@pytest.fixture(scope="module")
def plain(shared_result):
    """plain(steps): every global variable after ``steps`` runs of the train op in a plain
    ``tf.compat.v1.Session`` loop (one loop, read after each of ``PLAIN_STEPS``' runs, made once
    per test session)."""
    folder = shared_result("graph-monitored-plain", _plain_references)

    def get(steps: int) -> dict[str, np.ndarray]:
        assert steps in PLAIN_STEPS, steps
        return _load(os.path.join(folder, f"plain{steps}.npz"))

    get.folder = folder  # type: ignore[attr-defined]  # (TensorFlow's own run's, beside: _tf_run)
    return get


def _saver_values(logdir: str) -> dict[str, np.ndarray]:
    """The newest checkpoint, restored by a TF1 Saver in a fresh graph (the program's variables)."""
    import tensorflow as tf

    latest = tf.train.latest_checkpoint(logdir)
    assert latest is not None
    reader = tf.train.load_checkpoint(latest)
    return {name.replace("/", "__"): reader.get_tensor(name) for name in reader.get_variable_to_shape_map()}


@pytest.mark.slow
def test_a_tf1_program_under_monitored_training_session_with_hooks_ends_bit_equal_to_the_plain_loop(short_tmp, plain):
    logdir, out = os.path.join(short_tmp, "run"), os.path.join(short_tmp, "final.npz")
    stdout = _run_program("--steps", "120", "--out", out, "--logdir", logdir)
    assert "finished at step 120 after 120 runs" in stdout
    final = _load(out)
    assert _bit_equal(final, plain(120))
    # its final checkpoint has TF1's names and the same values
    saved = _saver_values(logdir)
    assert _bit_equal({k: saved[k] for k in final}, final)
    # the SummarySaverHook (every 50 steps: the Scaffold's merge_all) and the StepCounterHook (every 100)
    # wrote through the summary service
    from tensorboard.backend.event_processing import event_accumulator as ea

    acc = ea.EventAccumulator(logdir, size_guidance={ea.SCALARS: 0})
    acc.Reload()
    steps = [e.step for e in acc.Scalars("loss")]
    assert steps[0] == 1 and len(steps) == 3 and all(45 <= b - a <= 50 for a, b in zip(steps, steps[1:])), steps
    assert [e.step for e in acc.Scalars("global_step/sec")] in ([100], [101]), acc.Tags()


def _trainer_exits(logdir: str) -> list[dict]:
    return [e for e in lifecycle(logdir) if e["event"] == "exited" and e["role"] == "trainer"]


@pytest.mark.slow
def test_an_aborted_run_recovers_in_process_from_the_newest_checkpoint_and_is_no_trainer_restart(short_tmp, plain):
    logdir, out = os.path.join(short_tmp, "run"), os.path.join(short_tmp, "final.npz")
    proc = launch(logdir, "--steps", "150", "--abort-at", "30", "--step-delay", "0.05", "--out", out, target=PROGRAM,
                  opts=NO_STANDBY)
    code, stdout, err = finish(proc, 300)
    assert code == 0, err[-3000:]
    assert "AbortedError after the run that reached step 30" in stdout
    assert "procsv: AbortedError in a run: a new session restores the newest checkpoint" in stdout
    spawned = [e for e in lifecycle(logdir) if e["event"] == "spawned" and e.get("role") == "trainer"]
    assert len(spawned) == 1  # no trainer restart
    starts = [e for e in lifecycle(logdir) if e["event"] in ("restored", "initialized") and e["pid"] == spawned[0]["pid"]]
    assert [e["event"] for e in starts][:1] == ["initialized"] and len(starts) == 2, starts
    again = starts[1]["step"]  # the newest committed checkpoint at the abort (0: none yet, initialized again)
    assert again < 30 or again == 30 and starts[1]["event"] == "restored"
    # runs 1..30 (the 30th aborted after it ran), then steps again+1 .. 150, in this one process
    assert f"finished at step 150 after {30 + 150 - again} runs in this process" in stdout, stdout
    exits = _trainer_exits(logdir)
    assert len(exits) == 1 and exits[0].get("code") == 0, exits
    assert _bit_equal(_load(out), plain(150))


@pytest.mark.slow
def test_three_sigkills_at_random_moments_and_monitored_training_session_ends_bit_equal_to_the_plain_loop(
        short_tmp, plain):
    # graph_monitored_train.py is TensorFlow's CIFAR-10 tutorial's program (its hooks, its loop, its
    # optimizer's moving averages), but for its input queues; also compared with TF's own run of it
    logdir, out = os.path.join(short_tmp, "run"), os.path.join(short_tmp, "final.npz")
    # ~10 ms a run, a commit every 0.5 s (the program's default 1 s in TF's run): each attempt is killed within
    # 0.25 s of its first commit past the last one, at most ~75 runs past its restore (quiet: kills at 18, 49
    # and 89; fewer runs under load), so the three land well inside the 300
    steps = 300
    proc = launch(logdir, "--steps", str(steps), "--step-delay", "0.01", "--save-checkpoint-secs", "0.5", "--out", out,
                  target=PROGRAM)
    try:
        killed_at = sigkill_attempts_after_their_commits(logdir, 3, random.Random(40), 0.25)
    finally:
        code, stdout, err = finish(proc, 400)
    assert code == 0, err[-3000:]
    deaths = [e for e in _trainer_exits(logdir) if e.get("signal") == "SIGKILL"]
    assert len(deaths) == 3
    assert all(s is not None and 0 < s < steps for s in killed_at), killed_at  # each landed mid-run
    restored = restores(logdir)
    assert len(restored) == 3 and all(0 < s < steps for s in restored), restored  # each attempt resumed mid-run
    assert f"finished at step {steps}" in stdout
    assert _bit_equal(_load(out), plain(steps))
    saved = _saver_values(logdir)  # the final checkpoint too, read by TF
    assert _bit_equal({k: saved[k] for k in plain(steps)}, plain(steps))
    # the CIFAR-10 tutorial's program under TensorFlow's own MonitoredTrainingSession and hooks, never killed:
    # the same final variables, and a final checkpoint of the same name and values
    theirs, their_dir = _tf_run(plain.folder)
    assert _bit_equal(_load(out), theirs)
    import tensorflow as tf

    assert os.path.basename(tf.train.latest_checkpoint(their_dir)) == os.path.basename(tf.train.latest_checkpoint(logdir))
    assert _bit_equal(_saver_values(their_dir), saved)


# ------------------------------------------------------------------ in-process sessions
def test_tensorflows_own_hook_and_listener_classes_run_step_fn_and_raw_session_in_graph_mode(logdir):
    import tensorflow as tf

    from procsv import train

    calls = []

    class Listener(tf.compat.v1.train.CheckpointSaverListener):
        def before_save(self, session, global_step_value):
            calls.append(("before_save", global_step_value))

        def after_save(self, session, global_step_value):
            calls.append(("after_save", global_step_value))

    class Hook(tf.compat.v1.train.SessionRunHook):
        def begin(self):
            calls.append("begin")

        def after_create_session(self, session, coord):
            calls.append(("after_create_session", int(session.run(tf.compat.v1.train.get_global_step()))))

        def before_run(self, run_context):
            return tf.compat.v1.train.SessionRunArgs({"loss": m["loss"]})

        def after_run(self, run_context, run_values):
            calls.append(("after_run", round(float(run_values.results["loss"]), 4)))

        def end(self, session):
            calls.append(("end", int(session.run(m["gs"]))))

    with tf.Graph().as_default() as graph:
        m = _model(tf)
        saver_hook = train.CheckpointSaverHook(logdir, save_steps=2, listeners=[Listener()])
        with train.SingularMonitoredSession(hooks=[Hook(), saver_hook], checkpoint_dir=logdir) as sess:
            assert sess.graph is graph and graph.finalized
            first = sess.run(m["loss"])
            step = sess.run_step_fn(lambda step_context: step_context.run_with_hooks([m["train_op"], m["gs"]])[1])
            # the step read in the run may be from before its increment or after (TF's graphs: no order)
            assert step in (0, 1) and sess.raw_session().run(m["gs"]) == 1  # no hook runs for the raw session
            with pytest.raises(ValueError, match="step_context"):
                sess.run_step_fn(lambda ctx: None)
            sess.run(m["train_op"])
        assert not graph.finalized  # unfrozen again, as TF
    assert first == 1.0
    runs = [c for c in calls if c[0] == "after_run"]
    assert calls[:2] == ["begin", ("after_create_session", 0)] and len(runs) == 3
    # as TF: the CheckpointSaverHook saves step 0 at session creation (listeners around it), then
    # step 2 in the run that reached it (save_steps=2; with listeners the run waits for the commit,
    # as TF's synchronous save), so its end() has no new step to save: the listeners see each step once
    saves = [c for c in calls if c[0] in ("before_save", "after_save")]
    assert saves == [("before_save", 0), ("after_save", 0), ("before_save", 2), ("after_save", 2)], calls
    assert calls.index(("after_save", 2)) < calls.index(("end", 2)) and calls[-1] == ("end", 2), calls
    assert committed_steps(logdir) == [0, 2]


@pytest.mark.parametrize("kind", ["SingularMonitoredSession", "MonitoredSession", "MonitoredTrainingSession"])
def test_a_monitored_session_closes_its_session_at_its_close_as_tensorflows(logdir, kind):
    """The session a hook got at ``after_create_session`` is closed once the block ends, with
    TensorFlow's classes and with procsv's (each ended session kept its TF session open before)."""
    import tensorflow as tf

    from procsv import train

    def ended_session(api) -> Exception:
        got = []

        class Keep(tf.compat.v1.train.SessionRunHook):
            def after_create_session(self, session, coord):
                got.append(session)

        with tf.Graph().as_default():
            m = _model(tf)
            args = {"checkpoint_dir": None} if kind != "MonitoredSession" else {}
            with getattr(api, kind)(hooks=[Keep()], **args) as sess:
                sess.run(m["train_op"])
                assert got and int(got[0].run(m["gs"])) == 1
            with pytest.raises(RuntimeError) as err:
                got[0].run(m["gs"])
            return err.value

    theirs = ended_session(tf.compat.v1.train)
    ours = ended_session(train)
    assert str(ours) == str(theirs) == "Attempted to use a closed Session."


def test_singular_monitored_session_does_not_recover_from_an_aborted_run(logdir):
    import tensorflow as tf

    from procsv import train

    class Abort(train.SessionRunHook):
        def after_run(self, run_context, run_values):
            raise tf.errors.AbortedError(None, None, "aborted")

    with tf.Graph().as_default():
        m = _model(tf)
        with pytest.raises(tf.errors.AbortedError):
            with train.SingularMonitoredSession(hooks=[Abort()], checkpoint_dir=logdir) as sess:
                sess.run(m["train_op"])


@pytest.mark.slow
def test_a_tf1_checkpoint_to_start_from_queue_runners_out_of_range_and_a_step_context_stop_in_graph_mode(logdir, tmp_path):
    import tensorflow as tf

    from procsv import train

    start = str(tmp_path / "tf1" / "model.ckpt")
    with tf.Graph().as_default():  # a TF1 Saver's checkpoint (of step 7, w = 5) made by plain TF
        m = _model(tf)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run([m["w"].assign(5.0), m["gs"].assign(7)])
            path = tf.compat.v1.train.Saver().save(sess, start, global_step=7)

    with tf.Graph().as_default():
        m = _model(tf)
        queue = tf.queue.FIFOQueue(10, tf.float32)
        tf.compat.v1.train.add_queue_runner(tf.compat.v1.train.QueueRunner(queue, [queue.enqueue(1.0)]))
        size = queue.size()
        final = train.FinalOpsHook({"w": m["w"], "gs": m["gs"]})
        with train.SingularMonitoredSession(hooks=[final], checkpoint_dir=logdir,
                                            checkpoint_filename_with_path=path) as sess:
            raw = sess.raw_session()
            assert raw.run(m["gs"]) == 7 and raw.run(m["w"]) == 5.0  # restored from the TF1 checkpoint
            wait_for(lambda: raw.run(size) > 0, 30, what="the queue runner started at creation")
            sess.run(m["train_op"])
            sess.run(m["train_op"])
            raise tf.errors.OutOfRangeError(None, None, "input exhausted")  # a clean end of the block
        assert final.final_ops_values["gs"] == 9  # end() ran: the exit was clean
        assert committed_steps(logdir)[-1] == 9

    with tf.Graph().as_default():
        m = _model(tf)
        with train.MonitoredSession(train.ChiefSessionCreator(checkpoint_dir=logdir)) as sess:
            assert sess.run(m["gs"]) == 9  # the logdir's own checkpoint wins now

            def stop(step_context):
                step_context.run_with_hooks(m["train_op"])
                step_context.request_stop()

            sess.run_step_fn(stop)
        assert sess.should_stop()
        assert committed_steps(logdir)[-1] == 10


@pytest.mark.slow
def test_sigterm_commits_the_last_step_of_a_tf1_program_and_a_relaunch_ends_bit_equal_to_the_plain_loop(short_tmp, plain):
    logdir, out = os.path.join(short_tmp, "run"), os.path.join(short_tmp, "final.npz")
    args = ("--steps", "300", "--step-delay", "0.01", "--save-checkpoint-secs", "1000", "--out", out)
    proc = launch(logdir, *args, target=PROGRAM, opts=NO_STANDBY)
    try:
        wait_for(lambda: (raw_status(logdir) or {}).get("step", 0) > 20, 120, what="training to start")
        proc.send_signal(signal.SIGTERM)
    finally:
        code, stdout, err = finish(proc)
    assert code == 128 + signal.SIGTERM, err[-3000:]
    stopped = committed_steps(logdir)[-1]
    assert 20 < stopped < 300
    assert f"finished at step {stopped} after {stopped} runs" in stdout  # the block ended early, cleanly
    reasons = [e["reason"] for e in lifecycle(logdir) if e["event"] == "checkpoint_committed"]
    assert reasons[-1] == "preempted"
    code, stdout, err = finish(launch(logdir, *args, target=PROGRAM, opts=NO_STANDBY))
    assert code == 0, err[-3000:]
    assert f"finished at step 300 after {300 - stopped} runs in this process" in stdout, stdout
    assert _bit_equal(_load(out), plain(300))


@pytest.mark.slow
def test_a_worker_session_in_graph_mode_restores_the_chiefs_checkpoint_and_saves_nothing(logdir):
    import tensorflow as tf

    from procsv import train

    with tf.Graph().as_default():
        m = _model(tf)
        # (a CheckpointSaverHook saves at the session's creation and at its end, as TF's; None would save nothing)
        with train.MonitoredTrainingSession(checkpoint_dir=logdir, save_checkpoint_secs=3600) as sess:
            for _ in range(5):
                sess.run(m["train_op"])
    assert committed_steps(logdir) == [0, 5]
    with tf.Graph().as_default():
        m = _model(tf)
        with train.MonitoredTrainingSession(is_chief=False, checkpoint_dir=logdir) as sess:
            assert sess.run(m["gs"]) == 5  # the chief's checkpoint, restored with TF1's names
            sess.run(m["train_op"])
            assert sess.run(m["gs"]) == 6
    assert committed_steps(logdir) == [0, 5]  # a worker saves nothing


@pytest.mark.slow
def test_a_worker_under_ps_waits_for_the_chief_up_to_max_wait_secs_then_raises_deadline_exceeded(logdir, monkeypatch):
    """Graph mode under ``--ps`` (the variables live on a server the chief initializes): a worker's
    MonitoredTrainingSession(is_chief=False, max_wait_secs=) and WorkerSessionCreator(max_wait_secs=)
    wait for ready_op, then raise TF's DeadlineExceededError while no chief has initialized the model
    (TF's SessionManager.wait_for_session); once it has, the worker's session comes up with the
    chief's values, never initializing them itself."""
    import tensorflow as tf

    from procsv import train
    from procsv.common import env

    monkeypatch.setenv(env.PS, "1")  # procsv launch --ps 1: a non-chief waits for its chief
    server = tf.distribute.Server.create_local_server()  # the shared variables' server; no chief yet
    with tf.Graph().as_default():
        _model(tf)
        with pytest.raises(tf.errors.DeadlineExceededError, match="Session was not ready after waiting 1 secs"):
            train.MonitoredTrainingSession(is_chief=False, master=server.target, checkpoint_dir=logdir,
                                           max_wait_secs=1)
    with tf.Graph().as_default():
        _model(tf)
        creator = train.WorkerSessionCreator(master=server.target, checkpoint_dir=logdir, max_wait_secs=2)
        with pytest.raises(tf.errors.DeadlineExceededError, match="Session was not ready after waiting 2 secs"):
            train.MonitoredSession(creator)
    with tf.Graph().as_default():  # the chief initializes the model on the server
        m = _model(tf)
        with tf.compat.v1.Session(server.target) as chief:
            chief.run(tf.compat.v1.global_variables_initializer())
            chief.run(m["w"].assign(3.0))
    with tf.Graph().as_default():
        m = _model(tf)
        with train.MonitoredTrainingSession(is_chief=False, master=server.target, checkpoint_dir=logdir,
                                            max_wait_secs=1) as sess:
            assert sess.run(m["w"]) == 3.0  # the chief's value: the worker initialized nothing
            sess.run(m["train_op"])
            assert sess.run(m["gs"]) == 1
    assert committed_steps(logdir) == []  # a worker saves nothing


@pytest.mark.slow
def test_procsv_train_saver_is_tensorflows_saver_and_names_what_the_checkpoint_service_saves(logdir):
    """``procsv.train.Saver`` is ``tf.compat.v1.train.Saver``. A graph MonitoredTrainingSession whose
    Scaffold has ``procsv.train.Saver(var_list=[w, global_step])``: procsv's checkpoint service
    commits what that Saver names (with TF1's names, not the Momentum slot), which
    ``tf.train.latest_checkpoint`` finds and the same Saver restores in a plain ``tf.compat.v1.Session``.
    As TF's page says of a MonitoredSession, "it cannot be sent to saver.save"."""
    import tensorflow as tf

    from procsv import train

    assert train.Saver is tf.compat.v1.train.Saver
    with tf.Graph().as_default():
        m = _model(tf)
        scaffold = train.Scaffold(saver=train.Saver(var_list=[m["w"], m["gs"]]))
        with train.MonitoredTrainingSession(checkpoint_dir=logdir, scaffold=scaffold, save_checkpoint_secs=3600) as sess:
            for _ in range(3):
                sess.run(m["train_op"])
            w = sess.run(m["w"])
            with pytest.raises(TypeError, match="'sess' must be a Session"):
                scaffold.saver.save(sess, os.path.join(logdir, "elsewhere"))
    assert committed_steps(logdir) == [0, 3]  # the hook's saves at the creation and at the end, as TF's
    path = tf.train.latest_checkpoint(logdir)
    assert path is not None and path.endswith("model.ckpt-3")
    assert {name for name, _ in tf.train.list_variables(path)} == {"w", "global_step"}
    with tf.Graph().as_default():
        m = _model(tf)
        with tf.compat.v1.Session() as plain:
            train.Saver(var_list=[m["w"], m["gs"]]).restore(plain, path)
            assert (plain.run(m["w"]), plain.run(m["gs"])) == (w, 3)
            assert w != 1.0  # three steps trained it


@pytest.mark.slow
def test_sv_log_scalar_in_a_tf1_program_after_the_graph_is_frozen(short_tmp):
    from tensorboard.backend.event_processing import event_accumulator as ea

    logdir = os.path.join(short_tmp, "run")
    out = run_python([os.path.join(PROGRAMS, "graph_log_scalar.py"), logdir], env=quiet_env(), timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "finalized=True" in out.stdout
    acc = ea.EventAccumulator(logdir, size_guidance={ea.SCALARS: 0})
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("my/scalar")] == [(1, 0.0), (2, 1.0), (3, 2.0)]


def test_the_session_creators_master_and_config_reach_the_graph_session(logdir):
    import tensorflow as tf

    from procsv import train

    server = tf.distribute.Server.create_local_server()
    config = tf.compat.v1.ConfigProto(log_device_placement=False, intra_op_parallelism_threads=1)
    with tf.Graph().as_default():
        m = _model(tf)
        creator = train.ChiefSessionCreator(checkpoint_dir=logdir, master=server.target, config=config)
        with train.MonitoredSession(creator) as sess:
            sess.run(m["train_op"])
            raw = sess._graph.raw_session()
            assert raw.sess_str == server.target.encode()  # a session on that server (bytes, as TF's)
            assert raw.session.raw._config.intra_op_parallelism_threads == 1  # made with that ConfigProto
            assert raw.run(m["gs"]) == 1


def _on_server(sess, server, m):
    """The graph session inside a monitored session: made on ``server`` with the test's ConfigProto."""
    raw = sess._graph.raw_session()
    assert raw.sess_str == server.target.encode()
    assert raw.session.raw._config.intra_op_parallelism_threads == 1
    return raw


@pytest.mark.slow
def test_master_and_config_reach_the_graph_session_of_every_monitored_session_and_creator(logdir):
    """MonitoredTrainingSession(master=, config=) (chief and worker), SingularMonitoredSession(master=,
    config=) and WorkerSessionCreator(master=, config=): the graph session is made on that target
    with that ConfigProto, as TF's, and trains."""
    import tensorflow as tf

    from procsv import train

    server = tf.distribute.Server.create_local_server()
    config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=1)
    with tf.Graph().as_default():
        m = _model(tf)
        with train.MonitoredTrainingSession(master=server.target, config=config, checkpoint_dir=logdir,
                                            save_checkpoint_secs=3600) as sess:
            sess.run(m["train_op"])
            assert _on_server(sess, server, m).run(m["gs"]) == 1
    with tf.Graph().as_default():
        m = _model(tf)
        with train.SingularMonitoredSession(master=server.target, config=config, checkpoint_dir=logdir) as sess:
            assert sess.run(m["gs"]) == 1  # restored
            sess.run(m["train_op"])
            assert _on_server(sess, server, m).run(m["gs"]) == 2
    assert committed_steps(logdir)[-1] == 2
    with tf.Graph().as_default():
        m = _model(tf)
        with train.MonitoredTrainingSession(is_chief=False, master=server.target, config=config,
                                            checkpoint_dir=logdir) as sess:
            assert _on_server(sess, server, m).run(m["gs"]) == 2
    with tf.Graph().as_default():
        m = _model(tf)
        creator = train.WorkerSessionCreator(master=server.target, config=config, checkpoint_dir=logdir)
        with train.MonitoredSession(creator) as sess:
            sess.run(m["train_op"])
            assert _on_server(sess, server, m).run(m["gs"]) == 3
    assert committed_steps(logdir)[-1] == 2  # the workers saved nothing


@pytest.mark.slow
def test_scalars_an_eager_function_logged_earlier_in_the_process_do_not_break_a_graph_session(logdir):
    """The process's rings of scalars logged inside a tf.function (eager variables, made by an earlier
    eager program or test in this process) are read at a graph session's step boundary inside a
    ``tf.Graph().as_default()`` block: they are read eagerly there (init_scope), never with a
    graph-mode ``numpy()`` (which raised NotImplementedError and failed the run: seen in CI when an
    eager test ran before this file in the same worker)."""
    import tensorflow as tf

    from procsv import train
    from procsv.trainer.summaries.graph_rings import PROCESS_RINGS

    @tf.function
    def eager_step() -> None:
        PROCESS_RINGS.log({"eager/x": tf.constant(1.5)}, tf.constant(7, tf.int64))

    eager_step()
    with tf.Graph().as_default():
        m = _model(tf)
        with train.MonitoredTrainingSession(checkpoint_dir=logdir, save_checkpoint_secs=3600,
                                            save_summaries_steps=1) as sess:
            for _ in range(3):
                sess.run(m["train_op"])
            assert sess.run(m["gs"]) == 3
    assert committed_steps(logdir) == [0, 3]  # the hook's saves at the creation and at the end, as TF's


def _writer_events(tf, folder):
    """What a writer's event files in ``folder`` hold: the steps of each scalar tag, the SessionLog statuses."""
    import glob

    tags, logs = {}, []
    for path in sorted(glob.glob(os.path.join(folder, "events.out.tfevents.*"))):
        for event in tf.compat.v1.train.summary_iterator(path):
            if event.HasField("session_log"):
                logs.append(int(event.session_log.status))
            for value in event.summary.value:
                tags.setdefault(value.tag, []).append(event.step)
    return tags, logs


@pytest.mark.slow
def test_summary_saver_and_step_counter_hooks_write_into_a_passed_summary_writers_own_directory(logdir, tmp_path):
    """Graph mode, as TensorFlow's own hooks (run here too, on TF's SingularMonitoredSession): a
    FileWriter passed as summary_writer= gets the SummarySaverHook's summaries (from step 1, every
    2 steps), a SessionLog START, and the StepCounterHook's global_step/sec, in its own directory
    (not the logdir); read back with EventAccumulator."""
    import tensorflow as tf
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from procsv import train

    seen = {}
    for name, api in (("tf", tf.compat.v1.train), ("procsv", train)):
        folder = str(tmp_path / f"writer-{name}")
        with tf.Graph().as_default():
            m = _model(tf)
            writer = tf.compat.v1.summary.FileWriter(folder)
            hooks = [api.SummarySaverHook(save_steps=2, summary_writer=writer, summary_op=tf.compat.v1.summary.merge_all()),
                     api.StepCounterHook(every_n_steps=2, summary_writer=writer)]
            kwargs = {"checkpoint_dir": logdir} if name == "procsv" else {}
            with api.SingularMonitoredSession(hooks=hooks, **kwargs) as sess:
                for _ in range(6):
                    sess.run(m["train_op"])
            writer.close()
        seen[name] = _writer_events(tf, folder)
        acc = EventAccumulator(folder, size_guidance={"scalars": 0})
        acc.Reload()
        assert [e.step for e in acc.Scalars("loss")] == seen[name][0]["loss"]
    tags, logs = seen["procsv"]
    assert tags["loss"][0] == 1 and len(tags["loss"]) >= 3 and tags.get("global_step/sec"), tags
    assert logs == seen["tf"][1] == [int(tf.compat.v1.SessionLog.START)]
    assert set(tags) == set(seen["tf"][0]) == {"loss", "global_step/sec"}
    assert tags["loss"][0] == seen["tf"][0]["loss"][0]


@pytest.mark.slow
def test_a_checkpoint_saver_hooks_scaffold_names_the_saver_that_saves_as_in_tensorflow(logdir, tmp_path):
    """Graph mode: CheckpointSaverHook(scaffold=Scaffold(saver=Saver([w, global_step]))) saves with
    that Saver (not the session's default one over every variable, the Momentum slot too), as
    TensorFlow's own hook on TF's SingularMonitoredSession: the same variables in the checkpoint,
    read back with tf.train.list_variables."""
    import tensorflow as tf

    from procsv import train

    names = {}
    for name, api in (("tf", tf.compat.v1.train), ("procsv", train)):
        folder = logdir if name == "procsv" else str(tmp_path / "tf")
        with tf.Graph().as_default():
            m = _model(tf)
            scaffold = api.Scaffold(saver=tf.compat.v1.train.Saver({"w": m["w"], "global_step": m["gs"]}))
            hook = api.CheckpointSaverHook(folder, save_steps=2, scaffold=scaffold)
            kwargs = {"checkpoint_dir": logdir} if name == "procsv" else {}
            with api.SingularMonitoredSession(hooks=[hook], **kwargs) as sess:
                for _ in range(3):
                    sess.run(m["train_op"])
        names[name] = {n for n, _ in tf.train.list_variables(tf.train.latest_checkpoint(folder))}
    assert names["procsv"] == names["tf"] == {"w", "global_step"}


@pytest.mark.slow
def test_monitored_training_session_save_graph_def_writes_graph_pbtxt_and_the_graph_events_as_tensorflows(logdir, tmp_path):
    """Graph mode: MonitoredTrainingSession(save_graph_def=True) (its CheckpointSaverHook's) writes
    graph.pbtxt, a GraphDef event and a MetaGraphDef event (read with EventAccumulator) and a
    <prefix>.meta per checkpoint into the checkpoint_dir; save_graph_def=False neither graph.pbtxt nor
    .meta files, and still both events (TF's writer is opened with the graph). The same as TensorFlow's own MonitoredTrainingSession, run here too."""
    import tensorflow as tf
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from procsv import train

    seen = {}
    for name, api in (("tf", tf.compat.v1.train), ("procsv", train)):
        for save in (True, False):
            folder = str(tmp_path / f"{name}-{save}") if name == "tf" else os.path.join(logdir, str(save))
            with tf.Graph().as_default():
                m = _model(tf)
                with api.MonitoredTrainingSession(checkpoint_dir=folder, save_checkpoint_steps=2, save_summaries_steps=None,
                                                  save_summaries_secs=None, log_step_count_steps=None,
                                                  save_graph_def=save) as sess:
                    for _ in range(2):
                        sess.run(m["train_op"])
            acc = EventAccumulator(folder)
            acc.Reload()
            tags = acc.Tags()
            metas = any(n.endswith(".meta") for n in os.listdir(folder))  # model.ckpt-<step>.meta, TF's Saver's
            seen[(name, save)] = (os.path.exists(os.path.join(folder, "graph.pbtxt")), tags["graph"], tags["meta_graph"],
                                  metas)
            if save:
                assert "global_step" in {node.name for node in acc.Graph().node}
                assert acc.MetaGraph().saver_def.filename_tensor_name
    assert seen[("procsv", True)] == seen[("tf", True)] == (True, True, True, True)
    # TF's hooks open their writer with the graph (FileWriter(logdir, graph=...)): both events either way
    assert seen[("procsv", False)] == seen[("tf", False)] == (False, True, True, False)


def test_a_scaffolds_local_init_feed_dict_feeds_its_local_init_op_as_tensorflows(logdir):
    """Graph mode: Scaffold(local_init_op=..., local_init_feed_dict={placeholder: 7.0}): the
    local_init_op runs with that feed when the session is made (a local variable assigned from an
    unfed placeholder would fail otherwise), as TensorFlow's own SingularMonitoredSession."""
    import tensorflow as tf

    from procsv import train

    seen = {}
    for name, api in (("tf", tf.compat.v1.train), ("procsv", train)):
        with tf.Graph().as_default():
            m = _model(tf)
            fed = tf.compat.v1.placeholder(tf.float32, [], name="fed")
            local = tf.compat.v1.get_variable("local", initializer=0.0,
                                              collections=[tf.compat.v1.GraphKeys.LOCAL_VARIABLES])
            with tf.control_dependencies([local.initializer]):
                local_init = tf.group(local.assign(fed), tf.compat.v1.tables_initializer())
            scaffold = api.Scaffold(local_init_op=local_init, local_init_feed_dict={fed: 7.0})
            kwargs = {"checkpoint_dir": logdir} if name == "procsv" else {}
            with api.SingularMonitoredSession(scaffold=scaffold, **kwargs) as sess:
                sess.run(m["train_op"])
                seen[name] = float(sess.run(local))
    assert seen == {"tf": 7.0, "procsv": 7.0}
