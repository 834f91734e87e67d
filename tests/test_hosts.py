"""A trainer group over two "hosts" (``--nnodes 2``): network namespaces on a veth bridge, one logdir.

Node 0 (the master watchdog) runs in this namespace on the bridge's address; node 1's agent runs
in its own network namespace with its own address, as another machine would, and both share the
logdir directory (as hosts share a network filesystem). Real processes, real TensorFlow
collectives over the bridge, real SIGKILLs of a whole "host", and real CURVE handshakes. Needs
root (``ip netns``); skipped otherwise.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
from typing import Any, Iterator

import pytest

from conftest import finish, launch, lifecycle, quiet_env, raw_status, wait_for

# one bridge, namespace and subnet per pytest-xdist worker: two workers may run these tests at once
_W = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0")[2:] or 0)
BRIDGE, NS, VETH, PREFIX = f"pvtbr{_W}", f"pvt{_W}", f"pvtv{_W}", f"10.78.{_W}"
MASTER_IP, HOST1_IP = f"{PREFIX}.1", f"{PREFIX}.11"
ARGS = ("--strategy", "multiworker", "--save-model-secs", "1", "--step-delay", "0.004", "--print-every-steps", "100000")


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


@pytest.fixture(scope="module")
def hosts() -> Iterator[None]:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2 (ip netns) for the second host's network namespace")
    ip("netns", "del", NS, check=False)
    ip("link", "del", BRIDGE, check=False)
    ip("link", "add", BRIDGE, "type", "bridge")
    ip("addr", "add", f"{MASTER_IP}/24", "dev", BRIDGE)
    ip("link", "set", BRIDGE, "up")
    ip("netns", "add", NS)
    ip("link", "add", VETH, "type", "veth", "peer", "name", f"{VETH}p")
    ip("link", "set", f"{VETH}p", "netns", NS)
    ip("link", "set", VETH, "master", BRIDGE, "up")
    ip("netns", "exec", NS, "ip", "addr", "add", f"{HOST1_IP}/24", "dev", f"{VETH}p")
    ip("netns", "exec", NS, "ip", "link", "set", f"{VETH}p", "up")
    ip("netns", "exec", NS, "ip", "link", "set", "lo", "up")
    try:
        yield
    finally:
        for pid in host_pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        ip("netns", "del", NS, check=False)
        ip("link", "del", BRIDGE, check=False)


def host_pids() -> list[int]:
    """Every process of the second host (its network namespace)."""
    out = ip("netns", "pids", NS, check=False).stdout
    return [int(p) for p in out.split()]


def master_addr() -> str:
    return f"{MASTER_IP}:{random.randint(30000, 60000)}"


def agent(logdir: str, addr: str, *target_args: str, opts: tuple[str, ...] = ()) -> subprocess.Popen[str]:
    """Node 1's ``procsv launch``, in the second host's namespace."""
    cmd = ["ip", "netns", "exec", NS, sys.executable, "-m", "procsv", "launch", "procsv.examples.digits",
           "--logdir", logdir, "--nnodes", "2", "--node-rank", "1", "--master-addr", addr, *opts, "--", *target_args]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=quiet_env(),
                            start_new_session=True)


def events(logdir: str, name: str) -> list[dict[str, Any]]:
    return [r for r in lifecycle(logdir) if r.get("event") == name]


def test_a_group_over_two_hosts_waits_for_a_killed_host_to_come_back_and_finishes(hosts, logdir):
    addr = master_addr()
    args = (*ARGS, "--steps", "1200")
    opts = ("--nnodes", "2", "--master-addr", addr)
    master = launch(logdir, *args, opts=opts)
    first = agent(logdir, addr, *args)
    try:
        wait_for(lambda: events(logdir, "first_step"), 120, what="the group's first step")
        wait_for(lambda: (raw_status(logdir) or {}).get("step", 0) >= 150, 120, what="step 150")
        for pid in host_pids():  # the whole host goes: its agent and its trainer
            os.kill(pid, signal.SIGKILL)
        first.wait(10)
        wait_for(lambda: events(logdir, "node_lost"), 30, what="the host to be found lost")
        assert len(events(logdir, "first_step")) == 1  # the group does not restart without it
        time.sleep(1.0)
        assert len(events(logdir, "first_step")) == 1
        second = agent(logdir, addr, *args)
    finally:
        code, out, err = finish(master)
    acode, aout, aerr = finish(second, timeout=30)
    assert code == 0, err
    assert acode == 0 and "the job ended (exit code 0)" in aerr, aerr
    joined = events(logdir, "node_joined")
    assert [(r["node"], r["host"]) for r in joined] == [(1, HOST1_IP), (1, HOST1_IP)]
    assert events(logdir, "node_lost")[0]["node"] == 1
    assert len(events(logdir, "restarting")) == 1
    spawned = {(r["role"], r["attempt"], r["via"]) for r in events(logdir, "spawned") if r["role"] == "worker1"}
    assert spawned == {("worker1", 1, "node1"), ("worker1", 2, "node1")}
    assert events(logdir, "finished")[-1]["step"] == 1200
    from test_group import restores_with_plain_tf

    assert restores_with_plain_tf(logdir) == 1200
    assert not host_pids()  # nothing of the job is left on the second host either


def test_a_peer_without_the_jobs_client_key_is_refused_and_the_job_fails_after_the_rejoin_timeout(hosts, logdir):
    addr = master_addr()
    master = launch(logdir, *ARGS, "--steps", "50", opts=("--nnodes", "2", "--master-addr", addr,
                                                           "--rejoin-timeout", "8"))
    keys_dir = os.path.join(logdir, ".procsv", "curve")
    wait_for(lambda: os.path.exists(os.path.join(keys_dir, "job.json")), 60, what="the job's keys")
    assert os.stat(keys_dir).st_mode & 0o777 == 0o700
    assert all(os.stat(os.path.join(keys_dir, n)).st_mode & 0o777 == 0o600 for n in os.listdir(keys_dir))
    # an intruder on the second host: it knows the server's public key but not the job's client key
    rogue = subprocess.run(
        ["ip", "netns", "exec", NS, sys.executable, "-c", ROGUE, addr, os.path.join(keys_dir, "server_public")],
        capture_output=True, text=True, timeout=60, env=quiet_env())
    assert rogue.returncode == 0, rogue.stderr
    assert "replies=0" in rogue.stdout, rogue.stdout
    code, out, err = finish(master)
    assert code == 1, err
    assert not events(logdir, "node_joined")
    assert "node 1 did not join within --rejoin-timeout 8 s" in err
    assert not events(logdir, "spawned") or all(r["role"] in ("summary", "checkpoint", "zygote")
                                                for r in events(logdir, "spawned"))


ROGUE = r"""
import sys, time, zmq
from procsv.ipc.messages import NodeHello
from procsv.ipc.transport import send, drain
addr, server_public = sys.argv[1], open(sys.argv[2], "rb").read().strip()
ctx = zmq.Context()
socks = []
for curve in (True, False):  # with its own key pair, and in plain text
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.IDENTITY, b"node1")
    s.setsockopt(zmq.LINGER, 0)
    if curve:
        pub, sec = zmq.curve_keypair()
        s.curve_publickey, s.curve_secretkey, s.curve_serverkey = pub, sec, server_public
    s.connect("tcp://" + addr)
    socks.append(s)
replies = 0
deadline = time.monotonic() + 4
while time.monotonic() < deadline:
    for s in socks:
        send(s, NodeHello(1, 1, "10.9.9.9", 1, ["10.9.9.9:1"], []))
        replies += sum(1 for _ in drain(s, first_timeout_ms=100))
print(f"replies={replies}")
"""
