"""A restarted checkpoint service applies only the trainer's own retention settings, never defaults.

The slow test runs the real checkpoint service as a child process (SIGKILLed and restarted, as
the watchdog would) while this process plays the trainer with a real TensorFlow checkpoint and a
DEALER socket named like the trainer's. The pure tests check the settings file's parsing.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from typing import Any, Optional

import pytest
import zmq

from conftest import committed_steps, wait_for
from procsv.ipc.codec import ProtocolError
from procsv.ipc.messages import CheckpointSetup, SaveData, SaveReason, SaveResult
from procsv.ipc.transport import Endpoints, drain, make_socket, send
from procsv.common import spawn
from procsv.common.layout import Layout, read_json
from procsv.services.checkpoint.settings import CheckpointSettings
from procsv.trainer.checkpoint.snapshot import take

MAX_TO_KEEP = 1000  # the user's setting; the service's old default was 5


class Trainer:
    """This process as the trainer: a TF checkpoint, snapshots as frames, the trainer's DEALER."""

    def __init__(self, tmp_path: Any, logdir: str) -> None:
        import tensorflow as tf

        self.logdir = logdir
        self.layout = Layout(logdir)
        self.layout.create()
        self.runtime = str(tmp_path / "rt")
        os.makedirs(self.runtime, mode=0o700)
        self.endpoints = Endpoints(self.runtime)
        self.attempt = 0
        self.service: Optional[subprocess.Popen[bytes]] = None
        self.var = tf.Variable(tf.zeros([16, 8]))
        self.ckpt = tf.train.Checkpoint(w=self.var)
        _ = self.ckpt.save_counter
        self.zctx = zmq.Context()
        self.sock = make_socket(self.zctx, zmq.DEALER, sndhwm=4, identity=f"trainer-{os.getpid()}".encode(),
                                linger_ms=0)
        self.sock.connect(self.endpoints.checkpoint)

    def start_service(self) -> None:
        self.attempt += 1
        env = spawn.child_env(role="checkpoint", attempt=self.attempt, logdir=self.logdir,
                              runtime_dir=self.runtime, supervised=False)
        self.service = spawn.spawn(spawn.service_argv("checkpoint"), env, self.log_path())

    def log_path(self) -> str:
        return os.path.join(self.logdir, "logs", f"checkpoint.{self.attempt}.log")

    def log(self) -> str:
        try:
            with open(self.log_path()) as fh:
                return fh.read()
        except FileNotFoundError:
            return ""

    def kill_service(self) -> None:
        assert self.service is not None
        self.service.send_signal(signal.SIGKILL)
        self.service.wait(timeout=30)

    def setup(self, step: int, in_flight: Optional[int]) -> None:
        send(self.sock, CheckpointSetup(os.getpid(), "model.ckpt", None, MAX_TO_KEEP, None, step, None, in_flight))

    def snapshot(self, step: int) -> None:
        self.var.assign(self.var + 1.0)
        self.ckpt.save_counter.assign_add(1)
        snap = take(self.ckpt, lambda n: None)  # no shared memory: every tensor travels as a frame
        assert send(self.sock, SaveData(step, SaveReason.PERIODIC, "model.ckpt", snap.specs, None), snap.frames)

    def results(self, timeout: float) -> list[SaveResult]:
        return [r.msg for r in drain(self.sock, first_timeout_ms=int(timeout * 1000))
                if not isinstance(r, ProtocolError) and isinstance(r.msg, SaveResult)]

    def wait_result(self, step: int, timeout: float, heartbeat: bool = False) -> SaveResult:
        """The result for ``step``; with ``heartbeat``, a setup naming it in flight every 2 s meanwhile,
        as the trainer sends."""
        deadline = time.monotonic() + timeout
        next_beat = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            for res in self.results(0.2):
                if res.step == step:
                    return res
            if heartbeat and time.monotonic() >= next_beat:
                self.setup(step, in_flight=step)
                next_beat += 2.0
        raise AssertionError(f"no SaveResult for step {step} in {timeout} s\n{self.log()}")

    def close(self) -> None:
        self.sock.close()
        self.zctx.term()
        if self.service is not None and self.service.poll() is None:
            self.service.send_signal(signal.SIGTERM)
            try:
                self.service.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.service.kill()
                self.service.wait()


@pytest.mark.slow
def test_a_restarted_service_never_applies_default_retention(tmp_path, logdir):
    t = Trainer(tmp_path, logdir)
    try:
        t.start_service()
        t.setup(0, None)
        for step in range(1, 8):
            t.snapshot(step)
            assert t.wait_result(step, 120).ok, t.log()
        assert committed_steps(logdir) == list(range(1, 8))
        assert (read_json(t.layout.checkpoint_settings) or {}).get("max_to_keep") == MAX_TO_KEEP

        # SIGKILL; the restarted service gets a snapshot before any setup (the trainer's DEALER
        # delivers what it queued while the service was down)
        t.kill_service()
        t.start_service()
        t.snapshot(8)
        res = t.wait_result(8, 120, heartbeat=True)
        assert res.ok, t.log()
        assert committed_steps(logdir) == list(range(1, 9)), t.log()  # the persisted settings applied

        # again, without the settings file: the snapshot waits, uncommitted, for the trainer's settings
        t.kill_service()
        os.unlink(t.layout.checkpoint_settings)
        t.start_service()
        t.snapshot(9)
        wait_for(lambda: "holding the snapshot of step 9" in t.log(), 120, what="the service to hold the snapshot")
        assert t.results(0.5) == []
        assert committed_steps(logdir) == list(range(1, 9))
        t.setup(9, in_flight=9)
        assert t.wait_result(9, 60).ok, t.log()
        assert committed_steps(logdir) == list(range(1, 10)), t.log()
        assert (read_json(t.layout.checkpoint_settings) or {}).get("max_to_keep") == MAX_TO_KEEP
    finally:
        t.close()


def test_settings_round_trip_and_identify_their_trainer():
    msg = CheckpointSetup(123, "model.ckpt", 60.0, 1000, 2.5, 7)
    s = CheckpointSettings.from_setup(b"trainer-123", msg)
    from dataclasses import asdict
    assert CheckpointSettings.from_json(asdict(s)) == s
    assert s.of(b"trainer-123") and not s.of(b"trainer-124")
    assert s.max_to_keep == 1000 and s.keep_checkpoint_every_n_hours == 2.5 and s.save_model_secs == 60.0


@pytest.mark.parametrize("obj", [None, [], {}, {"trainer": "aa", "basename": "m", "max_to_keep": True,
                                                    "save_model_secs": None, "keep_checkpoint_every_n_hours": None},
                                 {"trainer": "aa", "basename": "m", "max_to_keep": 3,
                                  "save_model_secs": "60", "keep_checkpoint_every_n_hours": None}])
def test_malformed_settings_are_not_used(obj):
    assert CheckpointSettings.from_json(obj) is None
