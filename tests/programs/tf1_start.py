"""What a graph-mode Supervisor saves and logs as its standard services start: ``python tf1_start.py
CASE LOGDIR [--tf]`` prints ``result <json>`` (``--tf``: TensorFlow's own Supervisor instead).

``with_step``: a graph with a global step; ``prepare_or_wait_for_session`` and no run: the
checkpoint the logdir gets (waited for, bounded) and the summary logged before the stop.
``no_step``: a graph without a global step, the same, then ``v`` set to 5 and runs until the
checkpoint holds it (bounded), the stop, and a second Supervisor on the logdir: what it restored,
and the checkpoint prefixes the logdir holds.
``validation``: TensorFlow's PTB tutorial's shape: the merged scalars as the summary op, an epoch's three
training steps, then its validation (runs of the cost, which advance no step) for 0.8 s, with summaries
every 0.1 s and checkpoints every 0.3 s: the values of ``cost`` and ``global_step/sec`` logged at step 3,
where the step stood, and the newest checkpoint in the logdir as the validation ended (it runs on until
that is step 3's, for at most ``WAIT`` s); then the same under a MonitoredTrainingSession with a
StopAtStepHook (whose step read is in every run's fetches), in ``LOGDIR/monitored``.
"""

from __future__ import annotations

import glob
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import tensorflow as tf  # noqa: E402

tf.compat.v1.disable_eager_execution()
CASE, LOGDIR = sys.argv[1], sys.argv[2]
if "--tf" in sys.argv:
    Supervisor = tf.compat.v1.train.Supervisor
else:
    import procsv

    Supervisor = procsv.Supervisor
WAIT = 20.0  # seconds: a bound, not a pause


def wait_for(cond, what: str):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(0.05)
    raise SystemExit(f"timed out waiting for {what}")


def stored(prefix: str, name: str) -> float:
    try:
        return float(tf.train.load_variable(prefix, name).reshape(-1)[0])
    except (tf.errors.OpError, ValueError):
        return float("nan")


def summaries(logdir: str) -> list[list[object]]:
    out: list[list[object]] = []
    for path in sorted(glob.glob(os.path.join(logdir, "events.out.tfevents.*"))):
        for ev in tf.compat.v1.train.summary_iterator(path):
            out += [[int(ev.step), v.tag, float(v.simple_value)] for v in ev.summary.value]
    return out


def case_with_step() -> dict[str, object]:
    with tf.Graph().as_default():
        tf.compat.v1.train.get_or_create_global_step()
        v = tf.compat.v1.get_variable("v", initializer=3.0)
        tf.compat.v1.summary.scalar("v", v)
        sv = Supervisor(logdir=LOGDIR)
        sv.prepare_or_wait_for_session("")
        latest = wait_for(lambda: tf.train.latest_checkpoint(LOGDIR), "the checkpoint at the start")
        wait_for(lambda: glob.glob(os.path.join(LOGDIR, "events.out.tfevents.*")), "the event file")
        sv.stop()
    return {"checkpoint": os.path.basename(latest), "v": stored(latest, "v"), "summaries": summaries(LOGDIR)}


def case_no_step() -> dict[str, object]:
    out: dict[str, object] = {}
    with tf.Graph().as_default():
        v = tf.compat.v1.get_variable("v", initializer=1.0)
        set5 = v.assign(5.0)
        tf.compat.v1.summary.scalar("v", v)
        sv = Supervisor(logdir=LOGDIR, save_model_secs=0.2)
        sess = sv.prepare_or_wait_for_session("")
        latest = wait_for(lambda: tf.train.latest_checkpoint(LOGDIR), "the checkpoint at the start")
        out.update(first=os.path.basename(latest), first_v=stored(latest, "v"), global_step=sv.global_step)
        sess.run(set5)

        def rewritten() -> bool:
            sess.run(v)  # (a run: a step where every run is one)
            return stored(os.path.join(LOGDIR, "model.ckpt"), "v") == 5.0

        wait_for(rewritten, "model.ckpt to be rewritten with v = 5")
        sv.stop()
    with tf.Graph().as_default():
        v = tf.compat.v1.get_variable("v", initializer=1.0)
        sv = Supervisor(logdir=LOGDIR, save_model_secs=0.2)
        sess = sv.prepare_or_wait_for_session("")
        out["restored_v"] = float(sess.run(v))
        sv.stop()
    names = [n for n in os.listdir(LOGDIR) if n.startswith("model.ckpt")]
    out["prefixes"] = sorted({n.split(".data-")[0].removesuffix(".index").removesuffix(".meta") for n in names})
    out["latest"] = os.path.basename(tf.train.latest_checkpoint(LOGDIR) or "")
    out["summaries_at_0"] = [s for s in summaries(LOGDIR) if s[0] == 0][:1]
    return out


def case_validation() -> dict[str, object]:
    with tf.Graph().as_default():
        w = tf.compat.v1.Variable(1.0, name="w")
        step = tf.compat.v1.train.get_or_create_global_step()
        cost = tf.square(w - 0.25)
        tf.compat.v1.summary.scalar("cost", cost)
        train = tf.group(w.assign(w * 0.5 + 0.25), step.assign_add(1))
        sv = Supervisor(logdir=LOGDIR, save_model_secs=0.3, save_summaries_secs=0.1)
        with sv.managed_session() as sess:
            for _ in range(3):
                sess.run(train)
            until, bound = time.monotonic() + 0.8, time.monotonic() + WAIT

            def saved() -> str:
                return os.path.basename(tf.train.latest_checkpoint(LOGDIR) or "")

            # the validation epoch: the global step stands at 3 (0.8 s, and until the periodic checkpoint of
            # step 3 is in the logdir: bounded)
            while time.monotonic() < until or (saved() != "model.ckpt-3" and time.monotonic() < bound):
                sess.run({"cost": cost})
                time.sleep(0.005)
            during = saved()
    at3 = [s for s in summaries(LOGDIR) if s[0] == 3]
    out: dict[str, object] = {tag: [s[2] for s in at3 if s[1] == tag] for tag in ("cost", "global_step/sec")}
    out["saved_during_validation"] = during
    out["monitored_saved_during_validation"] = monitored_validation(os.path.join(LOGDIR, "monitored"))
    return out


def monitored_validation(logdir: str) -> str:
    """The validation's shape under a MonitoredTrainingSession whose StopAtStepHook reads the global step at
    every run (TF's, or procsv.train's): three steps, then runs of the cost until the CheckpointSaverHook's
    periodic checkpoint of step 3 is in ``logdir`` (bounded); its newest checkpoint then."""
    session = tf.compat.v1.train.MonitoredTrainingSession
    if "--tf" not in sys.argv:
        import procsv.train

        session = procsv.train.MonitoredTrainingSession
    with tf.Graph().as_default():
        w = tf.compat.v1.Variable(1.0, name="w")
        step = tf.compat.v1.train.get_or_create_global_step()
        cost = tf.square(w - 0.25)
        train = tf.group(w.assign(w * 0.5 + 0.25), step.assign_add(1))
        with session(checkpoint_dir=logdir, save_checkpoint_secs=0.3, save_summaries_steps=None,
                     save_summaries_secs=None, log_step_count_steps=None,
                     hooks=[tf.compat.v1.train.StopAtStepHook(last_step=100)]) as sess:
            for _ in range(3):
                sess.run(train)
            bound = time.monotonic() + WAIT
            while os.path.basename(tf.train.latest_checkpoint(logdir) or "") != "model.ckpt-3" \
                    and time.monotonic() < bound:
                sess.run(cost)
                time.sleep(0.005)
            return os.path.basename(tf.train.latest_checkpoint(logdir) or "")


if __name__ == "__main__":
    print("result " + json.dumps(globals()[f"case_{CASE}"](), sort_keys=True), flush=True)
