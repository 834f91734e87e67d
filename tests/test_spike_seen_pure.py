"""Loss spikes as people see them (issue 68), purely: the watchdog's tally of the trainers'
``SpikeDetected``/``SpikeReplayed`` (spikes by action, the last one, transient faults by host), the
suspect-host rule (``--suspect-after``) and its record and line, and what ``procsv status`` (text and
``--json``), Prometheus, procsv's TensorBoard scalars and ``procsv report`` show of them. The real
launch that reads ``procsv status --json`` back is ``tests/test_spike.py``'s rollback test."""

from __future__ import annotations

import argparse

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from procsv.common.errors import UsageError
from procsv.ipc.messages import SpikeDetected, SpikeReplayed
from procsv.launch_args import check_numbers
from procsv.report import RunReport, render
from procsv.status import render as render_status
from procsv.watchdog import observe
from procsv.watchdog.publish.events import SCHEMA, Event
from procsv.watchdog.publish.metrics import families
from procsv.watchdog.publish.runmetrics import StepRate, take_snapshot
from procsv.watchdog.publish.runscalars import Sent, due
from procsv.watchdog.rules.findings import SUSPECT_AFTER, Findings, suspect
from procsv.watchdog.rules.state import ChildView, RunView

PID = 4242


def _view(limit: int = SUSPECT_AFTER) -> RunView:
    view = RunView(launch_start=0.0, findings=Findings(suspect_after=limit))
    t = ChildView("trainer", "trainer", 1, PID, 0.0)
    view.children["trainer"] = t
    view.attempts.append(t)
    return view


def _detected(step: int, action: str = "rollback", pid: int = PID) -> SpikeDetected:
    return SpikeDetected(pid, step, step - 2, 14.9, 2.6, 0.29, action, 1.0)


def _replayed(step: int, host: str, reproduced: bool = False) -> SpikeReplayed:
    return SpikeReplayed(PID, step, step - 2, reproduced, 14.9, 14.9 if reproduced else 0.31, host, 1.0)


def _feed(view: RunView) -> list:
    """Four spikes rolled back and replayed (on host a the data's, then two transient faults; one on
    host b), one warned of; one found by another pid is nobody's (the replay after it is a's third fault)."""
    got = []
    for msg in (_detected(65), _replayed(65, "a", reproduced=True), _detected(120), _replayed(120, "a"),
                _detected(200), _replayed(200, "b"), _detected(300), _replayed(300, "a"),
                _detected(310, "warn"), _detected(320, pid=9999), _replayed(320, "a")):
        got += observe.heard(view, msg, 1.0)
    return got


def test_the_suspect_rule_is_a_host_reaching_its_limit_of_transient_faults():
    assert SUSPECT_AFTER == 3  # the documented default (docs/cli.md --suspect-after)
    assert [suspect(n, 3) for n in (0, 1, 2, 3, 4)] == [False, False, False, True, True]
    assert suspect(1, 1)
    found = Findings(suspect_after=2)
    assert not found.replayed("a", reproduced=True)  # the data's: no fault
    assert [found.replayed("a", False), found.replayed("b", False), found.replayed("a", False),
            found.replayed("a", False)] == [False, False, True, False]  # suspect once, at its 2nd
    assert found.transient == {"a": 3, "b": 1} and found.suspects == ["a"]


def test_the_watchdog_tallies_spikes_and_transient_faults_and_reports_a_suspect_host_once():
    # before: a spike was its record only; nothing counted spikes or a host's transient faults
    view = _view(limit=2)
    got = _feed(view)
    for r in got:
        assert r.event is not None and set(r.fields) == SCHEMA[r.event]
    suspects = [r for r in got if r.event == Event.HOST_SUSPECT]
    assert len(suspects) == 1 and suspects[0].fields == {"host": "a", "faults": 2, "limit": 2, "step": 300}
    assert suspects[0].say == ("procsv: host a is suspect: 2 transient fault(s) in this launch (loss spikes that "
                               "did not come again when replayed, the last at step 300; --suspect-after 2); "
                               "reported only, nothing is excluded or stopped")
    found = view.findings
    assert (found.spikes, found.by_action, found.transient, found.suspects) == \
        (5, {"rollback": 4, "warn": 1}, {"a": 3, "b": 1}, ["a"])  # pid 9999's spike is nobody's; a's replay of it is
    assert found.spikes_json() == {
        "seen": 5, "by_action": {"rollback": 4, "warn": 1},
        "last": {"step": 310, "onset": 308, "loss": 14.9, "threshold": 2.6, "median": 0.29, "action": "warn"},
        "transient_faults": {"a": 3, "b": 1}, "suspect_hosts": ["a"], "suspect_after": 2}
    assert not [r for r in got if r.event == Event.HOST_SUSPECT and r.fields["host"] == "b"]
    default = _view()
    _feed(default)
    assert default.findings.suspects == ["a"] and default.findings.transient["a"] == 3  # at the 3rd, by default


def test_a_replay_whose_input_did_not_come_back_is_no_transient_fault_and_its_record_says_where_it_differed():
    # before: a spike_replayed not reproduced was a transient fault of its host, always: a loop feeding the
    # batch of its own counter (its replay trains other batches) made its host suspect. Now a replay whose
    # steps before the onset gave other losses (differs_at) counts no fault, and its record says the step
    view = _view(limit=1)
    msg = SpikeReplayed(PID, 65, 65, False, 14.9, 0.19, "a", 1.0, differs_at=61)
    got = observe.heard(view, _detected(65), 1.0) + observe.heard(view, msg, 1.0)
    (record,) = [r for r in got if r.event == Event.SPIKE_REPLAYED]
    assert set(record.fields) == SCHEMA[Event.SPIKE_REPLAYED] and record.fields["differs_at"] == 61
    assert view.findings.transient == {} and view.findings.suspects == []
    assert not [r for r in got if r.event == Event.HOST_SUSPECT]
    assert observe.heard(view, _replayed(120, "a"), 1.0)[-1].event == Event.HOST_SUSPECT  # (a true one still counts)


def test_procsv_status_says_the_spikes_the_last_one_and_each_hosts_transient_faults():
    view = _view(limit=2)
    _feed(view)
    status = {"state": "running", "step": 320, "restarts": 0, "processes": [], "spikes": view.findings.spikes_json()}
    text = render_status(status, "/tmp/run")
    assert ("  loss spikes: 5 seen (rollback 4, warn 1); the last at steps 308-310: loss 14.9 against a threshold "
            "of 2.6, warn") in text, text
    assert ("  transient faults (spikes not again when replayed), by host: a 3 (suspect), b 1; suspect from 2 "
            "(reported only: nothing is excluded or stopped)") in text, text
    quiet = render_status({**status, "spikes": Findings().spikes_json()}, "/tmp/run")
    assert "spike" not in quiet and "transient" not in quiet  # none seen: no line


def test_prometheus_counts_spikes_by_action_and_transient_faults_by_host_and_names_the_suspect():
    view = _view(limit=2)
    registry = CollectorRegistry(auto_describe=False)

    class Snap:
        def __init__(self, snap):
            self.snap = snap

        def collect(self):
            yield from families(self.snap, 1000.0, None, {"target": "t"})

    before = take_snapshot(view, 1.0, 1000.0, 900.0, StepRate())
    text = generate_latest(_register(registry, Snap(before))).decode()
    assert "procsv_loss_spikes_total{" not in text and "procsv_host_suspect{" not in text, text
    _feed(view)
    registry = CollectorRegistry(auto_describe=False)
    text = generate_latest(_register(registry, Snap(take_snapshot(view, 2.0, 1001.0, 900.0, StepRate())))).decode()
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for fam in text_string_to_metric_families(text) for s in fam.samples}
    assert samples[("procsv_loss_spikes_total", (("action", "rollback"),))] == 4
    assert samples[("procsv_loss_spikes_total", (("action", "warn"),))] == 1
    assert samples[("procsv_transient_faults_total", (("host", "a"),))] == 3
    assert samples[("procsv_transient_faults_total", (("host", "b"),))] == 1
    assert samples[("procsv_host_suspect", (("host", "a"),))] == 1
    assert ("procsv_host_suspect", (("host", "b"),)) not in samples


def _register(registry: CollectorRegistry, collector: object) -> CollectorRegistry:
    registry.register(collector)  # type: ignore[arg-type]
    return registry


def test_procsvs_tensorboard_run_gets_a_point_of_the_spike_counts_at_each_change():
    view = _view(limit=2)
    view.step = 70
    observe.heard(view, _detected(65), 1.0)
    points, sent = due(view, 1.0, 100.0, Sent(next_periodic=1e9))
    assert [(p.step, p.tags, p.values) for p in points] == [(65, ["procsv/loss_spikes", "procsv/transient_faults"],
                                                             [1.0, 0.0])]
    assert due(view, 2.0, 101.0, sent)[0] == []
    observe.heard(view, _replayed(65, "a"), 2.0)  # the replay said: the machine's
    points, sent = due(view, 3.0, 102.0, sent)
    assert [(p.step, p.values) for p in points] == [(65, [1.0, 1.0])]


def test_procsv_report_names_a_suspect_host():
    events = [{"time": 1.0, "event": "spike_detected", "step": 65, "onset": 65, "loss": 14.9, "threshold": 2.6,
               "median": 0.29, "action": "rollback"},
              {"time": 2.0, "event": "spike_replayed", "step": 65, "reproduced": False, "host": "a"},
              {"time": 2.0, "event": "host_suspect", "host": "a", "faults": 3, "limit": 3, "step": 65}]
    rep = RunReport(logdir="/tmp/run", state="succeeded", step=90, live_pid=None, started_at=0.0, ended_at=10.0,
                    goodput=None, summary=None, spikes=events)
    text = render(rep)
    assert ("  suspect host a: 3 transient fault(s) (loss spikes not again when replayed, the last at step 65; "
            "--suspect-after 3): reported only, nothing excluded or stopped") in text, text


def test_suspect_after_is_at_least_1():
    from procsv.cli import _parser as build_parser

    args = build_parser().parse_args(["launch", "t.py", "--logdir", "r", "--suspect-after", "0"])
    with pytest.raises(UsageError, match="--suspect-after must be >= 1, not 0"):
        check_numbers(args)
    assert build_parser().parse_args(["launch", "t.py", "--logdir", "r"]).suspect_after == SUSPECT_AFTER
    assert isinstance(args, argparse.Namespace)
