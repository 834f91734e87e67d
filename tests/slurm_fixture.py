"""A real Slurm cluster for the tests: ``munged``, ``slurmctld`` and two ``slurmd`` nodes.

Debian's ``slurm-wlm`` and ``munge`` (installed with apt-get if missing; the tests are skipped, saying
why, only when that install is impossible). The controller runs in this network namespace on a
bridge's address; each ``slurmd`` runs in its own network namespace with its own address, as another
machine would, and every node shares the filesystem (the logdir, this checkout, its virtualenv).
Everything lives in one folder under /tmp (config, munge key and socket, state, spool, logs).

One cluster for the whole test session, even under pytest-xdist: the workers that use it register
under an flock in ``users`` (their pids); the first starts the daemons, the last to leave stops them
and removes the namespaces. A worker that died without leaving is dropped by the next one.

``AuthInfo=cred_expire=10``: Slurm holds a requeued job for the credential lifetime (default
120 s, slurm.conf(5): "This also controls how long a requeued job must wait before starting
again"); 10 s keeps a requeue test short, and the tests report that delay apart from procsv's part.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from typing import Iterator, Optional

import pytest

from conftest import wait_for

ROOT = "/tmp/procsv-slurm"
BRIDGE, PREFIX = "pvsbr0", "10.81.0"
CTL_IP = f"{PREFIX}.1"
NODES = {f"{PREFIX}.11": f"{PREFIX}.11", f"{PREFIX}.12": f"{PREFIX}.12"}  # node name -> its namespace's address (names are the addresses: a node's name resolves on every host)
CTL_PORT, NODE_PORT = 16817, 16818
CRED_EXPIRE = 10  # seconds a requeued job waits before it may start again (Slurm's default: 120)
PARTITION = "procsv"


def run(*cmd: str, check: bool = True, timeout: float = 60, env: Optional[dict[str, str]] = None
        ) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(cmd), capture_output=True, text=True, check=check, timeout=timeout, env=env)


def ensure_installed() -> Optional[str]:
    """None once slurmctld, slurmd, munged and scontrol are on this machine (installing them with
    apt-get if missing), else why they cannot be."""
    tools = ("slurmctld", "slurmd", "munged", "scontrol", "sbatch", "mungekey")
    if all(shutil.which(t) or os.path.exists(f"/usr/sbin/{t}") for t in tools):
        return None
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        return "Slurm is not installed and apt-get cannot install it here (needs root and apt-get)"
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    lock = os.path.join("/tmp", "procsv-slurm-install.lock")
    with open(lock, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)  # one install at a time (xdist workers)
        if all(shutil.which(t) or os.path.exists(f"/usr/sbin/{t}") for t in tools):
            return None
        up = run("apt-get", "update", "-q", check=False, timeout=600, env=env)
        got = run("apt-get", "install", "-y", "-q", "slurm-wlm", "munge", check=False, timeout=900, env=env)
    if got.returncode != 0:
        tail = (got.stderr or up.stderr or got.stdout).strip().splitlines()[-1:] or ["?"]
        return f"apt-get install slurm-wlm munge failed (no network or no package source?): {tail[0]}"
    return None


def _sbin(tool: str) -> str:
    return shutil.which(tool) or f"/usr/sbin/{tool}"


@dataclass
class Cluster:
    """A running cluster: the environment its client commands need, and helpers over them."""

    root: str

    @property
    def env(self) -> dict[str, str]:
        return {"SLURM_CONF": os.path.join(self.root, "slurm.conf")}

    def cmd(self, *args: str, check: bool = True, timeout: float = 60) -> str:
        return run(*args, check=check, timeout=timeout, env=dict(os.environ, **self.env)).stdout

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job``'s fields (JobState, Restarts, EligibleTime, ExitCode, ...)."""
        out = self.cmd("scontrol", "show", "job", "-o", job_id, check=False)
        fields: dict[str, str] = {}
        for word in out.split():
            key, eq, value = word.partition("=")
            if eq and key not in fields:
                fields[key] = value
        return fields

    def node_states(self) -> dict[str, str]:
        out = self.cmd("sinfo", "-h", "-N", "-o", "%N %T", check=False)
        return dict(line.split() for line in out.splitlines() if len(line.split()) == 2)


def _conf(root: str) -> str:
    cpus = 4
    nodes = "\n".join(f"NodeName={n} NodeAddr={ip} CPUs={cpus} RealMemory=1000 State=UNKNOWN"
                      for n, ip in NODES.items())
    return f"""ClusterName=procsvtest
SlurmctldHost={socket.gethostname().split('.')[0]}({CTL_IP})
SlurmctldPort={CTL_PORT}
SlurmdPort={NODE_PORT}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={root}/munge.sock,cred_expire={CRED_EXPIRE}
SlurmUser=root
SlurmdUser=root
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
JobRequeue=1
ReturnToService=2
MinJobAge=600
KillWait=30
MpiDefault=none
AccountingStorageType=accounting_storage/none
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool/%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.%n.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.%n.log
SchedulerParameters=sched_interval=2
SlurmctldParameters=enable_configless
{nodes}
PartitionName={PARTITION} Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return run("ip", *args, check=check)


def _pid(path: str) -> Optional[int]:
    try:
        with open(path) as fh:
            pid = int(fh.read().strip() or 0)
    except (OSError, ValueError):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    return pid


def start(root: str = ROOT) -> Cluster:
    """Write the config, make the network, start munged, slurmctld and both slurmd; wait until both
    nodes are idle."""
    stop(root)
    for name in os.listdir(root) if os.path.isdir(root) else []:  # an earlier session's logs and pid files
        if name.endswith((".log", ".pid")):
            os.remove(os.path.join(root, name))
    for sub in ("state", "spool"):
        os.makedirs(os.path.join(root, sub), exist_ok=True)
    os.chmod(root, 0o755)
    with open(os.path.join(root, "slurm.conf"), "w") as fh:
        fh.write(_conf(root))
    key = os.path.join(root, "munge.key")
    if not os.path.exists(key):
        run(_sbin("mungekey"), "--create", f"--keyfile={key}")
    os.chmod(key, 0o600)
    run(_sbin("munged"), "--force", f"--socket={root}/munge.sock", f"--key-file={key}",
        f"--pid-file={root}/munged.pid", f"--log-file={root}/munged.log", f"--seed-file={root}/munged.seed")
    _ip("link", "add", BRIDGE, "type", "bridge")
    _ip("addr", "add", f"{CTL_IP}/24", "dev", BRIDGE)
    _ip("link", "set", BRIDGE, "up")
    for i, (name, addr) in enumerate(NODES.items(), 1):
        ns, veth = f"pvs{i}", f"pvsv{i}"
        _ip("netns", "add", ns)
        _ip("link", "add", veth, "type", "veth", "peer", "name", f"{veth}p")
        _ip("link", "set", f"{veth}p", "netns", ns)
        _ip("link", "set", veth, "master", BRIDGE, "up")
        _ip("netns", "exec", ns, "ip", "addr", "add", f"{addr}/24", "dev", f"{veth}p")
        _ip("netns", "exec", ns, "ip", "link", "set", f"{veth}p", "up")
        _ip("netns", "exec", ns, "ip", "link", "set", "lo", "up")
    env = dict(os.environ, SLURM_CONF=os.path.join(root, "slurm.conf"))
    run(_sbin("slurmctld"), "-c", "-f", os.path.join(root, "slurm.conf"), env=env)
    for i, name in enumerate(NODES, 1):  # nsenter: the network namespace only (ip netns exec would remount
        # /sys, hiding the cgroup mounts slurmd's cgroup plugin needs)
        os.makedirs(os.path.join(root, "spool", name), exist_ok=True)
        run("nsenter", f"--net=/run/netns/pvs{i}", _sbin("slurmd"), "-N", name, "-f", os.path.join(root, "slurm.conf"),
            env=env)
    cluster = Cluster(root)

    def idle() -> bool:
        states = cluster.node_states()
        for n, s in states.items():
            if s.startswith(("down", "drain")):
                cluster.cmd("scontrol", "update", f"nodename={n}", "state=resume", check=False)
        return len(states) == len(NODES) and all(s == "idle" for s in states.values())

    wait_for(idle, 60, interval=0.2, what="both Slurm nodes idle")
    return cluster


def stop(root: str = ROOT) -> None:
    """Stop every daemon of the cluster (and any job process left in its namespaces); remove the
    namespaces and the bridge. Idempotent."""
    for i in range(1, len(NODES) + 1):
        ns = f"pvs{i}"
        pids = run("ip", "netns", "pids", ns, check=False).stdout.split()
        for p in pids:
            try:
                os.kill(int(p), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
    pidfiles = [os.path.join(root, f"slurmd.{n}.pid") for n in NODES] + \
        [os.path.join(root, "slurmctld.pid"), os.path.join(root, "munged.pid")]
    for path in pidfiles:
        pid = _pid(path)
        if pid is not None:
            os.kill(pid, signal.SIGTERM)
            try:
                wait_for(lambda: _pid(path) is None, 10, interval=0.2, what=f"{path} to exit")
            except AssertionError:
                os.kill(pid, signal.SIGKILL)
    for i in range(1, len(NODES) + 1):
        _ip("netns", "del", f"pvs{i}", check=False)
    _ip("link", "del", BRIDGE, check=False)
    for i in range(1, len(NODES) + 1):
        wait_for(lambda: _ip("link", "show", f"pvsv{i}", check=False).returncode != 0, 60, interval=0.2,
                 what=f"the veth pvsv{i} to be gone")
    shutil.rmtree(os.path.join(root, "state"), ignore_errors=True)
    shutil.rmtree(os.path.join(root, "spool"), ignore_errors=True)


def _users(root: str) -> list[int]:
    try:
        with open(os.path.join(root, "users")) as fh:
            pids = [int(p) for p in fh.read().split()]
    except (OSError, ValueError):
        return []
    alive = []
    for p in pids:
        try:
            os.kill(p, 0)
            alive.append(p)
        except ProcessLookupError:
            pass
    return alive


def _set_users(root: str, pids: list[int]) -> None:
    with open(os.path.join(root, "users"), "w") as fh:
        fh.write(" ".join(str(p) for p in pids))


@pytest.fixture(scope="session")
def slurm() -> Iterator[Cluster]:
    """The session's cluster (started by the first worker that asks, stopped by the last)."""
    why = ensure_installed()
    if why is not None:
        pytest.skip(why)
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("a Slurm cluster of two nodes needs root and iproute2 (ip netns)")
    os.makedirs(ROOT, exist_ok=True)
    lock = open(os.path.join(ROOT, "lock"), "w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        users = _users(ROOT)
        live = _pid(os.path.join(ROOT, "slurmctld.pid")) is not None
        if not users or not live:
            t0 = time.monotonic()
            start(ROOT)
            print(f"\nslurm fixture: cluster started in {time.monotonic() - t0:.1f} s")
        _set_users(ROOT, [*users, os.getpid()])
        fcntl.flock(lock, fcntl.LOCK_UN)
        yield Cluster(ROOT)
    finally:
        fcntl.flock(lock, fcntl.LOCK_EX)
        users = [p for p in _users(ROOT) if p != os.getpid()]
        _set_users(ROOT, users)
        if not users:
            stop(ROOT)
        fcntl.flock(lock, fcntl.LOCK_UN)
        lock.close()
