"""Non-finite training made visible (issue 41): one real ``procsv launch`` whose step 25 is poisoned,
read back through every output (the lifecycle log, ``procsv status``/``--json``, ``logs/report.json``,
``procsv report`` and its plot, the metrics endpoint, procsv's own TensorBoard scalars); and the
pure pieces (the watchdog's observation, the live line, the due scalars)."""

from __future__ import annotations

import json
import os
import signal
import urllib.error
import urllib.request
from typing import Optional

import pytest
from PIL import Image
from prometheus_client.parser import text_string_to_metric_families
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from conftest import PROGRAMS, REPO, finish, launch, lifecycle, quiet_env, run_python, wait_for
from pyfork import ForkedRun
from procsv.ipc.messages import NonfiniteDetected, RestoreSource, RolledBack, StepSkipped
from procsv.watchdog import observe
from procsv.watchdog.publish import liveline
from procsv.watchdog.publish.events import SCHEMA, Event, check
from procsv.watchdog.publish.runscalars import Sent, due
from procsv.watchdog.rules.failures import Failure
from procsv.watchdog.rules.state import ChildView, RunView

NAN_TRAIN = os.path.join(PROGRAMS, "nan_train.py")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _scrape(port: int) -> Optional[dict[str, float]]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            text = resp.read().decode()
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None
    return {s.name: s.value for fam in text_string_to_metric_families(text) for s in fam.samples if not s.labels}


def _procsv(*args: str, path: str = "") -> ForkedRun:
    env = quiet_env(PYTHONPATH=os.pathsep.join(p for p in (path, os.environ.get("PYTHONPATH", "")) if p))
    return run_python(["-m", "procsv", *args], env=env, cwd=REPO, timeout=120)


@pytest.mark.slow
def test_a_skipped_step_shows_in_events_status_report_plot_metrics_and_tensorboard(logdir, tmp_path, matplotlib_dir):
    # before: the rollback and the skip were lines in the trainer's log only: no lifecycle event, nothing
    # in status.json, report.json, the metrics or procsv's scalars
    port = _free_port()
    proc = launch(logdir, "--nan-at", "25", "--steps", "120", "--step-delay", "0.03", target=NAN_TRAIN,
                  opts=("--metrics-port", str(port), "--quiet", "--standby", "fork"))  # no restart: no standby
    try:
        live = wait_for(lambda: (s := _scrape(port)) and s.get("procsv_steps_skipped_total") == 1.0 and s, 180,
                        what="the skipped step in the metrics")
        assert live["procsv_rollbacks_total"] == 2.0  # the retry's, then the skip's
        code, out, err = finish(proc, 240)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert code == 0, err

    # the lifecycle log: in the order they happened, with their fields
    mine = [e for e in lifecycle(logdir) if e["event"] in ("nonfinite_detected", "rolled_back", "step_skipped")]
    assert [e["event"] for e in mine] == ["nonfinite_detected", "rolled_back", "nonfinite_detected", "rolled_back",
                                          "step_skipped"], mine
    for e in mine:
        check(Event(e["event"]), {k: v for k, v in e.items() if k not in ("time", "event")})
        assert e["step"] == 25
    found = [e for e in mine if e["event"] == "nonfinite_detected"]
    assert all("NaN or infinite" in e["what"] and e["epoch"] is None and e["batch"] is None for e in found)
    back = [e for e in mine if e["event"] == "rolled_back"]
    # restored from the trainer's own snapshot memory (issue 41: the in-memory tier when it holds the
    # newest finite state): a slot's copy of step 20 (the checkpoint's) or of a later in-memory snapshot
    restored = back[0]["restored_step"]
    assert 20 <= restored < 25, back
    # the retry's rollback restores that snapshot; the skip's puts back the state of step 24, kept in
    # memory when the retry began (no second replay: retry_state)
    assert [(e["restored_step"], e["source"], e["skip"]) for e in back] == [(restored, "memory", False),
                                                                            (24, "memory", True)]
    assert back[0]["path"].startswith("/proc/") and "#slot" in back[0]["path"], back
    assert back[1]["path"] == "memory#retry24" and all(e["secs"] >= 0 for e in back), back
    assert mine[-1]["skipped"] == 1 and mine[-1]["epoch"] is None

    st = _procsv("status", logdir, "--json")
    assert st.returncode == 0, st.stderr
    record = json.loads(st.stdout)
    assert record["skipped_steps"] == [25] and record["rollbacks"] == 2
    text = _procsv("status", logdir).stdout
    assert "non-finite: 2 rollback(s), 1 step(s) skipped: 25" in text, text

    with open(os.path.join(logdir, "logs", "report.json")) as fh:
        saved = json.load(fh)
    assert saved["skipped_steps"] == [25] and saved["rollbacks"] == 2
    report = _procsv("report", logdir)
    assert report.returncode == 0, report.stderr
    assert "non-finite: 2 rollback(s), 1 step(s) skipped (NaN or infinite loss twice): 25" in report.stdout
    png = str(tmp_path / "timeline.png")
    drawn = _procsv("report", logdir, "--plot", png, path=matplotlib_dir)
    assert drawn.returncode == 0, drawn.stderr
    with Image.open(png) as img:
        pixels = img.convert("RGB")
        colors = {pixels.getpixel((x, y)) for x in range(img.size[0]) for y in range(img.size[1])}
    assert (255, 127, 14) in colors  # the skipped step's cross

    acc = EventAccumulator(os.path.join(logdir, "procsv"))
    acc.Reload()
    skipped = [(e.step, e.value) for e in acc.Scalars("procsv/steps_skipped")]
    rollbacks = [(e.step, e.value) for e in acc.Scalars("procsv/rollbacks")]
    assert skipped[-1] == (25, 1.0), skipped
    assert rollbacks[-1] == (25, 2.0), rollbacks


# ----------------------------------------------------------------------------- pure


def _view() -> RunView:
    view = RunView(launch_start=0.0)
    t = ChildView("trainer", "trainer", 1, 4242, 0.0)
    view.children["trainer"] = t
    view.attempts.append(t)
    return view


def test_the_watchdog_turns_the_trainers_messages_into_events_and_counts():
    view = _view()
    got = observe.heard(view, NonfiniteDetected(4242, 25, 1.0, "the loss of step 25 is NaN or infinite"), 1.0)
    got += observe.heard(view, RolledBack(4242, 25, 20, RestoreSource.MEMORY, "", True, 0.01, 1.0, epoch=2, batch=7),
                         1.0)
    got += observe.heard(view, StepSkipped(4242, 25, 1.0, 1, epoch=2, batch=7), 1.0)
    got += observe.heard(view, StepSkipped(4242, 25, 2.0, 1), 2.0)  # met again after a restart: one step
    got += observe.heard(view, StepSkipped(9999, 30, 2.0, 1), 2.0)  # not the trainer's: ignored
    assert [r.event for r in got] == [Event.NONFINITE_DETECTED, Event.ROLLED_BACK, Event.STEP_SKIPPED,
                                      Event.STEP_SKIPPED]
    for r in got:
        assert r.event is not None and set(r.fields) == SCHEMA[r.event]
    assert got[1].fields["source"] == "memory" and got[2].fields["epoch"] == 2 and got[2].fields["batch"] == 7
    assert (got[1].fields["epoch"], got[1].fields["batch"]) == (2, 7)  # a rollback names Keras' (epoch, batch) too
    assert view.skipped_steps == [25] and view.rollbacks == 1 and view.findings.nonfinite == 1


def test_the_live_line_names_the_event_and_counts_skipped_steps():
    line = liveline.LiveLine()
    line.event(Event.STEP_SKIPPED, {"pid": 1, "step": 25, "epoch": None, "batch": None, "skipped": 1})
    facts = line.facts(1.0, 30, 0, 0.9, 1)
    text = liveline.format_line(facts, 200)
    assert "skipped step 25 (non-finite)" in text and "| skipped 1" in text, text
    assert liveline.event_text(Event.ROLLED_BACK, {"step": 25, "restored_step": 20, "skip": False}) == \
        "rolled back to step 20 (retrying step 25)"
    assert "skipped" not in liveline.format_line(liveline.LiveLine().facts(1.0, 30, 0, 0.9), 200)


def test_procsv_report_takes_skipped_steps_from_report_json_else_from_the_events_of_a_live_launch():
    from procsv.report import nonfinite

    events = [{"time": 10.0, "event": "launch"},
              {"time": 11.0, "event": "rolled_back", "step": 25},
              {"time": 12.0, "event": "rolled_back", "step": 25},
              {"time": 12.5, "event": "step_skipped", "step": 25},
              {"time": 20.0, "event": "step_skipped", "step": 25},  # met again after a restart
              {"time": 30.0, "event": "step_skipped", "step": 40}]
    assert nonfinite(events, None) == ([(12.5, 25), (30.0, 40)], 2)  # live: what the events say
    assert nonfinite(events, {"skipped_steps": [25, 40, 50], "rollbacks": 6}) == ([(12.5, 25), (30.0, 40), (30.0, 50)], 6)
    assert nonfinite([{"time": 1.0, "event": "launch"}], {"series": []}) == ([], 0)  # an older report.json


def test_a_rollback_and_a_skip_are_each_a_scalar_point_once():
    view = _view()
    view.step, view.rollbacks = 30, 1
    points, sent = due(view, 1.0, 100.0, Sent(next_periodic=1e9))
    assert [(p.step, p.tags, p.values) for p in points] == [(30, ["procsv/rollbacks", "procsv/steps_skipped"],
                                                             [1.0, 0.0])]
    view.rollbacks, view.skipped_steps, view.step = 2, [25], 26
    points, sent = due(view, 2.0, 101.0, sent)
    assert [(p.step, p.values) for p in points] == [(25, [2.0, 1.0])]
    assert due(view, 3.0, 102.0, sent)[0] == []


# ----------------------------------------------------------------------------- the switch the benchmark measures with


def test_nonfinite_check_0_turns_detection_off_for_measuring_its_cost(tmp_path, monkeypatch):
    # before: there was no way to run without detection (nonfinite_tags=() still watched the returned
    # loss and scanned every snapshot), so its cost could not be measured against a run without it
    import numpy as np
    import tensorflow as tf

    import procsv

    monkeypatch.setenv("PROCSV_NONFINITE_CHECK", "0")
    w = tf.Variable(tf.ones([4]))

    @tf.function
    def train(x):  # type: ignore[no-untyped-def]
        err = w * x - 1.0
        w.assign_sub(0.01 * err * x)
        return tf.reduce_sum(err * err)

    sv = procsv.Supervisor(logdir=str(tmp_path), checkpoint={"w": w}, save_model_secs=600, save_checkpoint_steps=10,
                           on_nonfinite="stop")
    with sv.managed_session() as sess:
        for s in range(1, 31):
            sess.run(lambda: train(tf.fill([4], float("nan") if s == 12 else 1.0)))
    assert sv._rollback.watch.losses.reads == 0 and sv._rollback.watch.refusals == 0  # nothing kept, checked or refused
    latest = tf.train.latest_checkpoint(str(tmp_path))
    assert latest is not None and latest.endswith("-30"), latest  # committed as it was: NaN
    assert np.isnan(tf.train.load_checkpoint(latest).get_tensor("w/.ATTRIBUTES/VARIABLE_VALUE")).all()


@pytest.mark.slow
def test_a_keras_fit_names_each_steps_input_position_for_the_non_finite_events(tmp_path):
    # before: the events' epoch and batch were always null: nothing told the watch where a step's input was
    import keras
    import numpy as np
    import tensorflow as tf

    import procsv.keras
    from procsv.trainer.nonfinite import notices

    x = np.random.default_rng(0).normal(size=(100, 8)).astype(np.float32)
    ds = tf.data.Dataset.from_tensor_slices((x, x[:, :4].argmax(axis=1))).batch(16)  # 7 batches an epoch
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4)])
    model.compile(keras.optimizers.SGD(0.01), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    backup = procsv.keras.BackupAndRestore(backup_dir=str(tmp_path))
    seen: dict[int, object] = {}

    class Grab(keras.callbacks.Callback):  # before BackupAndRestore's on_train_end, which lets its Supervisor go
        def on_train_end(self, logs=None):  # type: ignore[no-untyped-def]
            assert backup.sv is not None
            seen.update({s: backup.sv._rollback.watch.position(s) for s in (1, 7, 8, 14, 15)})  # type: ignore[misc]

    model.fit(ds, epochs=2, callbacks=[Grab(), backup], verbose=0)
    assert seen == {1: (0, 0), 7: (0, 6), 8: (1, 0), 14: (1, 6), 15: (1, 7)}  # 15: past the end, as if it ran
    msg = notices.detected(8, "the loss of step 8 is NaN or infinite", lambda s: seen[s])  # type: ignore[arg-type,return-value]
    assert (msg.step, msg.epoch, msg.batch) == (8, 1, 0)


def test_refused_snapshots_of_one_trainer_are_coalesced_in_the_lifecycle_and_every_one_counted():
    """Issue 51: under --on-nonfinite continue every snapshot is refused and told (NonfiniteDetected):
    one nonfinite_detected record each grew lifecycle.jsonl by ~71 MB a day. A trainer's first is
    written at once, then at most one a minute (``repeats``: the detections it stands for), and its
    last when it ends; a rollback or a skipped step ends a series (each rollback keeps its record)."""
    view = _view()
    got = []
    for i in range(200):  # a refusal every 0.2 s for 40 s, then the trainer's end
        got += observe.heard(view, NonfiniteDetected(4242, 25, 1.0, "the state is non-finite"), 10.0 + 0.2 * i)
    assert [r.fields["repeats"] for r in got] == [1]  # the first; the rest wait (under a minute)
    got += observe.heard(view, NonfiniteDetected(4242, 25, 1.0, "the state is non-finite"), 70.0)  # a minute on
    assert [r.fields["repeats"] for r in got] == [1, 200]
    got += observe.heard(view, NonfiniteDetected(4242, 25, 1.0, "the state is non-finite"), 71.0)
    got += observe.reaped(view, "trainer", 1, Failure("trainer", 1, 4242, 1, 72.0, ""), 72.0)  # its end
    found = [r for r in got if r.event == Event.NONFINITE_DETECTED]
    assert [r.fields["repeats"] for r in found] == [1, 200, 1] and got[-1].event == Event.EXITED
    assert sum(r.fields["repeats"] for r in found) == view.findings.nonfinite == 202
    for r in found:
        assert set(r.fields) == SCHEMA[Event.NONFINITE_DETECTED]
    # --on-nonfinite rollback: detected, rolled back, detected again at once: a record each
    view = _view()
    seq = observe.heard(view, NonfiniteDetected(4242, 25, 1.0, "x"), 1.0)
    seq += observe.heard(view, RolledBack(4242, 25, 20, RestoreSource.MEMORY, "", False, 0.01, 1.0), 1.1)
    seq += observe.heard(view, NonfiniteDetected(4242, 25, 1.0, "x"), 1.2)
    assert [r.event for r in seq] == [Event.NONFINITE_DETECTED, Event.ROLLED_BACK, Event.NONFINITE_DETECTED]
