"""A restarted trainer's wait for the trainer processes it replaces to be gone, before its program runs.

Runs in the trainer (:mod:`procsv.trainer.__main__`), before the program. The watchdog learns of a trainer's
death from its robust mutex (:mod:`procsv.common.mutex`) while the dying process still tears its memory down:
its files, sockets, ports, locks and device handles are released only after that, 30-100 ms after a SIGKILL for a
process that imported TensorFlow (longer on a loaded machine or for a larger process). The restart is decided and
forked meanwhile; a program that binds a fixed port (its own ``tf.train.Server``), takes a file lock or opens a
device the dead trainer held would find it still taken ("Could not start gRPC server") and the restart fail once.
The watchdog names this host's earlier trainer processes it has not reaped (``ChildConfig.predecessors``); the new
trainer waits on a pidfd of each until it has exited (everything it held released), at most :data:`BOUND` seconds.
"""

from __future__ import annotations

import os
import select
import sys
import time
from typing import Callable

BOUND = 10.0  # seconds: a process stuck in the kernel (uninterruptible I/O) may never end; the program starts then


def wait_gone(pids: tuple[int, ...], bound: float = BOUND, clock: Callable[[], float] = time.monotonic) -> list[int]:
    """Wait until each of ``pids`` has exited (one reaped already is not waited for: it has no pidfd; the kernel hands
    pids out in turn, so one freed is not another process's again within this wait), at most ``bound`` seconds in
    all; the pids still running then, said in one line on stderr."""
    fds: dict[int, int] = {}
    for pid in pids:
        try:
            fds[pid] = os.pidfd_open(pid)
        except OSError:  # gone and reaped already (ESRCH), or no pidfd on this kernel: nothing to wait for
            continue
    end = clock() + bound
    try:
        while fds:
            left = end - clock()
            if left <= 0:
                break
            ready, _, _ = select.select(list(fds.values()), [], [], left)
            for pid in [p for p, fd in fds.items() if fd in ready]:
                os.close(fds.pop(pid))
    finally:
        running = sorted(fds)
        for fd in fds.values():
            os.close(fd)
    if running:
        print(f"procsv: the earlier trainer process(es) {', '.join(map(str, running))} of this host still not gone "
              f"{bound:g} s after their end (stuck in the kernel: uninterruptible I/O?); the program starts now, and "
              f"a port, lock or device they held may still be taken (ps -o pid,stat,wchan -p "
              f"{','.join(map(str, running))})", file=sys.stderr, flush=True)
    return running
