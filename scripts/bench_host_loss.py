#!/usr/bin/env python3
"""A silent host: how soon node 0 finds it lost, and how often a slow one is found lost by mistake (issue 70).

Root only. A job over two "hosts" (``procsv launch --nnodes 2``; the second host a network namespace on a veth
bridge under its node agent, as ``bench_group.py``'s), whose members run a plain-Python program that sleeps (the
detection is the watchdogs', not TensorFlow's: no collective is needed to measure it, and each launch costs a
few CPU-seconds instead of ~20). The shared logdir is on a loop-mounted ext4 of its own (frozen for the
filesystem stall).

- **Time to detection**, ``--repeats`` runs of each, interleaved: once the agent has beaten for 3 s, every
  packet between node 0 and the second host is dropped both ways (blackhole routes in each namespace: no FIN,
  no RST, no ICMP; its processes run on); the time from the drop to node 0's ``node_lost`` record. With the
  probes (the default: rule 12's fast path) and as before them (the agent run with
  ``PROCSV_FAULT=agent:no_probe_port``, so node 0 finds it by ``--node-timeout 15`` alone).
- **A dead agent**, its host up: the agent SIGKILLed (its probe port closed: the kernel answers a probe with a
  reset); the time from the kill to ``node_lost``.
- **False losses**, ``--minutes`` each, counted as ``node_lost`` records: two CPU-bound processes per core in the
  second host's namespace; the agent SIGSTOPped for 200 ms every 3 s; the logdir's filesystem frozen
  (``fsfreeze``) for 10 s every 30 s (writes and their fsyncs block, on both hosts); the agent SIGSTOPped
  10 s every 30 s (an agent blocked as long as that stall: past the 129 probes its port once queued, under
  ``--node-timeout 15``). ``--together``: the four at once, each its own job (the hogs load every job's
  agent, the freeze every job's logdir): ``--minutes`` of all four instead of four times ``--minutes``.

- **The group back** (``--only regroup``, or with the others), ``--repeats`` runs of each, interleaved: the
  digits example's group over the two hosts (``--strategy multiworker --nproc 1 --save-model-secs 1``: TensorFlow
  collectives, a launch ~20 CPU-s) with the default ``--rejoin-timeout``, its packets dropped as above once it
  committed. With ``--min-nodes 1``: from the drop (and from ``node_lost``) to the smaller group's first step
  (its chief's ``first_step``), the restore apart (the new chief's ``spawned`` -> ``restored``: its TensorFlow
  start-up, strategy and the read of the state; issue 70's goal is 1 s plus that). Without it: the packets pass
  again ``HEAL_SECS`` after ``node_lost``; from the agent's hello (``node_joined``) to the group of two's first
  step, the restore apart (the goal: 1 s plus that), and from the packets passing to that hello. Each with the steps re-done (the last step trained before minus the step restored) and
  where the restore came from (``restored``'s ``source``). Without it, where the time from the hello went too
  (a second table, medians): the worker's start, each member's strategy, start-up, warm-up and restore (the
  worker's ``worker_ready`` record), and from the later member's restore to the group's first step.
  ``--every-host``: only the runs without ``--min-nodes``; ``--baseline DIR``: each run again with a checkout of
  the code before (both launches run its ``procsv``), interleaved, its column beside; ``--keep DIR``: each run's
  logdir copied there.

- **A partition healed** (``--only heal``, alone: its own table and line), ``--repeats`` runs of each length and
  agent, interleaved: the sleeper job (no TensorFlow), node_lost, then the second host's packets dropped on for
  ``--partitions`` seconds (2,10,30 by default) more, then passing again. The drop here is the bridge's (its port
  to the second host disabled: every frame dropped there, after each host's kernel sent it, as a switch's outage;
  each side's TCP retransmits on its own backoff: the blackhole routes of the other modes fail a send locally,
  and a new write goes out at once after the heal). Measured: the heal -> node 0's ``node_joined`` (the agent's
  hello; its ``link``: 1, the old connection, or a new one), with the agent as it is (it redials once node 0's
  address answers again) and as before (``PROCSV_FAULT=agent:no_redial``: its old connection waits out its
  backoff, a new one only after 2 x ``--node-timeout``). One line ``heal_hello_secs=<median> heal_hello_max=<max>
  heal_hello_before_secs=<median> heal_hello_before_max=<max> heal_load=<1-min load>``; exits 1 if a run fails.

- **The master lost** (``--only master``, alone: its own table and line), ``--repeats`` runs of each, interleaved:
  the digits group of two as in ``regroup`` (``--save-model-secs 30``: in-memory copies newer than the disk's),
  8 s after its first commit node 0 is lost: "silent", its packets dropped both ways for 20 s with its processes
  left running, then SIGKILLed; or "sigkill", every process of node 0's launch SIGKILLed at once. Then node 0's
  launch is started again with the same command. Measured: the drop (or kill) -> node 1's member stopped (by its
  agent, or ended by TensorFlow's coordination service), the relaunch -> node 1's agent joined and -> the group's
  first step, the relaunched group's restore (``source``, step) and the steps re-done (node 0's status file's step
  at the kill minus the step restored). One line ``masterloss_stale_silent_secs=<median>
  masterloss_stale_sigkill_secs=<median> masterloss_back_silent_secs=<median> masterloss_back_sigkill_secs=<median>
  masterloss_redone_silent=<median> masterloss_redone_sigkill=<median> masterloss_from_memory=<n>/<runs>
  masterloss_load=<1-min load>``; exits 1 if a run fails, node 1's members stay in the stale group past 0.5 s
  (median), or a relaunched group restores from anything but node 1's replica.

- **Link blips and one-way cuts** (``--only blip``, alone: its own table and line), ``--repeats`` runs, this checkout
  and ``--baseline DIR`` (a checkout of the code before: both launches run its ``procsv``) interleaved: the sleeper
  job's silent host (as in ``detect``); ``--blip-count`` blips of each ``--blips`` length (every frame between the
  hosts dropped both ways by a ``blackhole`` qdisc on each veth end, then passing: no carrier lost, no neighbour entry
  flushed), counting node 0's ``node_lost`` records, the agent's findings of node 0 lost and the hosts never taken
  back within 20 s; and a one-way cut each way (node 1's frames to node 0 dropped as they leave it, or node 0's to
  node 1 at the bridge's port): the cut -> node 0's ``node_lost`` and -> the agent's line finding node 0 lost. One line
  ``blip_detect_secs=<median> blip_detect_base_secs=<median> blip_<L>_losses=<n>/<blips> blip_<L>_losses_base=<n>/<blips>
  ... blip_stuck=<n> blip_stuck_base=<n> oneway_10_node0_secs=<median> oneway_10_agent_secs=<median>
  oneway_01_node0_secs=<median> oneway_01_agent_secs=<median> blip_load=<1-min load>``; exits 1 if this checkout's
  silent host is found past 0.5 s (median), a one-way cut is not found by either side within 10 s, a blip of 0.2 s or
  less costs a loss, or a host lost in a blip is never taken back.

Prints each run, a table (medians, min-max) with the load average, and one line
``hostloss_detect_secs=<median> hostloss_detect_timeout_secs=<median> hostloss_false_cpu=<n>
hostloss_false_sigstop=<n> hostloss_false_fsstall=<n> hostloss_false_stop10=<n> hostloss_minutes=<m> hostloss_shrink_secs=<median>
hostloss_shrink_restore_secs=<median> hostloss_shrink_beyond_restore_secs=<median> hostloss_back_secs=<median>
hostloss_back_beyond_restore_secs=<median> hostloss_load=<1-min load>`` (``nan`` for a half not run). Exits 1 if a silent host is not found, found later
than 0.5 s (median) with the probes, any slow host is found lost, a regroup run fails, the smaller group's
first step comes later than 1 s plus its restore after the loss (median), or the group of two's later than 1 s
plus its restore after the hello (median). ``PROCSV_BENCH_HOST=N`` gives the second host names of its own (two benches at once).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Iterator, Optional

from bench_group import (ENV, EXAMPLE, NET, NS, VETH, BenchError, chief_first_step, events, find, launch,  # scripts/
                         second_host, status, stop, strategy_up, wait)

SLEEPER = "import time\nwhile True:\n    time.sleep(1)\n"
MASTER, HOST1 = f"{NET}.1", f"{NET}.11"
BEATEN_SECS = 3.0  # the agent beats this long before a drop (node 0 learns its gaps)
FAST_BOUND = 0.5  # the bound for the median time to detection with the probes
BACK_BOUND = 1.0  # the bound: the group's first step after the loss (plus the restore), or after the hello
HEAL_SECS = 2.0  # without --min-nodes, the packets pass again this long after node_lost


def run(*cmd: str) -> None:
    subprocess.run(cmd, capture_output=True, check=False)


@contextlib.contextmanager
def own_filesystem(root: str) -> Iterator[str]:
    """A 256 MiB ext4 loop-mounted under ``root`` (what the stall freezes); yields its mount point."""
    image, mnt = os.path.join(root, "fs.img"), os.path.join(root, "mnt")
    os.makedirs(mnt)
    with open(image, "wb") as fh:
        fh.truncate(256 << 20)
    subprocess.run(["mkfs.ext4", "-q", image], check=True)
    subprocess.run(["mount", "-o", "loop", image, mnt], check=True)
    try:
        yield mnt
    finally:
        run("fsfreeze", "-u", mnt)
        run("umount", "-l", mnt)


class Job:
    """Node 0's launch and the second host's agent, of the sleeper, in ``logdir``."""

    def __init__(self, root: str, logdir: str, agent_env: dict[str, str], tree: str = "") -> None:
        """``tree``: a checkout whose ``procsv`` both launches run (``--baseline``; "" for this one's)."""
        self.logdir = logdir
        target = os.path.join(root, "sleeper.py")
        with open(target, "w") as fh:
            fh.write(SLEEPER)
        addr = f"{MASTER}:{random.randint(30000, 60000)}"
        common = [sys.executable, "-m", "procsv", "launch", target, "--logdir", logdir, "--quiet", "--no-prewarm",
                  "--nnodes", "2", "--master-addr", addr, "--node-timeout", "15", "--startup-timeout", "0",
                  "--hang-timeout", "0"]
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        if tree:  # (ahead of the installed one; run from root: `-m` puts the working directory first)
            env["PYTHONPATH"] = os.pathsep.join(p for p in (tree, env.get("PYTHONPATH", "")) if p)
        self.master = subprocess.Popen(common, stdout=subprocess.DEVNULL, stderr=open(logdir + ".err", "wb"),
                                       env=env, start_new_session=True, cwd=root)
        self.agent = subprocess.Popen(["ip", "netns", "exec", NS, *common, "--node-rank", "1"],
                                      stdout=subprocess.DEVNULL, stderr=open(logdir + ".agent.err", "wb"),
                                      env={**env, **agent_env}, start_new_session=True, cwd=root)

    def joined(self) -> float:
        """Wait for the agent to join; the wall time it did."""
        try:
            got = wait(lambda: next((e for e in events(self.logdir) if e["event"] == "node_joined"), None), 120,
                       "node 1 to join")
        except BenchError as exc:  # (seen once at load 13: say what each side said)
            raise BenchError(f"{exc}; node 0 ({self.master.poll()}): {_tail(self.logdir + '.err')!r}; agent "
                             f"({self.agent.poll()}): {_tail(self.logdir + '.agent.err')!r}") from None
        return float(got["time"])

    def losses(self) -> list[dict[str, Any]]:
        return [e for e in events(self.logdir) if e["event"] == "node_lost"]

    def end(self, sweep: bool = True) -> None:
        """Kill the job; ``sweep``: and every process left in the second host's namespace (not while other
        jobs run there: ``--together``'s first job to end killed the others' agents, before their counts)."""
        for proc in (self.agent, self.master):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        pids = subprocess.run(["ip", "netns", "pids", NS], capture_output=True, text=True).stdout.split() if sweep else []
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)


@contextlib.contextmanager
def dropped() -> Iterator[float]:
    """Every packet between node 0 and the second host dropped both ways; yields the wall time it began."""
    run("ip", "route", "add", "blackhole", f"{HOST1}/32")
    run("ip", "netns", "exec", NS, "ip", "route", "add", "blackhole", f"{MASTER}/32")
    try:
        yield time.time()
    finally:
        run("ip", "netns", "exec", NS, "ip", "route", "del", "blackhole", f"{MASTER}/32")
        run("ip", "route", "del", "blackhole", f"{HOST1}/32")


def detection(mnt: str, name: str, probes: bool, tree: str = "") -> dict[str, Any]:
    """One silent host: seconds from the drop to ``node_lost``, and the record's silent_secs."""
    job = Job(mnt, os.path.join(mnt, name), {} if probes else {"PROCSV_FAULT": "agent:no_probe_port"}, tree)
    try:
        job.joined()
        time.sleep(BEATEN_SECS)
        with dropped() as at:
            lost = wait(lambda: next(iter(job.losses()), None), 60, "node 1 found lost")
        return {"detect": lost["time"] - at, "silent": lost["silent_secs"], "reason": lost["reason"]}
    finally:
        job.end()


def dead_agent(mnt: str, name: str) -> dict[str, Any]:
    """The agent SIGKILLed, its host up (its probe port closed: a reset): seconds from the kill to ``node_lost``."""
    job = Job(mnt, os.path.join(mnt, name), {})
    try:
        job.joined()
        time.sleep(BEATEN_SECS)
        at = time.time()
        os.kill(job.agent.pid, signal.SIGKILL)
        lost = wait(lambda: next(iter(job.losses()), None), 60, "node 1 found lost")
        return {"detect": lost["time"] - at, "silent": lost["silent_secs"], "reason": lost["reason"]}
    finally:
        job.end()


FREEZE = threading.Lock()  # (--together: one fsfreeze of the shared mount at a time)


def slow(mnt: str, name: str, kind: str, minutes: float, sweep: bool = True) -> dict[str, Any]:
    """One slow host for ``minutes``: the ``node_lost`` records counted (none expected); ``sweep``: see
    :meth:`Job.end` (the namespace's teardown kills what is left)."""
    job = Job(mnt, os.path.join(mnt, name), {})
    hogs: list[subprocess.Popen[bytes]] = []
    stops = stalls = 0
    try:
        job.joined()
        time.sleep(BEATEN_SECS)
        end = time.monotonic() + 60 * minutes
        if kind == "cpu":
            hogs = [subprocess.Popen(["ip", "netns", "exec", NS, sys.executable, "-c", "while True: pass"])
                    for _ in range(2 * (os.cpu_count() or 1))]
            time.sleep(max(0.0, end - time.monotonic()))
        while kind in ("sigstop", "stop10") and time.monotonic() < end:
            os.kill(job.agent.pid, signal.SIGSTOP)  # (`ip netns exec` execs the agent: its pid)
            time.sleep(0.2 if kind == "sigstop" else 10.0)
            os.kill(job.agent.pid, signal.SIGCONT)
            stops += 1
            time.sleep(2.8 if kind == "sigstop" else min(20.0, max(0.0, end - time.monotonic())))
        while kind == "fsstall" and time.monotonic() < end:
            with FREEZE:
                subprocess.run(["fsfreeze", "-f", mnt], check=True)
                try:
                    time.sleep(10.0)
                finally:
                    subprocess.run(["fsfreeze", "-u", mnt], check=True)
            stalls += 1
            time.sleep(min(20.0, max(0.0, end - time.monotonic())))
        time.sleep(1.0)
        lost = job.losses()
        codes = (job.master.poll(), job.agent.poll())
        got = {"losses": len(lost), "stops": stops, "stalls": stalls, "hogs": len(hogs),
               "reasons": [e["reason"] for e in lost], "alive": codes == (None, None)}
        if codes != (None, None):  # (a run that ended early counted nothing after its end: say why it ended)
            got["ended"] = {who: (code, _tail(path)) for who, code, path in
                            (("master", codes[0], job.logdir + ".err"), ("agent", codes[1], job.logdir + ".agent.err"))}
        return got
    finally:
        for h in hogs:
            h.kill()
            h.wait()
        job.end(sweep)


def _tail(path: str, lines: int = 6) -> str:
    with contextlib.suppress(OSError), open(path, errors="replace") as fh:
        return "".join(fh.readlines()[-lines:])
    return ""


KINDS = (("cpu", "two CPU hogs per core on its host"), ("sigstop", "agent SIGSTOPped 200 ms every 3 s"),
         ("fsstall", "logdir's filesystem frozen 10 s every 30 s"), ("stop10", "agent SIGSTOPped 10 s every 30 s"))


def regroup(root: str, name: str, elastic: bool, tree: str = "") -> dict[str, Any]:
    """One silent loss of the second host under a TensorFlow group of two (see the module's docstring); ``tree``: a
    checkout whose ``procsv`` both launches run (``--baseline``; "" for this one's)."""
    logdir = os.path.join(root, name)
    os.makedirs(logdir)
    example = [*EXAMPLE, "--steps", "1000000", "--save-model-secs", "1"]
    group = ("--nproc", "1", "--nnodes", "2", "--master-addr", f"{MASTER}:{random.randint(30000, 60000)}",
             "--group-grace-secs", "0")
    env = dict(ENV, PYTHONPATH=os.pathsep.join(p for p in (tree, ENV.get("PYTHONPATH", "")) if p)) if tree else None
    master = launch(logdir, ["--min-nodes", "1"] if elastic else [], example, group, env=env)
    agent = launch(logdir, [], example, (*group, "--node-rank", "1"), ("ip", "netns", "exec", NS), ".agent", env=env)
    out: dict[str, Any] = {"elastic": elastic}
    try:
        wait(lambda: chief_first_step(logdir, 1), 300, "the group's first step")
        wait(lambda: find(events(logdir), "checkpoint_committed"), 120, "the group's first commit")
        with dropped() as at:
            lost = wait(lambda: find(events(logdir), "node_lost", after=at), 60, "node 1 found lost")
            if elastic:
                small = wait(lambda: find(events(logdir), "membership", nodes=[0]), 60, "the group without node 1")
                first = wait(lambda: chief_first_step(logdir, small["attempt"]), 120, "the smaller group's first step")
            else:
                time.sleep(max(0.0, lost["time"] + HEAL_SECS - time.time()))  # the partition's length
        if not elastic:
            joined = wait(lambda: find(events(logdir), "node_joined", after=lost["time"], node=1), 120,
                          "node 1's agent back")
            spawned = wait(lambda: find(events(logdir), "spawned", after=lost["time"], role="trainer"), 120,
                           "the group of two")
            first = wait(lambda: chief_first_step(logdir, spawned["attempt"]), 120, "the group of two's first step")
            out["back"] = first["time"] - joined["time"]
            out["healed_hello"] = joined["time"] - (lost["time"] + HEAL_SECS)
        ev = events(logdir)
        spawned = find(ev, "spawned", pid=first["pid"])
        restored = find(ev, "restored", pid=first["pid"]) or find(ev, "initialized", pid=first["pid"])
        trained = [e for e in ev if e["event"] == "trained" and e.get("role") == "trainer" and e["time"] < first["time"]]
        if spawned is None or restored is None:
            raise BenchError(f"{logdir}: the new chief's spawned or restored record is missing")
        out.update(detect=lost["time"] - at, restore=restored["time"] - spawned["time"], source=restored.get("source"),
                   restored_step=restored["step"], redone=(trained[-1]["step"] - restored["step"]) if trained else None)
        if elastic:
            out.update(shrink=first["time"] - at, lost_first=first["time"] - lost["time"])
            out["beyond"] = out["shrink"] - out["restore"]
        else:
            out.update(beyond=out["back"] - out["restore"], hello_spawn=spawned["time"] - joined["time"])
    finally:
        out["code"] = stop(master)
        stop(agent, 30)
    if not elastic and "back" in out:
        out.update(parts(logdir, joined["time"], spawned, first))
    return out


def parts(logdir: str, hello: float, spawned: dict[str, Any], first: dict[str, Any]) -> dict[str, Any]:
    """Where the group of two's time from the hello went, each from the hello (s): the worker's start
    (``worker_spawned``: node 0 heard its MemberStarted), each member's strategy up (the example's own line),
    ``*_prepared`` (its program's start-up done), ``*_ready`` (restored: the chief's ``restored``, the worker's
    ``worker_ready``, else its ``trained`` record's ``ready_at``, a checkout before the record), and
    ``ready_first``: from the later member's restore to the group's first step (its first step's instantiation,
    kernels and first collective). Read once the launches ended (the worker's ``trained`` record is at its end)."""
    ev = events(logdir)
    a = spawned["attempt"]
    worker = find(ev, "spawned", role="worker1", attempt=a)
    chief = find(ev, "restored", pid=first["pid"]) or find(ev, "initialized", pid=first["pid"]) or {}
    ready = (find(ev, "worker_ready", pid=worker["pid"]) if worker else None) or {}
    trained = (find(ev, "trained", pid=worker["pid"]) if worker else None) or {}
    rel = (lambda t: None if t is None else round(t - hello, 3))
    out: dict[str, Any] = {"worker_spawned": rel(worker["time"]) if worker else None,
                           "chief_up": rel(strategy_up(logdir, a)), "worker_up": rel(strategy_up(logdir, a, "worker1")),
                           "chief_prepared": rel(chief.get("prepared_at")), "chief_warm": chief.get("warm_secs"),
                           "chief_ready": rel(chief.get("time")), "chief_restore": chief.get("secs"),
                           "worker_prepared": rel(ready.get("prepared_at")), "worker_warm": ready.get("warm_secs"),
                           "worker_ready": rel(ready.get("time", trained.get("ready_at"))),
                           "worker_restore": ready.get("secs", trained.get("restore_secs"))}
    later = max((t for t in (out["chief_ready"], out["worker_ready"]) if t is not None), default=None)
    out["ready_first"] = round(first["time"] - hello - later, 3) if later is not None else None
    return out


def keep(root: str, name: str, into: str) -> None:
    """Copy run ``name``'s logdir and its launches' stderr from ``root`` under ``into`` (``--keep``)."""
    os.makedirs(into, exist_ok=True)
    src = os.path.join(root, name)
    with contextlib.suppress(OSError):
        shutil.copytree(src, os.path.join(into, name), dirs_exist_ok=True, ignore=shutil.ignore_patterns("*.sock"))
    for tail in (".out", ".agent"):
        with contextlib.suppress(OSError):
            shutil.copy(src + tail, os.path.join(into, name + tail))


def _tree(pid: int) -> list[int]:
    """``pid`` and every process under it (node 0's launch: its watchdog, services, trainers, standbys)."""
    import psutil
    try:
        top = psutil.Process(pid)
        return [pid, *(p.pid for p in top.children(recursive=True))]
    except psutil.Error:
        return []


def _stopped_at(path: str, text: str, pid: int, timeout: float) -> Optional[float]:
    """The wall time node 1's member ``pid`` ended (on its own: TensorFlow's coordination service lost its leader)
    or ``text`` showed up in its agent's output at ``path`` (polled every 50 ms); None past ``timeout``."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        with contextlib.suppress(OSError):
            with open(path, errors="replace") as fh:
                if text in fh.read():
                    return time.time()
        try:
            with open(f"/proc/{pid}/stat") as fh:
                if fh.read().rpartition(")")[2].split()[0] in ("Z", "X"):
                    return time.time()
        except OSError:
            return time.time()
        time.sleep(0.05)
    return None


MASTER_SILENT_WAIT = 20.0  # a silent master's processes are left running this long (past --node-timeout 15)
STOPPING = "stopping this host's trainers"  # the agent's line once it stops its members for a silent master


def master_loss(root: str, name: str, kind: str) -> dict[str, Any]:
    """Node 0 lost under a TensorFlow group of two (``kind`` "silent": its packets dropped both ways, its processes
    left running ``MASTER_SILENT_WAIT`` s, then SIGKILLed; "sigkill": its processes SIGKILLed at once), then its
    launch started again with the same command: how long node 1's members stay in the stale group (the drop or
    kill -> the agent's line stopping them), what the relaunched master restores from, the steps re-done."""
    logdir = os.path.join(root, name)
    os.makedirs(logdir)
    example = [*EXAMPLE, "--steps", "1000000", "--save-model-secs", "30"]
    group = ("--nproc", "1", "--nnodes", "2", "--master-addr", f"{MASTER}:{random.randint(30000, 60000)}",
             "--group-grace-secs", "0")
    master = launch(logdir, [], example, group)
    agent = launch(logdir, [], example, (*group, "--node-rank", "1"), ("ip", "netns", "exec", NS), ".agent")
    out: dict[str, Any] = {"kind": kind}
    again: Optional[subprocess.Popen[bytes]] = None
    try:
        wait(lambda: chief_first_step(logdir, 1), 300, "the group's first step")
        wait(lambda: find(events(logdir), "checkpoint_committed"), 120, "the group's first commit")
        time.sleep(8.0)  # in-memory copies newer than the disk's (--save-model-secs 30)
        pids = _tree(master.pid)
        last = int(status(logdir).get("step") or 0)  # (node 0's status file: the group's last step, each round)
        stopped: Optional[float] = None
        member = find(events(logdir), "spawned", role="worker1")
        assert member is not None
        with contextlib.ExitStack() as cut:
            at = time.time()
            if kind == "silent":
                cut.enter_context(dropped())
                stopped = _stopped_at(logdir + ".agent", STOPPING, member["pid"], MASTER_SILENT_WAIT)
                time.sleep(max(0.0, at + MASTER_SILENT_WAIT - time.time()))  # (silent as long, however soon it stopped)
            if kind == "silent":
                last = int(status(logdir).get("step") or 0)
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            master.wait()
            killed = time.time()
        if kind == "sigkill":
            stopped = _stopped_at(logdir + ".agent", STOPPING, member["pid"], 60)
        out["stale"] = None if stopped is None else stopped - at
        ev = events(logdir)
        committed = [e for e in ev if e["event"] == "checkpoint_committed"]
        out["disk_step"] = committed[-1].get("step") if committed else None
        attempts = max((e.get("attempt") or 0) for e in ev if e["event"] == "spawned")
        relaunched = time.time()
        again = launch(logdir, [], example, group, out_name=".out2")
        spawned = wait(lambda: find(events(logdir), "spawned", after=relaunched, role="trainer"), 300,
                       "the relaunched master's chief")
        first = wait(lambda: find(events(logdir), "first_step", after=relaunched, pid=spawned["pid"]), 300,
                     "the relaunched group's first step")
        ev = events(logdir)
        restored = find(ev, "restored", pid=first["pid"]) or find(ev, "initialized", pid=first["pid"])
        out.update(last=last, attempts_before=attempts, killed_after=killed - at, back=first["time"] - relaunched,
                   rejoin=(find(ev, "node_joined", after=relaunched) or {"time": float("nan")})["time"] - relaunched,
                   source=restored.get("source") if restored else None,
                   restored_step=restored.get("step") if restored else None)
        # (node 0's status file, written each round, may lag the group by a few steps at a SIGKILL: at least 0)
        out["redone"] = max(0, last - out["restored_step"]) if out["restored_step"] is not None else None
    finally:
        if again is not None:
            out["code"] = stop(again)
        for pid in _tree(master.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        stop(agent, 30)
    return out


@contextlib.contextmanager
def bridge_dropped() -> Iterator[float]:
    """Every frame between node 0 and the second host dropped by the bridge (its port to the second host disabled:
    sent by each kernel, lost on the way); yields the wall time it began, and the heal's on exit is ``HEALED[0]``."""
    subprocess.run(["bridge", "link", "set", "dev", VETH, "state", "0"], check=True)
    try:
        yield time.time()
    finally:
        subprocess.run(["bridge", "link", "set", "dev", VETH, "state", "3"], check=True)  # (forwarding)
        HEALED[:] = [time.time()]


HEALED: list[float] = []


def heal(mnt: str, name: str, length: float, redial: bool) -> dict[str, Any]:
    """One partition of the sleeper job's second host, ``length`` s past ``node_lost``: the heal -> ``node_joined``."""
    job = Job(mnt, os.path.join(mnt, name), {} if redial else {"PROCSV_FAULT": "agent:no_redial"})
    try:
        job.joined()
        time.sleep(BEATEN_SECS)
        with bridge_dropped() as at:
            lost = wait(lambda: next(iter(job.losses()), None), 60, "node 1 found lost")
            time.sleep(max(0.0, lost["time"] + length - time.time()))
        healed = HEALED[0]
        joined = wait(lambda: find(events(job.logdir), "node_joined", after=healed, node=1), 120, "node 1's hello")
        return {"hello": joined["time"] - healed, "link": joined.get("link"), "detect": lost["time"] - at}
    finally:
        job.end()


AGENT_FOUND = "node 0 is lost ("  # the agent's line once it finds its master lost (the fast way)


def _agent_found(job: Job, after: int) -> Optional[float]:
    """The wall time the agent's output first showed :data:`AGENT_FOUND` past byte ``after``, polled; None if not yet."""
    with contextlib.suppress(OSError), open(job.logdir + ".agent.err", errors="replace") as fh:
        if AGENT_FOUND in fh.read()[after:]:
            return time.time()
    return None


def _err_size(job: Job) -> int:
    with contextlib.suppress(OSError):
        return len(open(job.logdir + ".agent.err", errors="replace").read())
    return 0


@contextlib.contextmanager
def one_way(way: str) -> Iterator[float]:
    """Every frame one way dropped on the wire, the other way passing (a blackhole qdisc on the egress of the veth
    end the frames leave by: each kernel takes them as sent, no error, no ICMP); ``way`` "1->0": the second host's
    frames to node 0 (its own end, in its namespace), "0->1": node 0's to it (the bridge's port to it). Yields the
    wall time it began."""
    cmd = ["ip", "netns", "exec", NS, "tc"] if way == "1->0" else ["tc"]
    dev = VETH + "p" if way == "1->0" else VETH
    subprocess.run([*cmd, "qdisc", "add", "dev", dev, "root", "blackhole"], check=True)
    try:
        yield time.time()
    finally:
        subprocess.run([*cmd, "qdisc", "del", "dev", dev, "root"], check=True)


def blips(mnt: str, name: str, length: float, count: int, tree: str, flap: float = 0.0) -> dict[str, Any]:
    """One sleeper job: ``count`` blips of ``length`` s (every frame between the hosts dropped both ways, :func:`one_way`
    each way at once, then passing), 3 s apart once the agent beats again; the ``node_lost`` records counted and the
    agent's findings of node 0 lost (its line). A blip found a loss waits for the agent's hello (node_joined) before the
    next. Not the bridge's port disabled, as ``heal``'s partitions: with its one port down the bridge loses its carrier
    and node 0 its neighbour entry for the host, and a probe sent after the blip waits for the next ARP request, 1 s
    after the first (``retrans_time_ms``): every blip of 0.15 s then cost a loss, a link flap's cost, not a blip's.
    ``flap``: each blip is two, ``flap`` s apart (a flapping link: the agent still deaf from the first, its
    connection waiting out TCP's retransmission, when the second begins)."""
    job = Job(mnt, os.path.join(mnt, name), {}, tree)
    losses = agent_losses = stuck = done = 0
    try:
        job.joined()
        time.sleep(BEATEN_SECS)
        for _ in range(count):
            size, before = _err_size(job), len(job.losses())
            with one_way("0->1") as at, one_way("1->0"):
                time.sleep(max(0.0, at + length - time.time()))
            if flap > 0:
                time.sleep(flap)
                with one_way("0->1") as again, one_way("1->0"):
                    time.sleep(max(0.0, again + length - time.time()))
            time.sleep(1.5)
            done += 1
            agent_losses += _agent_found(job, size) is not None
            if len(job.losses()) > before:
                losses += 1
                try:
                    wait(lambda: find(events(job.logdir), "node_joined", after=at, node=1), STUCK_SECS, "node 1 back")
                except BenchError:  # (its agent rode the blip out and kept the lost group's member: the job ends here)
                    stuck += 1
                    break
            time.sleep(BEATEN_SECS)
        return {"losses": losses, "agent_losses": agent_losses, "blips": done, "stuck": stuck}
    finally:
        job.end()


STUCK_SECS = 20.0  # a host lost in a blip and not taken back within this: stuck (node 0 waits up to --rejoin-timeout)


def cut_one_way(mnt: str, name: str, way: str, tree: str) -> dict[str, Any]:
    """One sleeper job, a one-way cut ``way`` (:func:`one_way`) held until both sides found it: seconds from the cut
    to node 0's ``node_lost`` and to the agent's line finding node 0 lost (None: not within 10 s)."""
    job = Job(mnt, os.path.join(mnt, name), {}, tree)
    try:
        job.joined()
        time.sleep(BEATEN_SECS)
        size = _err_size(job)
        with one_way(way) as at:
            found: dict[str, Optional[float]] = {"node0": None, "agent": None}
            end = time.time() + 10.0
            while time.time() < end and None in found.values():
                lost = next(iter(job.losses()), None)
                if found["node0"] is None and lost is not None:
                    found["node0"] = lost["time"] - at
                if found["agent"] is None and (seen := _agent_found(job, size)) is not None:
                    found["agent"] = seen - at
                time.sleep(0.02)
        return found
    finally:
        job.end()


def blip_main(args: argparse.Namespace) -> int:
    """``--only blip``: a silent host's detection, blips of each ``--blips`` length (``--blip-count`` each) and the two
    one-way cuts, ``--repeats`` runs of each, this checkout's rule and ``--baseline``'s (a checkout of the code
    before) interleaved; a table, one line, exit 1 if a check of this checkout's fails."""
    lengths = [float(x) for x in args.blips.split(",") if x]
    trees = {"now": "", **({"base": os.path.abspath(args.baseline)} if args.baseline else {})}
    root = tempfile.mkdtemp(prefix="procsv-bench-blip-")
    detect: dict[str, list[float]] = {k: [] for k in trees}
    lost: dict[tuple[str, float], list[dict[str, Any]]] = {(k, n): [] for k in trees for n in lengths}
    cuts: dict[tuple[str, str], list[dict[str, Any]]] = {(k, w): [] for k in trees for w in ("1->0", "0->1")}
    failures: list[str] = []
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, root, True)
        mnt = stack.enter_context(own_filesystem(root))
        stack.enter_context(second_host())
        time.sleep(1.0)  # (the veth up: an agent started at once found its route unreachable)
        for i in range(args.repeats):
            for key in (list(trees) if i % 2 == 0 else list(trees)[::-1]):
                tree = trees[key]
                try:
                    got = detection(mnt, f"bdetect{i}{key}", True, tree)
                    detect[key].append(got["detect"])
                    print(f"[{key}] silent host found after {got['detect']:.3f} s; load {os.getloadavg()[0]:.1f}",
                          flush=True)
                    for length in lengths:
                        b = blips(mnt, f"blip{i}{key}{length:g}", length, args.blip_count, tree, args.flap_gap)
                        lost[(key, length)].append(b)
                        print(f"[{key}] blips of {length:g} s: {b}; load {os.getloadavg()[0]:.1f}", flush=True)
                    for way in ("1->0", "0->1"):
                        c = cut_one_way(mnt, f"oneway{i}{key}{way[0]}", way, tree)
                        cuts[(key, way)].append(c)
                        print(f"[{key}] one-way cut {way}: {c}; load {os.getloadavg()[0]:.1f}", flush=True)
                except BenchError as exc:
                    failures.append(f"[{key}] {exc}")
    load = os.getloadavg()
    keys = list(trees)
    print()
    print("| case | " + " | ".join("this checkout" if k == "now" else "baseline" for k in keys) + " |")
    print("| --- |" + " --- |" * len(keys))
    print("| silent host: drop -> node_lost | " + " | ".join(spread(detect[k]) for k in keys) + " |")
    for length in lengths:
        cells = [f"{sum(r['losses'] for r in lost[(k, length)])}/{sum(r['blips'] for r in lost[(k, length)])} "
                 f"(agent: {sum(r['agent_losses'] for r in lost[(k, length)])}; never back: "
                 f"{sum(r['stuck'] for r in lost[(k, length)])})" for k in keys]
        print(f"| blip of {length:g} s: host losses (the agent's findings of node 0 lost; hosts never taken back) | "
              + " | ".join(cells) + " |")
    for way in ("1->0", "0->1"):
        for side in ("node0", "agent"):
            cells = [spread([c[side] for c in cuts[(k, way)] if c[side] is not None]) +
                     f" ({sum(c[side] is None for c in cuts[(k, way)])} not found)" for k in keys]
            print(f"| one-way cut {way}: cut -> {side} found it | " + " | ".join(cells) + " |")
    print(f"load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")
    med = (lambda xs: f"{statistics.median(xs):.3f}" if xs else "nan")
    rate = (lambda k, n: f"{sum(r['losses'] for r in lost[(k, n)])}/{sum(r['blips'] for r in lost[(k, n)])}")
    line = [f"blip_detect_secs={med(detect['now'])}", f"blip_detect_base_secs={med(detect.get('base', []))}"]
    stuck = (lambda k: sum(r["stuck"] for (t, _), rs in lost.items() if t == k for r in rs))
    for length in lengths:
        line += [f"blip_{length:g}_losses={rate('now', length)}"] + \
            ([f"blip_{length:g}_losses_base={rate('base', length)}"] if "base" in trees else [])
    line += [f"blip_stuck={stuck('now')}"] + ([f"blip_stuck_base={stuck('base')}"] if "base" in trees else [])
    for way, tag in (("1->0", "10"), ("0->1", "01")):
        for side in ("node0", "agent"):
            line.append(f"oneway_{tag}_{side}_secs={med([c[side] for c in cuts[('now', way)] if c[side] is not None])}")
    print(" ".join(line) + f" blip_load={load[0]:.1f}")
    if detect["now"] and statistics.median(detect["now"]) > FAST_BOUND:
        failures.append(f"the silent host's median time to detection is past {FAST_BOUND} s")
    failures += [f"a one-way cut {w} was not found by {side}" for (k, w), rs in cuts.items() if k == "now"
                 for r in rs for side in ("node0", "agent") if r[side] is None]
    failures += [f"a blip of {n:g} s (within the rule's bound) cost a host loss" for (k, n), rs in lost.items()
                 if k == "now" and n <= BLIP_RIDDEN and any(r["losses"] for r in rs)]
    failures += [f"a host lost in a blip of {n:g} s was never taken back" for (k, n), rs in lost.items()
                 if k == "now" and any(r["stuck"] for r in rs)]
    for f in failures:
        print(f"bench_host_loss: FAILED: {f}", file=sys.stderr)
    return 1 if failures else 0


BLIP_RIDDEN = 0.2  # a blip this short is ridden out at any phase, with a margin for the load (the rule: 0.25 s)


def heal_main(args: argparse.Namespace) -> int:
    """``--only heal``: ``heal`` of each length and agent, ``--repeats`` runs interleaved; a table, one line."""
    lengths = [float(x) for x in args.partitions.split(",") if x]
    root = tempfile.mkdtemp(prefix="procsv-bench-heal-")
    runs: dict[tuple[float, bool], list[dict[str, Any]]] = {(n, r): [] for n in lengths for r in (True, False)}
    failures: list[str] = []
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, root, True)
        stack.enter_context(second_host())
        for i in range(args.repeats):
            for length in lengths:
                for redial in ((True, False) if i % 2 == 0 else (False, True)):
                    try:
                        got = heal(root, f"heal{i}-{length:g}-{int(redial)}", length, redial)
                    except BenchError as exc:
                        failures.append(f"heal {length:g} s ({'redial' if redial else 'before'}): {exc}")
                        continue
                    runs[(length, redial)].append(got)
                    print(f"partition {length:g} s past node_lost, {'redial' if redial else 'before (no_redial)'}: "
                          f"{got}; load {os.getloadavg()[0]:.1f}", flush=True)
    load = os.getloadavg()
    print()
    print("| partition past node_lost | heal -> hello (redial) | its link | heal -> hello (before) | its link |")
    print("| --- | --- | --- | --- | --- |")
    for length in lengths:
        new, old = runs[(length, True)], runs[(length, False)]
        print(f"| {length:g} s | {spread([r['hello'] for r in new])} | {[r['link'] for r in new]} | "
              f"{spread([r['hello'] for r in old])} | {[r['link'] for r in old]} |")
    print(f"load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")
    if any(len(rs) < args.repeats for rs in runs.values()):
        failures.append("a heal run did not get as far as its measure")
    new = [r["hello"] for (_, redial), rs in runs.items() if redial for r in rs]
    old = [r["hello"] for (_, redial), rs in runs.items() if not redial for r in rs]
    med = (lambda xs: f"{statistics.median(xs):.3f}" if xs else "nan")
    top = (lambda xs: f"{max(xs):.3f}" if xs else "nan")
    print(f"heal_hello_secs={med(new)} heal_hello_max={top(new)} heal_hello_before_secs={med(old)} "
          f"heal_hello_before_max={top(old)} heal_load={load[0]:.1f}")
    for f in failures:
        print(f"bench_host_loss: FAILED: {f}", file=sys.stderr)
    return 1 if failures else 0


def master_main(args: argparse.Namespace) -> int:
    """``--only master``: ``master_loss`` of each kind, ``--repeats`` runs interleaved; a table, one line, exit 1 on a failed check."""
    root = tempfile.mkdtemp(prefix="procsv-bench-masterloss-")
    runs: dict[str, list[dict[str, Any]]] = {"silent": [], "sigkill": []}
    failures: list[str] = []
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, root, True)
        stack.enter_context(second_host())
        for i in range(args.repeats):
            for kind in (("silent", "sigkill") if i % 2 == 0 else ("sigkill", "silent")):
                try:
                    got = master_loss(root, f"master{i}{kind}", kind)
                except BenchError as exc:
                    failures.append(f"master {kind}: {exc}")
                    continue
                runs[kind].append(got)
                print(f"master {kind}: {got}; load {os.getloadavg()[0]:.1f}", flush=True)
    load = os.getloadavg()
    col = (lambda rs, k: spread([r[k] for r in rs if isinstance(r.get(k), (int, float))]))
    print()
    print("| node 0 lost | silent (packets dropped, then killed) | SIGKILLed |")
    print("| --- | --- | --- |")
    for key, what in (("stale", "drop/kill -> node 1's members stopped"), ("back", "relaunch -> the group's first step"),
                      ("rejoin", "relaunch -> node 1's agent joined")):
        print(f"| {what} | {col(runs['silent'], key)} | {col(runs['sigkill'], key)} |")
    for key, what in (("source", "restored from"), ("redone", "steps re-done"), ("restored_step", "step restored"),
                      ("disk_step", "newest disk checkpoint")):
        print(f"| {what} | {[r.get(key) for r in runs['silent']]} | {[r.get(key) for r in runs['sigkill']]} |")
    print(f"load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")
    if any(len(rs) < args.repeats for rs in runs.values()):
        failures.append("a master run did not get as far as its measure")
    failures += [f"master {r['kind']}: members never stopped" for rs in runs.values() for r in rs if r["stale"] is None]
    for kind, rs in runs.items():
        stale = [r["stale"] for r in rs if r["stale"] is not None]
        if stale and statistics.median(stale) > FAST_BOUND:
            failures.append(f"master {kind}: node 1's members stayed in the stale group past {FAST_BOUND:g} s (median)")
        failures += [f"master {kind}: the relaunched group restored from {r['source']}, not from node 1's replica"
                     for r in rs if r.get("source") not in ("peer", "memory")]
    med = (lambda rs, k: f"{statistics.median(v):.3f}" if (v := [r[k] for r in rs if isinstance(r.get(k), (int, float))])
           else "nan")
    mem = (lambda rs: sum(1 for r in rs if r.get("source") in ("memory", "peer")))
    print(f"masterloss_stale_silent_secs={med(runs['silent'], 'stale')} "
          f"masterloss_stale_sigkill_secs={med(runs['sigkill'], 'stale')} "
          f"masterloss_back_silent_secs={med(runs['silent'], 'back')} "
          f"masterloss_back_sigkill_secs={med(runs['sigkill'], 'back')} "
          f"masterloss_redone_silent={med(runs['silent'], 'redone')} masterloss_redone_sigkill={med(runs['sigkill'], 'redone')} "
          f"masterloss_from_memory={mem(runs['silent']) + mem(runs['sigkill'])}/{sum(map(len, runs.values()))} "
          f"masterloss_load={load[0]:.1f}")
    for f in failures:
        print(f"bench_host_loss: FAILED: {f}", file=sys.stderr)
    return 1 if failures else 0


def spread(xs: list[float]) -> str:
    return f"{statistics.median(xs):.3f} s ({min(xs):.3f}-{max(xs):.3f})" if xs else "-"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--minutes", type=float, default=30.0, help="length of each false-loss run (30 for the issue)")
    ap.add_argument("--only", choices=("detect", "slow", "regroup", "master", "heal", "blip"), help="run one part only")
    ap.add_argument("--blips", default="0.2,0.3,0.5", help="--only blip: the blips' lengths (s)")
    ap.add_argument("--blip-count", type=int, default=10, help="--only blip: blips of each length per run")
    ap.add_argument("--flap-gap", type=float, default=0.0,
                    help="--only blip: each blip two, this many seconds apart (a flapping link; 0: one)")
    ap.add_argument("--partitions", default="2,10,30", help="--only heal: the partitions' lengths past node_lost (s)")
    ap.add_argument("--together", action="store_true", help="the false-loss runs at once (each its own job)")
    ap.add_argument("--kinds", default=",".join(k for k, _ in KINDS), help="the false-loss runs, by name")
    ap.add_argument("--every-host", action="store_true", help="--only regroup: only the runs without --min-nodes")
    ap.add_argument("--baseline", default="", help="--only blip, regroup: a checkout of the code before, run beside "
                                                   "this one's (interleaved)")
    ap.add_argument("--keep", default="", help="copy each regroup run's logdir (and its launches' output) under this folder")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("bench_host_loss: needs root (network namespaces, mounts)", file=sys.stderr)
        return 2
    if args.only == "master":
        return master_main(args)
    if args.only == "heal":
        return heal_main(args)
    if args.only == "blip":
        return blip_main(args)
    root = tempfile.mkdtemp(prefix="procsv-bench-hostloss-")
    fast: list[float] = []
    old: list[float] = []
    dead: list[float] = []
    falses: dict[str, int] = {}
    shrinks: list[dict[str, Any]] = []
    backs: list[dict[str, Any]] = []
    before: list[dict[str, Any]] = []  # --baseline's every-host runs
    failures: list[str] = []
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, root, True)  # (last: after the unmount)
        mnt = stack.enter_context(own_filesystem(root))
        stack.enter_context(second_host())
        if args.only in (None, "detect"):
            for i in range(args.repeats):
                for probes, into in ((True, fast), (False, old)):
                    try:
                        got = detection(mnt, f"detect{i}{'p' if probes else 't'}", probes)
                    except BenchError as exc:
                        failures.append(f"detection ({'probes' if probes else '--node-timeout'}): {exc}")
                        continue
                    into.append(got["detect"])
                    print(f"silent host, {'probes' if probes else '--node-timeout 15 alone'}: found after "
                          f"{got['detect']:.3f} s (silent_secs {got['silent']:.3f}): {got['reason']}", flush=True)
                try:
                    got = dead_agent(mnt, f"dead{i}")
                except BenchError as exc:
                    failures.append(f"dead agent: {exc}")
                    continue
                dead.append(got["detect"])
                print(f"dead agent, host up: found after {got['detect']:.3f} s: {got['reason']}", flush=True)
        if args.only in (None, "regroup"):
            trees = ("", os.path.abspath(args.baseline)) if args.baseline else ("",)
            for i in range(args.repeats):
                modes = (False,) if args.every_host else ((True, False) if i % 2 == 0 else (False, True))
                for elastic in modes:
                    for tree in (trees if i % 2 == 0 else trees[::-1]):  # (interleaved: the load falls on both)
                        name = f"regroup{i}{'e' if elastic else 'a'}{'b' if tree else ''}"
                        try:
                            got = regroup(root, name, elastic, tree)
                        except BenchError as exc:
                            failures.append(f"regroup ({'--min-nodes 1' if elastic else 'every host'}"
                                            f"{', baseline' if tree else ''}): {exc}")
                            continue
                        finally:
                            if args.keep:
                                keep(root, name, args.keep)
                        got["load"] = round(os.getloadavg()[0], 1)
                        (before if tree else shrinks if elastic else backs).append(got)
                        print(f"regroup, {'--min-nodes 1' if elastic else 'every host'}"
                              f"{' (baseline)' if tree else ''}: {got}", flush=True)
        if args.only in (None, "slow"):
            kinds = [k for k in args.kinds.split(",") if k]

            def one(kind: str) -> None:
                try:
                    got = slow(mnt, f"slow-{kind}", kind, args.minutes, sweep=not args.together)
                except BenchError as exc:
                    failures.append(f"{kind}: {exc}")
                    return
                falses[kind] = got["losses"]
                print(f"slow host ({kind}, {args.minutes:g} min): {got['losses']} false losses; {got}", flush=True)
            if args.together:
                threads = [threading.Thread(target=one, args=(k,)) for k in kinds]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
            else:
                for kind in kinds:
                    one(kind)
    load = os.getloadavg()
    print()
    print("| case | result |")
    print("| --- | --- |")
    print(f"| silent host, time to detection (probes, default) | {spread(fast)} |")
    print(f"| silent host, time to detection (--node-timeout 15 alone, before) | {spread(old)} |")
    print(f"| dead agent (SIGKILL), host up: time to detection | {spread(dead)} |")
    together = ", all at once" if args.together else ""
    for kind, what in KINDS:
        print(f"| slow host: {what}, {args.minutes:g} min{together} | {falses.get(kind, '-')} false losses |")
    col = (lambda rs, k: spread([r[k] for r in rs if r.get(k) is not None]))
    print(f"| silent host, --min-nodes 1: drop -> smaller group's first step | {col(shrinks, 'shrink')} |")
    print(f"|   of it node_lost -> first step | {col(shrinks, 'lost_first')} |")
    print(f"|   of it the restore (spawned -> restored) | {col(shrinks, 'restore')} |")
    print(f"|   beyond the restore (goal <= {BACK_BOUND:g} s) | {col(shrinks, 'beyond')} |")
    print(f"|   steps re-done; restored from | {[r['redone'] for r in shrinks]}; {[r['source'] for r in shrinks]} |")
    print(f"| silent host, every host: agent's hello -> group's first step (goal <= {BACK_BOUND:g} s) | "
          f"{col(backs, 'back')} |")
    print(f"|   of it the restore (spawned -> restored) | {col(backs, 'restore')} |")
    print(f"|   beyond the restore | {col(backs, 'beyond')} |")
    print(f"|     of it the hello -> the new chief spawned | {col(backs, 'hello_spawn')} |")
    print(f"|   packets passing -> the agent's hello | {col(backs, 'healed_hello')} |")
    print(f"|   steps re-done; restored from | {[r['redone'] for r in backs]}; {[r['source'] for r in backs]} |")
    print(f"load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")
    if backs:
        print()
        print("| every host, from the hello (s) | this checkout | " + ("baseline |" if before else ""))
        print("| --- | --- | " + ("--- |" if before else ""))
        for key in ("back", "beyond", "hello_spawn", "worker_spawned", "chief_up", "worker_up", "chief_prepared",
                    "worker_prepared", "chief_warm", "worker_warm", "chief_ready", "worker_ready", "chief_restore",
                    "worker_restore", "ready_first"):
            print(f"| {key} | {col(backs, key)} | " + (f"{col(before, key)} |" if before else ""))
        loads = (lambda rs: f"{min(r['load'] for r in rs):g}-{max(r['load'] for r in rs):g}" if rs else "-")
        print(f"| 1-min load at each run's end | {loads(backs)} | " + (f"{loads(before)} |" if before else ""))
    if args.only in (None, "regroup"):
        if (len(shrinks) < args.repeats and not args.every_host) or len(backs) < args.repeats:
            failures.append("a regroup run did not get as far as its measure")
        failures += [f"regroup run exited {r['code']} (want 143: stopped by the bench)"
                     for r in shrinks + backs if r["code"] not in (143, 1)]
        if shrinks and statistics.median(r["beyond"] for r in shrinks) > BACK_BOUND:
            failures.append(f"the smaller group's first step came past {BACK_BOUND:g} s plus its restore (median)")
        if backs and statistics.median(r["beyond"] for r in backs) > BACK_BOUND:
            failures.append(f"the group of two's first step came past {BACK_BOUND:g} s plus its restore after the "
                            "hello (median)")
    if args.only in (None, "detect") and (not fast or statistics.median(fast) > FAST_BOUND):
        failures.append(f"the silent host's median time to detection is past {FAST_BOUND} s")
    failures += [f"{n} false losses ({k})" for k, n in falses.items() if n]
    med = (lambda xs: f"{statistics.median(xs):.3f}" if xs else "nan")
    print(f"hostloss_detect_secs={med(fast)} hostloss_detect_timeout_secs={med(old)} "
          f"hostloss_false_cpu={falses.get('cpu', 'nan')} hostloss_false_sigstop={falses.get('sigstop', 'nan')} "
          f"hostloss_false_fsstall={falses.get('fsstall', 'nan')} hostloss_false_stop10={falses.get('stop10', 'nan')} "
          f"hostloss_minutes={args.minutes:g} "
          f"hostloss_shrink_secs={med([r['shrink'] for r in shrinks])} "
          f"hostloss_shrink_restore_secs={med([r['restore'] for r in shrinks])} "
          f"hostloss_shrink_beyond_restore_secs={med([r['beyond'] for r in shrinks])} "
          f"hostloss_back_secs={med([r['back'] for r in backs])} "
          f"hostloss_back_beyond_restore_secs={med([r['beyond'] for r in backs])} hostloss_load={load[0]:.1f}")
    for f in failures:
        print(f"bench_host_loss: FAILED: {f}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
