"""A node agent's stop signal is left to node 0 while connected (pure: procsv.watchdog.multihost.agentstop)."""

from __future__ import annotations

import signal

from procsv.watchdog.multihost.agentstop import StopRequest

TERM, INT = int(signal.SIGTERM), int(signal.SIGINT)


def test_a_connected_agent_leaves_sigterm_to_node_0_and_says_so_once_even_when_it_comes_twice():
    stop = StopRequest(limit=60)
    stops = [TERM]
    assert stop.decide(stops, 100.0, connected=True) is None and stops == []
    assert (stop.signum, stop.news) == (TERM, True)
    assert stop.line() == ("SIGTERM received: node 0 stops the job in order (this host's trainers stop when it says "
                           "so; on their own if node 0 is silent or after 60 s)")
    stop.news = False
    assert stop.decide([TERM], 101.0, connected=True) is None  # Slurm's and srun's: the same request
    assert not stop.news
    assert stop.decide([], 160.0, connected=True) is None
    assert stop.decide([], 160.5, connected=True) == 128 + TERM  # node 0 never stopped the job: on its own


def test_an_agent_not_connected_or_losing_node_0_stops_at_once():
    assert StopRequest(60).decide([TERM], 0.0, connected=False) == 128 + TERM
    stop = StopRequest(60)
    assert stop.decide([INT], 0.0, connected=True) is None
    assert stop.decide([], 5.0, connected=False) == 128 + INT  # node 0 went silent meanwhile


def test_a_second_interrupt_stops_the_agent_now():
    stop = StopRequest(60)
    assert stop.decide([INT], 0.0, connected=True) is None
    assert stop.decide([INT], 1.0, connected=True) == 128 + INT


def test_no_signal_no_stop():
    assert StopRequest(60).decide([], 0.0, connected=True) is None


def test_take_says_a_new_request_once():
    said: list[str] = []
    stop = StopRequest(60)
    assert stop.take([TERM], 0.0, True, said.append) is None
    assert stop.take([TERM], 1.0, True, said.append) is None
    assert said == [stop.line()]
