"""Helpers shared by the tests of a group over two hosts (``test_hosts_group_tier``,
``test_hosts_group_replica``): node 0's launch and node 1's agent of one job, started by hand or
around the body of a ``with`` that ends with both exiting 0. The hosts themselves (network
namespaces on a veth bridge) and node 1's agent are tests/test_hosts.py's."""

from __future__ import annotations

import contextlib
import os
from typing import Any, Iterator

from conftest import PROGRAMS, finish, launch
from test_hosts import agent, master_addr


def two_hosts(logdir: str, *args: str, env: dict[str, str] | None = None,
              nproc: int = 1, agent_env: dict[str, str] | None = None,
              target: str = "procsv.examples.digits", opts: tuple[str, ...] = ()) -> tuple[Any, Any, str]:
    """Node 0's launch (``env``) and node 1's agent (``agent_env``) of one job (``--nproc N --nnodes 2``:
    N members a host; with N = 1 worker1 on node 1); ``opts``: both launches' options besides."""
    addr = master_addr()
    per_host = ("--nproc", str(nproc), *opts)
    opts = (*per_host, "--nnodes", "2", "--master-addr", addr, "--node-timeout", "4", "--group-grace-secs", "0")
    master = launch(logdir, *args, opts=opts, env=env, target=target)
    return master, agent(logdir, addr, *args, opts=per_host, env=agent_env, target=target), addr


def paced(tmp_path: Any) -> tuple[str, tuple[str, ...]]:
    """For ``target=PACED`` (tests/programs/paced.py: digits whose ``--step-delay`` ends once a file
    exists): the file, and the program arguments that name it."""
    gate = str(tmp_path / "fast")
    return gate, ("--fast-after", gate)


def unpace(gate: str) -> None:
    """A paced run's steps left run at once (the events the pacing waited for happened, or the test failed)."""
    with open(gate, "a"):
        pass


PACED = os.path.join(PROGRAMS, "paced.py")


@contextlib.contextmanager
def two_hosts_ending_well(logdir: str, *args: str, env: dict[str, str] | None = None,
                          nproc: int = 1, agent_env: dict[str, str] | None = None,
                          target: str = "procsv.examples.digits", gate: str | None = None) -> Iterator[None]:
    """:func:`two_hosts` around the body of a ``with``; then node 0's launch and node 1's agent end,
    both with exit code 0 (a body that raised: node 0's launch ended, its error raised). With ``gate``
    (a paced run's file), the steps left after the body run at once."""
    master, first, _ = two_hosts(logdir, *args, env=env, nproc=nproc, agent_env=agent_env, target=target)
    try:
        yield
    finally:
        if gate is not None:
            unpace(gate)
        code, out, err = finish(master)
    acode, aout, aerr = finish(first, timeout=30)
    assert code == 0, err
    assert acode == 0, aerr
