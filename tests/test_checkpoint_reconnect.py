"""A trainer that reconnects to the checkpoint service is heard at once, and a session it starts
again in the same process (TF's "retry on preemption" loop) never inherits the in-memory snapshot
of the session it left.

CI once saw a retry loop lose every checkpoint after its abort: the trainer's new connection
reused its process-wide ZeroMQ identity while the service's ROUTER still held the old one, and a
ROUTER rejects such a peer for good, so its snapshots went nowhere and the run "succeeded" with
its final checkpoint never committed. The slow tests run the real checkpoint service; the first
recreates that race by stopping the service (SIGSTOP) across the reconnect.
"""

from __future__ import annotations

import os
import signal

import pytest
import zmq

from conftest import finish, launch, quiet_env, status_json
from procsv.ipc.transport import make_socket
from test_checkpoint_settings import Trainer

pytestmark = pytest.mark.slow


def test_a_reconnect_under_the_identity_the_service_still_holds_is_heard(tmp_path):
    logdir = str(tmp_path / "run")
    trainer = Trainer(tmp_path, logdir)
    try:
        trainer.start_service()
        trainer.setup(0, None)
        trainer.snapshot(1)
        assert trainer.wait_result(1, 60).ok
        assert trainer.service is not None
        os.kill(trainer.service.pid, signal.SIGSTOP)  # the service's ROUTER sees both connections at once
        try:
            trainer.snapshot(2)  # queued on the old connection, then dropped with it
            identity = trainer.sock.getsockopt(zmq.IDENTITY)
            trainer.sock.close()
            trainer.sock = make_socket(trainer.zctx, zmq.DEALER, sndhwm=4, identity=identity, linger_ms=0)
            trainer.sock.connect(trainer.endpoints.checkpoint)
            trainer.setup(1, None)
            trainer.snapshot(3)
        finally:
            os.kill(trainer.service.pid, signal.SIGCONT)
        result = trainer.wait_result(3, 30)
        assert result.ok and result.step == 3
    finally:
        trainer.close()


def test_a_retried_session_drops_the_snapshot_it_left_and_commits_its_final_checkpoint(logdir):
    # in-memory snapshots up to a fifth of the loop's time: the 40 steps between the commit of step
    # 150 and the abort at 190 hand the service several, the newest held when the session ends
    proc = launch(logdir, "--mode", "retry", "--steps", "300", "--save-checkpoint-steps", "50", "--step-delay",
                  "0.01", "--abort-at-step", "190", target="procsv.examples.supervised", opts=("--standby", "fork"),
                  env=quiet_env(PROCSV_MEMORY_SNAPSHOTS="0.2"))  # (no restart: no hot standby)
    code, out, err = finish(proc)
    assert code == 0, err
    assert "supervised: aborted at step 190; retrying" in out
    assert "supervised: finished at step 300" in out and "final checkpoint committed at step 300" in out
    with open(os.path.join(logdir, "logs", "checkpoint.1.log")) as fh:
        service_log = fh.read()
    # the in-memory snapshot the aborted session handed over (a step past 150) is dropped when the
    # same process restores step 150 in its new session, and never becomes a checkpoint later
    assert "started a new session" in service_log, service_log
    assert "persisting its in-memory snapshot" not in service_log, service_log
    assert "no answer from the checkpoint service" not in err
    import tensorflow as tf

    assert tf.train.latest_checkpoint(logdir) == os.path.join(logdir, "model.ckpt-300")
    st = status_json(logdir)
    assert st is not None and st["step"] == 300 and st["state"] == "succeeded"
