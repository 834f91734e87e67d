"""Graph-mode cases: ``python tf1_cases.py CASE LOGDIR [--tf]`` prints ``result <json>``;
``python tf1_cases.py CASE1,CASE2,... BASE [--tf]`` runs each case in turn in this one process (each
in its own graph, with ``BASE/CASE`` as its logdir) and prints ``result CASE <json>`` for each (a
case that raised: ``{"raised": "<type>: <message>"}``), saving a TensorFlow import per case.

Each case builds a small graph and runs a graph-mode ``procsv.Supervisor`` (``--tf``: TensorFlow's
own classes instead, where the case compares with them), and prints what it observed: what ran
at the start, what the session returned, what raised.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

tf.compat.v1.disable_eager_execution()
CASE, LOGDIR = sys.argv[1], sys.argv[2]
USE_TF = "--tf" in sys.argv
if USE_TF:
    Supervisor, SessionManager = tf.compat.v1.train.Supervisor, tf.compat.v1.train.SessionManager
else:
    import procsv
    from procsv.train import SessionManager

    Supervisor = procsv.Supervisor
log: list[str] = []


def model() -> tuple[object, object, object]:
    """A counter model: ``v`` (from ``init_feed_dict``'s placeholder), a local variable, a train op."""
    start = tf.compat.v1.placeholder_with_default(1.0, [], name="start")
    v = tf.compat.v1.get_variable("v", initializer=start)
    local = tf.compat.v1.get_variable("local", initializer=0.0, collections=[tf.compat.v1.GraphKeys.LOCAL_VARIABLES])
    gs = tf.compat.v1.train.get_or_create_global_step()
    train = tf.group(v.assign_add(1.0), gs.assign_add(1))
    return start, v, (local, train, gs)


def run_session(**kwargs: object) -> dict[str, object]:
    """A Supervisor of the case's graph; one managed session: 3 training runs; what was seen."""
    start, v, (local, train, gs) = model()
    sv = Supervisor(logdir=LOGDIR, save_summaries_secs=None, **kwargs)
    try:
        with sv.managed_session() as sess:
            seen = {"v": float(sess.run(v)), "local": float(sess.run(local))}
            for _ in range(3):
                sess.run(train)
            seen.update(v_end=float(sess.run(v)), step=int(sess.run(gs)))
    except RuntimeError as exc:
        return {"error": str(exc).split(".")[0]}
    return seen


def case_defaults() -> dict[str, object]:
    """init_op (fed by init_feed_dict), init_fn and local_init_op on a fresh start; graph= passed."""
    with tf.Graph().as_default() as graph:
        start, v, (local, train, gs) = model()
        init_local = tf.group(local.initializer)
        with tf.control_dependencies([init_local]):
            init_local = tf.group(local.assign_add(5.0))

        def init_fn(sess: object) -> None:
            log.append(f"init_fn v={float(sess.run(v))}")  # type: ignore[attr-defined]

        sv = Supervisor(logdir=LOGDIR, save_summaries_secs=None, init_feed_dict={start: 10.0},
                        local_init_op=init_local, init_fn=init_fn, graph=graph)
        with sv.managed_session() as sess:
            seen = {"v": float(sess.run(v)), "local": float(sess.run(local)),
                    "session_graph": sess.graph is graph, "global_step": sv.global_step is gs,
                    "init_feed_dict": sv.init_feed_dict == {start: 10.0}, "finalized": graph.finalized,
                    "tf_session": isinstance(sess, tf.compat.v1.Session)}
            for _ in range(3):
                sess.run(train)
            seen.update(v_end=float(sess.run(v)), step=int(sess.run(gs)))
    return dict(seen, log=log)


def case_no_init_op() -> dict[str, object]:
    """init_op=None, nothing else: the ready_op finds the variables uninitialized (TF's RuntimeError)."""
    with tf.Graph().as_default():
        return run_session(init_op=None)


def case_nothing_to_init() -> dict[str, object]:
    """init_op=None, local_init_op=None, no init_fn: TF's RuntimeError before anything runs."""
    with tf.Graph().as_default():
        return run_session(init_op=None, local_init_op=None, ready_op=None)


def case_init_fn_only() -> dict[str, object]:
    """init_op=None with an init_fn that initializes: ready."""
    with tf.Graph().as_default():
        start, v, (local, train, gs) = model()
        op = tf.compat.v1.global_variables_initializer()

        def init_fn(sess: object) -> None:
            sess.run(op)  # type: ignore[attr-defined]
            log.append("init_fn")

        sv = Supervisor(logdir=LOGDIR, save_summaries_secs=None, init_op=None, init_fn=init_fn)
        with sv.managed_session() as sess:
            return {"v": float(sess.run(v)), "log": log}


def case_not_ready_for_local_init() -> dict[str, object]:
    """ready_for_local_init_op reports a variable: TF's RuntimeError naming it."""
    with tf.Graph().as_default():
        _, v, (local, *_rest) = model()
        never = tf.compat.v1.get_variable("never", initializer=0.0, collections=["other"])
        return _plain_error(ready_for_local_init_op=tf.compat.v1.report_uninitialized_variables([never]),
                            local_init_op=local.initializer)


def _plain_error(**kwargs: object) -> dict[str, object]:
    sv = Supervisor(logdir=LOGDIR, save_summaries_secs=None, **kwargs)
    try:
        with sv.managed_session():
            return {"error": None}
    except RuntimeError as exc:
        return {"error": str(exc)}


def case_queue_runners() -> dict[str, object]:
    """The graph's queue runners start with the session; a non-collected one with start_queue_runners."""
    with tf.Graph().as_default():
        counter = tf.compat.v1.get_variable("counter", initializer=0, dtype=tf.int32)
        queue = tf.queue.FIFOQueue(10, [tf.int32])
        tf.compat.v1.train.add_queue_runner(tf.compat.v1.train.QueueRunner(queue, [queue.enqueue(counter.assign_add(1))]))
        other = tf.queue.FIFOQueue(10, [tf.int32])
        extra = tf.compat.v1.train.QueueRunner(other, [other.enqueue(tf.constant(7))])
        gs = tf.compat.v1.train.get_or_create_global_step()
        train = tf.group(queue.dequeue(), gs.assign_add(1))
        got = queue.dequeue()
        dequeue_other = other.dequeue()
        sv = Supervisor(logdir=LOGDIR, save_summaries_secs=None)
        with sv.managed_session() as sess:
            sess.run(train)
            first = [int(sess.run(got)) for _ in range(3)]
            threads = sv.start_queue_runners(sess, [extra])
            seven = int(sess.run(dequeue_other))
            names = sorted({type(t).__name__ for t in threads})
        return {"first": first, "seven": seven, "threads": names}


def case_summary_placeholder() -> dict[str, object]:
    """merge_all needs a placeholder no run feeds: said once, turned off; summary_computed still works."""
    with tf.Graph().as_default():
        z = tf.compat.v1.placeholder(tf.float32, [], name="z")
        tf.compat.v1.summary.scalar("z", z)
        gs = tf.compat.v1.train.get_or_create_global_step()
        train = gs.assign_add(1)
        hand = tf.compat.v1.summary.scalar("hand", tf.cast(gs, tf.float32) * 2.0, collections=["mine"])
        sv = Supervisor(logdir=LOGDIR, save_summaries_secs=0.01)
        with sv.managed_session() as sess:
            for _ in range(20):
                sess.run(train)
                summ = sess.run(hand)
                sv.summary_computed(sess, summ)
                threading.Event().wait(0.01)
            return {"summary_op_off": sv.summary_op is None, "step": int(sess.run(gs))}


def case_session_manager() -> dict[str, object]:
    """SessionManager as TF's page says: prepare, recover, wait (the same script runs TF's own with --tf)."""
    out: dict[str, object] = {}
    with tf.Graph().as_default() as g:
        v = tf.compat.v1.get_variable("v", initializer=3.0)
        init = tf.compat.v1.global_variables_initializer()
        ready = tf.compat.v1.report_uninitialized_variables()
        saver = tf.compat.v1.train.Saver()
        bump = v.assign_add(1.0)
        ckdir = os.path.join(LOGDIR, "sm")
        os.makedirs(ckdir, exist_ok=True)
        try:
            SessionManager(ready_for_local_init_op=ready, graph=g)
        except ValueError as exc:
            out["rl_without_local"] = str(exc).split(",")[0]
        sm = SessionManager(ready_op=ready, graph=g, recovery_wait_secs=0.1)
        sess, restored = sm.recover_session("", saver=saver, checkpoint_dir=ckdir)
        out["recover_empty"] = restored
        try:
            sm.prepare_session("", init_op=None, saver=saver, checkpoint_dir=ckdir)
        except RuntimeError as exc:
            out["prepare_nothing"] = str(exc)
        calls: list[float] = []
        sess = sm.prepare_session("", init_op=init, saver=saver, checkpoint_dir=ckdir,
                                  init_fn=lambda s: calls.append(float(s.run(v))))
        out["prepared"], out["init_fn_saw"] = float(sess.run(bump)), list(calls)
        saver.save(sess, os.path.join(ckdir, "model.ckpt"), global_step=1)
        calls.clear()
        sess2 = sm.prepare_session("", init_op=init, saver=saver, checkpoint_dir=ckdir,
                                   init_fn=lambda s: calls.append(1.0))
        out["restored"], out["init_fn_on_restore"] = float(sess2.run(v)), calls
        sess3, restored = sm.recover_session("", saver=saver, checkpoint_dir=ckdir)
        out["recovered"] = [restored, float(sess3.run(v))]
        try:
            SessionManager(ready_op=tf.constant(["never ready"]), graph=g,
                           recovery_wait_secs=0.1).wait_for_session("", max_wait_secs=0.3)
        except tf.errors.DeadlineExceededError as exc:
            out["wait_deadline"] = exc.message
        out["wait_ready"] = type(SessionManager(graph=g).wait_for_session("", max_wait_secs=0.3)).__name__
    return out


def case_steps() -> dict[str, object]:
    """Which runs are steps (procsv only): sv.step after each run of a list of fetches."""
    with tf.Graph().as_default():
        x = tf.compat.v1.placeholder(tf.float32, [], name="x")
        w = tf.compat.v1.get_variable("w", initializer=1.0)
        loss = tf.square(w * x)
        gs = tf.compat.v1.train.get_or_create_global_step()
        train = tf.compat.v1.train.GradientDescentOptimizer(0.01).minimize(loss, global_step=gs, name="train")
        grouped = tf.group(train)
        jump = gs.assign(20)
        by_two = tf.compat.v1.assign_add(gs, 2)
        z = tf.compat.v1.placeholder(tf.float32, [], name="z")
        watched = tf.identity(z, name="loss")  # a watched loss (nonfinite_tags "loss") that trains nothing
        slow = tf.compat.v1.py_func(lambda: time.sleep(0.2) or np.float32(0), [], tf.float32, name="slow")
        feed = {x: 2.0}
        clock = StoppableClock()
        sv = Supervisor(logdir=LOGDIR, save_summaries_secs=None, clock=clock)
        seen: list[object] = []
        with sv.managed_session() as sess:
            for name, fetches in [("loss", loss), ("op", train), ("list", [train, loss]), ("dict", {"t": train}),
                                  ("by name", "train"), ("group", grouped), ("global step", gs), ("w", w)]:
                sess.run(fetches, feed_dict=feed)
                seen.append([name, sv.step])
            other = threading.Thread(target=lambda: sess.run(train, feed_dict=feed))
            other.start()
            other.join()
            seen.append(["other thread", sv.step, int(sess.run(gs))])
            sess.run(train, feed_dict=feed)
            seen.append(["after", sv.step])
            sess.run(jump)  # a writer that adds no constant: its value is read
            seen.append(["assign", sv.step])
            sess.run(by_two)
            seen.append(["add 2", sv.step])
            sess.run(by_two, feed_dict={by_two.op.inputs[1]: 5})  # its constant fed: read, not inferred
            seen.append(["add 2 fed 5", sv.step])
            lagged = []  # 250 steps: sv.step equals the variable after each (steps inferred, not read)
            for _ in range(250):
                sess.run(train, feed_dict=feed)
                if sv.step != int(sess.run(gs)):
                    lagged.append([sv.step, int(sess.run(gs))])
            seen.append(["250 more", sv.step, lagged])
            plans = _run_plans(sv, sess, clock, train, loss, watched, slow, x, z)
            sv.request_stop()
            seen.append(["read after the stop", float(sess.run(loss, feed_dict=feed))])
            try:
                sess.run(train, feed_dict=feed)
            except procsv.TrainingStopped:
                seen.append(["step after the stop", "TrainingStopped", sv.step])
        return {"seen": seen, "plans": plans}


class StoppableClock:
    """The Supervisor's clock: monotonic, or standing still while ``stopped`` (no boundary's time comes)."""

    def __init__(self) -> None:
        self.stopped: float | None = None

    def __call__(self) -> float:
        return time.monotonic() if self.stopped is None else self.stopped


def _run_plans(sv: object, sess: object, clock: StoppableClock, train: object, loss: object, watched: object,
               slow: object, x: object, z: object) -> dict[str, object]:
    """What a run of a structure already seen works out again: the probe's plan and the walk of the
    fetches for watched losses are counted over 50 steps of [train, watched] (a new list and feed
    dict each time), and the session's runs of anything else (a read of the global step alone)
    while a boundary is made due every 10th step (the clock stands still: no other boundary
    comes due); the watched loss is still handed over when not finite; a list changed in place is
    planned anew; a boundary whose time comes during a (0.2 s) run is made right after it."""
    import math

    import procsv.trainer.graph.session as graph_session

    out: dict[str, object] = {}
    mutated = [loss]
    sess.run(mutated, feed_dict={x: 2.0})
    before = sv.step
    mutated.append(train)  # the same list object, now with the train op: a step
    sess.run(mutated, feed_dict={x: 2.0})
    out["list changed in place"] = sv.step - before
    sess.run([train, watched], feed_dict={x: 2.0, z: 1.0})  # seen once
    sess.run([train, slow], feed_dict={x: 2.0})  # seen once
    calls = {"plan": 0, "keep_watched": 0, "other runs": 0, "boundaries": 0}
    boundary_steps: list[int] = []
    probe, walk, raw, state = sess._probe, graph_session.keep_watched, sess._sess, sv._state
    boundary = state.boundary

    class Counting:
        """The session's tf.compat.v1.Session, counting the runs of anything but a list or tuple."""

        def run(self, fetches: object, *args: object) -> object:
            if not isinstance(fetches, (list, tuple)):
                calls["other runs"] += 1
            return raw.run(fetches, *args)

        def __getattr__(self, name: str) -> object:
            return getattr(raw, name)

    def counted_boundary(step: int) -> None:
        calls["boundaries"] += 1
        boundary_steps.append(step)
        boundary(step)

    plan = probe.plan
    losses = sv._state.losses
    kept: list[object] = []

    def counted_plan(*args: object) -> object:
        calls["plan"] += 1
        return plan(*args)

    def counted_walk(*args: object) -> None:
        calls["keep_watched"] += 1
        walk(*args)

    probe.plan, graph_session.keep_watched = counted_plan, counted_walk
    losses.keep = lambda step, value: kept.append([step, "nan" if math.isnan(value) else float(value)])
    sess._sess, state.boundary = Counting(), counted_boundary
    clock.stopped = time.monotonic()
    try:
        for i in range(50):
            if i % 10 == 0:
                state.open_end()  # the progress half's work is due at the next step's boundary
            sess.run([train, watched], feed_dict={x: 2.0, z: 1.0})
        start = sv.step
        sess.run([train, watched], feed_dict={x: 2.0, z: float("nan")})
        out["nan step"] = sv.step - start
        sess._sess = raw
        clock.stopped = None
        sess.run([train, watched], feed_dict={x: 2.0, z: 1.0})  # bounds set on the running clock again
        del boundary_steps[:]
        state.set_end(state.end_step, clock() + 0.05)  # the progress half's time comes during the next run
        sess.run([train, slow], feed_dict={x: 2.0})
        out["boundary made right after the slow run"] = boundary_steps == [sv.step]
    finally:
        clock.stopped = None
        del probe.plan, losses.keep
        graph_session.keep_watched, sess._sess, state.boundary = walk, raw, boundary
    boundaries = calls.pop("boundaries")
    out["boundaries made due were made"] = boundaries >= 5
    out["worked out again in 51 runs"] = calls
    out["kept"] = kept
    return out


def case_no_global_step() -> dict[str, object]:
    """Graphs without a global step, as TF's Supervisor takes them: nothing is added to the graph
    (``sv.global_step`` None, the graph's variables the program's), so an ``init_op`` built before
    the Supervisor, or ``init_op=None`` with an ``init_fn``, makes the model ready; a graph with no
    variable to save (an empty Saver) runs with and without a logdir. procsv only: every run of the
    session is a step (``sv.step``), counted in Python."""
    out: dict[str, object] = {}
    with tf.Graph().as_default():
        w = tf.compat.v1.get_variable("w", initializer=1.0)
        bump = w.assign_add(1.0)
        sv = Supervisor(logdir=os.path.join(LOGDIR, "a"), save_summaries_secs=None)
        with sv.managed_session() as sess:
            steps = []
            for _ in range(3):
                sess.run(bump)
                steps.append(getattr(sv, "step", None))
            out.update(global_step=sv.global_step, w=float(sess.run(w)),
                       variables=[v.op.name for v in tf.compat.v1.global_variables()])
            if not USE_TF:
                out["steps"] = steps
    with tf.Graph().as_default():
        v = tf.compat.v1.get_variable("v", initializer=2.0)
        init = tf.compat.v1.global_variables_initializer()
        sv = Supervisor(logdir=os.path.join(LOGDIR, "b"), init_op=init, save_summaries_secs=None)
        sess = sv.prepare_or_wait_for_session("")
        out["init_op_before"] = float(sess.run(v))
        sv.stop()
    with tf.Graph().as_default():
        v = tf.compat.v1.get_variable("v", initializer=3.0)
        sv = Supervisor(logdir=os.path.join(LOGDIR, "c"), init_op=None, init_fn=lambda s: s.run(v.initializer),
                        save_summaries_secs=None)
        sess = sv.prepare_or_wait_for_session("")
        out["init_fn"] = float(sess.run(v))
        sv.stop()
    for name, logdir in (("empty_saver_no_logdir", None), ("empty_saver", os.path.join(LOGDIR, "d"))):
        with tf.Graph().as_default():
            c = tf.constant(5.0)
            sv = Supervisor(logdir=logdir, saver=tf.compat.v1.train.Saver(allow_empty=True), save_summaries_secs=None)
            with sv.managed_session() as sess:
                out[name] = float(sess.run(c))
    return out


def case_restore() -> dict[str, object]:
    """A second Supervisor on the logdir of a first that saved with sv.saver.save: restored, init_op
    and init_fn not run; a variable outside the saver stays uninitialized (TF's ready_op error), or
    is initialized by a local_init_op."""
    out: dict[str, object] = {}
    for phase in ("first", "second", "third"):
        with tf.Graph().as_default():
            start, v, (local, train, gs) = model()
            extra = tf.compat.v1.get_variable("extra", initializer=5.0)
            kwargs: dict[str, object] = {"saver": tf.compat.v1.train.Saver([v, gs]),
                                         "init_fn": lambda sess, phase=phase: log.append(f"init_fn {phase}")}
            if phase == "third":
                kwargs["local_init_op"] = tf.group(local.initializer, extra.initializer)
            sv = Supervisor(logdir=LOGDIR, save_summaries_secs=None, save_model_secs=None, **kwargs)
            try:
                with sv.managed_session() as sess:
                    out[phase] = [float(sess.run(v)), int(sess.run(gs))]
                    if phase == "first":
                        for _ in range(4):
                            sess.run(train)
                        path = sv.saver.save(sess, sv.save_path, global_step=gs)
                        out["saved"] = os.path.basename(path)
                        sv.request_stop()
            except RuntimeError as exc:
                out[phase] = str(exc).split(".")[0]
    out["log"] = log
    return out


def case_graph_file() -> dict[str, object]:
    """A chief and a worker (``is_chief=False``) on a logdir each, both with sessions on one local
    server (the worker's model is the one the chief initialized there, as TF's worker waits for):
    is ``graph.pbtxt`` there after the session started?"""
    out: dict[str, object] = {}
    server = tf.distribute.Server.create_local_server()
    for role, chief in (("chief", True), ("worker", False)):
        with tf.Graph().as_default():
            start, v, (local, train, gs) = model()
            logdir = os.path.join(LOGDIR, role)
            sv = Supervisor(logdir=logdir, save_summaries_secs=None, save_model_secs=None, is_chief=chief)
            with sv.managed_session(server.target) as sess:
                sess.run(train)
                out[role] = os.path.exists(os.path.join(logdir, "graph.pbtxt"))
                sv.request_stop()
    return out


def case_master_config() -> dict[str, object]:
    """``managed_session(master, config)`` and ``prepare_or_wait_for_session(master=, config=)``:
    the session's target and ConfigProto; three training runs on a local in-process server."""
    out: dict[str, object] = {}
    server = tf.distribute.Server.create_local_server()
    config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=1, allow_soft_placement=True)
    for how in ("managed", "prepare"):
        with tf.Graph().as_default():
            start, v, (local, train, gs) = model()
            sv = Supervisor(logdir=os.path.join(LOGDIR, how), save_summaries_secs=None, save_model_secs=None)
            if how == "managed":
                with sv.managed_session(server.target, config) as sess:
                    out[how] = _master_config_seen(sess, server.target, train, gs)
            else:
                sess = sv.prepare_or_wait_for_session(master=server.target, config=config)
                out[how] = _master_config_seen(sess, server.target, train, gs)
                sv.stop()
    return out


def _master_config_seen(sess: object, target: str, train: object, gs: object) -> dict[str, object]:
    raw = getattr(sess, "raw", sess)
    for _ in range(3):
        sess.run(train)  # type: ignore[attr-defined]
    conf = raw._config  # the ConfigProto the tf.compat.v1.Session was made with
    return {"sess_str": _text(sess.sess_str), "raw_target": _text(raw.sess_str), "target": _text(target),  # type: ignore[attr-defined]
            "sess_str_type": type(sess.sess_str).__name__,  # type: ignore[attr-defined]
            "intra_op": conf.intra_op_parallelism_threads if conf is not None else None,
            "soft": conf.allow_soft_placement if conf is not None else None,
            "step": int(sess.run(gs))}  # type: ignore[attr-defined]


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def case_local_init_run_options() -> dict[str, object]:
    """``local_init_run_options`` reach the run of ``local_init_op``: a RunOptions with
    ``timeout_in_ms=1`` on a local_init_op that blocks (a dequeue of an empty queue) fails it with
    DeadlineExceeded, as TF; without the options it would block."""
    with tf.Graph().as_default():
        start, v, (local, train, gs) = model()
        queue = tf.queue.FIFOQueue(1, [tf.float32])
        blocking = tf.group(local.assign(queue.dequeue()))
        opts = tf.compat.v1.RunOptions(timeout_in_ms=1)
        sv = Supervisor(logdir=LOGDIR, save_summaries_secs=None, save_model_secs=None, local_init_op=blocking,
                        local_init_run_options=opts)
        try:
            with sv.managed_session() as sess:
                return {"error": None, "v": float(sess.run(v))}
        except tf.errors.DeadlineExceededError as exc:
            return {"error": type(exc).__name__}


def case_no_logdir() -> dict[str, object]:
    """``logdir=None``: five training runs; what the Supervisor says it has (nothing saved, no summaries)."""
    with tf.Graph().as_default():
        start, v, (local, train, gs) = model()
        tf.compat.v1.summary.scalar("v", v)
        sv = Supervisor(logdir=None, save_summaries_secs=0.01, save_model_secs=0.01)
        with sv.managed_session() as sess:
            for _ in range(5):
                sess.run(train)
                threading.Event().wait(0.02)
            seen = {"v": float(sess.run(v)), "step": int(sess.run(gs)), "save_path": sv.save_path,
                    "no_summary_writer": sv.summary_writer is None, "summary_op": getattr(getattr(sv.summary_op, "op", None), "type", None)}
        return dict(seen, cwd_files=sorted(os.listdir(".")))


def _standard_services_errors() -> dict[str, object]:
    """``start_standard_services(sess)`` of a worker (``is_chief=False``: TF's RuntimeError) and of a
    Supervisor without a logdir (TF warns and returns None)."""
    out: dict[str, object] = {}
    for what, kwargs in (("worker", {"logdir": os.path.join(LOGDIR, "worker"), "is_chief": False}),
                         ("no_logdir", {"logdir": None})):
        with tf.Graph().as_default():
            model()
            sv = Supervisor(save_summaries_secs=None, save_model_secs=None, **kwargs)
            try:
                out[what] = {"returned": sv.start_standard_services(None)}
            except RuntimeError as exc:
                out[what] = {"error": str(exc).split(".")[0]}
    return out


def case_standard_services() -> dict[str, object]:
    """What ``start_standard_services`` of a worker and of a Supervisor without a logdir do; then
    ``managed_session(start_standard_services=False)`` (procsv only): 10 runs, no checkpoint on the
    every-3-steps schedule and no summary_op summary; then ``sv.start_standard_services(sess)`` and 10
    more runs: both on their schedules. The steps of every checkpoint the logdir keeps are printed
    (the last one is the stop's)."""
    with tf.Graph().as_default():
        start, v, (local, train, gs) = model()
        tf.compat.v1.summary.scalar("value", v)
        sv = Supervisor(logdir=LOGDIR, save_summaries_secs=0.05, save_model_secs=None, save_checkpoint_steps=3,
                        max_to_keep=100)
        with sv.managed_session(start_standard_services=False) as sess:
            for _ in range(10):
                sess.run(train)
                threading.Event().wait(0.02)
            started = sv.start_standard_services(sess)
            meta = tf.compat.v1.train.export_meta_graph()  # sv.summary_writer's TF1 methods in graph mode
            sv.summary_writer.add_meta_graph(meta, 3)
            for _ in range(10):
                sess.run(train)
                threading.Event().wait(0.02)
    state = tf.train.get_checkpoint_state(LOGDIR)
    steps = sorted(int(p.rsplit("-", 1)[1]) for p in state.all_model_checkpoint_paths) if state else []
    return {"started": started, "checkpoint_steps": steps, **_standard_services_errors()}


def case_save_model_secs_zero() -> dict[str, object]:
    """``save_model_secs=0``: nothing is saved, as TF's Supervisor (no timed checkpoint, none at the
    stop, none at ``sess.close()`` before ``sv.stop()``); a second Supervisor on the logdir starts at 0."""
    out: dict[str, object] = {}
    for how in ("managed", "close_then_stop"):
        logdir = os.path.join(LOGDIR, how)
        for attempt in (1, 2):
            with tf.Graph().as_default():
                gs = tf.compat.v1.train.get_or_create_global_step()
                w = tf.compat.v1.get_variable("w", initializer=1.0)
                train = tf.group(w.assign_add(1.0), gs.assign_add(1))
                sv = Supervisor(logdir=logdir, save_model_secs=0, save_summaries_secs=None, summary_op=None)
                if how == "managed":
                    with sv.managed_session() as sess:
                        first = int(sess.run(gs))
                        for _ in range(3):
                            sess.run(train)
                else:
                    sess = sv.prepare_or_wait_for_session("")
                    first = int(sess.run(gs))
                    for _ in range(3):
                        sess.run(train)
                    sess.close()
                    sv.stop()
            out[f"{how} {attempt} first step"] = first
        out[f"{how} files"] = sorted(n for n in os.listdir(logdir) if n.startswith(("model.ckpt", "checkpoint")))
    return out


if __name__ == "__main__":
    if "," not in CASE:
        result = globals()[f"case_{CASE}"]()
        print("result " + json.dumps(result, sort_keys=True), flush=True)
    else:
        base = LOGDIR
        for name in CASE.split(","):
            LOGDIR = os.path.join(base, name)
            log.clear()
            try:
                result = globals()[f"case_{name}"]()
            except Exception as exc:  # noqa: BLE001  (reported, and the next case runs)
                result = {"raised": f"{type(exc).__name__}: {exc}"}
            print(f"result {name} " + json.dumps(result, sort_keys=True), flush=True)

