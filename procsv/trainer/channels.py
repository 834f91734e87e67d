"""The trainer's three ZeroMQ connections, all owned by the trainer's main thread.

Runs in the trainer. Nothing here ever blocks the training loop: sends are non-blocking (a full
queue returns False and the caller counts a drop), and the checkpoint socket is polled with a
zero timeout at step boundaries. The one exception is :meth:`wait_save_result`, used at the end
of training, which waits with a deadline for the final checkpoint to commit.
"""

from __future__ import annotations

import os
import time
from typing import Any, Optional, Sequence

import zmq

from procsv.ipc.codec import ProtocolError, decode
from procsv.ipc.messages import CheckpointSetup, Message, SaveData, SaveResult
from procsv.ipc.transport import Endpoints, make_socket, send


class TrainerChannels:
    def __init__(self, endpoints: Endpoints, supervised: bool) -> None:
        self.zctx = zmq.Context()
        ident = f"trainer-{os.getpid()}".encode()
        self.ckpt = make_socket(self.zctx, zmq.DEALER, sndhwm=4, identity=ident, linger_ms=0)
        self.ckpt.connect(endpoints.checkpoint)
        self.summary = make_socket(self.zctx, zmq.PUSH, sndhwm=256, linger_ms=3000)
        self.summary.connect(endpoints.summary)
        self.watchdog: Optional[zmq.Socket] = None
        if supervised:
            self.watchdog = make_socket(self.zctx, zmq.PUSH, sndhwm=1000, linger_ms=1000)
            self.watchdog.connect(endpoints.watchdog)

    def to_watchdog(self, msg: Message) -> bool:
        return self.watchdog is not None and send(self.watchdog, msg)

    def to_summary(self, msg: Message, payload: Sequence[Any] = ()) -> bool:
        return send(self.summary, msg, payload)

    def setup(self, msg: CheckpointSetup) -> None:
        send(self.ckpt, msg)

    def send_snapshot(self, msg: SaveData, frames: Sequence[Any]) -> bool:
        return send(self.ckpt, msg, frames)

    def poll_checkpoint(self) -> list[Message]:
        """Every message the checkpoint service has sent, without waiting."""
        out: list[Message] = []
        while self.ckpt.poll(0, zmq.POLLIN):
            try:
                msg, _ = decode(self.ckpt.recv_multipart(copy=False))
            except ProtocolError:
                continue
            out.append(msg)
        return out

    def wait_save_result(self, step: int, deadline: float) -> tuple[Optional[SaveResult], list[Message]]:
        """Wait until ``deadline`` (monotonic) for the result of the save at ``step``."""
        others: list[Message] = []
        while True:
            left_ms = int((deadline - time.monotonic()) * 1000)
            if left_ms <= 0 or not self.ckpt.poll(min(left_ms, 200), zmq.POLLIN):
                if time.monotonic() >= deadline:
                    return None, others
                continue
            try:
                msg, _ = decode(self.ckpt.recv_multipart(copy=False))
            except ProtocolError:
                continue
            if isinstance(msg, SaveResult) and msg.step == step:
                return msg, others
            others.append(msg)

    def close(self) -> None:
        for sock in (self.ckpt, self.summary, self.watchdog):
            if sock is not None:
                sock.close()
        self.zctx.term()
