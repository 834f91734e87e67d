"""The ``<prefix>.meta`` of a graph program's checkpoint committed from an in-memory snapshot.

The real checkpoint service runs as a child process; this process plays two trainers one after the
other (each a real trainer connection, :class:`TrainerChannels`), whose pids are stand-in processes
the service watches and this test SIGKILLs. The snapshots hold one framed tensor and, when a
trainer sends it, a ``MetaGraphDef`` frame (any bytes: the service writes it as it came). No
TensorFlow here: a graph program's end-to-end run is in tests/test_graph_supervisor.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
from typing import Any, Optional

import numpy as np

import pytest

from conftest import committed_steps, wait_for
from procsv.common import spawn
from procsv.common.layout import Layout, read_json
from procsv.ipc.messages import CheckpointSetup, SaveData, SaveReason, SnapshotHeld, TensorSpec
from procsv.ipc.transport import Endpoints
from procsv.services.checkpoint.memory import KeptMetaGraph, kept_meta_graph, with_kept_meta_graph
from procsv.trainer.channels import TrainerChannels

SPEC = TensorSpec("global_step/.ATTRIBUTES/VARIABLE_VALUE", "int64", [])


def _memory(step: int, meta: bool) -> SaveData:
    return SaveData(step, SaveReason.MEMORY, "model.ckpt", [SPEC], None, 0, False, meta)


def test_the_kept_meta_graph_is_its_trainers_last_and_is_added_only_to_that_trainers_snapshots():
    kept = kept_meta_graph(_memory(5, True), [b"t5", b"graph A"], b"trainer-a", None)
    assert kept == KeptMetaGraph(b"trainer-a", b"graph A")
    assert kept_meta_graph(_memory(9, False), [b"t9"], b"trainer-a", kept) is kept  # one without keeps it
    msg, payload = with_kept_meta_graph(_memory(9, False), [b"t9"], b"trainer-a", kept)
    assert msg == _memory(9, True) and payload == [b"t9", b"graph A"]
    # another trainer's (a restart, perhaps of another graph) snapshot without one stays without
    assert with_kept_meta_graph(_memory(12, False), [b"t12"], b"trainer-b", kept) == (_memory(12, False), [b"t12"])
    # one that carries its own keeps its own, and is not given a second
    assert with_kept_meta_graph(_memory(15, True), [b"t15", b"graph B"], b"trainer-b", kept) == (
        _memory(15, True), [b"t15", b"graph B"])
    assert kept_meta_graph(_memory(15, True), [b"t15", b"graph B"], b"trainer-b", kept) == KeptMetaGraph(
        b"trainer-b", b"graph B")
    assert with_kept_meta_graph(_memory(3, False), [b"t3"], b"trainer-a", None) == (_memory(3, False), [b"t3"])


class _Trainer:
    """One trainer's connection to the service; its pid is a stand-in process (killed to 'die')."""

    def __init__(self, runtime: str) -> None:
        self.life = subprocess.Popen(["sleep", "600"])
        self.ch = TrainerChannels(Endpoints(runtime), supervised=False)

    def setup(self, step: int) -> None:  # max_to_keep=1: retention retires the one before at each commit
        self.ch.setup(CheckpointSetup(self.life.pid, "model.ckpt", None, 1, None, step))

    def hold(self, step: int, meta: Optional[bytes]) -> SnapshotHeld:
        """Send an in-memory snapshot of ``step`` (with ``meta`` as its MetaGraphDef) and wait for its ack."""
        frames: list[Any] = [np.int64(step).tobytes()] + ([meta] if meta is not None else [])
        assert self.ch.send_snapshot(SaveData(step, SaveReason.MEMORY, "model.ckpt", [SPEC], None, 0, False,
                                              meta is not None), frames)
        held: SnapshotHeld = wait_for(lambda: [m for m in self.ch.poll_checkpoint()
                                               if isinstance(m, SnapshotHeld) and m.step == step], 30,
                                      what=f"the service to hold step {step}")[0]
        return held

    def die(self) -> None:
        self.life.send_signal(signal.SIGKILL)
        self.life.wait()

    def close(self) -> None:
        if self.life.poll() is None:
            self.die()
        self.ch.close()


def _metas(logdir: str) -> dict[str, bytes]:
    found = {}
    for name in sorted(os.listdir(logdir)):
        if name.endswith(".meta"):
            with open(os.path.join(logdir, name), "rb") as fh:
                found[name] = fh.read()
    return found


@pytest.mark.slow
def test_a_held_snapshot_sent_without_the_meta_graph_is_committed_with_its_trainers_last_one(short_tmp):
    """A trainer sends its MetaGraphDef with its first in-memory snapshot only; the service says it
    holds it with that one and with the next (sent without); the trainer dies: the committed
    checkpoint of the newest has that trainer's bytes as its ``<prefix>.meta``, named in its
    manifest. A second trainer (a restart, of another graph) is never given the first's: its first
    snapshot, sent without, is held without (so it sends its own), and its commit has its own; the
    first's checkpoint is retired with its ``.meta`` (max_to_keep=1)."""
    logdir, runtime = os.path.join(short_tmp, "run"), os.path.join(short_tmp, "rt")
    os.makedirs(runtime)
    Layout(logdir).create()
    env = spawn.child_env(role="checkpoint", attempt=1, logdir=logdir, runtime_dir=runtime, supervised=False)
    log_path = os.path.join(logdir, "logs", "checkpoint.1.log")
    service = spawn.spawn(spawn.service_argv("checkpoint"), env, log_path)
    trainers: list[_Trainer] = []

    def log() -> str:
        with open(log_path) as fh:
            return fh.read()

    try:
        first = _Trainer(runtime)
        trainers.append(first)
        first.setup(0)
        assert first.hold(5, b"graph of the first trainer").meta_graph
        assert first.hold(9, None).meta_graph  # held with the one sent before
        first.die()
        wait_for(lambda: committed_steps(logdir) == [9], 60, what=f"the held snapshot to commit\n{log()}")
        assert _metas(logdir) == {"model.ckpt-9.meta": b"graph of the first trainer"}
        manifest = read_json(os.path.join(logdir, ".procsv", "checkpoints", "model.ckpt-9.json"))
        assert manifest["reason"] == "memory" and "model.ckpt-9.meta" in manifest["files"]

        second = _Trainer(runtime)
        trainers.append(second)
        second.setup(9)
        assert not second.hold(12, None).meta_graph  # not the first trainer's graph
        assert second.hold(15, b"graph of the second trainer").meta_graph
        assert second.hold(18, None).meta_graph
        second.die()
        wait_for(lambda: committed_steps(logdir) == [18], 60, what=f"the second commit and the first's retirement\n{log()}")
        # (the retired manifest goes first, its files after it)
        wait_for(lambda: _metas(logdir) == {"model.ckpt-18.meta": b"graph of the second trainer"}, 60,
                 what=f"the retired checkpoint's .meta to be deleted with it\n{log()}")
    finally:
        for trainer in trainers:
            trainer.close()
        service.send_signal(signal.SIGTERM)
        try:
            service.wait(timeout=30)
        except subprocess.TimeoutExpired:
            service.kill()
            service.wait()
