"""StopWake: a stop signal ends a service's ZeroMQ poll at once (the services' loops wait in one)."""

from __future__ import annotations

import os
import signal
import threading
import time

import zmq

from procsv.common.stopwake import StopWake

LONG_MS = 60_000  # a poll this long ends only on the signal (or the message) within the test's time


def _pull(ctx: zmq.Context) -> zmq.Socket:
    sock = ctx.socket(zmq.PULL)
    sock.bind("inproc://stopwake")
    return sock


def test_a_sigterm_ends_the_wait_without_its_timeout_and_reaches_the_handler():
    ctx = zmq.Context()
    sock = _pull(ctx)
    seen: list[int] = []
    wake = StopWake(sock, seen.append)
    try:
        threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGTERM)).start()
        t0 = time.monotonic()
        assert wake.wait(LONG_MS) is False  # woken, but no message
        assert time.monotonic() - t0 < LONG_MS / 2000
        assert seen == [signal.SIGTERM]
    finally:
        wake.close()
        sock.close(0)
        ctx.term()


def test_plain_pyzmq_poll_sits_out_its_whole_timeout_after_a_signal():
    """Why StopWake exists: pyzmq retries a poll a signal interrupted, so a handler that only sets
    a flag is seen when the poll times out (here 1.5 s, the signal at 0.1 s)."""
    ctx = zmq.Context()
    sock = _pull(ctx)
    seen: list[int] = []
    old = signal.signal(signal.SIGTERM, lambda signum, frame: seen.append(signum))
    try:
        threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGTERM)).start()
        t0 = time.monotonic()
        assert sock.poll(1500, zmq.POLLIN) == 0
        assert time.monotonic() - t0 >= 1.5
        assert seen == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, old)
        sock.close(0)
        ctx.term()


def test_a_waiting_message_is_reported_and_close_puts_the_handlers_back():
    ctx = zmq.Context()
    sock = _pull(ctx)
    push = ctx.socket(zmq.PUSH)
    push.connect("inproc://stopwake")
    before = signal.getsignal(signal.SIGTERM)
    wake = StopWake(sock, lambda signum: None)
    try:
        push.send(b"x")
        assert wake.wait(LONG_MS) is True
        assert sock.recv() == b"x"
        assert wake.wait(0) is False
    finally:
        wake.close()
        push.close(0)
        sock.close(0)
        ctx.term()
    assert signal.getsignal(signal.SIGTERM) is before
    assert signal.set_wakeup_fd(-1) == -1  # no wakeup fd left behind
