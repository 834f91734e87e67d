"""The hooked run of graph sessions (procsv/trainer/monitored/graph_hooked.py) and the standard
hooks' graph-mode meaning, against a raw ``tf.compat.v1.Session``, compared with what TensorFlow's
own ``MonitoredSession`` gives for the same hooks.

Every graph is built in a ``with tf.Graph().as_default()`` block (eager execution stays on in the
pytest process); no Supervisor and no service is involved.
"""

from __future__ import annotations

import glob
import json
import logging
import os

import numpy as np
import pytest

pytestmark = pytest.mark.usefixtures("fresh_train_api")


def _model(tf):
    """A small deterministic graph: w, b, momentum slots, global step; the batch is sliced from
    constants by the global step (the input is a function of the step)."""
    rng = np.random.RandomState(0)
    xs = tf.constant(rng.randn(40, 3).astype(np.float32))
    ys = tf.constant(rng.randn(40, 1).astype(np.float32))
    gs = tf.compat.v1.train.get_or_create_global_step()
    start = tf.cast(tf.math.floormod(gs, 8) * 5, tf.int32)
    x, y = xs[start:start + 5], ys[start:start + 5]
    w = tf.compat.v1.get_variable("w", initializer=tf.constant(rng.randn(3, 1).astype(np.float32)))
    b = tf.compat.v1.get_variable("b", initializer=tf.zeros([1]))
    scale = tf.compat.v1.placeholder_with_default(tf.constant(1.0), [], name="scale")
    loss = tf.reduce_mean(tf.square(tf.matmul(x, w) + b - y)) * scale
    train_op = tf.compat.v1.train.MomentumOptimizer(0.05, 0.9).minimize(loss, global_step=gs)
    tf.compat.v1.summary.scalar("loss", loss)
    return {"gs": gs, "loss": loss, "train_op": train_op, "scale": scale, "w": w}


def _values(tf, sess):
    return {v.op.name: sess.run(v) for v in tf.compat.v1.global_variables()}


def _drive(tf, hooks, m, feed=None, max_runs=100):
    """What a MonitoredSession does around procsv's hooked run, on a raw session."""
    from procsv.trainer.coordinator import Coordinator
    from procsv.trainer.monitored.graph_hooked import GraphHookedSession

    for h in hooks:
        h.begin()
    sess = tf.compat.v1.Session()
    sess.run(tf.compat.v1.global_variables_initializer())
    coord = Coordinator()
    for h in hooks:
        h.after_create_session(sess, coord)
    hooked = GraphHookedSession(sess, hooks)
    losses = []
    runs = 0
    while not hooked.should_stop() and not coord.should_stop() and runs < max_runs:
        losses.append(hooked.run([m["train_op"], m["loss"]], feed_dict=feed)[1])
        runs += 1
    for h in hooks:
        h.end(sess)
    values = _values(tf, sess)
    sess.close()
    return losses, values


def _tf_drive(tf, hooks, feed=None, max_runs=100):
    """TensorFlow's own MonitoredSession with ``hooks`` (the reference)."""
    m = _model(tf)
    losses = []
    with tf.compat.v1.train.MonitoredSession(hooks=hooks(m)) as sess:
        runs = 0
        while not sess.should_stop() and runs < max_runs:
            losses.append(sess.run([m["train_op"], m["loss"]], feed_dict=feed)[1])
            runs += 1
        raw = sess._tf_sess()
        values = _values(tf, raw)
    return losses, values


class _Recorder:
    """Records what a hook of either API sees; ``base`` is TensorFlow's or procsv's SessionRunHook."""

    @staticmethod
    def make(base, log, extra_fetch=None, feed=None, options=None):
        class Recorder(base):
            def before_run(self, run_context):
                log.append(("before_run", run_context.original_args.feed_dict is not None))
                fetches = {"gs": extra_fetch} if extra_fetch is not None else None
                from tensorflow.compat.v1.train import SessionRunArgs

                return SessionRunArgs(fetches, feed_dict=feed, options=options)

            def after_run(self, run_context, run_values):
                results = None if run_values.results is None else {k: int(v) for k, v in run_values.results.items()}
                log.append(("after_run", results, run_values.options.trace_level,
                            len(run_values.run_metadata.step_stats.dev_stats) > 0))

        return Recorder()


def test_hooks_get_their_own_fetches_and_the_merged_options_as_in_tensorflows_monitored_session():
    import tensorflow as tf

    from procsv import train

    full = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
    logs = {}
    for api_name in ("tf", "procsv"):
        with tf.Graph().as_default():
            log = logs[api_name] = []
            base = tf.compat.v1.train.SessionRunHook if api_name == "tf" else train.SessionRunHook

            def hooks(m):
                scale_fed = {m["scale"]: 2.0}
                return [_Recorder.make(base, log, extra_fetch=m["scale"]),
                        _Recorder.make(base, log, feed=scale_fed, options=full),
                        _Recorder.make(base, log)]

            if api_name == "tf":
                losses, values = _tf_drive(tf, hooks, max_runs=3)
            else:
                m = _model(tf)
                losses, values = _drive(tf, hooks(m), m, max_runs=3)
            logs[api_name + "_result"] = (losses, values)
    assert logs["procsv"] == logs["tf"]
    # the first hook saw its fetch (the second hook's feed: 2), the third nothing; every hook saw
    # the second hook's FULL_TRACE and the step stats it produced
    assert [e for e in logs["procsv"] if e[0] == "after_run"][:3] == [
        ("after_run", {"gs": 2}, 3, True), ("after_run", None, 3, True), ("after_run", None, 3, True)]
    tf_losses, tf_values = logs["tf_result"]
    losses, values = logs["procsv_result"]
    assert losses == tf_losses  # the hook's feed (scale = 2) reached the run in both
    assert values.keys() == tf_values.keys() and all(np.array_equal(values[k], tf_values[k]) for k in values)


def test_feeds_that_conflict_are_an_error_and_the_callers_options_are_not_changed():
    import tensorflow as tf

    from procsv import train
    from procsv.trainer.monitored.graph_hooked import GraphHookedSession

    with tf.Graph().as_default():
        m = _model(tf)
        feed = {m["scale"]: 3.0}
        mine = tf.compat.v1.RunOptions(timeout_in_ms=5)
        log = []
        wide = tf.compat.v1.RunOptions(timeout_in_ms=60000, report_tensor_allocations_upon_oom=True)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            both = GraphHookedSession(sess, [_Recorder.make(train.SessionRunHook, log, feed=feed),
                                             _Recorder.make(train.SessionRunHook, log, feed=feed)])
            with pytest.raises(RuntimeError, match="Same tensor is fed by two hooks"):
                both.run(m["loss"])
            one = GraphHookedSession(sess, [_Recorder.make(train.SessionRunHook, log, feed=feed, options=wide)])
            with pytest.raises(RuntimeError, match="Same tensor is fed by a SessionRunHook and user"):
                one.run(m["loss"], feed_dict={m["scale"]: 1.0})

            seen = []

            class Options(train.SessionRunHook):
                def before_run(self, run_context):
                    return train.SessionRunArgs(None, options=wide)

                def after_run(self, run_context, run_values):
                    seen.append(run_values.options)

            assert GraphHookedSession(sess, [Options()]).run(m["loss"], feed_dict=feed, options=mine) == \
                pytest.approx(3 * sess.run(m["loss"]))
            assert seen[0].timeout_in_ms == 60000 and seen[0].report_tensor_allocations_upon_oom
            assert mine.timeout_in_ms == 5 and not mine.report_tensor_allocations_upon_oom


def test_a_stop_requested_by_a_hook_ends_the_runs():
    import tensorflow as tf

    from procsv import train
    from procsv.trainer.monitored.graph_hooked import GraphHookedSession

    class StopAfterTwo(tf.compat.v1.train.SessionRunHook):  # TensorFlow's own base class
        def __init__(self):
            self.runs = 0

        def after_run(self, run_context, run_values):
            self.runs += 1
            if self.runs == 2:
                run_context.request_stop()

    with tf.Graph().as_default():
        m = _model(tf)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            hooked = GraphHookedSession(sess, [StopAfterTwo(), train.SessionRunHook()])
            hooked.run(m["train_op"])
            assert not hooked.should_stop()
            hooked.run(m["train_op"])
            assert hooked.should_stop()
            with pytest.raises(RuntimeError, match="Run called even after should_stop requested"):
                hooked.run(m["train_op"])
            assert sess.run(m["gs"]) == 2


def _standard_hooks(train_api, m, outdir, final_ops):
    """The same standard hooks from either API (``train_api``: ``tf.compat.v1.train`` or ``procsv.train``)."""
    return [
        train_api.StopAtStepHook(last_step=12),
        train_api.NanTensorHook(m["loss"]),
        train_api.LoggingTensorHook({"loss": m["loss"], "step": "global_step:0"}, every_n_iter=5),
        train_api.StepCounterHook(every_n_steps=4, output_dir=outdir),
        train_api.SummarySaverHook(save_steps=5, output_dir=outdir, summary_op=tf_merged()),
        train_api.FeedFnHook(lambda: {m["scale"]: 0.5}),
        train_api.GlobalStepWaiterHook(wait_until_step=0),
        train_api.ProfilerHook(save_steps=5, output_dir=outdir),
        final_ops,
    ]


def tf_merged():
    import tensorflow as tf

    return tf.compat.v1.summary.merge_all()


def _summary_steps(outdir, tag):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(outdir)
    acc.Reload()
    return [e.step for e in acc.Scalars(tag)] if tag in acc.Tags()["scalars"] else []


def test_standard_hooks_in_graph_mode_do_what_tensorflows_own_do(tmp_path, caplog):
    import tensorflow as tf

    from procsv import train

    results = {}
    for api_name, train_api in (("tf", tf.compat.v1.train), ("procsv", train)):
        outdir = str(tmp_path / api_name)
        with tf.Graph().as_default():
            final = {}

            def hooks(m):
                final["hook"] = train_api.FinalOpsHook({"w": m["w"], "gs": m["gs"]})
                return _standard_hooks(train_api, m, outdir, final["hook"])

            caplog.clear()
            with caplog.at_level(logging.INFO):
                if api_name == "tf":
                    losses, values = _tf_drive(tf, hooks)
                else:
                    m = _model(tf)
                    losses, values = _drive(tf, hooks(m), m)
            logged = [r.getMessage() for r in caplog.records if "loss = " in r.getMessage()]
            tf.compat.v1.summary.FileWriterCache.clear()
            results[api_name] = {
                "losses": losses, "values": values, "final": final["hook"].final_ops_values,
                "logged_lines": len(logged),
                "loss_summaries": _summary_steps(outdir, "loss"),
                "rate_summaries": _summary_steps(outdir, "global_step/sec"),
                "timelines": sorted(os.path.basename(p) for p in glob.glob(os.path.join(outdir, "timeline-*.json"))),
            }
    tf_r, mine = results["tf"], results["procsv"]
    assert len(mine["losses"]) == len(tf_r["losses"]) == 12  # StopAtStepHook(last_step=12)
    assert mine["losses"] == tf_r["losses"]  # FeedFnHook's scale reached every run
    assert all(np.array_equal(mine["values"][k], tf_r["values"][k]) for k in tf_r["values"])
    assert np.array_equal(mine["final"]["w"], tf_r["final"]["w"]) and mine["final"]["gs"] == tf_r["final"]["gs"] == 12
    assert mine["logged_lines"] == tf_r["logged_lines"] == 3  # runs 0, 5, 10
    # SummarySaverHook, StepCounterHook and ProfilerHook count from the global step fetched in the
    # run, which may be read before or after the run's increment (TF's own too): the first summary
    # is at step 1, then every save_steps, or one step sooner after a read that saw the increment
    for r in (tf_r, mine):
        assert r["loss_summaries"][0] == 1 and _gaps(r["loss_summaries"]) <= {4, 5}
        assert r["rate_summaries"] and _gaps([1] + r["rate_summaries"]) <= {3, 4}
        traced = [int(name[len("timeline-"):-len(".json")]) for name in r["timelines"]]
        assert len(traced) >= 2 and _gaps(sorted(traced)) <= {4, 5}
    with open(os.path.join(str(tmp_path / "procsv"), mine["timelines"][0])) as fh:
        assert json.load(fh)["traceEvents"]


def _gaps(steps):
    return {b - a for a, b in zip(steps, steps[1:])}


def test_nan_tensor_hook_in_graph_mode_fails_or_stops():
    import tensorflow as tf

    from procsv import train

    with tf.Graph().as_default():
        m = _model(tf)
        nan = {m["scale"]: float("nan")}
        with pytest.raises(train.NanLossDuringTrainingError):
            _drive(tf, [train.NanTensorHook(m["loss"])], m, feed=nan)
    with tf.Graph().as_default():
        m = _model(tf)
        nan = {m["scale"]: float("nan")}
        losses, values = _drive(tf, [train.NanTensorHook(m["loss"], fail_on_nan_loss=False)], m, feed=nan)
        assert len(losses) == 1 and np.isnan(losses[0])


def test_logging_tensor_hook_refuses_tensor_names_only_in_eager_mode():
    import tensorflow as tf

    from procsv import train

    with pytest.raises(ValueError, match="tensor names"):
        train.LoggingTensorHook(["loss:0"], every_n_iter=1)
    with tf.Graph().as_default():
        m = _model(tf)
        name = m["loss"].name[:-2]  # an op name: its only output
        hook = train.LoggingTensorHook([name], at_end=True, formatter=lambda v: f"at end {v}")
        hook.begin()
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(m["train_op"])
            assert sess.run(hook._fetches) == {name: sess.run(m["loss"])}


def test_final_ops_feed_dict_and_logging_at_end_with_a_formatter_in_graph_mode(caplog):
    import tensorflow as tf

    from procsv import train

    with tf.Graph().as_default():
        m = _model(tf)
        plain = train.FinalOpsHook(m["loss"])
        final = train.FinalOpsHook(m["loss"], final_ops_feed_dict={m["scale"]: 2.0})
        logging_hook = train.LoggingTensorHook({"loss": m["loss"]}, at_end=True,
                                               formatter=lambda values: f"final loss {values['loss']:.6f}")
        with caplog.at_level(logging.INFO):
            losses, values = _drive(tf, [train.StopAtStepHook(last_step=3), plain, final, logging_hook], m)
    loss = plain.final_ops_values  # the final variables' loss (scale 1)
    assert len(losses) == 3 and loss > 0
    assert final.final_ops_values == pytest.approx(2 * loss)  # run with final_ops_feed_dict
    assert [r.getMessage() for r in caplog.records if r.getMessage().startswith("final loss")] == [
        f"final loss {loss:.6f}"]


@pytest.mark.slow
def test_global_step_waiter_hook_in_graph_mode_starts_at_its_step_and_waits_for_another_writer():
    """Graph mode, as TF: the graph's global step at wait_until_step (4, as restored) starts at
    once; below it (3 < 5) the first run waits, reading the step every 0.5 s, until another writer
    (here a thread, as another worker's runs under a parameter server) brings it to 5, and only then
    runs the train op."""
    import threading
    import time

    import tensorflow as tf

    from procsv import train
    from procsv.trainer.coordinator import Coordinator
    from procsv.trainer.monitored.graph_hooked import GraphHookedSession

    for wait, start in ((4, 4), (5, 3)):
        with tf.Graph().as_default():
            m = _model(tf)
            to_wait = m["gs"].assign(wait)
            hook = train.GlobalStepWaiterHook(wait_until_step=wait)
            hook.begin()
            sess = tf.compat.v1.Session()
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(m["gs"].assign(start))
            hook.after_create_session(sess, Coordinator())
            hooked = GraphHookedSession(sess, [hook])
            if wait <= start:
                hooked.run(m["train_op"])
                hooked.run(m["train_op"])
                assert sess.run(m["gs"]) == start + 2
            else:
                writer = threading.Timer(1.0, lambda: sess.run(to_wait))
                writer.start()
                t0 = time.monotonic()
                hooked.run(m["train_op"])  # waits for step 5, then runs once
                waited = time.monotonic() - t0
                writer.join()
                assert waited >= 0.9 and sess.run(m["gs"]) == wait + 1
            sess.close()
