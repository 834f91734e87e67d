"""The sessions procsv hands a TF1 graph program are sessions to TensorFlow's own code (issue 50, point 2).

In-process tests: each builds its graph in ``with tf.Graph().as_default()`` (eager execution stays on
in the pytest process; the Supervisor's services run as child processes of the test). What they
show: ``Saver.save(sess, path)``, TF's own ``CheckpointSaverHook`` and ``start_queue_runners`` take
the session of a ``SingularMonitoredSession`` and of ``Supervisor.managed_session()``; a program's own
session creator (any object with ``create_session()``) runs under procsv's ``MonitoredSession`` as
under TF's; ``raw_session()`` is None once the session is closed.
"""

from __future__ import annotations

import os

import pytest

pytestmark = pytest.mark.usefixtures("fresh_train_api")


@pytest.mark.slow
def test_saver_save_and_tensorflows_checkpoint_saver_hook_take_procsvs_graph_sessions(logdir, tmp_path):
    import tensorflow as tf
    from tensorflow.python.client.session import SessionInterface

    from procsv import train

    with tf.Graph().as_default():
        gs = tf.compat.v1.train.get_or_create_global_step()
        step = tf.compat.v1.assign_add(gs, 1)
        saver = tf.compat.v1.train.Saver()
        tf_hook = tf.compat.v1.train.CheckpointSaverHook(str(tmp_path / "tf_hook"), save_steps=1, saver=saver)
        with train.SingularMonitoredSession(hooks=[tf_hook], checkpoint_dir=logdir) as sess:
            assert sess.run(step) == 1
            raw = sess.raw_session()
            assert isinstance(raw, SessionInterface)
            path = saver.save(raw, str(tmp_path / "mine" / "model.ckpt"), global_step=gs)
            with raw.as_default():
                assert tf.compat.v1.train.start_queue_runners(raw) == []
    assert path == str(tmp_path / "mine" / "model.ckpt-1")
    assert tf.train.load_variable(path, "global_step") == 1
    # TensorFlow's own hook saved at session creation and after the run, through procsv's raw session
    assert tf.train.latest_checkpoint(str(tmp_path / "tf_hook")).endswith("model.ckpt-1")
    assert tf.train.load_variable(str(tmp_path / "tf_hook" / "model.ckpt-0"), "global_step") == 0

    with tf.Graph().as_default():
        gs = tf.compat.v1.train.get_or_create_global_step()
        step = tf.compat.v1.assign_add(gs, 1)
        saver = tf.compat.v1.train.Saver()
        sv = train.Supervisor(logdir=str(tmp_path / "sv"), save_model_secs=0, save_summaries_secs=0)
        with sv.managed_session() as sess:
            sess.run(step)
            sess.run(step)
            path = saver.save(sess, str(tmp_path / "sv_mine" / "model.ckpt"), global_step=gs)
        sv.stop()
    assert path.endswith("model.ckpt-2") and tf.train.load_variable(path, "global_step") == 2


@pytest.mark.slow
def test_raw_session_is_none_once_the_singular_monitored_session_is_closed(logdir):
    import tensorflow as tf

    from procsv import train

    with tf.Graph().as_default():
        gs = tf.compat.v1.train.get_or_create_global_step()
        step = tf.compat.v1.assign_add(gs, 1)
        with train.SingularMonitoredSession(checkpoint_dir=logdir) as sess:
            assert sess.raw_session() is not None
            sess.run(step)
        assert sess.raw_session() is None
        sess = train.SingularMonitoredSession(checkpoint_dir=logdir)
        sess.run(step)
        sess.close()
        assert sess.raw_session() is None


class _OwnCreator:
    """A program's own session creator (TF's SessionCreator interface: only ``create_session()``):
    a plain ``tf.compat.v1.Session`` with the variables initialized, counted."""

    def __init__(self, tf, init_op):
        self._tf = tf
        self._init_op = init_op
        self.made = []

    def create_session(self):
        sess = self._tf.compat.v1.Session()
        sess.run(self._init_op)
        self.made.append(sess)
        return sess


def test_a_programs_own_session_creator_gets_tensorflows_coordinated_recoverable_session(tmp_path):
    import tensorflow as tf

    from procsv import train

    calls = []

    class Hook(tf.compat.v1.train.SessionRunHook):
        def begin(self):
            calls.append("begin")

        def after_create_session(self, session, coord):
            calls.append(("after_create_session", type(session).__name__, coord.should_stop()))
            self.coord = coord

        def after_run(self, run_context, run_values):
            calls.append("after_run")
            if len([c for c in calls if c == "after_run"]) == 2:
                raise tf.errors.AbortedError(None, None, "aborted in the second run")

        def end(self, session):
            calls.append("end")

    with tf.Graph().as_default():
        gs = tf.compat.v1.train.get_or_create_global_step()
        step = tf.compat.v1.assign_add(gs, 1)
        init = tf.compat.v1.global_variables_initializer()
        creator = _OwnCreator(tf, init)
        hook = Hook()
        sess = train.MonitoredSession(session_creator=creator, hooks=[hook])
        assert sess.run(step) == 1
        # the AbortedError: the session is closed, a new one made by the program's creator, the run retried
        assert sess.run(step) == 1 and len(creator.made) == 2
        assert sess.run_step_fn(lambda step_context: step_context.session.run(gs)) == 1
        assert not sess.should_stop()
        # another thread's error recorded in the coordinator: should_stop() is True, close() raises it
        hook.coord.request_stop(ValueError("a reader thread failed"))
        assert sess.should_stop()
        with pytest.raises(ValueError, match="a reader thread failed"):
            sess.close()
        assert creator.made[0]._closed and creator.made[1]._closed
        with pytest.raises(RuntimeError, match="Session is already closed"):
            sess.close()
    # TF's interface, to subclass: procsv's own creators are SessionCreators too
    assert issubclass(train.ChiefSessionCreator, train.SessionCreator)
    with pytest.raises(NotImplementedError):
        train.SessionCreator().create_session()
    assert calls[:2] == ["begin", ("after_create_session", "Session", False)]
    assert calls.count(("after_create_session", "Session", False)) == 2 and "end" in calls


def test_procsvs_checkpoint_saver_hook_on_a_programs_own_session_saves_what_tensorflows_does(tmp_path):
    import tensorflow as tf

    from procsv import train

    def run(monitored_session, saver_hook, folder):
        with tf.Graph().as_default():
            gs = tf.compat.v1.train.get_or_create_global_step()
            w = tf.compat.v1.get_variable("w", initializer=1.0)
            step = tf.group(tf.compat.v1.assign_add(gs, 1), tf.compat.v1.assign_add(w, 0.5))
            creator = _OwnCreator(tf, tf.compat.v1.global_variables_initializer())
            hook = saver_hook(str(folder), save_steps=2, saver=tf.compat.v1.train.Saver())
            with monitored_session(session_creator=creator, hooks=[hook]) as sess:
                for _ in range(5):
                    sess.run(step)
                sess.run(w.assign_add(10.0))  # a run that does not advance the step: the save at the end holds it
        state = tf.train.get_checkpoint_state(str(folder))
        return ([os.path.basename(p) for p in state.all_model_checkpoint_paths],
                {os.path.basename(p): (int(tf.train.load_variable(p, "global_step")), float(tf.train.load_variable(p, "w")))
                 for p in state.all_model_checkpoint_paths})

    theirs = run(tf.compat.v1.train.MonitoredSession, tf.compat.v1.train.CheckpointSaverHook, tmp_path / "tf")
    mine = run(train.MonitoredSession, train.CheckpointSaverHook, tmp_path / "procsv")
    assert theirs[0] == ["model.ckpt-0", "model.ckpt-2", "model.ckpt-4", "model.ckpt-5"]
    assert mine == theirs and theirs[1]["model.ckpt-5"] == (5, 13.5)


@pytest.mark.slow
def test_checkpoint_saver_hook_saves_synchronously_and_an_aborted_run_resumes_from_the_last_saved_step(logdir):
    import tensorflow as tf

    from conftest import committed_steps
    from procsv import train

    class AbortAtFourthRun(train.SessionRunHook):
        runs = 0

        def before_run(self, run_context):
            self.runs += 1
            if self.runs == 4:
                raise tf.errors.AbortedError(None, None, "aborted at the fourth run")

    with tf.Graph().as_default():
        gs = tf.compat.v1.train.get_or_create_global_step()
        do_step = tf.compat.v1.assign_add(gs, 1)
        scaffold = train.Scaffold()
        hooks = [AbortAtFourthRun(), train.CheckpointSaverHook(logdir, save_steps=1, scaffold=scaffold)]
        with train.MonitoredSession(session_creator=train.ChiefSessionCreator(scaffold, checkpoint_dir=logdir),
                                    hooks=hooks) as sess:
            assert sess.run(gs) == 0 and committed_steps(logdir) == [0]
            # as TF's synchronous save: the run that saved returns with its checkpoint committed
            assert sess.run(do_step) == 1 and committed_steps(logdir) == [0, 1]
            assert sess.run(do_step) == 2 and committed_steps(logdir) == [0, 1, 2]
            # the fourth run is aborted before it runs: a new session restores step 2, the last one
            # saved (TF's: its synchronous save had it on disk), and the run is made again
            assert sess.run(do_step) == 3
            assert sess.run(do_step) == 4 and not sess.should_stop()


@pytest.mark.slow
def test_an_after_save_that_returns_true_stops_after_that_run_and_the_final_save_holds_the_state_at_close(logdir, tmp_path):
    import tensorflow as tf

    from procsv import train

    class StopAtTwo(tf.compat.v1.train.CheckpointSaverListener):
        def after_save(self, session, global_step_value):
            return global_step_value >= 2

    def model():
        gs = tf.compat.v1.train.get_or_create_global_step()
        w = tf.compat.v1.get_variable("w", initializer=1.0)
        return gs, w, tf.group(tf.compat.v1.assign_add(gs, 1), tf.compat.v1.assign_add(w, 0.5))

    with tf.Graph().as_default():
        _, _, step = model()
        hook = train.CheckpointSaverHook(logdir, save_steps=2, listeners=[StopAtTwo()])
        runs = 0
        with train.MonitoredSession(session_creator=train.ChiefSessionCreator(checkpoint_dir=logdir),
                                    hooks=[hook]) as sess:
            while not sess.should_stop() and runs < 10:
                sess.run(step)
                runs += 1
    assert runs == 2  # as TF: the stop comes right after the run that saved step 2

    folder = str(tmp_path / "at_close")
    with tf.Graph().as_default():
        _, w, step = model()
        bump = w.assign_add(10.0)
        hook = train.CheckpointSaverHook(folder, save_steps=100)
        with train.MonitoredSession(session_creator=train.ChiefSessionCreator(checkpoint_dir=folder),
                                    hooks=[hook]) as sess:
            for _ in range(3):
                sess.run(step)
            sess.run(bump)  # no step: the save at the close still holds it, as TF's end()
    path = tf.train.latest_checkpoint(folder)
    assert path.endswith("model.ckpt-3")
    assert tf.train.load_variable(path, "global_step") == 3 and tf.train.load_variable(path, "w") == 12.5


@pytest.mark.slow
def test_monitored_training_session_with_save_checkpoint_secs_0_saves_no_checkpoint_not_even_a_final_one(logdir):
    import tensorflow as tf

    from procsv import train
    from conftest import committed_steps

    with tf.Graph().as_default():
        gs = tf.compat.v1.train.get_or_create_global_step()
        step = tf.compat.v1.assign_add(gs, 1)
        # as TF: save_checkpoint_secs=0 adds no CheckpointSaverHook, and without one nothing is saved
        with train.MonitoredTrainingSession(is_chief=True, checkpoint_dir=logdir, save_checkpoint_secs=0) as sess:
            assert sess.run(step) == 1 and sess.run(step) == 2
        assert committed_steps(logdir) == []
        with train.MonitoredTrainingSession(is_chief=True, checkpoint_dir=logdir) as sess:
            assert sess.run(gs) == 0  # nothing to restore
            assert sess.run(step) == 1
        assert committed_steps(logdir)[-1] == 1  # the default hook's final save still happens


def _a_program_that_asks_for_no_checkpoints(tf, monitored_training_session, logdir: str, eager: bool) -> list[int]:
    """A training program that logs summaries but asks for no checkpoints
    (``MonitoredTrainingSession(checkpoint_dir=..., save_checkpoint_secs=None)``, no steps), run twice:
    the global step each run starts at."""
    starts = []
    for _ in range(2):
        if eager:
            gs = tf.Variable(0, dtype=tf.int64, name="global_step")
            w = tf.Variable(1.0)
            with monitored_training_session(checkpoint_dir=logdir, save_checkpoint_secs=None,
                                            checkpoint={"w": w, "global_step": gs}) as sess:
                starts.append(int(gs.numpy()))
                for _ in range(3):
                    sess.run(lambda: w.assign_add(1.0))
            continue
        with tf.Graph().as_default():
            gs = tf.compat.v1.train.get_or_create_global_step()
            step = tf.compat.v1.assign_add(gs, 1)
            with monitored_training_session(checkpoint_dir=logdir, save_checkpoint_secs=None) as sess:
                starts.append(int(sess.run(gs)))
                for _ in range(3):
                    sess.run(step)
    return starts


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["graph", "eager"])
def test_monitored_training_session_with_save_checkpoint_secs_none_writes_no_checkpoint_and_a_rerun_starts_at_0(
        tmp_path, mode):
    # before: procsv committed a final checkpoint at the end (model.ckpt-3) and the rerun restored step 3;
    # TF's MonitoredTrainingSession adds no CheckpointSaverHook for None (without steps) and saves nothing
    import tensorflow as tf

    from procsv import train
    from conftest import committed_steps

    if mode == "graph":
        theirs = str(tmp_path / "tf")
        assert _a_program_that_asks_for_no_checkpoints(
            tf, tf.compat.v1.train.MonitoredTrainingSession, theirs, eager=False) == [0, 0]
        assert tf.train.latest_checkpoint(theirs) is None
    ours = str(tmp_path / "procsv")
    assert _a_program_that_asks_for_no_checkpoints(tf, train.MonitoredTrainingSession, ours, eager=mode == "eager") \
        == [0, 0]
    assert committed_steps(ours) == [] and tf.train.latest_checkpoint(ours) is None


@pytest.mark.parametrize("creator", ["procsv", "own"])
def test_request_stop_outside_a_with_block_raises_stop_iteration_and_leaves_should_stop_false(logdir, creator):
    """Both graph sessions (procsv's creator, and a program's own: one end, session_end.py)."""
    import tensorflow as tf

    from procsv import train

    with tf.Graph().as_default():
        gs = tf.compat.v1.train.get_or_create_global_step()
        step = tf.compat.v1.assign_add(gs, 1)

        def step_fn(step_context):
            step_context.run_with_hooks(step)
            step_context.request_stop()

        made = (train.ChiefSessionCreator(checkpoint_dir=logdir) if creator == "procsv" else
                _OwnCreator(tf, tf.compat.v1.global_variables_initializer()))
        sess = train.MonitoredSession(made)
        with pytest.raises(StopIteration):
            sess.run_step_fn(step_fn)
        assert not sess.should_stop()  # as TF: only a with block turns the StopIteration into the end
        assert sess.run(step) == 2
        sess.close()
        assert sess.should_stop()


@pytest.mark.slow
def test_close_inside_a_with_block_is_session_already_closed_at_its_end(logdir):
    import tensorflow as tf

    from procsv import train

    with tf.Graph().as_default():
        gs = tf.compat.v1.train.get_or_create_global_step()
        step = tf.compat.v1.assign_add(gs, 1)
        with pytest.raises(RuntimeError, match="Session is already closed"):
            with train.MonitoredSession(train.ChiefSessionCreator(checkpoint_dir=logdir)) as sess:
                sess.run(step)
                sess.close()
        sess = train.SingularMonitoredSession(checkpoint_dir=logdir)
        sess.close()
        with pytest.raises(RuntimeError, match="Session is already closed"):
            sess.close()



@pytest.mark.parametrize("creator", ["procsv", "own"])
@pytest.mark.slow
def test_a_second_close_calls_every_hooks_end_with_no_session_then_raises_as_tensorflows(logdir, tmp_path, creator):
    """TF's ``_close_internal`` runs ``end()`` on the hooks again at a second close, with the session
    gone (None), and raises ``RuntimeError('Session is already closed.')`` whatever ``end(None)``
    raised. Before: procsv's raised at once, and a hook saw one ``end()``."""
    import tensorflow as tf

    from procsv import train

    def ends(monitored_session, session_creator) -> list:
        class Ends(tf.compat.v1.train.SessionRunHook):
            seen: list = []

            def end(self, session):
                Ends.seen.append(None if session is None else "session")
                if session is None:
                    raise AttributeError("'NoneType' object has no attribute 'run'")  # as a hook that runs at its end

        with tf.Graph().as_default():
            gs = tf.compat.v1.train.get_or_create_global_step()
            step = tf.compat.v1.assign_add(gs, 1)
            sess = monitored_session(session_creator(tf.compat.v1.global_variables_initializer()), hooks=[Ends()])
            sess.run(step)
            sess.close()
            with pytest.raises(RuntimeError, match="Session is already closed"):
                sess.close()
            with pytest.raises(RuntimeError, match="Session is already closed"):
                with monitored_session(session_creator(tf.compat.v1.global_variables_initializer()),
                                       hooks=[Ends()]) as inner:
                    inner.run(step)
                    inner.close()
        return Ends.seen

    def tf_creator(init_op):
        return tf.compat.v1.train.ChiefSessionCreator(scaffold=tf.compat.v1.train.Scaffold(init_op=init_op))

    def procsv_creator(init_op):
        if creator == "own":
            return _OwnCreator(tf, init_op)
        return train.ChiefSessionCreator(checkpoint_dir=logdir)

    theirs = ends(tf.compat.v1.train.MonitoredSession, tf_creator)
    ours = ends(train.MonitoredSession, procsv_creator)
    assert theirs == ["session", None, "session", None]
    assert ours == theirs


RAW_PROGRAM = os.path.join(os.path.dirname(__file__), "programs", "graph_raw_session.py")


def test_every_method_of_tensorflows_session_is_procsvs_own_forwarded_or_safe():
    """Each name TF's ``SessionInterface``/``BaseSession``/``Session`` define is accounted for by
    ``session_type`` (a TensorFlow upgrade that adds a public one fails here), and both proxy classes
    define the public ones themselves, so none of TF's methods runs on a proxy's missing handles."""
    from procsv.trainer import session_type
    from procsv.trainer.graph.session import GraphSession
    from procsv.trainer.monitored.graph_creator import GraphRawSession

    assert session_type.unaccounted() == set()
    assert "_run" in session_type.private_methods() and "_make_callable_from_options" in session_type.private_methods()
    public = {name for name in session_type.tf_names() if not name.startswith("_")}
    assert public - {"as_default", "reset"} <= session_type.OWN
    for cls in (GraphSession, GraphRawSession):
        assert session_type.OWN <= set(vars(cls)), cls
        made = session_type.as_tf_session(cls, "_x")
        for name in session_type.private_methods():
            assert name in vars(made), (cls, name)


@pytest.mark.slow
def test_every_graph_session_procsv_hands_out_is_a_tf_compat_v1_session_and_still_counts_its_steps(logdir, tmp_path):
    """``raw_session()``, ``step_context.session`` and ``managed_session()``'s session are
    ``tf.compat.v1.Session`` instances (TF's ``SingularMonitoredSessionTest::test_raw_session``);
    runs through them, through a callable, and ``op.run()`` under ``as_default()`` are steps procsv
    counts; TF's ``saver.save(raw, path)`` and ``start_queue_runners(sess=raw)`` with a real queue
    runner work; collecting a proxy closes nothing and raises nothing; ``raw_session()`` is None after
    the close."""
    import gc
    import sys

    import tensorflow as tf

    from procsv import train
    from procsv.trainer import session_type
    from procsv.trainer.monitored.graph_creator import GraphRawSession

    unraisable = []
    old_hook, sys.unraisablehook = sys.unraisablehook, unraisable.append
    try:
        with tf.Graph().as_default():
            gs = tf.compat.v1.train.get_or_create_global_step()
            step = tf.compat.v1.assign_add(gs, 1)
            queue = tf.compat.v1.FIFOQueue(10, tf.int64)
            runner = tf.compat.v1.train.QueueRunner(queue, [queue.enqueue(tf.constant(7, tf.int64))])
            tf.compat.v1.train.add_queue_runner(runner, collection="mine")
            taken = queue.dequeue()
            saver = tf.compat.v1.train.Saver()
            with train.SingularMonitoredSession(checkpoint_dir=logdir) as sess:
                raw = sess.raw_session()
                assert isinstance(raw, tf.compat.v1.Session)
                seen = sess.run_step_fn(lambda step_context: step_context.session)
                assert seen is raw and isinstance(seen, tf.compat.v1.Session)
                sv = raw.supervisor
                assert raw.run(step) == 1 and sv.step == 1
                assert raw.make_callable(step)() == 2 and sv.step == 2
                with raw.as_default():
                    assert tf.compat.v1.get_default_session() is raw
                    step.op.run()
                assert sv.step == 3
                path = saver.save(raw, str(tmp_path / "mine" / "model.ckpt"), global_step=gs)
                coord = tf.compat.v1.train.Coordinator()
                threads = tf.compat.v1.train.start_queue_runners(sess=raw, coord=coord, collection="mine")
                assert len(threads) == 2 and raw.run(taken) == 7  # (an enqueue thread, and with a coord its closer)
                coord.request_stop()
                coord.join(threads, stop_grace_period_secs=30)
                spare = session_type.make(GraphRawSession, "_inner", raw.session, raw.supervisor)
                del spare
                gc.collect()
                assert raw.run(step) == 4  # the watched session is still open
            assert sess.raw_session() is None
    finally:
        sys.unraisablehook = old_hook
    assert unraisable == []
    assert path.endswith("model.ckpt-3") and tf.train.load_variable(path, "global_step") == 3

    with tf.Graph().as_default():
        gs = tf.compat.v1.train.get_or_create_global_step()
        step = tf.compat.v1.assign_add(gs, 1)
        sv = train.Supervisor(logdir=str(tmp_path / "sv"), save_model_secs=0, save_summaries_secs=0)
        with sv.managed_session() as sess:
            assert isinstance(sess, tf.compat.v1.Session)
            with sess.as_default():
                step.op.run()
            assert sv.step == 1
        sv.stop()


@pytest.mark.slow
def test_a_program_training_only_through_raw_session_is_not_hung_and_its_checkpoints_advance(logdir):
    """Under ``procsv launch --hang-timeout 3``, a program whose every training run is
    ``raw_session().run`` (several seconds of them) sees a ``tf.compat.v1.Session``, runs as one trainer
    (never restarted as hung), and the checkpoints advance with its steps: committed every 20 steps up
    to its final step, the newest one restored by a plain TF1 Saver holding that step."""
    import tensorflow as tf

    from conftest import committed_steps, finish, launch, lifecycle

    code, out, err = finish(launch(logdir, logdir, "200", "0.03", target=RAW_PROGRAM,
                                   opts=("--hang-timeout", "3", "--standby", "fork")),
                            timeout=300)
    assert code == 0, err[-3000:]
    assert "raw session is a tf.compat.v1.Session: True" in out
    final = int(next(line for line in out.splitlines() if "final global step" in line).split()[-1])
    assert final == 200
    events = lifecycle(logdir)
    assert [e for e in events if e["event"] == "first_step"]
    assert len([e for e in events if e["event"] == "spawned" and e["role"] == "trainer"]) == 1  # never hung
    assert [e["step"] for e in events if e["event"] == "finished"] == [final]
    commits = [(e["step"], e["reason"]) for e in events if e["event"] == "checkpoint_committed"]
    assert [step for step, reason in commits if reason == "steps"] == list(range(0, 201, 20)), commits
    assert committed_steps(logdir)[-1] == 200
    latest = tf.train.latest_checkpoint(logdir)
    assert latest is not None and latest.endswith("model.ckpt-200")
    with tf.Graph().as_default():
        gs = tf.compat.v1.train.get_or_create_global_step()
        tf.compat.v1.get_variable("w", initializer=1.0)
        with tf.compat.v1.Session() as plain:
            tf.compat.v1.train.Saver().restore(plain, latest)
            assert plain.run(gs) == 200



@pytest.mark.slow
def test_a_with_block_on_a_graph_session_makes_it_the_default_session_as_tensorflows(logdir, tmp_path):
    """``with sess:`` (TF's ``Session.__enter__``) on the Supervisor's session and on ``raw_session()``
    makes it the default session and its graph the default graph: ``op.run()`` and ``tensor.eval()``
    inside run through it; the block's end closes it; as TF's classes (the
    program runs both, eager execution disabled). Was: ``No default session is registered``."""
    import json

    from conftest import REPO, quiet_env, run_python

    def program(where: str, *flag: str) -> list[object]:
        done = run_python([WITH_PROGRAM, where, *flag], env=quiet_env(), cwd=REPO, timeout=300)
        lines = [x for x in done.stdout.splitlines() if x.startswith("result ")]
        assert done.returncode == 0 and len(lines) == 1, done.stdout[-2000:] + done.stderr[-3000:]
        return json.loads(lines[0][len("result "):])

    theirs = program(str(tmp_path / "tf"), "--tf")
    ours = program(logdir)
    assert ours == theirs == [True, True, 2, True, True, 1, "Attempted to use a closed Session."]


WITH_PROGRAM = os.path.join(os.path.dirname(__file__), "programs", "tf1_with_session.py")


def _a_thread_reports_an_error_between_runs(tf, session, step_run, coord_of) -> dict:  # type: ignore[no-untyped-def]
    """A program's input or logging thread fails and reports it to the coordinator (``coord.stop_on_exception()``,
    as a queue runner does); the loop runs twice more before it leaves the block. What each run returned and
    what the block raised."""
    import threading

    def failing() -> None:
        with coord_of().stop_on_exception():
            raise RuntimeError("a thread wants to stop")

    seen: dict = {"runs": []}
    try:
        with session as sess:
            seen["runs"].append(step_run(sess))
            thread = threading.Thread(target=failing)
            thread.start()
            thread.join()
            seen["coord_should_stop"] = coord_of().should_stop()
            seen["runs"].append(step_run(sess))
            seen["runs"].append(step_run(sess))
    except RuntimeError as e:
        seen["raised"] = str(e)
    return seen


class _Coord:
    """A hook that keeps the coordinator the session hands its hooks (TF's public way to reach it)."""

    def __init__(self, hook_base) -> None:  # type: ignore[no-untyped-def]
        outer = self
        self.coord = None

        class Keep(hook_base):  # type: ignore[misc, valid-type]
            def after_create_session(self, session, coord):  # type: ignore[no-untyped-def]
                outer.coord = coord

        self.hook = Keep()


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["MonitoredSession", "SingularMonitoredSession"])
def test_a_threads_error_reported_to_the_coordinator_lets_the_next_runs_go_ahead_and_raises_at_the_blocks_end(kind):
    # before: procsv's run after the report raised a clean stop (no run went ahead) where TF's sessions run
    # it (TF's test_regular_exception_reported_to_coord_pass_through_run); the error leaves the block either way
    import tensorflow as tf

    from procsv import train

    seen = {}
    for name, module in (("tf", tf.compat.v1.train), ("procsv", train)):
        with tf.Graph().as_default():
            gs = tf.compat.v1.train.get_or_create_global_step()
            step = tf.compat.v1.assign_add(gs, 1)
            keep = _Coord(tf.compat.v1.train.SessionRunHook)
            seen[name] = _a_thread_reports_an_error_between_runs(
                tf, getattr(module, kind)(hooks=[keep.hook]), lambda sess: int(sess.run(step)), lambda: keep.coord)
    assert seen["tf"] == {"runs": [1, 2, 3], "coord_should_stop": True, "raised": "a thread wants to stop"}
    assert seen["procsv"] == seen["tf"]


@pytest.mark.slow
def test_an_eager_monitored_session_lets_the_next_runs_go_ahead_after_a_threads_error_and_raises_at_the_end():
    import tensorflow as tf

    from procsv import train

    w = tf.Variable(0.0)
    keep = _Coord(train.SessionRunHook)
    session = train.MonitoredSession(train.ChiefSessionCreator(scaffold=train.Scaffold(checkpoint={"w": w})),
                                     hooks=[keep.hook])
    seen = _a_thread_reports_an_error_between_runs(
        tf, session, lambda sess: (sess.run(lambda: w.assign_add(1.0)), float(w.numpy()))[1], lambda: keep.coord)
    assert seen == {"runs": [1.0, 2.0, 3.0], "coord_should_stop": True, "raised": "a thread wants to stop"}


def _a_loop_whose_loss_turns_nan(tf, module, hook_class, fail: bool, eager: bool,  # type: ignore[no-untyped-def]
                                 checkpoint_dir=None) -> dict:
    """TF's CIFAR-10 tutorial's pattern without a checkpoint_dir: a MonitoredTrainingSession with a
    NanTensorHook on the loss, ``while not sess.should_stop(): sess.run(train_op)``; the loss is NaN at the
    4th run. How many runs the loop made and what left it (the exception's class name and text)."""
    seen: dict = {"runs": 0}
    try:
        if eager:
            w = tf.Variable(1.0)
            x = {"value": 1.0}

            def step():  # type: ignore[no-untyped-def]
                w.assign_add(0.1 * x["value"])
                return w * x["value"]

            with module.MonitoredTrainingSession(hooks=[hook_class(None, fail_on_nan_loss=fail)],
                                                 checkpoint_dir=checkpoint_dir,
                                                 checkpoint={"w": w} if checkpoint_dir else None) as sess:
                while not sess.should_stop() and seen["runs"] < 6:
                    x["value"] = float("nan") if seen["runs"] == 3 else 1.0
                    sess.run(step)
                    seen["runs"] += 1
            return seen
        with tf.Graph().as_default():
            gs = tf.compat.v1.train.get_or_create_global_step()
            x = tf.compat.v1.placeholder(tf.float32, [])
            w = tf.compat.v1.get_variable("w", initializer=1.0)
            loss = w * x
            train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss, global_step=gs)
            with module.MonitoredTrainingSession(hooks=[hook_class(loss, fail_on_nan_loss=fail)],
                                                 checkpoint_dir=checkpoint_dir) as sess:
                while not sess.should_stop() and seen["runs"] < 6:
                    sess.run(train_op, feed_dict={x: float("nan") if seen["runs"] == 3 else 1.0})
                    seen["runs"] += 1
    except Exception as e:  # (a SystemExit such as procsv's exit 4 is no program's to catch: it fails the test)
        # (TF's class: a program swapped to procsv.train still catches tf.compat.v1.train.NanLossDuringTrainingError)
        seen["raised"] = (type(e).__name__, str(e), isinstance(e, tf.compat.v1.train.NanLossDuringTrainingError),
                          isinstance(e, module.NanLossDuringTrainingError))
    return seen


@pytest.mark.slow
@pytest.mark.parametrize("fail", [True, False], ids=["fail_on_nan_loss", "stop_on_nan_loss"])
def test_a_nan_tensor_hook_without_a_checkpoint_dir_raises_or_stops_at_the_nan_run_as_tensorflows(fail):
    # before: with nothing to roll back to (no checkpoint_dir) procsv still took the hook's tensor for its
    # --on-nonfinite rollback, never checked it, and the loop trained on through the NaN (6 runs, no error)
    import tensorflow as tf

    from procsv import train

    theirs = _a_loop_whose_loss_turns_nan(tf, tf.compat.v1.train, tf.compat.v1.train.NanTensorHook, fail, eager=False)
    ours = _a_loop_whose_loss_turns_nan(tf, train, train.NanTensorHook, fail, eager=False)
    eager = _a_loop_whose_loss_turns_nan(tf, train, train.NanTensorHook, fail, eager=True)
    expected = {"runs": 3, "raised": ("NanLossDuringTrainingError", "NaN loss during training.", True, True)} if fail \
        else {"runs": 4}  # False: the hook asks for a stop after the NaN run, and the loop ends cleanly
    assert theirs == expected
    assert ours == expected and eager == expected


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["graph", "eager"])
def test_a_nan_tensor_hook_that_stops_on_nan_stops_the_loop_cleanly_with_a_checkpoint_dir_and_commits_no_nan_state(
        tmp_path, mode):
    # before: under --on-nonfinite rollback (the default) procsv took the hook's tensor, the loop trained on
    # past the NaN, and the final checkpoint's refusal ended the process with exit code 4 (a SystemExit).
    # The program asked to stop cleanly on a NaN loss: the loop stops after the NaN run, as TF's; procsv
    # commits no checkpoint of that state (TF's final save would hold it)
    import tensorflow as tf

    from procsv import train
    from conftest import committed_steps

    expected = {"runs": 4}
    if mode == "graph":
        theirs = _a_loop_whose_loss_turns_nan(tf, tf.compat.v1.train, tf.compat.v1.train.NanTensorHook, False,
                                              eager=False, checkpoint_dir=str(tmp_path / "tf"))
        assert theirs == expected
    ours = str(tmp_path / "procsv")
    assert _a_loop_whose_loss_turns_nan(tf, train, train.NanTensorHook, False, eager=mode == "eager",
                                        checkpoint_dir=ours) == expected
    assert committed_steps(ours) == [0]  # the CheckpointSaverHook's save at the creation; none of step 4


def _a_loop_whose_loss_stays_nan(tf, module, eager: bool, checkpoint_dir: str) -> dict:  # type: ignore[no-untyped-def]
    """TF's CIFAR-10 tutorial's pattern with a checkpoint_dir, whose loss turns NaN at the 6th run and stays
    NaN (a diverged model: no rollback gets past it), the program catching TF's NanLossDuringTrainingError
    around its session block, as a program that reports the NaN and exits does. How many runs it made, what
    it caught (class name, text, TF's class, procsv's), and whether every committed checkpoint is finite.
    The eager loop ends at step 30 (as a StopAtStepHook's), which the rollback never reaches: it gives up
    first, whenever its checks come (with 30 runs, a loaded run's rollback once restored the in-memory
    snapshot of step 0 and the loop ended inside its replay, which ended the training there: no error
    raised); its step function reads its step itself (a replay at the loop's end runs it alone).
    The graph loop feeds NaN from its 6th run on: replayed too, so the give-up comes however it ends."""
    import numpy as np

    seen: dict = {"runs": 0}
    try:
        if eager:
            w = tf.Variable(1.0, name="w")
            x = {"value": 1.0}

            def step():  # type: ignore[no-untyped-def]
                x["value"] = float("nan") if int(module.get_global_step().numpy()) >= 5 else 1.0
                w.assign_add(0.1 * x["value"])
                return w * x["value"]

            with module.MonitoredTrainingSession(hooks=[module.NanTensorHook(None)], checkpoint_dir=checkpoint_dir,
                                                 checkpoint={"w": w}, save_checkpoint_steps=2,
                                                 log_step_count_steps=None) as sess:
                while not sess.should_stop() and int(module.get_global_step().numpy()) < 30:
                    sess.run(step)
                    seen["runs"] += 1
        else:
            with tf.Graph().as_default():
                gs = tf.compat.v1.train.get_or_create_global_step()
                x = tf.compat.v1.placeholder(tf.float32, [])
                w = tf.compat.v1.get_variable("w", initializer=1.0)
                loss = w * x
                train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss, global_step=gs)
                with module.MonitoredTrainingSession(hooks=[module.NanTensorHook(loss)], checkpoint_dir=checkpoint_dir,
                                                     save_checkpoint_steps=2, log_step_count_steps=None) as sess:
                    while not sess.should_stop() and seen["runs"] < 200:
                        sess.run(train_op, feed_dict={x: float("nan") if seen["runs"] >= 5 else 1.0})
                        seen["runs"] += 1
    except tf.compat.v1.train.NanLossDuringTrainingError as e:
        seen["caught"] = (type(e).__name__, str(e), isinstance(e, module.NanLossDuringTrainingError))
    state = tf.train.get_checkpoint_state(checkpoint_dir)
    paths = list(state.all_model_checkpoint_paths) if state is not None else []
    seen["finite"] = all(np.isfinite(tf.train.load_checkpoint(p).get_tensor(k)).all() for p in paths
                         for k in tf.train.load_checkpoint(p).get_variable_to_shape_map() if k.startswith("w"))
    return seen


@pytest.mark.slow
def test_a_nan_tensor_hook_whose_nan_the_rollback_gives_up_raises_tensorflows_catchable_error(tmp_path, capfd):
    # before: with a checkpoint_dir, procsv's --on-nonfinite rollback took the hook's tensor and, where it gave
    # the NaN up (here --max-skips 3 exceeded in graph mode, the final checkpoint's state in eager mode), ended
    # the process with exit code 4 through a SystemExit that no `except` of the program saw. The program
    # chose NanTensorHook(fail_on_nan_loss=True): its run (or its block's end) raises TF's catchable
    # NanLossDuringTrainingError, as TF's hook at the NaN run; no checkpoint of the NaN state is committed
    # (TF's own CheckpointSaverHook commits step 6's NaN weights)
    import tensorflow as tf

    from procsv import train

    theirs = _a_loop_whose_loss_stays_nan(tf, tf.compat.v1.train, eager=False, checkpoint_dir=str(tmp_path / "tf"))
    assert theirs == {"runs": 5, "caught": ("NanLossDuringTrainingError", "NaN loss during training.", True),
                      "finite": False}
    for mode in ("graph", "eager"):
        ours = _a_loop_whose_loss_stays_nan(tf, train, eager=mode == "eager", checkpoint_dir=str(tmp_path / mode))
        assert ours["caught"] == theirs["caught"] and ours["finite"] is True, (mode, ours)
        assert ours["runs"] >= 5, (mode, ours)  # procsv finds the NaN at a check of the kept losses, not at once
        said = capfd.readouterr().err
        assert "rollback gives up" in said and "NanTensorHook(fail_on_nan_loss=True) raises NanLossDuringTrainingError" \
            in said and "non-finite training at step " in said, (mode, said)
