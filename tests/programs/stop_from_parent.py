"""A service's stop handling without the service: the stop signals blocked from the start (as the
services' bootstrap does), then a :class:`StopWake` that obeys only this process's parent, or
anyone once the parent is gone. Prints ``ready`` once waiting and ``stopped <signum>`` at the end."""

from __future__ import annotations

import sys

from procsv.common import stopfrom

stopfrom.block()  # before zmq makes its threads

import zmq  # noqa: E402

from procsv.common.bootstrap import read_config  # noqa: E402
from procsv.common.stopwake import StopWake  # noqa: E402


def main() -> int:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PULL)
    sock.bind("inproc://stop-from-parent")
    stops: list[int] = []
    wake = StopWake(sock, stops.append, stopfrom.Authority.parent("the parent", read_config().parent_pid), "stop_from_parent")
    print("ready", flush=True)
    while not stops:
        wake.wait(60_000)
    wake.close()
    sock.close(0)
    ctx.term()
    print(f"stopped {stops[0]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
