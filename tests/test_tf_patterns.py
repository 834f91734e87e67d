"""TF1 patterns that TensorFlow's own Supervisor tests use, run on procsv's Supervisor in a graph program.

Runs in the test's process (a graph program inside ``tf.Graph().as_default()``); a plain-python
Supervisor with a logdir starts its two services as child processes (real ZeroMQ), and what it
committed is read back with TensorFlow's own readers.

* ``sess.close()`` then ``sv.stop()`` (TF's documented order, ``supervisor_test.testBasics``): the
  stop does not raise, and the final checkpoint holds the state the session had when it closed.
* ``Supervisor(logdir='')`` is TF's "no logdir" (``if logdir:``): nothing is written anywhere, and
  ``summary_computed`` raises TF's "requires a summary writer".
* a worker's Supervisor (``is_chief=False``) refuses a ref variable without a device, TF's
  ``ValueError`` (``testSetupFail``);
* the Saver ``import_meta_graph`` returns (a SaverDef's, with no variable list) restores and saves
  the graph's variables (``testRestoreFromMetaGraph``).
* TensorFlow's PTB tutorial ends with ``sv.saver.save(session, FLAGS.save_path, global_step=sv.global_step)``
  where ``FLAGS.save_path`` is the Supervisor's logdir: TF writes ``<save_path>-<step>`` beside it, with
  the state file of that folder; so does procsv (it refused any path but ``sv.save_path``), and commits
  the run's checkpoint of the step too.
* a replica program (``mnist_replica``'s ``Supervisor(is_chief=task_index == 0, ...)``) reads its
  Supervisor's ``save_path``, ``save_model_secs``, ``save_summaries_secs`` and ``summary_writer``: the
  chief's are TF's, a worker's are None as TF's non-chief's, and its ``summary_computed`` raises TF's
  "requires a summary writer" (compared with TF's own Supervisor in graph mode; an eager worker too).
* ``Supervisor(global_step=None)`` in a graph that has a global step: ``sv.global_step`` is None, as
  TF's (left out, it is the graph's), and the program trains as under TF's; in an eager program too:
  procsv counts the runs, saves ``model.ckpt`` (TF's name without a step) and a rerun resumes the count.
"""

from __future__ import annotations

import os

import pytest

pytestmark = pytest.mark.slow


def test_a_graph_session_closed_before_stop_keeps_its_last_state_and_the_stop_raises_nothing(logdir):
    import tensorflow as tf

    import procsv

    with tf.Graph().as_default():
        v = tf.compat.v1.Variable(0, dtype=tf.int64, name="v")
        step = tf.compat.v1.train.get_or_create_global_step()
        train = tf.group(v.assign_add(3), step.assign_add(1))
        sv = procsv.Supervisor(logdir=logdir, save_model_secs=None, save_summaries_secs=None)
        sess = sv.prepare_or_wait_for_session("")
        for _ in range(10):
            sess.run(train)
        sess.close()
        sv.stop()  # raised RuntimeError('Attempted to use a closed Session.') from its final checkpoint

    latest = tf.train.latest_checkpoint(logdir)
    assert latest is not None and latest.endswith("model.ckpt-10"), latest
    reader = tf.train.load_checkpoint(latest)
    assert int(reader.get_tensor("v")) == 30 and int(reader.get_tensor("global_step")) == 10


def test_an_empty_logdir_is_no_logdir_nothing_is_written_and_summaries_need_a_writer(tmp_path, monkeypatch):
    import tensorflow as tf

    import procsv

    monkeypatch.chdir(tmp_path)
    with tf.Graph().as_default():
        v = tf.compat.v1.Variable(1.0, name="v")
        tf.compat.v1.summary.scalar("v", v)
        summ = tf.compat.v1.summary.merge_all()
        add = v.assign_add(1.0)
        sv = procsv.Supervisor(logdir="")
        assert sv.logdir is None and sv.save_path is None and sv.saver is None and sv.summary_writer is None
        sess = sv.prepare_or_wait_for_session("")
        with pytest.raises(RuntimeError, match="requires a summary writer"):
            sv.summary_computed(sess, sess.run(summ))
        sess.run(add)
        sess.close()
        sv.stop()
    assert os.listdir(tmp_path) == []  # no checkpoint, event file, lock or runtime folder in the current directory


def test_a_worker_supervisor_refuses_unplaced_variables_as_tf_and_takes_placed_ones(logdir):
    import tensorflow as tf

    import procsv

    with tf.Graph().as_default():
        tf.compat.v1.Variable([1.0, 2.0], name="v", use_resource=False)  # a ref variable: TF's check is on those
        with pytest.raises(ValueError, match="must have their device set"):
            procsv.Supervisor(logdir=logdir, is_chief=False)
    with tf.Graph().as_default(), tf.compat.v1.device("/job:ps"):
        tf.compat.v1.Variable([1.0, 2.0], name="v", use_resource=False)
        assert procsv.Supervisor(logdir=logdir, is_chief=False).is_chief is False


def test_the_saver_import_meta_graph_returns_restores_and_saves_the_graphs_variables(logdir):
    import tensorflow as tf

    import procsv

    with tf.Graph().as_default():
        v = tf.compat.v1.Variable(5, dtype=tf.int64, name="v0", use_resource=False)  # "v0:0" is its value
        step = tf.compat.v1.train.get_or_create_global_step()
        train = tf.group(v.assign_add(2), step.assign_add(1))
        sv = procsv.Supervisor(logdir=logdir, save_model_secs=None, save_summaries_secs=None)
        sess = sv.prepare_or_wait_for_session("")
        for _ in range(3):
            sess.run(train)
        prefix = sv.saver.save(sess, sv.save_path)
        sv.stop()
    assert prefix.endswith("model.ckpt-3") and os.path.exists(prefix + ".meta")

    with tf.Graph().as_default():
        saver = tf.compat.v1.train.import_meta_graph(prefix + ".meta")  # a Saver of a SaverDef: no var_list
        sv = procsv.Supervisor(logdir=logdir, saver=saver, save_model_secs=None, save_summaries_secs=None)
        sess = sv.prepare_or_wait_for_session("")
        assert sess.run("v0:0") == 11 and sv.restored_from is not None  # crashed: 'NoneType' is not iterable
        train = tf.compat.v1.get_default_graph().get_operation_by_name(train.name)
        sess.run(train)
        again = sv.saver.save(sess, sv.save_path)
        sv.stop()
    assert again.endswith("model.ckpt-4")
    assert int(tf.train.load_checkpoint(again).get_tensor("v0")) == 13


def _ptb_pattern(supervisor: type, save_path: str) -> str:
    """The PTB tutorial's shape: the Supervisor's logdir is FLAGS.save_path, a few steps, then a save there."""
    import tensorflow as tf

    with tf.Graph().as_default():
        w = tf.compat.v1.Variable(1.0, name="w")
        gs = tf.compat.v1.train.get_or_create_global_step()
        train = tf.group(w.assign(w * 0.5 + 0.25), gs.assign_add(1))
        sv = supervisor(logdir=save_path, save_model_secs=0, save_summaries_secs=0)
        with sv.managed_session() as session:
            for _ in range(3):
                session.run(train)
            return str(sv.saver.save(session, save_path, global_step=sv.global_step))


def test_the_ptb_tutorials_save_to_its_own_save_path_writes_what_tensorflows_writes(tmp_path):
    import tensorflow as tf

    import procsv
    from conftest import committed_steps

    theirs = _ptb_pattern(tf.compat.v1.train.Supervisor, str(tmp_path / "tf" / "ptb"))
    ours = _ptb_pattern(procsv.Supervisor, str(tmp_path / "procsv" / "ptb"))  # raised UsageError "pass sv.save_path"
    assert os.path.relpath(theirs, tmp_path / "tf") == os.path.relpath(ours, tmp_path / "procsv") == "ptb-3"
    for prefix, folder in ((theirs, tmp_path / "tf"), (ours, tmp_path / "procsv")):
        assert tf.train.latest_checkpoint(str(folder)) == prefix and os.path.exists(prefix + ".meta")
        reader = tf.train.load_checkpoint(prefix)
        assert (float(reader.get_tensor("w")), int(reader.get_tensor("global_step"))) == (0.5625, 3)
    assert committed_steps(str(tmp_path / "procsv" / "ptb"))[-1] == 3  # the run keeps the step too


def test_a_save_to_a_path_of_the_programs_own_in_the_logdir_leaves_the_logdirs_state_file_to_the_service(logdir):
    import tensorflow as tf

    import procsv

    with tf.Graph().as_default():
        w = tf.compat.v1.Variable(2.0, name="w")
        gs = tf.compat.v1.train.get_or_create_global_step()
        train = tf.group(w.assign_add(1.0), gs.assign_add(1))
        sv = procsv.Supervisor(logdir=logdir, save_model_secs=0, save_summaries_secs=0)
        with sv.managed_session() as sess:
            sess.run(train)
            sess.run(train)
            mine = sv.saver.save(sess, os.path.join(logdir, "mine"), global_step=7)  # TF names it as told
    assert mine == os.path.join(logdir, "mine-7") and float(tf.train.load_checkpoint(mine).get_tensor("w")) == 4.0
    assert tf.train.latest_checkpoint(logdir) == os.path.join(os.path.abspath(logdir), "model.ckpt-2")


def _what_a_replica_program_sees(sv, sess) -> dict:  # type: ignore[no-untyped-def]
    """What TF's between-graph replica programs (``mnist_replica``'s pattern) read of their Supervisor:
    where the chief saves, its intervals, whether there is a writer (workers skip their summaries by
    it), and what ``summary_computed`` does on this task."""
    seen = {"save_path": sv.save_path, "save_model_secs": sv.save_model_secs,
            "save_summaries_secs": sv.save_summaries_secs, "writer": sv.summary_writer is not None}
    try:
        sv.summary_computed(sess, b"", global_step=0)
        seen["summary_computed"] = "written"
    except RuntimeError as e:
        seen["summary_computed"] = str(e).split(" (")[0]  # TF's sentence (procsv may say why after it)
    return seen


@pytest.mark.parametrize("is_chief", [True, False], ids=["chief", "worker"])
def test_a_replicas_supervisor_has_tensorflows_save_path_intervals_and_writer_on_the_chief_and_none_on_a_worker(
        tmp_path, is_chief):
    # before: a worker's procsv.Supervisor said <logdir>/model.ckpt, 600, 120 and had a writer that took
    # summary_computed silently, where TF's non-chief has None for all four and raises
    import tensorflow as tf

    import procsv

    seen = {}
    for name, supervisor in (("tf", tf.compat.v1.train.Supervisor), ("procsv", procsv.Supervisor)):
        logdir = str(tmp_path / name)
        with tf.Graph().as_default(), tf.compat.v1.device("/job:ps"):  # a replica's variables are placed
            tf.compat.v1.train.get_or_create_global_step()
            sv = supervisor(logdir=logdir, is_chief=is_chief, save_model_secs=30, save_summaries_secs=7)
            seen[name] = _what_a_replica_program_sees(sv, None)
            seen[name]["save_path"] = seen[name]["save_path"] and os.path.relpath(seen[name]["save_path"], logdir)
            if sv.summary_writer is not None:
                sv.summary_writer.close()
    assert seen["procsv"] == seen["tf"]
    if is_chief:
        assert seen["tf"] == {"save_path": "model.ckpt", "save_model_secs": 30, "save_summaries_secs": 7,
                              "writer": True, "summary_computed": "written"}
    else:
        assert seen["tf"] == {"save_path": None, "save_model_secs": None, "save_summaries_secs": None,
                              "writer": False, "summary_computed": "Writing a summary requires a summary writer."}


def test_an_eager_workers_supervisor_has_no_save_path_intervals_or_writer_as_tensorflows_non_chief(tmp_path):
    import tensorflow as tf

    import procsv

    sv = procsv.Supervisor(logdir=str(tmp_path), is_chief=False, checkpoint={"w": tf.Variable(1.0)},
                           save_model_secs=30, save_summaries_secs=7)
    assert _what_a_replica_program_sees(sv, None) == {
        "save_path": None, "save_model_secs": None, "save_summaries_secs": None, "writer": False,
        "summary_computed": "Writing a summary requires a summary writer."}


def test_global_step_none_in_a_graph_that_has_one_gives_none_as_tensorflows_and_training_goes_on():
    # before: procsv's Supervisor took global_step=None for "not given" and handed out the graph's
    # global step; TF's None means "no global step" (USE_DEFAULT is the graph's)
    import tensorflow as tf

    import procsv

    seen = {}
    for name, supervisor in (("tf", tf.compat.v1.train.Supervisor), ("procsv", procsv.Supervisor)):
        with tf.Graph().as_default():
            step = tf.compat.v1.train.get_or_create_global_step()
            v = tf.compat.v1.Variable(0.0, name="v")
            train = tf.group(v.assign_add(1.0), step.assign_add(1))
            sv = supervisor(logdir=None, global_step=None, summary_op=None)
            default = supervisor(logdir=None, graph=tf.compat.v1.get_default_graph(), summary_op=None) \
                if name == "procsv" else None  # (TF's would finalize the graph twice: fine, but not needed)
            sess = sv.prepare_or_wait_for_session("")
            for _ in range(3):
                sess.run(train)
            seen[name] = {"global_step": getattr(sv.global_step, "name", sv.global_step), "v": float(sess.run(v)),
                          "step": int(sess.run(step))}
            if default is not None:
                seen["default"] = default.global_step is step
            sess.close()
            sv.stop()
    assert seen["tf"] == {"global_step": None, "v": 3.0, "step": 3}
    assert seen["procsv"] == seen["tf"]
    assert seen["default"] is True  # left out (USE_DEFAULT): the graph's, as TF's


def test_global_step_none_in_an_eager_program_is_no_step_counted_by_procsv_saved_unnumbered_and_resumed(logdir):
    # before: an eager Supervisor took global_step=None for "not given": it created a step variable, handed it
    # out as sv.global_step and saved it in model.ckpt-N. As in graph mode (the test above), None is TF's
    # "no global step": sv.global_step is None, procsv counts the runs, the checkpoint is TF's name without a
    # step (model.ckpt) holding the program's state only, and a rerun resumes the count from its manifest
    import tensorflow as tf

    import procsv

    seen = []
    for _ in range(2):  # the program, then its rerun in the same logdir
        w = tf.Variable(0.0, name="w")
        sv = procsv.Supervisor(logdir=logdir, checkpoint={"w": w}, global_step=None, save_summaries_secs=None)
        assert sv.global_step is None
        with sv.managed_session() as sess:
            began = (sv.step, float(w.numpy()))
            for _ in range(3):
                sess.run(lambda: w.assign_add(1.0))
        seen.append({"began": began, "ended": (sv.step, float(w.numpy())), "global_step": sv.global_step})
    assert seen == [{"began": (0, 0.0), "ended": (3, 3.0), "global_step": None},
                    {"began": (3, 3.0), "ended": (6, 6.0), "global_step": None}]
    assert tf.train.latest_checkpoint(logdir) == os.path.join(logdir, "model.ckpt")
    assert sorted(f for f in os.listdir(logdir) if f.startswith("model.ckpt")) == [
        "model.ckpt.data-00000-of-00002", "model.ckpt.data-00001-of-00002", "model.ckpt.index"]
    stored = tf.train.load_checkpoint(os.path.join(logdir, "model.ckpt"))
    assert float(stored.get_tensor("w/.ATTRIBUTES/VARIABLE_VALUE")) == 6.0
    assert not [k for k in stored.get_variable_to_shape_map() if "global_step" in k]
    left_out = procsv.Supervisor(logdir=None, checkpoint={"w": tf.Variable(0.0)})  # USE_DEFAULT: the created one
    assert isinstance(left_out.global_step, tf.Variable) and left_out.global_step.dtype == tf.int64
