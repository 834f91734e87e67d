"""The sockets of a run are its user's alone, and each has a bound on the frames it takes.

The slow test looks at a live run from outside: its runtime directory is 0700 and every socket
file 0600, both owned by the user who launched it; a forked child that drops to ``nobody``
(tests run as root) can neither list the directory nor connect to any socket (``EACCES``, also
with the directory opened up to 0755, which leaves the socket files' own mode as the only
guard), and what it sends through ZeroMQ never arrives: every receiver's rejection count stays
where it was, the same processes live, and training goes on. The fast tests check the pieces:
:func:`bind_private`, ``MAXMSGSIZE`` on :func:`make_socket`'s sockets, the frame limits against
the trainer's own bounds, and :class:`Rejections`' log lines.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import socket
import stat
import time
from typing import Any

import pytest
import zmq

from conftest import finish, launch, quiet_env, raw_status, runtime_dir, wait_for
from procsv.ipc.codec import ProtocolError, RejectReason, SchemaMismatch
from procsv.ipc.rejections import Rejections
from procsv.ipc.transport import (CHECKPOINT_FRAME_MAX, CONTROL_FRAME_MAX, SUMMARY_FRAME_MAX, Endpoints, bind_private,
                                  make_socket)
from procsv.trainer.summaries.buffer import ITEM_BYTES_MAX

NOBODY = 65534
ROLES = ("watchdog", "checkpoint", "summary")

# ----------------------------------------------------------------------------- pieces


def test_bind_private_makes_the_socket_file_0600_and_refuses_tcp(tmp_path):
    ctx = zmq.Context()
    try:
        sock = make_socket(ctx, zmq.ROUTER)
        bind_private(sock, Endpoints(str(tmp_path)).checkpoint)
        assert stat.S_IMODE(os.stat(tmp_path / "checkpoint.sock").st_mode) == 0o600
        other = make_socket(ctx, zmq.ROUTER)
        with pytest.raises(ValueError, match="ipc://"):
            bind_private(other, "tcp://127.0.0.1:0")
        sock.close(0)
        other.close(0)
    finally:
        ctx.term()


def test_every_socket_has_a_frame_limit_and_a_larger_frame_never_arrives(tmp_path):
    ctx = zmq.Context()
    try:
        assert make_socket(ctx, zmq.PULL).getsockopt(zmq.MAXMSGSIZE) == CONTROL_FRAME_MAX
        router = make_socket(ctx, zmq.ROUTER, max_frame=1000)
        bind_private(router, Endpoints(str(tmp_path)).summary)
        big = make_socket(ctx, zmq.DEALER)
        big.connect(Endpoints(str(tmp_path)).summary)
        big.send_multipart([b"x" * 1001])
        small = make_socket(ctx, zmq.DEALER)
        small.connect(Endpoints(str(tmp_path)).summary)
        small.send_multipart([b"y" * 1000, b"z" * 1000])  # the limit is per frame
        assert router.poll(2000)
        assert [bytes(f) for f in router.recv_multipart()[1:]] == [b"y" * 1000, b"z" * 1000]
        assert not router.poll(300)  # the 1001-byte frame was dropped with its connection
        for s in (router, big, small):
            s.close(0)
    finally:
        ctx.term()


def test_the_frame_limits_fit_the_largest_legitimate_frames():
    assert SUMMARY_FRAME_MAX > ITEM_BYTES_MAX  # the trainer keeps no summary payload above this
    assert CHECKPOINT_FRAME_MAX >= 2 << 30  # protobuf's limit for one serialized (variant) tensor
    assert CONTROL_FRAME_MAX >= 1 << 20


def test_a_snapshot_frame_above_the_checkpoint_socket_limit_is_refused_by_the_trainer(monkeypatch):
    import tensorflow as tf

    from procsv.common.errors import UnsupportedState
    from procsv.trainer.checkpoint import snapshot

    ckpt = tf.train.Checkpoint(w=tf.Variable(tf.zeros([64, 64])))
    _ = ckpt.save_counter
    monkeypatch.setattr(snapshot, "CHECKPOINT_FRAME_MAX", 1000)
    with pytest.raises(UnsupportedState, match="w/.ATTRIBUTES/VARIABLE_VALUE: 16384 bytes in one frame"):
        snapshot.take(ckpt, lambda nbytes: None)  # no shared memory: numeric tensors travel as frames


def test_rejections_are_counted_by_reason_and_said_once_per_reason():
    lines: list[str] = []
    r = Rejections("procsv summary", ".procsv/summary_stats.json", lines.append)
    for _ in range(1000):
        r.count(SchemaMismatch(3))
        r.count(ProtocolError("header is not JSON", RejectReason.NOT_JSON))
    r.count(SchemaMismatch(None))
    assert r.record() == {"total": 2001, "by_reason": {"not_json": 1000, "schema_version": 1001}}
    assert len(lines) == 2
    assert [line for line in lines if "schema version" in line] == [
        "procsv summary: refusing messages with schema version 3; this procsv speaks schema version 2: a process "
        "of another procsv release is talking to this run (said once; every such message is counted in "
        ".procsv/summary_stats.json)"]


# ----------------------------------------------------------------------------- a live run


def _as_nobody(runtime: str) -> dict[str, Any]:
    """In a forked child that dropped to nobody: try to list ``runtime``, connect to each socket
    (plain AF_UNIX) and send a malformed message to each through ZeroMQ; report what happened."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        code = 0
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            out: dict[str, Any] = {"uid": os.getuid(), "euid": os.geteuid()}
            try:
                os.listdir(runtime)
                out["listdir"] = 0
            except OSError as exc:
                out["listdir"] = exc.errno
            for role in ROLES:
                path = os.path.join(runtime, f"{role}.sock")
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                try:
                    s.connect(path)
                    out[f"connect:{role}"] = 0
                except OSError as exc:
                    out[f"connect:{role}"] = exc.errno
                finally:
                    s.close()
            ctx = zmq.Context()
            for role in ROLES:
                z = ctx.socket(zmq.PUSH if role == "watchdog" else zmq.DEALER)
                z.setsockopt(zmq.LINGER, 500)
                z.setsockopt(zmq.SNDTIMEO, 1000)
                z.connect(getattr(Endpoints(runtime), role))
                try:
                    z.send_multipart([b"\xffnot a message"])
                    out[f"zmq:{role}"] = "queued"  # it may sit in a queue that never connects
                except zmq.Again:
                    out[f"zmq:{role}"] = "no peer"
                z.close()
            ctx.term()
            os.write(w, json.dumps(out).encode())
        except BaseException as exc:  # noqa: BLE001 -- report anything, then leave without pytest's cleanup
            os.write(w, json.dumps({"error": repr(exc)}).encode())
            code = 1
        finally:
            os._exit(code)
    os.close(w)
    data = b""
    while chunk := os.read(r, 65536):
        data += chunk
    os.close(r)
    os.waitpid(pid, 0)
    return json.loads(data)


def _rejected(logdir: str) -> dict[str, int]:
    totals = {"watchdog": ((raw_status(logdir) or {}).get("rejected") or {}).get("total", -1)}
    for role in ("checkpoint", "summary"):
        try:
            with open(os.path.join(logdir, ".procsv", f"{role}_stats.json")) as fh:
                totals[role] = json.load(fh)["rejected"]["total"]
        except (OSError, ValueError, KeyError):
            totals[role] = -1
    return totals


def _pids(logdir: str) -> dict[str, int]:
    return {p["role"]: p["pid"] for p in (raw_status(logdir) or {}).get("processes", [])}


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to drop to another user")
def test_another_user_cannot_reach_any_socket_of_a_live_run(logdir):
    import psutil

    # (steps of 20 ms, not 2: the test waits on its own probes, not on steps; each step is CPU of the trainer and
    # the services, and 50 of them still show training went on)
    proc = launch(logdir, "--steps", "1000000", "--step-delay", "0.02", opts=("--quiet", "--standby", "fork"),
                  env=quiet_env(TMPDIR="/tmp"))  # /tmp is world-searchable: the runtime dir is the guard
    try:
        wait_for(lambda: (raw_status(logdir) or {}).get("step", 0) > 0, 90, what="the first step")
        wait_for(lambda: min(_rejected(logdir).values()) >= 0, 30, what="every stats file")
        pids = _pids(logdir)
        runtime = runtime_dir(pids["checkpoint"])
        st = os.stat(runtime)
        assert stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == os.geteuid()
        assert os.path.dirname(runtime) == "/tmp"
        for role in ROLES:
            sst = os.stat(os.path.join(runtime, f"{role}.sock"))
            assert stat.S_ISSOCK(sst.st_mode) and stat.S_IMODE(sst.st_mode) == 0o600 and sst.st_uid == os.geteuid()
        before = _rejected(logdir)
        step_before = raw_status(logdir)["step"]

        got = _as_nobody(runtime)
        assert got.get("uid") == NOBODY and got.get("euid") == NOBODY, got
        assert got["listdir"] == errno.EACCES
        for role in ROLES:
            assert got[f"connect:{role}"] == errno.EACCES, (role, got)

        os.chmod(runtime, 0o755)  # a directory opened up by mistake: the socket files still refuse
        try:
            opened = _as_nobody(runtime)
        finally:
            os.chmod(runtime, 0o700)
        assert opened["listdir"] == 0
        for role in ROLES:
            assert opened[f"connect:{role}"] == errno.EACCES, (role, opened)

        # nothing arrived: the counts would have grown by one per send; training went on
        wait_for(lambda: raw_status(logdir)["step"] > step_before + 50, 60, what="more steps")
        time.sleep(1.5)  # the stats files are rewritten at most every second
        assert _rejected(logdir) == before
        assert _pids(logdir) == pids
        assert all(psutil.pid_exists(p) for p in pids.values())
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
        code, out, err = finish(proc, timeout=120)
    assert code == 128 + signal.SIGTERM, err[-3000:]
    print(f"as nobody: {got}; with the directory 0755: {opened}")


def test_procsv_status_gathers_each_process_rejections(tmp_path):
    from procsv.common.layout import Layout, write_json
    from procsv.status import read_status, render

    layout = Layout(str(tmp_path / "run"))
    layout.create()
    write_json(layout.status, {"state": "running", "step": 3, "processes": [],
                               "rejected": {"total": 2, "by_reason": {"not_json": 2}}})
    write_json(layout.checkpoint_stats, {"pid": 1, "rejected": {"total": 5, "by_reason": {"schema_version": 5}}})
    status = read_status(layout)
    assert status is not None
    assert status["rejected"] == {"watchdog": {"total": 2, "by_reason": {"not_json": 2}},
                                  "checkpoint": {"total": 5, "by_reason": {"schema_version": 5}},
                                  "summary": None}  # no stats file yet
    assert "messages refused (malformed or foreign): watchdog 2, checkpoint 5" in render(status, layout.logdir)
