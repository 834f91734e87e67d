"""Helpers shared by the tests of a group over two hosts (``test_hosts_group_tier``,
``test_hosts_group_replica``): node 0's launch and node 1's agent of one job, started by hand or
around the body of a ``with`` that ends with both exiting 0. The hosts themselves (network
namespaces on a veth bridge) and node 1's agent are tests/test_hosts.py's."""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

from conftest import finish, launch
from test_hosts import agent, master_addr


def two_hosts(logdir: str, *args: str, env: dict[str, str] | None = None,
              nproc: int = 1, agent_env: dict[str, str] | None = None) -> tuple[Any, Any, str]:
    """Node 0's launch (``env``) and node 1's agent (``agent_env``) of one job (``--nproc N --nnodes 2``:
    N members a host; with N = 1 worker1 on node 1)."""
    addr = master_addr()
    per_host = ("--nproc", str(nproc))
    opts = (*per_host, "--nnodes", "2", "--master-addr", addr, "--node-timeout", "4", "--group-grace-secs", "0")
    master = launch(logdir, *args, opts=opts, env=env)
    return master, agent(logdir, addr, *args, opts=per_host, env=agent_env), addr


@contextlib.contextmanager
def two_hosts_ending_well(logdir: str, *args: str, env: dict[str, str] | None = None,
                          nproc: int = 1, agent_env: dict[str, str] | None = None) -> Iterator[None]:
    """:func:`two_hosts` around the body of a ``with``; then node 0's launch and node 1's agent end,
    both with exit code 0 (a body that raised: node 0's launch ended, its error raised)."""
    master, first, _ = two_hosts(logdir, *args, env=env, nproc=nproc, agent_env=agent_env)
    try:
        yield
    finally:
        code, out, err = finish(master)
    acode, aout, aerr = finish(first, timeout=30)
    assert code == 0, err
    assert acode == 0, aerr
