"""A hot-standby trainer's wait: run the program up to restoring, then wait to be promoted.

Runs in the trainer process, in the main thread, inside the first Supervisor's
``prepare_or_wait_for_session`` (or ``managed_session``) when ``PROCSV_STANDBY=1``: the watchdog
forked this process from the zygote while another trainer trains (:mod:`procsv.watchdog.rules.standby`).
By then the program has done everything before that call: its module is imported, its data
loaded, its model and optimizer built, its Supervisor created. The standby tells the watchdog
(:class:`StandbyReady`) and waits for SIGUSR1, with no thread, no socket and no CPU spent (all its
preparation ran at idle CPU priority where that can be undone: :mod:`procsv.trainer.standby.priority`); the
watchdog's SIGTERM ends it at once (exit 0: it has nothing to save). A SIGTERM/SIGINT from anyone
else (Slurm's or systemd's to every process of the job at once) is left to the watchdog while it
lives, so that the run ends as a stop of the watchdog alone ends it: the zygote forks a standby
with the stop signals blocked (:mod:`procsv.common.stopfrom`), and the wait reads them with their
senders; at the promotion they are unblocked, and one still pending reaches the trainer's stop
handlers like any stop of a trainer. Promoted, it goes on exactly as a trainer that
just reached this point: it connects to the services, asks for the dead trainer's in-memory
snapshot, restores, and trains. What the program did before (printing, opening files) it did
when the standby was prepared, not at the promotion.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import time
from typing import Any

import psutil
import zmq

from procsv.common import env, stopfrom
from procsv.common.bootstrap import ChildContext
from procsv.ipc.messages import StandbyReady
from procsv.ipc.transport import make_socket, send
from procsv.trainer import outcome
from procsv.trainer.standby import priority

def is_standby() -> bool:
    return os.environ.get(env.STANDBY) == "1"


def wait_for_promotion(ctx: ChildContext) -> None:
    """Block until SIGUSR1 (promotion); exit 0 on SIGTERM. Afterwards this process is no standby."""
    promoted = False

    def on_promote(signum: int, frame: Any) -> None:
        nonlocal promoted
        promoted = True

    r, w = os.pipe()
    os.set_blocking(w, False)
    old_wakeup = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    old_usr1 = signal.signal(signal.SIGUSR1, on_promote)
    old_term = signal.signal(signal.SIGTERM, lambda signum, frame: os._exit(0))  # unless blocked (below)
    senders = _stop_senders()
    if outcome.early_stop_signal() is not None:
        os._exit(0)  # the run ended while this standby was still getting ready
    if senders is not None:
        _take_stop_signals(*senders)  # one that came while it was getting ready
    prepared = max(0.0, time.time() - psutil.Process().create_time())
    if ctx.supervised:
        zctx: zmq.Context[Any] = zmq.Context()
        sock = make_socket(zctx, zmq.PUSH, linger_ms=1000)
        sock.connect(ctx.endpoints.watchdog)
        send(sock, StandbyReady(os.getpid(), ctx.attempt, prepared))
        sock.close()
        zctx.term()
    print(f"procsv: standby ready after {prepared:.2f} s; waiting to be promoted", flush=True)
    waited = time.monotonic()
    watched = [r] + ([senders[0].fileno()] if senders is not None else [])
    try:
        while not promoted:
            ready, _, _ = select.select(watched, [], [], 5.0)
            if r in ready:
                os.read(r, 512)  # the signal numbers: their handlers have run
            if senders is not None and not promoted and senders[0].fileno() in ready:
                _take_stop_signals(*senders)
    finally:
        signal.set_wakeup_fd(old_wakeup)
        signal.signal(signal.SIGUSR1, old_usr1)
        signal.signal(signal.SIGTERM, old_term)
        os.close(r)
        os.close(w)
        if senders is not None:  # now a trainer: a stop signal still pending goes to its handlers
            senders[0].close()
            stopfrom.unblock()
    os.environ[env.STANDBY] = "0"
    priority.restore()  # back to normal CPU priority, every thread (a no-op if it was never lowered)
    print(f"procsv: promoted from standby (waited {time.monotonic() - waited:.1f} s)", file=sys.stderr, flush=True)


def _stop_senders() -> "tuple[stopfrom.SignalFd, stopfrom.Authority] | None":
    """The stop signals with their senders, when the zygote forked this standby with them blocked;
    the authority is the watchdog, the zygote's parent (the standby dies with the zygote, which dies
    with the watchdog: while the zygote is this process's parent, the watchdog lives)."""
    if not stopfrom.blocked():
        return None  # not forked by a zygote: SIGTERM ends the wait from anyone, as it always did
    zygote = os.getppid()
    try:
        watchdog = psutil.Process(zygote).ppid()
    except psutil.Error:
        watchdog = 0
    sfd = stopfrom.SignalFd.open() if watchdog else None
    if sfd is None:  # no way to read the senders: the handlers take any stop signal again
        stopfrom.unblock()
        return None
    return sfd, stopfrom.Authority(watchdog, "the watchdog", lambda: os.getppid() == zygote)


def _take_stop_signals(sfd: stopfrom.SignalFd, authority: stopfrom.Authority) -> None:
    """Exit 0 on a stop signal the watchdog sent (or anyone's once it is gone); say so for another."""
    for sig in sfd.read():
        if authority.obeys(sig):
            os._exit(0)
        print(authority.left_line("procsv standby", sig), flush=True)
