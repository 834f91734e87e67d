"""procsv.ipc.transport: bounded receives, drains, routed messages; NoReply for a request without a reply."""

from __future__ import annotations

import time

import pytest
import zmq

from procsv.ipc import pipe
from procsv.ipc.codec import ProtocolError, encode
from procsv.ipc.messages import Progress, ProtoRef, SaveReason, SaveResult, SummaryAck, SummaryBatch
from procsv.ipc.transport import (Endpoints, NoReply, ReceiveTimeout, Received, drain, make_socket, recv,
                                  recv_message, send)
from procsv.trainer.channels import TrainerChannels, read_summary_acks


@pytest.fixture
def pair(tmp_path):
    ctx = zmq.Context()
    router = make_socket(ctx, zmq.ROUTER)
    router.bind(Endpoints(str(tmp_path)).summary)
    dealer = make_socket(ctx, zmq.DEALER)
    dealer.connect(Endpoints(str(tmp_path)).summary)
    yield router, dealer
    router.close()
    dealer.close()
    ctx.term()


def test_recv_with_a_zero_timeout_raises_at_once_when_nothing_waits(pair):
    router, _ = pair
    t0 = time.monotonic()
    with pytest.raises(ReceiveTimeout):
        recv(router, 0)
    with pytest.raises(ReceiveTimeout):
        recv(router, 50)
    assert time.monotonic() - t0 < 2.0


def test_a_routed_message_names_its_sender_and_the_reply_reaches_it(pair):
    router, dealer = pair
    batch = SummaryBatch(protos=[ProtoRef(1, 2.0)])
    send(dealer, batch, [b"payload"])
    got = recv_message(router, 2000, routed=True)
    assert got.msg == batch and [bytes(f) for f in got.payload] == [b"payload"]
    assert got.identity
    send(router, SummaryAck("s", 4, 0), prefix=[got.identity])
    assert read_summary_acks(dealer, 2.0) == [SummaryAck("s", 4, 0)]


def test_drain_yields_what_waits_and_malformed_messages_as_errors(pair):
    router, dealer = pair
    send(dealer, SummaryAck("a", 1))
    dealer.send_multipart([b"not json"])
    send(dealer, SummaryAck("b", 2))
    got: list = []
    deadline = time.monotonic() + 10
    while len(got) < 3 and time.monotonic() < deadline:  # a drain yields what has arrived: maybe not all three yet
        got += drain(router, first_timeout_ms=500, routed=True)
    assert len(got) == 3
    assert isinstance(got[0], Received) and got[0].msg == SummaryAck("a", 1)
    assert isinstance(got[1], ProtocolError)
    assert isinstance(got[2], Received) and got[2].msg == SummaryAck("b", 2)
    assert list(drain(router, routed=True)) == []


def test_drain_stops_at_its_limit(pair):
    router, dealer = pair
    for i in range(5):
        send(dealer, SummaryAck("a", i))
    time.sleep(0.2)
    assert len(list(drain(router, first_timeout_ms=1000, limit=2, routed=True))) == 2
    assert len(list(drain(router, first_timeout_ms=1000, routed=True))) == 3


def test_read_summary_acks_keeps_only_acks(pair):
    router, dealer = pair
    send(dealer, SummaryAck("a", 1))
    ident = recv_message(router, 2000, routed=True).identity
    assert ident is not None
    send(router, Progress(1, 2, 3.0), prefix=[ident])
    router.send_multipart([ident, b"garbage"])
    send(router, SummaryAck("a", 1), prefix=[ident])
    got: list = []
    deadline = time.monotonic() + 10
    while not got and time.monotonic() < deadline:  # a call returns what has arrived: maybe not all three yet
        got = read_summary_acks(dealer, 0.5)
    assert got == [SummaryAck("a", 1)]  # the progress and the garbage before it were dropped


class StepClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        self.now += 0.05
        return self.now


def test_a_save_result_that_never_comes_raises_no_reply(tmp_path):
    clock = StepClock()
    ch = TrainerChannels(Endpoints(str(tmp_path)), supervised=False, clock=clock)  # nobody is listening
    try:
        with pytest.raises(NoReply, match="step 7"):
            ch.wait_save_result(7, clock.now + 0.3)
    finally:
        ch.close()


def test_wait_save_result_returns_the_result_for_its_step(tmp_path):
    ctx = zmq.Context()
    router = make_socket(ctx, zmq.ROUTER)
    router.bind(Endpoints(str(tmp_path)).checkpoint)
    ch = TrainerChannels(Endpoints(str(tmp_path)), supervised=False)
    try:
        ch.ckpt.send_multipart(encode(Progress(1, 1, 1.0)))  # any message, so the router learns the dealer
        ident = recv_message(router, 2000, routed=True).identity
        assert ident is not None
        other = SaveResult(5, SaveReason.PERIODIC, True, "/x-5", None, 0.1)
        mine = SaveResult(7, SaveReason.FINAL, True, "/x-7", None, 0.2)
        send(router, other, prefix=[ident])
        send(router, mine, prefix=[ident])
        assert ch.wait_save_result(7, time.monotonic() + 10) == mine
    finally:
        ch.close()
        router.close()
        ctx.term()


def test_pipe_messages_round_trip_and_eof_is_reported():
    import os

    from procsv.ipc.messages import ForkReply, ZygoteReady

    r, w = os.pipe()
    reader = pipe.FramedReader(r)
    assert reader.read_available() == []
    pipe.write_framed(w, ForkReply(attempt=2, pid=1234))
    pipe.write_framed(w, ZygoteReady(pid=1234, import_secs=4.5))
    assert reader.wait(2.0)
    assert reader.read_available() == [ForkReply(attempt=2, pid=1234), ZygoteReady(pid=1234, import_secs=4.5)]
    os.close(w)
    with pytest.raises(EOFError):
        reader.read_available()
    os.close(r)
