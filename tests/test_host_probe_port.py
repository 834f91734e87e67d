"""Rule 12's probes on real sockets (:mod:`procsv.watchdog.multihost.probes`): a node agent's probe port,
in a process of its own that is SIGSTOPped, and node 0's prober. Plain Python: no TensorFlow, no launch.

The rule's side (when a host is suspected, probed and lost) is ``tests/test_host_loss_pure.py``'s; this is
what the rule assumes of the kernel: a host whose agent is stopped still answers every probe.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time

from procsv.watchdog.multihost.probes import Prober
from procsv.watchdog.rules.hosts import PROBE_EVERY

PORT_CHILD = ("from procsv.watchdog.multihost.probes import ProbePort\nimport time\n"
              "port = ProbePort('127.0.0.1')\nprint(port.address, flush=True)\n"
              "while True:\n    port.take()\n    time.sleep(0.01)\n")


def test_an_agent_stopped_longer_than_its_backlog_of_probes_still_answers_every_probe() -> None:
    """The agent SIGSTOPped (it accepts nothing): 600 probes, 30 s of a suspected host's probes at one every
    ``PROBE_EVERY``, each answered with a handshake by its host's kernel. Before, each probe's connection
    waited in the port's accept queue for the agent to take it: the 129th found the queue full, its SYN was
    dropped, and a stopped (or blocked) agent looked like a silent host 6.5 s into its stop (a false loss
    before --node-timeout 15; at load 21 the SIGSTOPped agent of tests/test_hosts_elastic3.py was found lost
    in 2.69 s, and a plain replay of node 0's rounds found one at 7.6 s of its stop). About 0.3 CPU-s."""
    assert 600 * PROBE_EVERY >= 30.0
    child = subprocess.Popen([sys.executable, "-c", PORT_CHILD], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        address = child.stdout.readline().strip()
        os.kill(child.pid, signal.SIGSTOP)
        prober = Prober(time.monotonic)
        for i in range(600):
            prober.send(1, address)
            socks = [s for s, _ in prober.out[1]]
            select.select([], socks, [], 2.0)
            _, got = prober.answers()
            assert got and all(handshake for _, _, handshake in got), f"probe {i} of a stopped agent unanswered"
        prober.close()
        os.kill(child.pid, signal.SIGCONT)
        assert child.poll() is None  # (its port took what the kernel queued, if anything, and it runs on)
    finally:
        child.kill()
        child.wait()
