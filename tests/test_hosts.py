"""A trainer group over two "hosts" (``--nnodes 2``): network namespaces on a veth bridge, one logdir.

Node 0 (the master watchdog) runs in this namespace on the bridge's address; node 1's agent runs
in its own network namespace with its own address, as another machine would, and both share the
logdir directory (as hosts share a network filesystem). Real processes, real TensorFlow
collectives over the bridge, real SIGKILLs of a whole "host", and real CURVE handshakes. Needs
root (``ip netns``); skipped otherwise.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from typing import Any, Iterator, Optional

import psutil
import pytest

import pyfork

from conftest import PROGRAMS, finish, launch, lifecycle, quiet_env, raw_status, wait_for, wait_role_pid
from proc_checks import gone
from procsv.common.layout import Layout
from procsv.status import read_status, render
from test_metrics import free_port
from test_probes import probe


def _slot() -> int:
    """A number no other process on this machine holds: the first of 8-99 whose lock file
    (``/tmp/procsv-test-hosts.N.lock``) this process could lock, held for its life (the fd is kept open;
    the kernel drops the lock when the process is gone). Network namespaces, links and addresses are the
    machine's, not a run's: named by the xdist worker alone, two pytest runs on one machine (two
    checkouts, or a suite beside a run of one file) took the same ``pvt0``, and each one's ``hosts``
    fixture deleted the other's namespace and bridge under its running agents. (From 8: a checkout
    before this named its hosts by the worker, 0-7.)"""
    import fcntl

    for n in range(8, 100):
        try:  # (another user's lock file, which this one cannot open: not a slot for us)
            fd = os.open(f"/tmp/procsv-test-hosts.{n}.lock", os.O_CREAT | os.O_RDWR, 0o666)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue
        return n
    raise RuntimeError("no free slot for the hosts tests' network namespaces (8-99 held)")


# one bridge, namespace and subnet per process (each pytest-xdist worker: two workers, or two runs, may
# run these tests at once)
_W = _slot()
BRIDGE, NS, VETH, PREFIX = f"pvtbr{_W}", f"pvt{_W}", f"pvtv{_W}", f"10.78.{_W}"
MASTER_IP, HOST1_IP = f"{PREFIX}.1", f"{PREFIX}.11"
ARGS = ("--strategy", "multiworker", "--save-model-secs", "1", "--step-delay", "0.004", "--print-every-steps", "100000")
# for a run that waits on time (a timeout, a stall, checkpoints), not on steps: fewer steps in that
# time, each of which costs CPU in both members (a collective); 20 a second (50 at 0.02 before)
PACED = (*ARGS, "--step-delay", "0.05")


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


@pytest.fixture(scope="module")
def hosts() -> Iterator[None]:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2 (ip netns) for the second host's network namespace")
    ip("netns", "del", NS, check=False)
    ip("link", "del", BRIDGE, check=False)
    # this slot's lock is ours: what an earlier run of it left is a dead run's (a run killed between the
    # veth's creation and its move into the namespace left it in this one, where no namespace's end takes it)
    ip("link", "del", VETH, check=False)
    # the kernel tears a deleted namespace down later (its veth with it): an earlier run's may linger
    wait_for(lambda: ip("link", "show", VETH, check=False).returncode != 0, 120, interval=0.5,
             what=f"an earlier run's {VETH} to be gone")
    ip("link", "add", BRIDGE, "type", "bridge")
    # a fixed address: a bridge without one takes its ports' lowest, and changes it when that port goes (a third
    # host's namespace deleted: test_hosts_elastic3's ``third``), and node 1's kernel, its neighbour entry for
    # node 0 then stale, sent to the old one: nothing reached node 0 for 30-45 s (an agent joined 45 s late)
    ip("link", "set", BRIDGE, "address", f"02:00:0a:4e:{_W:02x}:01")
    ip("addr", "add", f"{MASTER_IP}/24", "dev", BRIDGE)
    ip("link", "set", BRIDGE, "up")
    add_host(NS, VETH, HOST1_IP)
    try:
        yield
    finally:
        kill_all(host_pids())
        ip("netns", "del", NS, check=False)
        ip("link", "del", BRIDGE, check=False)


def add_host(ns: str, veth: str, address: str) -> None:
    """Another "host": network namespace ``ns`` on the bridge through the veth pair ``veth``, at ``address``."""
    ip("netns", "add", ns)
    ip("link", "add", veth, "type", "veth", "peer", "name", f"{veth}p")
    ip("link", "set", f"{veth}p", "netns", ns)
    ip("link", "set", veth, "master", BRIDGE, "up")
    ip("netns", "exec", ns, "ip", "addr", "add", f"{address}/24", "dev", f"{veth}p")
    ip("netns", "exec", ns, "ip", "link", "set", f"{veth}p", "up")
    ip("netns", "exec", ns, "ip", "link", "set", "lo", "up")


def kill_all(pids: list[int]) -> None:
    """SIGKILL each of ``pids`` that is still there."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def host_pids(ns: str = NS) -> list[int]:
    """Every process of a host (its network namespace; the second host's by default)."""
    out = ip("netns", "pids", ns, check=False).stdout
    return [int(p) for p in out.split()]


@contextlib.contextmanager
def packets_dropped(ns: str = NS, address: str = HOST1_IP) -> Iterator[float]:
    """A silent host for the body of a ``with``: every packet between this namespace (node 0's) and ``ns``
    (at ``address``) dropped, both ways, by blackhole routes in each (no FIN, no RST, no ICMP: as a cable
    pulled, a switch gone or a host's power; this machine's kernel has no netem, and no iptables or nft tool);
    yields the wall time the drops began. Its processes run on."""
    ip("route", "add", "blackhole", f"{address}/32")
    try:
        ip("netns", "exec", ns, "ip", "route", "add", "blackhole", f"{MASTER_IP}/32")
        try:
            yield time.time()
        finally:
            ip("netns", "exec", ns, "ip", "route", "del", "blackhole", f"{MASTER_IP}/32", check=False)
    finally:
        ip("route", "del", "blackhole", f"{address}/32", check=False)


@contextlib.contextmanager
def frames_dropped_from(ns: str = NS, veth: str = VETH) -> Iterator[float]:
    """A one-way cut for the body of a ``with``: every frame the host of ``ns`` sends dropped as it leaves it (a
    ``blackhole`` qdisc on its end of the veth ``veth``: its kernel takes each as sent, no error, no ICMP), the frames
    to it still passing; yields the wall time the drops began."""
    ip("netns", "exec", ns, "tc", "qdisc", "add", "dev", f"{veth}p", "root", "blackhole")
    try:
        yield time.time()
    finally:
        ip("netns", "exec", ns, "tc", "qdisc", "del", "dev", f"{veth}p", "root", check=False)


def master_addr() -> str:
    return f"{MASTER_IP}:{random.randint(30000, 60000)}"


def agent(logdir: str, addr: str, *target_args: str, opts: tuple[str, ...] = (),
          env: Optional[dict[str, str]] = None, target: str = "procsv.examples.digits") -> subprocess.Popen[str]:
    """Node 1's ``procsv launch``, in the second host's namespace."""
    env = env or quiet_env()
    fork = ("--fork-prewarm",) if pyfork.forks(["-m", "procsv"], env) else ()
    argv = ["-m", "procsv", "launch", target, "--logdir", logdir, "--nnodes", "2", "--node-rank", "1",
            "--master-addr", addr, *fork, *opts, "--", *target_args]
    return pyfork.popen_python(argv, netns=NS, imports_tf=False, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=env, start_new_session=True)


def _is_zygote(pid: int) -> bool:
    """Whether ``pid`` is a pre-warmed trainer: its log is a zygote's (a zygote grown from a seed shows its
    launch's command line, not ``procsv.zygote``)."""
    return "/logs/zygote" in _log_of(pid)


def _log_of(pid: int) -> str:
    """Where ``pid``'s standard output goes ("" if it is gone)."""
    try:
        return os.readlink(f"/proc/{pid}/fd/1")
    except OSError:
        return ""


def _cmdline(pid: int) -> str:
    """``pid``'s command line as the kernel keeps it: a process forked by a pre-warmed trainer keeps the
    zygote's (no exec), a fresh one is ``python -m procsv.trainer ...``; "" if it is gone."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def _waits_in_select(pid: int) -> bool:
    """Whether a pre-warmed trainer waits in its loop for forks, ready: its main thread blocked in select(2)
    (``procsv.zygote``'s loop, entered only after it wrote its ``ZygoteReady``; its imports never wait in select).
    Its agent reads that message in the same turn as any start asked of it later (it pumps the pipe first)."""
    import platform

    calls = {"x86_64": {"23", "270"}, "aarch64": {"72"}}.get(platform.machine(), set())  # select, pselect6
    try:
        with open(f"/proc/{pid}/syscall") as fh:
            return fh.read().split(" ", 1)[0] in calls
    except OSError:
        return False


def end_job(master: "subprocess.Popen[bytes]", node1: "subprocess.Popen[bytes]",
            code: Optional[int]) -> tuple[Optional[int], str]:
    """The end of a two-host test whose node 0 is stopped in order (its exit ``code``): if the test failed
    before (``code`` None), neither launch ends by itself: both are SIGKILLed and what node 0 said is
    printed. Then the agent's exit code and stderr."""
    if code is None:
        for proc in (master, node1):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        print("node 0 said:", finish(master)[2], file=sys.stderr)
    acode, _, aerr = finish(node1, timeout=60)
    return acode, aerr


def events(logdir: str, name: str) -> list[dict[str, Any]]:
    return [r for r in lifecycle(logdir) if r.get("event") == name]


@pytest.mark.slow
def test_a_group_over_two_hosts_keeps_node_0s_secret_waits_for_a_killed_host_to_come_back_and_finishes(
        hosts, logdir, tmp_path):
    """Node 1's host is SIGKILLed (agent and trainer) at step 150: node 0 finds it lost, the group
    waits (no restart without it), a new agent joins and the group finishes from the checkpoint.
    While the first agent runs, the CURVE keys: the server secret never leaves node 0 (the logdir
    holds public keys only), the agent files only its own public key (0600) for this launch; and
    the launch's keys go with it (the killed agent's key file too)."""
    from hosts_helpers import PACED, paced, unpace

    addr = master_addr()
    gate, fast = paced(tmp_path)  # (paced until the second agent is launched, then at once)
    # 400 steps at 0.02 s (800 at 0.004 before): the host's kill at step 150 left up to 650 steps, each one of
    # both members, to run after the second agent's restore
    args = (*ARGS, "--steps", "400", "--step-delay", "0.02", *fast)
    opts = ("--nnodes", "2", "--master-addr", addr, "--node-timeout", "4")  # (its agent's silence bound)
    master = launch(logdir, *args, opts=opts, target=PACED)
    port = free_port()  # node 1's probes, on its own address: as a kubelet probes a pod's IP
    first = agent(logdir, addr, *args, opts=("--metrics-port", str(port), "--metrics-host", "0.0.0.0"), target=PACED)
    try:
        assert wait_for(lambda: probe(port, "/readyz", HOST1_IP), 60, what="node 1's probes") == 503
        wait_for(lambda: events(logdir, "first_step"), 120, what="the group's first step")
        wait_for(lambda: probe(port, "/readyz", HOST1_IP) == 200, 60, what="node 1 ready after its member's step")
        assert probe(port, "/healthz", HOST1_IP) == 200 and probe(port, "/metrics", HOST1_IP) == 404
        wait_for(lambda: events(logdir, "node_joined"), 120, what="node 1 to join")
        # the logdir holds public keys only: the server's (job.json) and the agent's own (its key file)
        assert secret_keys_in(logdir) == []
        with open(os.path.join(logdir, ".procsv", "curve", "job.json")) as fh:
            job = json.load(fh)
        filed = key_files(logdir)
        assert len(filed) == 1, filed  # node 1's own key, for this launch
        (name, record), = filed.items()
        assert name.startswith(f"agent.{job['job']}.") and record["node"] == 1 and record["host"] == HOST1_IP
        assert os.stat(os.path.join(logdir, ".procsv", "curve", name)).st_mode & 0o777 == 0o600
        wait_for(lambda: (raw_status(logdir) or {}).get("step", 0) >= 150, 120, what="step 150")
        # both members run (a group steps together): procsv status says where each is (node 1's by its address)
        st = read_status(Layout(logdir))
        assert st is not None and st["group"] is not None and st["group"]["nnodes"] == 2, st
        where = {p["role"]: (p.get("rank"), p.get("node"), p.get("host")) for p in st["processes"]
                 if p["role"] in ("trainer", "worker1")}
        assert where == {"trainer": (0, 0, socket.gethostname()), "worker1": (1, 1, HOST1_IP)}, st
        line = next(ln for ln in render(st, logdir).splitlines() if ln.lstrip().startswith("worker1"))
        assert f"rank 1 on node 1 ({HOST1_IP}), step " in line, line
        for pid in host_pids():  # the whole host goes: its agent and its trainer
            os.kill(pid, signal.SIGKILL)
        first.wait(10)
        wait_for(lambda: events(logdir, "node_lost"), 30, what="the host to be found lost")
        assert len(events(logdir, "first_step")) == 1  # the group does not restart without it
        time.sleep(1.0)
        assert len(events(logdir, "first_step")) == 1
        second = agent(logdir, addr, *args, target=PACED)
    finally:
        unpace(gate)
        code, out, err = finish(master)
    acode, aout, aerr = finish(second, timeout=30)
    assert code == 0, err
    assert acode == 0 and "the job ended (exit code 0)" in aerr, aerr
    joined = events(logdir, "node_joined")
    assert [(r["node"], r["host"]) for r in joined] == [(1, HOST1_IP), (1, HOST1_IP)]
    lost = events(logdir, "node_lost")[0]
    assert lost["node"] == 1
    # its host up (a namespace whose processes were killed): a probe's reset finds it, before --node-timeout 4
    assert lost["reason"] == f"its agent sent no heartbeat for {lost['silent_secs']:.2f} s and its host answered a " \
                             "probe with a reset (no agent listens on its probe port: the agent is gone; before " \
                             "--node-timeout 4)", lost
    assert lost["silent_secs"] < 2.0, lost
    assert f"procsv: node 1 ({HOST1_IP}) is lost: {lost['reason']}; its trainers count as dead" in err
    assert len(events(logdir, "restarting")) == 1
    spawned = {(r["role"], r["attempt"], r["via"]) for r in events(logdir, "spawned") if r["role"] == "worker1"}
    assert spawned == {("worker1", 1, "node1"), ("worker1", 2, "node1")}
    assert events(logdir, "finished")[-1]["step"] == 400
    from test_group import restores_with_plain_tf

    assert restores_with_plain_tf(logdir) == 400
    assert not host_pids()  # nothing of the job is left on the second host either
    assert not os.path.exists(os.path.join(logdir, ".procsv", "curve"))  # the launch's keys went with it


@pytest.mark.slow
def test_a_peer_whose_key_is_not_filed_for_the_launch_is_refused_and_the_job_fails_after_the_rejoin_timeout(hosts, logdir):
    addr = master_addr()
    master = launch(logdir, *ARGS, "--steps", "50", opts=("--nnodes", "2", "--master-addr", addr,
                                                           "--rejoin-timeout", "8"))
    keys_dir = os.path.join(logdir, ".procsv", "curve")
    wait_for(lambda: os.path.exists(os.path.join(keys_dir, "job.json")), 60, what="the job's keys")
    assert os.stat(keys_dir).st_mode & 0o777 == 0o700
    assert all(os.stat(os.path.join(keys_dir, n)).st_mode & 0o777 == 0o600 for n in os.listdir(keys_dir))
    with open(os.path.join(keys_dir, "job.json")) as fh:
        server_public = json.load(fh)["server_public"]
    # an intruder on the second host: it knows the server's public key, but no key of its own is filed
    rogue = subprocess.run(
        ["ip", "netns", "exec", NS, sys.executable, "-c", ROGUE, addr, server_public],
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
addr, server_public = sys.argv[1], sys.argv[2].encode()
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


def key_files(logdir: str) -> dict[str, dict[str, Any]]:
    """The agents' public keys filed in the logdir for the current launch: file name -> its record."""
    folder = os.path.join(logdir, ".procsv", "curve")
    out = {}
    for name in os.listdir(folder) if os.path.isdir(folder) else []:
        if name.startswith("agent."):
            with open(os.path.join(folder, name)) as fh:
                out[name] = json.load(fh)
    return out


def secret_keys_in(logdir: str) -> list[str]:
    """The files of the logdir (checkpoint data aside) that hold a CURVE secret key whose public key
    is written in the logdir too: a key pair anyone who reads the logdir could use."""
    import zmq

    tokens: dict[bytes, set[str]] = {}
    for root, _, names in os.walk(logdir):
        for name in names:
            path = os.path.join(root, name)
            if ".data-" in name or name.endswith(".index") or os.path.getsize(path) > 1 << 20:
                continue
            with open(path, "rb") as fh:
                for token in re.findall(rb"[0-9A-Za-z.\-:+=^!/*?&<>()\[\]{}@%$#]{40}", fh.read()):
                    tokens.setdefault(token, set()).add(path)
    found = []
    for token, paths in tokens.items():
        try:
            if zmq.curve_public(token) in tokens:
                found += sorted(paths)
        except (ValueError, zmq.ZMQError):
            pass
    return found


@pytest.mark.slow
def test_every_agent_takes_node_0s_node_timeout_and_its_expiry_names_the_cause(hosts, logdir):
    """Node 0 runs with --node-timeout 4, the agent with the default (15): stopped with SIGSTOP,
    node 0 beats no more, and the agent stops its trainer after 4 s, saying why."""
    addr = master_addr()
    args = (*PACED, "--steps", "1000000")
    master = launch(logdir, *args, opts=("--nnodes", "2", "--master-addr", addr, "--node-timeout", "4"))
    node1 = agent(logdir, addr, *args)
    try:
        wait_for(lambda: events(logdir, "first_step"), 120, what="the group's first step")
        worker = wait_role_pid(logdir, "worker1")
        os.kill(master.pid, signal.SIGSTOP)  # the watchdog only: its trainer and services run on
        stopped = time.monotonic()
        try:
            wait_for(lambda: not psutil.pid_exists(worker) or psutil.Process(worker).status() == psutil.STATUS_ZOMBIE,
                     12, what="node 1's agent to stop its trainer")
            silent = time.monotonic() - stopped
        finally:
            os.kill(master.pid, signal.SIGCONT)
        assert 3.5 < silent < 12, silent
        assert node1.poll() is None  # it waits for node 0 to come back (--rejoin-timeout)
    finally:
        if master.poll() is None:
            os.killpg(master.pid, signal.SIGTERM)  # its NodeStop ends the agent
        try:
            code, out, err = finish(master)
        finally:
            acode, aout, aerr = finish(node1, timeout=30)
    # stopped by the SIGTERM: 143 when the chief's last step is committed, else (its worker was stopped, so
    # its collectives fail and its last steps cannot be saved) 1, saying so (issue 51: 128+N says nothing was lost)
    assert code == 143 or (code == 1 and "its checkpoint of the last step did not commit" in err), err
    assert acode == code and f"the job ended (exit code {code})" in aerr, aerr  # the agent ends with the job's code
    assert re.search(r"procsv node 1: the master is silent for [0-9.]+ s \(no heartbeat from node 0 for longer than "
                     r"its --node-timeout 4\): stopping this host's trainers", aerr), aerr
    assert not host_pids()


@pytest.mark.slow
def test_a_second_agent_claiming_a_held_node_is_refused_and_an_agent_whose_log_rotation_stalls_keeps_beating(
        hosts, logdir, tmp_path):
    """One run, node 0 with --node-timeout 4, two things of node 1's agent.

    The claim: a second agent claiming node 1, which the first agent holds, is refused (exit 2),
    asks again for twice node 0's timeout (8 s) before it gives up, is logged once, removes its key,
    and the group goes on.

    The stall: then node 0's trainer is SIGKILLed and the group restarts: node 1's agent starts
    worker1 again, and the rotation of its logs (the agent's second) stalls on the fault point
    ``watchdog:rotate_stall`` until the test creates the gate file. Before: the agent rotated in its
    loop and stopped beating there; node 0 found node 1 lost after 4 s. Now the agent's logdir
    thread stalls, the agent beats on, and the restarted group trains past six checkpoints (more
    than 4 s) with node 1 still in it."""
    addr = master_addr()
    args = (*PACED, "--steps", "1000000")
    gate = str(tmp_path / "gate")
    stopped = False
    master = launch(logdir, *args, opts=("--nnodes", "2", "--master-addr", addr, "--node-timeout", "4"))
    first = agent(logdir, addr, *args,
                  env=quiet_env(PROCSV_FAULT="watchdog:rotate_stall:2", PROCSV_FAULT_GATE=gate))
    second = None
    try:
        wait_for(lambda: events(logdir, "node_joined"), 120, what="node 1 to join")
        second = agent(logdir, addr, *args)
        scode, sout, serr = finish(second, timeout=60)
        assert scode == 2, serr
        assert "the master refuses this agent as node 1: node 1 is held by another agent" in serr, serr
        assert "giving up" in serr.splitlines()[-1], serr
        assert "the master still refuses this agent as node 1 after 8 s:" in serr, serr  # twice node 0's 4 s
        refused = events(logdir, "node_refused")
        assert len(refused) == 1, refused  # logged once, however often it asked
        assert refused[0]["node"] == 1 and refused[0]["host"] == HOST1_IP
        assert "held by another agent" in refused[0]["reason"]
        assert [r["pid"] for r in key_files(logdir).values()] == [first.pid]  # the refused agent removed its key
        assert first.poll() is None
        step = (raw_status(logdir) or {}).get("step", 0)
        wait_for(lambda: (raw_status(logdir) or {}).get("step", 0) > step + 50, 60, what="the group to go on")

        wait_for(lambda: events(logdir, "checkpoint_committed"), 180, what="the group's first checkpoint")
        os.kill(wait_role_pid(logdir, "trainer"), signal.SIGKILL)
        wait_for(lambda: [r for r in events(logdir, "spawned") if r["role"] == "worker1" and r["attempt"] == 2], 90,
                 what="node 1 to start worker1 again")
        restored = wait_for(lambda: events(logdir, "restored"), 90, what="the restarted group's restore")[0]
        wait_for(lambda: len([r for r in events(logdir, "checkpoint_committed") if r["step"] > restored["step"]]) >= 6,
                 120, what="six checkpoints of the restarted group while node 1's rotation stalls")
        assert not os.path.exists(gate)
        assert not events(logdir, "node_lost")
        with open(gate, "w"):
            pass
        os.killpg(master.pid, signal.SIGTERM)
        stopped = True
    finally:
        with open(gate, "a"):
            pass
        if not stopped and master.poll() is None:
            os.killpg(master.pid, signal.SIGTERM)
        try:
            code, out, err = finish(master)
        finally:
            acode, aout, aerr = finish(first, timeout=30)
            if second is not None and second.poll() is None:
                os.killpg(second.pid, signal.SIGKILL)
                second.wait()
    assert code == 143, err
    assert "refused an agent claiming node 1" in err
    assert acode == 143 and "the job ended (exit code 143)" in aerr, aerr
    assert "silent" not in aerr, aerr
    assert len(events(logdir, "node_joined")) == 1
    assert not events(logdir, "node_lost")
    assert [r["attempt"] for r in events(logdir, "spawned") if r["role"] == "worker1"] == [1, 2]
    assert [r["attempt"] for r in events(logdir, "restarted")] == [2]
    assert not host_pids()


def test_node_0s_node_timeout_is_15_s_unless_given():
    from procsv.cli import _parser

    args = _parser().parse_args(["launch", "procsv.examples.digits", "--logdir", "r", "--nnodes", "2"])
    assert args.node_timeout == 15.0


def test_a_node_timeout_that_is_not_positive_is_a_usage_error(tmp_path):
    out = subprocess.run([sys.executable, "-m", "procsv", "launch", "procsv.examples.digits", "--logdir",
                          str(tmp_path / "r"), "--nnodes", "2", "--master-addr", "127.0.0.1:5999",
                          "--node-timeout", "0"], capture_output=True, text=True, env=quiet_env(), timeout=60)
    assert out.returncode == 2
    assert out.stderr.strip() == "procsv: error: --node-timeout must be > 0, not 0"
    assert not os.path.exists(tmp_path / "r")


@pytest.mark.parametrize("route", ["none", "unreachable"])
def test_an_agent_with_no_route_to_node_0_is_one_line_and_exit_2_with_nothing_started(tmp_path, route):
    """Node 1's agent alone in a network namespace with no route to node 0's --master-addr (``none``: only its
    loopback, ENETUNREACH; ``unreachable``: an ``ip route add unreachable`` of node 0's subnet, EHOSTUNREACH; a wrong
    address is the same): one line naming the address and what to check, exit 2, no logdir made and no process
    left in the namespace (with --fork-prewarm: no seed planted). Before: a Python traceback (``OSError: [Errno 101]
    Network is unreachable``) from the agent's start."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2 (ip netns) for a namespace without a route")
    ns, addr = f"pvtnr{_W}", f"{PREFIX}.1:5999"
    ip("netns", "del", ns, check=False)
    ip("netns", "add", ns)
    try:
        ip("netns", "exec", ns, "ip", "link", "set", "lo", "up")
        if route == "unreachable":
            ip("netns", "exec", ns, "ip", "route", "add", "unreachable", f"{PREFIX}.0/24")
        out = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-m", "procsv", "launch", "procsv.examples.digits",
                              "--logdir", str(tmp_path / "r"), "--nnodes", "2", "--node-rank", "1", "--master-addr", addr,
                              "--fork-prewarm"], capture_output=True, text=True, env=quiet_env(), timeout=60)
        left = host_pids(ns)
    finally:
        ip("netns", "del", ns, check=False)
    why = "Network is unreachable" if route == "none" else "No route to host"
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip() == (f"procsv: error: node 1 has no route to node 0's --master-addr {addr} ({why}): check the "
                                  "address (node 0's `procsv launch --node-rank 0` prints \"waiting for the other hosts "
                                  f"at HOST:PORT\") and this host's routes (`ip route get {PREFIX}.1`)"), out.stderr
    assert not os.path.exists(tmp_path / "r")
    assert left == [], left


@pytest.mark.slow
def test_a_host_lost_during_node_0s_orderly_stop_does_not_keep_the_launch_alive(hosts, logdir):
    """SIGTERM reaches node 0 and, at the same moment, node 1's agent dies (a scheduler ending the
    whole job kills hosts too). Its members die with it, and no agent is left to report them: node 0
    finds the host lost (at once: its probe port's reset; else after --node-timeout) and ends. Before: rule 12 decided nothing once the run
    was finishing, and node 0 waited for the lost host's members for ever."""
    addr = master_addr()
    args = (*ARGS, "--steps", "1000000")
    master = launch(logdir, *args, opts=("--nnodes", "2", "--master-addr", addr, "--node-timeout", "4"))
    node1 = agent(logdir, addr, *args)
    try:
        wait_for(lambda: events(logdir, "first_step"), 120, what="the group's first step")
        os.killpg(master.pid, signal.SIGTERM)
        os.killpg(node1.pid, signal.SIGKILL)  # the agent and, by their parent-death signal, its members
        ended = time.monotonic()
        code, out, err = finish(master, timeout=60)
        took = time.monotonic() - ended
    finally:
        if master.poll() is None:
            os.killpg(master.pid, signal.SIGKILL)
        finish(node1, timeout=30)
    # stopped by the SIGTERM: 143 when the chief's last step is committed, else (its worker died with the host,
    # so its collectives fail and its last steps cannot be saved) 1, saying so (issue 51: 128+N says nothing lost)
    assert code == 143 or (code == 1 and "its checkpoint of the last step did not commit" in err), err
    assert took < 40, took
    lost = events(logdir, "node_lost")
    assert len(lost) == 1 and lost[0]["node"] == 1, lost
    wait_for(lambda: not host_pids(), 10, what="no process of the job left")


@pytest.mark.slow
def test_a_start_node_1s_agent_never_answers_loses_the_host_after_a_bound_and_never_holds_a_stop(hosts, logdir):
    """Node 1's agent beats on but answers none of node 0's first two starts (``agent:start_unanswered:1-2``: each
    read and dropped, as one lost with a connection node 0 did not see replaced). The first goes unanswered past
    rule 12's bound (``START_ANSWER_SECS`` plus --node-timeout 4): the host is lost, said with what to do, and taken
    back at its next hello; the second is still unanswered when SIGTERM reaches node 0, which ends at once, its
    agent told to stop. Before: node 0 waited for the first for ever, and a stop waited the stop's grace (120 s),
    then for ever."""
    from procsv.common import env as envvars
    from procsv.watchdog.rules.hosts import START_ANSWER_SECS

    addr = master_addr()
    args = (*PACED, "--steps", "1000000")
    master = launch(logdir, *args, opts=("--nnodes", "2", "--master-addr", addr, "--node-timeout", "4"))
    node1 = agent(logdir, addr, *args, env={**quiet_env(), envvars.FAULT: "agent:start_unanswered:1-2"})
    code: Optional[int] = None
    try:
        lost = wait_for(lambda: events(logdir, "node_lost"), 60, what="node 1 lost for its unanswered start")
        wait_for(lambda: [r for r in events(logdir, "restarted") if r.get("attempt") == 2], 60,
                 what="the group's restart, its start asked of node 1 again")
        time.sleep(1.0)  # (its StartMembers out, and dropped)
        assert not events(logdir, "first_step")
        os.killpg(master.pid, signal.SIGTERM)
        stopped = time.monotonic()
        code, out, err = finish(master, timeout=60)
        took = time.monotonic() - stopped
    finally:
        acode, aerr = end_job(master, node1, code)
    assert len(lost) == 1 and lost[0]["node"] == 1, lost
    assert "worker1" in lost[0]["reason"] and "answered no start" in lost[0]["reason"], lost
    assert lost[0]["silent_secs"] < 1.0, lost  # (it beat on: lost by the start, not by its silence)
    assert re.search(r"node 1 \(\S+\) is lost: its agent answered no start of worker1 \(attempt 1\) for "
                     rf"{START_ANSWER_SECS + 4:.0f}\.\d s .*procsv launch --node-rank 1", err), err
    assert code == 143, err
    assert took < 15, took
    assert acode == 143, aerr


@pytest.mark.slow
def test_status_writes_stalled_on_node_0_lose_no_host_node_1s_zygote_killed_is_reaped_and_a_sigterm_to_node_1s_agent_stops_the_job_in_order(  # noqa: E501
        hosts, logdir):
    """One run, node 0 with --node-timeout 4 and --save-model-secs 1000, three things (before, two runs).

    The stall, 10 s of status writes: before, the write ran in node 0's loop, which beats to the
    agents; after 3 s without a beat the agent SIGKILLed its trainers and the group restarted. The
    stall is the fault point ``status_stall``: its first two writes past step 0 block 5 s each, in
    the logdir writer thread, 2.5 times node 0's --node-timeout of 4 s. No host is lost, nothing
    restarts.

    Then node 1's pre-warmed trainer is SIGKILLed while its members train and no start is asked of
    it: the agent gives it up and reaps it within a sweep, as node 0's watchdog does its own. Before:
    the dead zygote stayed the agent's zygote, spared by every sweep, a zombie under the agent until
    the group's next start (a run that never restarts: until the job's end). The agent says so, and when it
    starts a new one (node 0's rule 13; before, never: the host's members started fresh for the rest of the run).

    Then a SIGTERM to one host's `procsv launch` (an agent connected to node 0) is left to node 0,
    which stops the whole job in order: the chief commits its last step (the run's only
    checkpoint), both launches exit 143. Before: the agent SIGKILLed its members and exited; node 0
    found the host lost and waited for it."""
    addr = master_addr()
    args = (*PACED, "--save-model-secs", "1000", "--steps", "1000000")
    master = launch(logdir, *args, opts=("--nnodes", "2", "--master-addr", addr, "--node-timeout", "4"),
                    env=quiet_env(PROCSV_FAULT="watchdog:status_stall:1-2"))
    node1 = agent(logdir, addr, *args)
    try:
        wait_for(lambda: events(logdir, "first_step"), 120, what="the group's first step")
        start = time.time()
        # two stalled writes (10 s at most from now); a record built after them is written at once
        wait_for(lambda: (raw_status(logdir) or {}).get("updated_at", 0) > start + 11, 90,
                 what="status.json written again after the stall")
        step = (raw_status(logdir) or {}).get("step", 0)
        wait_for(lambda: (raw_status(logdir) or {}).get("step", 0) > step + 50, 60, what="the group to go on")
        assert node1.poll() is None
        # (the agent is node1.pid: ip netns exec execs the launch)
        zygote = wait_for(lambda: next((c.pid for c in psutil.Process(node1.pid).children()
                                        if _is_zygote(c.pid)), None), 60,
                          what="node 1's pre-warmed trainer")
        os.kill(zygote, signal.SIGKILL)
        try:
            wait_for(lambda: gone(zygote) and not _zombies_of(node1.pid), 15,
                     what="node 1's dead zygote to be reaped")
        except AssertionError:
            raise AssertionError(f"zombies under node 1's agent: {_zombies_of(node1.pid)} "
                                 f"(its zygote: {zygote})") from None
        assert len(events(logdir, "first_step")) == 1  # the group trained on, no restart
        wait_for(lambda: (raw_status(logdir) or {}).get("step", 0) >= 100, 120, what="step 100")
        os.kill(node1.pid, signal.SIGTERM)  # ip netns exec execs the launch: this is the agent
        code, out, err = finish(master, timeout=120)
    finally:
        if master.poll() is None:
            os.killpg(master.pid, signal.SIGKILL)
        acode, aout, aerr = finish(node1, timeout=60)
    assert code == 143, err
    assert "procsv node 1: SIGTERM received: node 0 stops the job in order" in aerr
    # its zygote's loss said, with the new one it starts (node 0's rule 13: 10 s after; before, none, ever)
    assert "procsv node 1: the pre-warmed trainer died: this host's members start fresh until a new one is ready; " \
           "a new one in 10 s" in aerr, aerr
    assert acode == 143 and "the job ended (exit code 143)" in aerr, aerr
    # nothing said the master silent during the stall (the SIGTERM's own line names that case)
    assert "silent" not in aerr[:aerr.index("SIGTERM received")], aerr
    assert "the master is silent" not in aerr, aerr
    assert [e["signal"] for e in events(logdir, "preempted")] == ["SIGTERM"]
    assert not events(logdir, "node_lost") and not events(logdir, "restarting")
    assert len(events(logdir, "first_step")) == 1
    assert {(r["role"], r["attempt"]) for r in events(logdir, "spawned") if r["role"] == "worker1"} == {("worker1", 1)}
    committed = events(logdir, "checkpoint_committed")
    assert [e["reason"] for e in committed] == ["preempted"] and committed[-1]["step"] >= 100
    from test_group import restores_with_plain_tf

    assert restores_with_plain_tf(logdir) == committed[-1]["step"]
    wait_for(lambda: not host_pids(), 10, what="no process of the job left")


def named_cause(logdir: str, attempt: int) -> str:
    """What the records say broke ``attempt``: its ``breaker`` record if any, else the ``restarting`` one."""
    fixed = [r for r in events(logdir, "breaker") if r["attempt"] == attempt]
    if fixed:
        return str(fixed[-1]["error"])
    return str(next(r for r in events(logdir, "restarting") if r["attempt"] == attempt + 1)["error"])


def _zombies_of(pid: int) -> list[int]:
    try:
        return [c.pid for c in psutil.Process(pid).children() if c.status() == psutil.STATUS_ZOMBIE]
    except psutil.NoSuchProcess:
        return []


@pytest.mark.slow
def test_a_member_of_node_1_sigkilled_is_named_the_groups_breaker_and_its_agent_kills_and_reaps_what_it_left_behind(
        hosts, logdir, tmp_path):
    """One run, three things of node 1's member (worker1) SIGKILLed at step 30, then again (before, two runs).

    Who broke the group: the chief on node 0 fails in its next collective. The group restarts, and the
    records, the report and the status name worker1 killed by SIGKILL as the cause of attempt 1's end (a
    ``breaker`` record when the chief's end was judged first; ``--group-grace-secs 0``: the chief's end
    comes at once). Before: the ``restarting`` record, the report and the status named the chief's
    ``UnavailableError`` (or the like) whenever its exit came in first. (The other order, node 1's
    report never sent and its host found lost: tests/test_hosts_blame.py.)

    What it left behind: node 1's member starts helpers (``tests/programs/digits_helpers.py``): a sleeper in a session of
    its own, a child that exits once its parent is gone, a double-forked grandchild that exits after
    1 s. The member is SIGKILLed and the group restarts: the agent, their subreaper, kills and reaps
    them all (no zombie under it, no live helper; one line says so), as the watchdog does on node 0;
    the second member's helpers go at the job's end. Before (issue 51): the agent was their
    subreaper but never swept, so the two that exited stayed zombies under it for the whole run and
    the sleeper outlived the member, the agent and the job. Node 1's pre-warmed trainer is SIGSTOPped
    before the kill: its fork answer is overdue, the agent gives it up (SIGKILL) and starts the member
    fresh, and reaps it too within a sweep (before: a zombie under the agent until the job's end).

    Then the agent's new pre-warmed trainer (node 0's rule 13: 10 s after the loss) is used, not only started:
    once it is ready, the fresh member is SIGKILLed, and the group's next member on node 1 is forked from it
    (before the rule, the agent started none, and every later member of that host started fresh)."""
    addr = master_addr()
    args = (*PACED, "--steps", "1000000")
    marker = str(tmp_path / "helpers")
    master = launch(logdir, *args, opts=("--nnodes", "2", "--master-addr", addr, "--group-grace-secs", "0"))
    node1 = agent(logdir, addr, *args, "--helpers", marker, target=os.path.join(PROGRAMS, "digits_helpers.py"))
    helpers: dict[int, list[int]] = {}
    code: Optional[int] = None
    try:
        wait_for(lambda: os.path.exists(f"{marker}.1") and (raw_status(logdir) or {}).get("step", 0) >= 30, 180,
                 what="node 1's member with its helpers, and step 30")
        with open(f"{marker}.1") as fh:
            helpers[1] = [int(p) for p in fh.read().split()]
        member = next(p["pid"] for p in raw_status(logdir)["processes"] if p["role"] == "worker1")
        zygote = wait_for(lambda: next((c.pid for c in psutil.Process(node1.pid).children()
                                        if _is_zygote(c.pid)), None), 60,
                          what="node 1's pre-warmed trainer")
        os.kill(zygote, signal.SIGSTOP)  # its answer to the next fork is overdue: the agent gives it up
        killed_at = time.time()
        os.kill(member, signal.SIGKILL)
        wait_for(lambda: os.path.exists(f"{marker}.2") and len(events(logdir, "first_step")) >= 2, 180,
                 what="the restarted group's first step")
        exited = next(r for r in events(logdir, "exited") if r["role"] == "worker1" and r["attempt"] == 1)
        restarting = events(logdir, "restarting")[0]
        print(f"BLAME restarting={restarting['error']!r} at +{restarting['time'] - killed_at:.2f} s; "
              f"worker1 exited at +{exited['time'] - killed_at:.2f} s; "
              f"breaker={[r['error'] for r in events(logdir, 'breaker')]}", file=sys.stderr)
        st = read_status(Layout(logdir))
        assert st is not None
        last_error = str(st.get("last_error"))
        with open(f"{marker}.2") as fh:
            helpers[2] = [int(p) for p in fh.read().split()]
        # (the agent is node1.pid: ip netns exec execs the launch) bounded: the next sweep is due within 1 s
        try:
            wait_for(lambda: all(gone(p) for p in [*helpers[1], zygote]) and not _zombies_of(node1.pid), 15,
                     what="the first member's helpers and the given-up zygote to be killed and reaped")
        except AssertionError:
            left = {"live": [p for p in [*helpers[1], zygote] if not gone(p) and p not in _zombies_of(node1.pid)],
                    "zombies under the agent": _zombies_of(node1.pid)}
            raise AssertionError(f"the agent left its killed member's helpers {helpers[1]} "
                                 f"or its given-up zygote {zygote}: {left}") from None
        # the agent's new pre-warmed trainer (node 0's rule 13, 10 s after the loss) is used: once it waits for
        # forks, the fresh attempt 2 of worker1 is SIGKILLed, and attempt 3 is forked from it
        anew = wait_for(lambda: next((c.pid for c in psutil.Process(node1.pid).children()
                                      if _log_of(c.pid).endswith("/logs/zygote-node1.2.log")), None), 60,
                        what="node 1's new pre-warmed trainer (10 s after the loss)")
        wait_for(lambda: _waits_in_select(anew), 120, what="node 1's new pre-warmed trainer ready (in its loop)")
        zcmd = _cmdline(anew)
        second = next(r["pid"] for r in events(logdir, "spawned") if r["role"] == "worker1" and r["attempt"] == 2)
        assert "procsv.trainer" in _cmdline(second), _cmdline(second)  # (started fresh: an interpreter of its own)
        os.kill(second, signal.SIGKILL)
        wait_for(lambda: os.path.exists(f"{marker}.3") and len(events(logdir, "first_step")) >= 3, 180,
                 what="the group restarted again, node 1's member forked")
        third = next(r["pid"] for r in events(logdir, "spawned") if r["role"] == "worker1" and r["attempt"] == 3)
        forked = _cmdline(third)
        with open(f"{marker}.3") as fh:
            helpers[3] = [int(p) for p in fh.read().split()]
        master.send_signal(signal.SIGTERM)
        code, out, err = finish(master, timeout=120)
    finally:
        acode, aerr = end_job(master, node1, code)
    assert code == 143 and acode == 143, (err, aerr)
    said = re.findall(r"^procsv node 1: killed \d+ process\(es\) the run left behind \(pids ([\d, ]+)\)$", aerr, re.M)
    assert {int(p) for pids in said for p in pids.split(", ")} == {*helpers[1], *helpers[2], *helpers[3]}, aerr
    assert all(gone(p) for p in [*helpers[2], *helpers[3]]), helpers  # the second's at its kill, the third's at the end
    # attempt 3 of node 1's member was forked by the new pre-warmed trainer (its image: no interpreter of its own;
    # before, the agent never started one and every later member of that host started fresh), which the agent said
    assert forked == zcmd and "procsv.zygote" in zcmd, (forked, zcmd)
    assert re.search(r"^procsv node 1: a new pre-warmed trainer \(pid \d+, its log zygote-node1\.2\.log\): this host's "
                     r"members are forked again once it is ready$", aerr, re.M), aerr
    assert aerr.count("this host's members start fresh until a new one is ready") == 1, aerr  # (one loss only)
    wait_for(lambda: not host_pids(), 10, what="no process of the job left")
    # who broke the group: worker1, killed, as the records, the status, the report and node 0 say
    from procsv.report import gather, render as render_report

    truth = f"worker1 attempt 1 (pid {member}) was killed by SIGKILL"
    assert named_cause(logdir, 1).startswith(truth), (named_cause(logdir, 1), events(logdir, "restarting"))
    assert last_error.startswith(truth), last_error
    rep = gather(Layout(logdir))
    assert rep is not None and rep.restarts, rep
    assert rep.restarts[0].cause.startswith(truth) and rep.restarts[0].label == "SIGKILL", rep.restarts[0]
    text = render_report(rep)
    assert re.search(rf"restart at .* \[SIGKILL\]: {re.escape(truth)}", text), text
    assert f"procsv: {truth}" in err, err


@pytest.mark.slow
def test_an_agent_refused_until_its_predecessor_is_found_lost_waits_past_a_rejoin_timeout_shorter_than_that(
        hosts, logdir, tmp_path):
    """``--rejoin-timeout 2`` under ``--node-timeout 3``: a second agent for node 1, started while the
    first holds it, is refused; the first (and its member) is then SIGKILLed; node 0 finds it lost after
    3 s (the first agent has no probe port, ``agent:no_probe_port``: else its host's reset finds it at once) and
    the second agent's claim wins. Before: a refusal did not count as hearing from node 0, so the
    second agent gave up after 2 s (`the master did not come back within --rejoin-timeout 2 s`), and node 0
    failed the run 2 s after finding the host lost. Now it asks for twice node 0's timeout and the job ends 0."""
    from hosts_helpers import PACED, paced, unpace

    addr = master_addr()
    gate, fast = paced(tmp_path)  # (paced until the second agent's group steps, then at once)
    # 250 steps at 0.06 s (500 at 0.02 before: 15 s paced at most, not 10, the margin for a loaded machine; the
    # second agent's group restores an early commit, step 20-40 quietly, and runs the steps left at once)
    args = (*ARGS, "--steps", "250", "--step-delay", "0.06", *fast)
    opts = ("--nnodes", "2", "--master-addr", addr, "--node-timeout", "3", "--rejoin-timeout", "2",
            "--group-grace-secs", "0")
    master = launch(logdir, *args, opts=opts, target=PACED)
    # (each host's launch has the job's flags)
    first = agent(logdir, addr, *args, opts=("--rejoin-timeout", "2"), target=PACED,
                  env=quiet_env(PROCSV_FAULT="agent:no_probe_port"))
    second: Optional[subprocess.Popen[str]] = None
    try:
        wait_for(lambda: events(logdir, "checkpoint_committed"), 120, what="a commit of the group of two")
        second = agent(logdir, addr, *args, opts=("--rejoin-timeout", "2"), target=PACED)
        wait_for(lambda: events(logdir, "node_refused"), 60, what="the second agent refused")
        doomed = [first.pid, *(c.pid for c in psutil.Process(first.pid).children(recursive=True))]
        for pid in doomed:  # the first agent and its member: its host's, not the second agent
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        first.wait(10)
        wait_for(lambda: len(events(logdir, "first_step")) >= 2 or master.poll() is not None, 120,
                 what="the group with the second agent's member")
    finally:
        unpace(gate)
        code, out, err = finish(master)
    acode, aout, aerr = finish(second, timeout=30) if second is not None else (None, "", "")
    assert code == 0, err
    assert acode == 0 and "the master refuses this agent as node 1" in aerr, aerr
    assert [r["node"] for r in events(logdir, "node_lost")] == [1]
    assert events(logdir, "finished")[-1]["step"] == 250
