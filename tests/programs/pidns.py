"""Scenes played inside a fresh PID namespace (``unshare --pid --fork --mount-proc python pidns.py MODE ...``).

In a namespace of its own this program is pid 1 and nothing else starts processes, so
``/proc/sys/kernel/ns_last_pid`` places a bystander exactly on a chosen pid: the pid a shared file
records for a process of another namespace (another host, another container), or the pid of a
process that ended (a reused pid). Each scene prints one JSON object on its last line.

    other-host LOGDIR PID...   bystanders on the PIDs; then procsv status / preempt / stop LOGDIR
    fork-held-lock LOGDIR      the process that took LOGDIR's lock ends, a fork of it keeps it, a
                               bystander gets its pid; then procsv stop LOGDIR
    reused-forked-pid DIR      a trainer forked by a real pre-warmed trainer ends and is reaped by
                               it, a bystander gets its pid; then the watchdog's handle on the
                               trainer is signalled, group-killed and reaped
"""

import json
import os
import signal
import subprocess
import sys
import time


def bystander(pid: int) -> "subprocess.Popen[bytes]":
    """A process with exactly ``pid`` (leading its own process group), or an error."""
    with open("/proc/sys/kernel/ns_last_pid", "w") as fh:
        fh.write(str(pid - 1))
    proc = subprocess.Popen(["sleep", "120"], start_new_session=True)
    if proc.pid != pid:
        proc.kill()
        raise SystemExit(f"the bystander got pid {proc.pid}, not {pid}")
    return proc


def procsv(*args: str, timeout: float = 60) -> dict:
    out = subprocess.run([sys.executable, "-m", "procsv", *args], capture_output=True, text=True, timeout=timeout)
    return {"code": out.returncode, "out": out.stdout, "err": out.stderr}


def dies_within(proc: "subprocess.Popen[bytes]", secs: float) -> bool:
    """True if ``proc`` dies within ``secs`` (a signal sent to it is acted on at once)."""
    try:
        proc.wait(timeout=secs)
    except subprocess.TimeoutExpired:
        return False
    return True


def wait_for(cond, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise SystemExit("timed out")
        time.sleep(0.05)


def other_host(logdir: str, pids: list[int]) -> dict:
    others = [bystander(pid) for pid in pids]
    try:
        res = {"status_json": procsv("status", logdir, "--json"), "status": procsv("status", logdir),
               "preempt": procsv("preempt", logdir, "--target", "trainer"),
               "stop": procsv("stop", logdir, "--timeout", "3")}
        res["bystanders_alive"] = [not dies_within(p, 0.5) for p in others]
        return res
    finally:
        for p in others:
            p.kill()
            p.wait()


def fork_held_lock(logdir: str) -> dict:
    r, w = os.pipe()
    taker = os.fork()
    if taker == 0:  # takes the lock, forks a child that keeps it (the same open file), ends
        from procsv.common.layout import Layout, LogdirLock

        lay = Layout(logdir)
        lay.create()
        LogdirLock(lay).acquire()
        if os.fork() == 0:
            os.close(r)
            os.write(w, b"k")
            time.sleep(120)
            os._exit(0)
        os._exit(0)
    os.close(w)
    os.read(r, 1)
    os.waitpid(taker, 0)
    other = bystander(taker)
    try:
        res = {"stop": procsv("stop", logdir, "--timeout", "2"), "taker": taker}
        res["bystander_alive"] = not dies_within(other, 0.5)
        return res
    finally:
        other.kill()
        other.wait()


def reused_forked_pid(folder: str) -> dict:
    from procsv.common import spawn
    from procsv.common.layout import Layout, RuntimeDir
    from procsv.watchdog.children import ChildProcess
    from procsv.watchdog.prewarm import Zygote, zygote_env

    lay = Layout(os.path.join(folder, "run"))
    lay.create()
    runtime = RuntimeDir.create()
    target = os.path.join(folder, "ends.py")
    with open(target, "w") as fh:
        fh.write("import time\ntime.sleep(1.0)\n")
    z = Zygote(zygote_env(lay.logdir, runtime.path), os.path.join(folder, "zygote.log"), folder)
    try:
        deadline = time.monotonic() + 120
        while not z.ready:
            if not z.alive() or time.monotonic() > deadline:
                raise SystemExit("the zygote did not become ready")
            z.reader.wait(0.5)
            z.pump()
        env = spawn.child_env(role="trainer", attempt=1, logdir=lay.logdir, runtime_dir=runtime.path, supervised=False)
        z.request_fork(1, target, [], env, os.path.join(folder, "trainer.log"), folder)
        proc = None
        while proc is None:
            z.reader.wait(0.5)
            z.pump()
            proc = z.answer(1)
        handle = ChildProcess("trainer", "trainer", 1, proc, os.path.join(folder, "trainer.log"))
        wait_for(lambda: proc.poll() is not None, 60)  # it ended and the zygote reaped it
        other = bystander(proc.pid)
        try:
            handle.send_signal(signal.SIGTERM)
            alive_after_signal = not dies_within(other, 0.5)
            handle.kill_group(signal.SIGKILL)
            alive_after_group = not dies_within(other, 0.5)
            code = handle.reap(timeout=1.0)
            return {"code": code, "pid": proc.pid, "after_signal": alive_after_signal,
                    "after_group": alive_after_group, "after_reap": not dies_within(other, 0.5),
                    "pidfd_closed": handle.pidfd == -1}
        finally:
            other.kill()
            other.wait()
    finally:
        z.close(10)


def main() -> None:
    mode, rest = sys.argv[1], sys.argv[2:]
    if mode == "other-host":
        res = other_host(rest[0], [int(p) for p in rest[1:]])
    elif mode == "fork-held-lock":
        res = fork_held_lock(rest[0])
    else:
        res = reused_forked_pid(rest[0])
    print(json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
