"""The checkpoint service's loader tells the trainer by message, not by a file (issue 51, point 7's progress).

While the checkpoint service imports TensorFlow for a commit (a snapshot with a variant tensor), the
trainer whose snapshot waits must take the commit for slow, not dead. That sign of life was a file
the loader grew in ``.procsv/tmp/loading.<pid>/``, outside the message schema; it is now a typed
:class:`~procsv.ipc.messages.CommitLoading` on the checkpoint socket, when the load begins and each
second it moves. Here a real process runs the service's :class:`Loader` on a real ROUTER and
imports TensorFlow for real; the test is the trainer's DEALER and reads what arrives.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import zmq

import pytest

from conftest import burners, on_one_core
from procsv.ipc.messages import CheckpointSetup, CommitLoading, Message
from procsv.ipc.transport import ReceiveTimeout, recv_message, send

# the service's side: its ROUTER and its Loader, loading TensorFlow at a commit or before its Hello
SERVICE = r"""
import json, sys, time
import zmq
from procsv.common.layout import Layout
from procsv.ipc.transport import recv_message
from procsv.services.checkpoint.preload import Loader
from procsv.services.checkpoint.service import ACCEPT

mode, logdir, endpoint = sys.argv[1:4]
router = zmq.Context.instance().socket(zmq.ROUTER)
router.bind(endpoint)
print("bound", flush=True)
loader = Loader(Layout(logdir), None, (router, ACCEPT), 1, lambda line: print(line, file=sys.stderr, flush=True))
t0 = time.monotonic()
if mode == "commit":  # the trainer's snapshot arrived (its heartbeat stands for it): the commit needs TensorFlow
    identity = recv_message(router, 60000, routed=True, accept=ACCEPT).identity
    t0 = time.monotonic()
    loader.before_commit("a variant tensor", 7, identity)
else:  # a replacement service: this run needs TensorFlow, loaded before its Hello; a trainer waits meanwhile
    router.poll(60000)  # (its heartbeat is there before the load begins: nothing is read here)
    t0 = time.monotonic()
    loader.at_start()
print(json.dumps({"secs": time.monotonic() - t0, "early": [type(g).__name__ for g in loader.early]}), flush=True)
"""


def _run(mode: str, logdir: str, in_flight: int) -> tuple[list[Message], dict[str, object], list[str]]:
    """Run the service's loader in ``mode`` with the test as its trainer (a heartbeat naming
    ``in_flight``); return what the trainer received, what the service printed last, and every
    name ever seen in ``.procsv/tmp`` while it loaded."""
    os.makedirs(os.path.join(logdir, ".procsv"), exist_ok=True)  # (a launch made it)
    endpoint = "ipc://" + os.path.join(logdir, "ckpt.sock")
    proc = subprocess.Popen([sys.executable, "-c", SERVICE, mode, logdir, endpoint], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "bound", proc.communicate()[1][-3000:]
    dealer = zmq.Context.instance().socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(endpoint)
    send(dealer, CheckpointSetup(os.getpid(), "model.ckpt", None, 5, None, 100, None, in_flight))
    got: list[Message] = []
    seen: set[str] = set()
    tmp = os.path.join(logdir, ".procsv", "tmp")
    deadline = time.monotonic() + 300  # a TensorFlow import at load takes seconds; a hung one fails here
    try:
        while time.monotonic() < deadline:
            if os.path.isdir(tmp):
                seen.update(os.listdir(tmp))
            try:
                got.append(recv_message(dealer, 100).msg)
            except ReceiveTimeout:
                if proc.poll() is not None:
                    break
        out, err = proc.communicate(timeout=60)
    finally:
        dealer.close(0)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err[-3000:]
    return got, json.loads(out.strip().splitlines()[-1]), sorted(seen)


@pytest.mark.slow
def test_a_commit_that_loads_tensorflow_tells_its_trainer_by_message_and_grows_no_file(logdir):
    got, said, seen = _run("commit", logdir, in_flight=7)
    assert got and all(isinstance(m, CommitLoading) and m.step == 7 and m.what == "TensorFlow" for m in got), got
    secs = float(said["secs"])  # type: ignore[arg-type]
    if secs > 2.5:  # one when it began, then one each second it moved (an import at work moves)
        assert len(got) >= 2, (secs, got)
    assert not [n for n in seen if n.startswith("loading.")], seen
    with open(os.path.join(logdir, ".procsv", "checkpoint_needs.json")) as f:  # the next service loads it at start
        assert json.load(f) == {"tensorflow": "a variant tensor"}


@pytest.mark.slow
def test_a_service_loading_before_its_hello_tells_the_trainer_whose_snapshot_waits_and_keeps_its_messages(logdir):
    os.makedirs(os.path.join(logdir, ".procsv"))
    with open(os.path.join(logdir, ".procsv", "checkpoint_needs.json"), "w") as f:
        json.dump({"tensorflow": "a variant tensor"}, f)
    got, said, seen = _run("start", logdir, in_flight=5)
    assert got and all(isinstance(m, CommitLoading) and m.step == 5 and m.what == "TensorFlow" for m in got), got
    assert said["early"] == ["Received"], said  # the heartbeat, for the service's loop after its Hello
    assert not [n for n in seen if n.startswith("loading.")], seen



def test_checkpoint_needs_json_follows_what_the_commits_need_and_is_safe_to_delete(logdir, monkeypatch):
    """Issue 51: ``.procsv/checkpoint_needs.json`` was written once and never cleared: a run whose
    program no longer checkpoints a tf.data iterator imported TensorFlow at every service's start for
    good. It says what this run's commits need: rewritten when a commit needs something else, removed
    when a commit needs nothing, and a missing file only means the next commit that needs TensorFlow
    finds out (and records it) again (the first test above)."""
    from procsv.common.layout import Layout
    from procsv.services.checkpoint import preload
    from procsv.services.checkpoint.service import ACCEPT

    meta = os.path.join(logdir, ".procsv")
    os.makedirs(meta)
    path = os.path.join(meta, "checkpoint_needs.json")
    with open(path, "w") as f:
        json.dump({"tensorflow": "a variant tensor"}, f)
    router = zmq.Context.instance().socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.bind("ipc://" + os.path.join(logdir, "ckpt.sock"))
    said: list[str] = []
    try:
        loader = preload.Loader(Layout(logdir), None, (router, ACCEPT), 1, said.append)
        monkeypatch.setattr(preload, "loaded", lambda: True)  # TensorFlow is loaded here (the service's start did)
        assert not loader.before_commit("a dtype the native writer does not know (bfloat16)", 3, None)
        with open(path) as f:  # another need: rewritten (atomically)
            assert json.load(f) == {"tensorflow": "a dtype the native writer does not know (bfloat16)"}
        assert not loader.before_commit("", 4, None)  # this commit needs nothing: the file goes
        assert not os.path.exists(path)
        assert [line for line in said if "no longer need TensorFlow" in line], said
        assert not loader.before_commit("", 5, None)  # (and stays gone, said once)
        assert len([line for line in said if "no longer need" in line]) == 1 and not os.path.exists(path)
        assert preload.needed(Layout(logdir)) == ""  # the next service loads nothing before its Hello
    finally:
        router.close(0)


def test_checkpoint_needs_json_deleted_mid_run_is_written_again_at_the_next_commit_that_needs_it(logdir, monkeypatch):
    """The docs say the file is safe to delete: the next commit that needs TensorFlow records it again.
    A service read the file once and compared every commit with what it had read, so a file the user
    deleted under a live service stayed missing for as long as that service lived (a month): its
    replacement then started without TensorFlow and loaded it at a commit."""
    from procsv.common.layout import Layout
    from procsv.services.checkpoint import preload
    from procsv.services.checkpoint.service import ACCEPT

    meta = os.path.join(logdir, ".procsv")
    os.makedirs(meta)
    path = os.path.join(meta, "checkpoint_needs.json")
    router = zmq.Context.instance().socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.bind("ipc://" + os.path.join(logdir, "ckpt.sock"))
    try:
        loader = preload.Loader(Layout(logdir), None, (router, ACCEPT), 1, lambda line: None)
        monkeypatch.setattr(preload, "loaded", lambda: True)  # (loaded at this service's first commit)
        loader.before_commit("a variant tensor: a tf.data iterator's state", 10, None)
        with open(path) as f:
            assert json.load(f) == {"tensorflow": "a variant tensor: a tf.data iterator's state"}
        os.unlink(path)  # the user deletes it mid-run
        loader.before_commit("a variant tensor: a tf.data iterator's state", 20, None)
        with open(path) as f:  # the next commit that needs it records it again
            assert json.load(f) == {"tensorflow": "a variant tensor: a tf.data iterator's state"}
        assert preload.needed(Layout(logdir))  # so the next service loads it before its Hello
    finally:
        router.close(0)


# the trainer whose snapshot's commit began the load: a real process, SIGKILLed while the service loads
KILLED_TRAINER = r"""
import os, sys
import zmq
from procsv.ipc.messages import CheckpointSetup, CommitLoading
from procsv.ipc.transport import recv_message, send
dealer = zmq.Context.instance().socket(zmq.DEALER)
dealer.connect(sys.argv[1])
send(dealer, CheckpointSetup(os.getpid(), "model.ckpt", None, 5, None, 100, None, 7))
got = recv_message(dealer, 300000).msg
print(type(got).__name__, getattr(got, "step", None), flush=True)
sys.stdin.read()  # until it is killed
"""


@pytest.mark.slow
def test_a_trainer_restarted_while_the_service_still_loads_is_told_its_snapshot_waits_for_the_load(logdir):
    """A trainer SIGKILLed while its snapshot's commit loads TensorFlow: the watchdog restarts it and
    the new trainer's first snapshot waits behind that load. The loader told only the trainer whose
    snapshot began the load (now unroutable), so the new one heard nothing, and at its deadline took
    the loading service for stuck (SaveOverdue: the watchdog replaces the service, which loads again).
    The grown file it replaced told every trainer. At load (a CPU burner on the service's one core,
    ``on_one_core``: less CPU for it than two burners over two cores): the import takes seconds."""
    os.makedirs(os.path.join(logdir, ".procsv"))
    endpoint = "ipc://" + os.path.join(logdir, "ckpt.sock")
    with on_one_core():
        burn = burners()
        service = subprocess.Popen([sys.executable, "-c", SERVICE, "commit", logdir, endpoint], stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True)
    first = None
    dealer = zmq.Context.instance().socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    got: list[Message] = []
    try:
        assert service.stdout is not None and service.stdout.readline().strip() == "bound"
        first = subprocess.Popen([sys.executable, "-c", KILLED_TRAINER, endpoint], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True)
        assert first.stdout is not None
        assert first.stdout.readline().split() == ["CommitLoading", "7"]  # the load began, for its step 7
        first.kill()  # SIGKILL while the service loads
        first.wait()
        dealer.connect(endpoint)  # the restarted trainer: its snapshot of step 9 in flight
        send(dealer, CheckpointSetup(os.getpid(), "model.ckpt", None, 5, None, 8, None, 9))
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                got.append(recv_message(dealer, 100).msg)
            except ReceiveTimeout:
                if service.poll() is not None:
                    break
        out, err = service.communicate(timeout=60)
    finally:
        dealer.close(0)
        for p in [service, *burn, *([first] if first is not None else [])]:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert service.returncode == 0, err[-3000:]
    said = json.loads(out.strip().splitlines()[-1])
    assert float(said["secs"]) > 3, said  # (at load the import outlasts the restart by seconds)
    assert [m for m in got if isinstance(m, CommitLoading) and m.step == 9 and m.what == "TensorFlow"], (got, said)
