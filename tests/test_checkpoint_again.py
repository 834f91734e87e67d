"""A snapshot of a step already committed is not a second commit (issue 50's duplicate).

A trainer cannot always know what is on disk: a dead trainer's snapshot still in flight commits after
its successor restored, and a restarted trainer may send the step it restored. The checkpoint service
(run here in this process, on real ZeroMQ sockets: the test binds the watchdog's PULL and the summary
service's ROUTER) is the one that knows. Its answer to such a snapshot ends the trainer's wait, but
nothing is written again, the watchdog records one commit (one ``checkpoint_committed``) and the
summary service gets one ``SessionLog`` CHECKPOINT.
"""

from __future__ import annotations

import json
import os
from typing import Any

import zmq

from procsv.common.bootstrap import ChildContext
from procsv.common.layout import Layout
from procsv.ipc.messages import SaveData, SaveReason, SaveResult
from procsv.ipc.summary_messages import SessionLogEvent, SessionStatus
from procsv.ipc.transport import Endpoints, ReceiveTimeout, recv_message
from procsv.services.checkpoint.service import CheckpointService
from procsv.services.checkpoint.settings import CheckpointSettings
from procsv.watchdog.observe import heard
from procsv.watchdog.publish.events import Event
from procsv.watchdog.rules.state import RunView


def _drain(sock: zmq.Socket[Any], routed: bool) -> list[Any]:
    got = []
    while True:
        try:
            got.append(recv_message(sock, 2000 if not got else 300, routed=routed).msg)
        except ReceiveTimeout:
            return got


def test_a_snapshot_of_a_committed_step_is_answered_but_not_committed_or_logged_twice(tmp_path):
    layout = Layout(str(tmp_path / "run"))
    layout.create()
    runtime = str(tmp_path / "rt")
    os.makedirs(runtime)
    ends = Endpoints(runtime)
    zctx = zmq.Context.instance()
    watchdog, summary = zctx.socket(zmq.PULL), zctx.socket(zmq.ROUTER)
    for sock, where in ((watchdog, ends.watchdog), (summary, ends.summary)):
        sock.setsockopt(zmq.LINGER, 0)
        sock.bind(where)
    service = CheckpointService(ChildContext(layout, ends, "checkpoint", 1, supervised=True))
    try:
        settings = CheckpointSettings("00", "model.ckpt", None, 5, None)
        msg = SaveData(7, SaveReason.PERIODIC, "model.ckpt", [], None)
        first = service._save(msg, [], settings, reply_to=None)
        with open(os.path.join(layout.manifests, "model.ckpt-7.json"), "rb") as fh:
            manifest = fh.read()
        second = service._save(msg, [], settings, reply_to=None)  # the same step again
        assert first.ok and second.ok and first.path == second.path == os.path.join(layout.logdir, "model.ckpt-7")
        with open(os.path.join(layout.manifests, "model.ckpt-7.json"), "rb") as fh:
            assert fh.read() == manifest  # not written again
        results = [m for m in _drain(watchdog, False) if isinstance(m, SaveResult)]
        logs = [m for m in _drain(summary, True) if isinstance(m, SessionLogEvent)]
    finally:
        service.router.close(0)
        service.to_summary.close(0)
        if service.to_watchdog is not None:
            service.to_watchdog.close(0)
        watchdog.close(0)
        summary.close(0)
    assert [(r.step, r.ok) for r in results] == [(7, True), (7, True)]  # the trainer's wait ends either way
    assert [(log.status, log.step) for log in logs] == [(SessionStatus.CHECKPOINT, 7)]
    view = RunView(launch_start=0.0)
    reports = [r for m in results for r in heard(view, m, 1.0)]
    assert [(r.event, r.fields["step"]) for r in reports] == [(Event.CHECKPOINT_COMMITTED, 7)]
    assert view.commits == 1


def test_a_newer_revision_of_a_committed_step_is_rewritten_in_place_and_an_older_or_equal_one_is_not(tmp_path):
    """A snapshot of a committed step with ``revision`` above the manifest's is a newer state of it
    (runs that trained without advancing the step): the service rewrites ``model.ckpt-0`` in place
    (new files, the manifest's ``revision``), a commit the watchdog records and the summary service
    logs; one with an equal or lower revision (a dead trainer's, one that raced a newer rewrite) is
    answered ``again`` with the committed revision and writes nothing."""
    layout = Layout(str(tmp_path / "run"))
    layout.create()
    runtime = str(tmp_path / "rt")
    os.makedirs(runtime)
    ends = Endpoints(runtime)
    zctx = zmq.Context.instance()
    watchdog, summary = zctx.socket(zmq.PULL), zctx.socket(zmq.ROUTER)
    for sock, where in ((watchdog, ends.watchdog), (summary, ends.summary)):
        sock.setsockopt(zmq.LINGER, 0)
        sock.bind(where)
    service = CheckpointService(ChildContext(layout, ends, "checkpoint", 1, supervised=True))
    manifest = os.path.join(layout.manifests, "model.ckpt-0.json")

    def save(revision: int) -> tuple[SaveResult, bytes]:
        result = service._save(SaveData(0, SaveReason.PERIODIC, "model.ckpt", [], None, revision=revision), [],
                               CheckpointSettings("00", "model.ckpt", None, 5, None), reply_to=None)
        with open(manifest, "rb") as fh:
            return result, fh.read()

    try:
        first, m0 = save(0)
        rewrite, m1 = save(1)
        stale, m1_again = save(1)  # the same revision again
        older, m1_older = save(0)  # a first commit's snapshot, late
        results = [m for m in _drain(watchdog, False) if isinstance(m, SaveResult)]
        logs = [m for m in _drain(summary, True) if isinstance(m, SessionLogEvent)]
    finally:
        service.router.close(0)
        service.to_summary.close(0)
        if service.to_watchdog is not None:
            service.to_watchdog.close(0)
        watchdog.close(0)
        summary.close(0)
    assert [(r.ok, r.again, r.revision) for r in (first, rewrite, stale, older)] == [
        (True, False, 0), (True, False, 1), (True, True, 1), (True, True, 1)]
    assert m1 != m0 and json.loads(m1)["revision"] == 1 and "revision" not in json.loads(m0)
    assert m1_again == m1_older == m1  # not written again
    assert sorted(os.listdir(layout.manifests)) == ["model.ckpt-0.json"]  # no intent record, no kept files left
    assert [(log.status, log.step) for log in logs] == [(SessionStatus.CHECKPOINT, 0)] * 2
    view = RunView(launch_start=0.0)
    reports = [r for m in results for r in heard(view, m, 1.0)]
    assert [(r.event, r.fields["step"]) for r in reports] == [(Event.CHECKPOINT_COMMITTED, 0)] * 2
    assert view.commits == 2
