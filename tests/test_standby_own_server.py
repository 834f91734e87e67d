"""A program that starts its own ``tf.train.Server`` gets no hot standby, said once (issue 67, point 4).

TensorFlow's mnist_replica starts a server on the port its cluster names before its Supervisor; a hot
standby runs the program up to the session, so it started that server again on the port the live trainer
held: TensorFlow's "Could not start gRPC server", five standby deaths in a row (with back-off) before
procsv stopped preparing them. Now the first ends with ``EXIT_NO_STANDBY`` and the watchdog prepares none
for the rest of the run; a SIGKILLed trainer's restart forks from the zygote and the run finishes.
The program holds 1 GiB, as a real trainer holds its weights: the dead trainer's teardown then releases the port
0.2-0.7 s after the restart's fork at load 12, and the restart, forked on the death notice, waits for it (procsv.trainer.ends.predecessors.py;
without that wait the restart failed "Could not start gRPC server" in 3 of 3 runs).
Real processes: a launch, the program's real gRPC server, a real SIGKILL.
"""

from __future__ import annotations

import os
import signal
import socket

import pytest

from conftest import PROGRAMS, finish, launch, lifecycle, wait_for, wait_role_pid

pytestmark = pytest.mark.slow

OWN_SERVER = os.path.join(PROGRAMS, "own_server.py")


def test_a_program_with_its_own_server_gets_no_hot_standby_and_a_killed_trainer_restarts_by_fork(logdir):
    with socket.socket() as s:
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    ended_file = os.path.join(logdir, "at-exit.txt")
    proc = launch(logdir, "--port", str(port), "--steps", "300", "--at-exit", ended_file, "--ballast-mb", "1024",
                  target=OWN_SERVER)
    try:
        wait_for(lambda: [e for e in lifecycle(logdir) if e["event"] == "exited" and e["role"] == "standby"], 120,
                 what="the standby's end")
        os.kill(wait_role_pid(logdir, "trainer"), signal.SIGKILL)
    finally:
        code, out, err = finish(proc, 240)
    assert code == 0, err
    assert "own_server: finished at step 300" in out
    said = out + err
    assert said.count("procsv: no hot standby for this run: the standby trainer") == 1, said
    records = lifecycle(logdir)
    standbys = [e for e in records if e["event"] == "spawned" and e["role"] == "standby"]
    assert len(standbys) == 1, standbys  # before: one after another, five in a row
    ended = [e for e in records if e["event"] == "exited" and e["role"] == "standby"]
    assert [e.get("code") for e in ended] == [7], ended  # EXIT_NO_STANDBY, not a crash
    trainers = [e for e in records if e["event"] == "spawned" and e["role"] == "trainer"]
    assert [e["via"] for e in trainers] == ["zygote", "zygote"], trainers  # the restart forked
    with open(ended_file) as fh:  # the program's atexit ran in the trainer that ended it only: not in the standby
        assert fh.read() == f"atexit {trainers[1]['pid']}\n"  # (whose exit 7 is procsv's), nor the SIGKILLed one
