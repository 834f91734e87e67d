"""procsv under a real Slurm (tests/slurm_fixture.py): the examples in examples/slurm/ as sbatch jobs.

* ``scontrol requeue`` of a running ``sbatch --requeue`` job of the digits example: SIGTERM to every
  process of the job; the job comes back and ends COMPLETED at its last step with 0 steps lost and
  the weights of a plain uninterrupted run; its job id names the run in status.json and the metrics;
* ``scancel --signal=USR2 --batch`` (as ``sbatch --signal=B:USR2@T`` delivers it) with
  ``--requeue-on-preempt``: the run saves, stops in order, requeues its job, and the second run
  finishes;
* a 2-node job (``srun --ntasks-per-node=1``, ``--nproc 1`` per node, MultiWorkerMirroredStrategy)
  takes --nnodes/--node-rank/--master-addr from the step and survives a SIGKILL of node 1's trainer;
  the warning signal, forwarded by the batch script to the srun step, saves and requeues it;
* ``scontrol show hostnames`` expands every host list of tests/test_placement.py as procsv does.

Each prints its figures (steps lost, requeue-to-first-step time split into Slurm's and procsv's part).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from typing import Any, Iterator

import pytest

from conftest import CLEAN_ARGS, REPO, final_weights, lifecycle, quiet_env, raw_status, wait_for
from slurm_fixture import NODES, Cluster, slurm  # noqa: F401  (the session's cluster)
from test_placement import HOSTLISTS

pytestmark = pytest.mark.slow
EXAMPLES = os.path.join(REPO, "examples", "slurm")
NODE0, NODE1 = list(NODES)


def submit(cluster: Cluster, script: str, logdir: str, out: str, *sbatch: str, **env: str) -> str:
    """``sbatch --parsable`` one of examples/slurm/ with its settings in the environment; the job id."""
    job_env = quiet_env(PYTHON=sys.executable, LOGDIR=logdir, **cluster.env, **env)
    r = subprocess.run(["sbatch", "--parsable", f"--output={out}", f"--chdir={REPO}", *sbatch,
                        os.path.join(EXAMPLES, script)], capture_output=True, text=True, env=job_env, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip().split(";")[0]


@pytest.fixture
def jobs(slurm: Cluster) -> Iterator[list[str]]:  # noqa: F811
    """The test's job ids: cancelled at teardown (nothing of a failed test stays queued or running)."""
    ids: list[str] = []
    yield ids
    for job in ids:
        slurm.cmd("scancel", job, check=False)
    for job in ids:
        wait_for(lambda: slurm.job(job).get("JobState") not in ("RUNNING", "COMPLETING"), 60, interval=0.5,
                 what=f"job {job} to end")


def ended(cluster: Cluster, job: str) -> dict[str, str]:
    info = cluster.job(job)
    return info if info.get("JobState") in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL") else {}


def events(logdir: str, name: str) -> list[dict[str, Any]]:
    return [e for e in lifecycle(logdir) if e["event"] == name]


def figures(logdir: str, out: str, requeued_at: float, what: str, k: int = 0) -> tuple[int, float, float]:
    """(steps lost, Slurm's part, procsv's part of the time from the requeue to the first step of the
    requeued job), printed, for the job's ``k``-th interruption (0: the first). Slurm's part: from the
    stopped run's ``finished`` record to the batch script's start line of the next run (it includes
    procsv's exit after that record); procsv's: the orderly stop, and the next run's start up to its
    first step."""
    end = events(logdir, "finished")[k]
    # the run's last step: its last commit (the emergency checkpoint) or the last step the watchdog heard of
    last = max([end["step"]] + [e["step"] for e in events(logdir, "checkpoint_committed") if e["time"] <= end["time"]])
    after = [e for e in lifecycle(logdir) if e["time"] > end["time"]]
    lost = last - next(e for e in after if e["event"] == "restored")["step"]
    first_step = next(e for e in after if e["event"] == "first_step")["time"]
    with open(out) as fh:
        start = [float(line.split()[-1]) for line in fh if " start " in line and line.startswith("procsv job")][k + 1]
    slurm_part = start - end["time"]
    procsv_part = (end["time"] - requeued_at) + (first_step - start)
    print(f"\n{what}: {lost} steps lost (stopped at step {last}); requeue to first step "
          f"{first_step - requeued_at:.1f} s = procsv's orderly stop {end['time'] - requeued_at:.1f} s + "
          f"{slurm_part:.1f} s to the batch script's next start (procsv's exit, Slurm's cleanup, its hold of a "
          f"requeued job: cred_expire 10 s here, 120 s by default; scheduling) + procsv's start to the first step "
          f"{first_step - start:.1f} s")
    return lost, slurm_part, procsv_part


def same_weights(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a.keys() == b.keys() and len(a) > 4
    for key in a:
        assert (a[key] == b[key]).all(), f"{key} differs from the uninterrupted run"


def test_scontrol_show_hostnames_expands_every_host_list_as_procsv_does(slurm):  # noqa: F811
    for text, hosts in HOSTLISTS.items():
        assert slurm.cmd("scontrol", "show", "hostnames", text).split() == hosts, text


SINGLE_NODE = ("requeue", "warning")  # the two single-node jobs of one shared run (single_node_jobs)


def _single_node_jobs(slurm: Cluster, folder: str) -> None:  # noqa: F811
    """Both single-node jobs of the digits example, run side by side (each waits mostly on Slurm:
    its scheduling, the requeued job's hold of cred_expire), each interrupted at step 150 (at CLEAN_ARGS' 6 ms, the seconds step 300 took at 3 ms
    before): the first
    by ``scontrol requeue`` (with the metrics endpoint on), the second by the warning signal to its
    batch shell (``scancel --signal=USR2 --batch``). What each test reads goes to result.json; both
    jobs are cancelled at the end (nothing of a failed run stays queued or running)."""
    import json

    port = 19000 + os.getpid() % 1000
    logdir = {k: os.path.join(folder, k, "run") for k in SINGLE_NODE}
    out = {k: os.path.join(folder, k, "job.out") for k in SINGLE_NODE}
    for k in SINGLE_NODE:
        os.makedirs(os.path.join(folder, k))
    job: dict[str, str] = {}
    try:
        job["requeue"] = submit(slurm, "train.sbatch", logdir["requeue"], out["requeue"], f"--nodelist={NODE0}",
                                TRAIN_ARGS=" ".join(CLEAN_ARGS),
                                PROCSV_OPTS=f"--metrics-port {port} --metrics-host {NODE0} --standby fork")
        # (--standby fork: no launch of either job restarts its trainer, so none prepares a hot standby; the
        # requeued job's second launch restores from disk)
        job["warning"] = submit(slurm, "train.sbatch", logdir["warning"], out["warning"], f"--nodelist={NODE0}",
                                TRAIN_ARGS=" ".join(CLEAN_ARGS), PROCSV_OPTS="--standby fork")
        result: dict[str, Any] = {k: {"job": job[k], "logdir": logdir[k], "out": out[k]} for k in SINGLE_NODE}

        def interrupt_at_step_150() -> bool:
            """Interrupt each job that reached step 150 (each as soon as it does); True once both are."""
            for k in SINGLE_NODE:
                st = raw_status(logdir[k])
                if "at" in result[k] or not st or st.get("step", 0) < 150:
                    continue
                if k == "requeue":
                    result[k]["status_job"] = st["job"]
                    with urllib.request.urlopen(f"http://{NODE0}:{port}/metrics", timeout=10) as resp:
                        result[k]["run_info"] = next(line for line in resp.read().decode().splitlines()
                                                     if line.startswith("procsv_run_info"))
                    result[k]["at"] = time.time()
                    slurm.cmd("scontrol", "requeue", job[k])
                else:
                    result[k]["at"] = time.time()
                    slurm.cmd("scancel", "--signal=USR2", "--batch", job[k])
            return all("at" in result[k] for k in SINGLE_NODE)

        wait_for(interrupt_at_step_150, 180, what="step 150 in both jobs")
        for k in SINGLE_NODE:
            result[k]["info"] = wait_for(lambda: ended(slurm, job[k]), 300, interval=0.5, what=f"job {job[k]} to end")
    finally:
        for j in job.values():
            slurm.cmd("scancel", j, check=False)
        for j in job.values():
            wait_for(lambda: slurm.job(j).get("JobState") not in ("RUNNING", "COMPLETING"), 60, interval=0.5,
                     what=f"job {j} to end")
    with open(os.path.join(folder, "result.json"), "w") as fh:
        json.dump(result, fh)


@pytest.fixture
def single_node_jobs(slurm, shared_result) -> dict[str, dict[str, Any]]:  # noqa: F811
    """What :func:`_single_node_jobs` saw, made once per test session (``shared_result``: every
    pytest-xdist worker reads the same two jobs)."""
    import json

    folder = shared_result("slurm-single-node-jobs", lambda f: _single_node_jobs(slurm, f))
    with open(os.path.join(folder, "result.json")) as fh:
        return json.load(fh)


def test_a_requeued_job_ends_completed_at_its_last_step_with_no_step_lost_and_exact_weights(
        single_node_jobs, clean_weights):
    run = single_node_jobs["requeue"]
    job, logdir, out, info = run["job"], run["logdir"], run["out"], run["info"]
    assert run["status_job"] == job  # the job id names the run
    assert f'job="{job}"' in run["run_info"]
    requeued_at = run["at"]
    with open(out) as fh:
        text = fh.read()
    assert (info["JobState"], info["Restarts"], info["ExitCode"]) == ("COMPLETED", "1", "0:0"), text
    stop, done = events(logdir, "finished")
    assert (stop["state"], stop["exit_code"], done["state"], done["step"]) == ("stopped", 143, "succeeded", 600)
    lost, _, _ = figures(logdir, out, requeued_at, "scontrol requeue")
    assert lost == 0
    same_weights(final_weights(logdir), clean_weights)
    assert "KillWait" not in text  # --stop-grace-secs 25 fits in KillWait 30: no warning


def test_a_warning_signal_to_the_batch_shell_saves_requeues_and_the_second_run_finishes(single_node_jobs):
    run = single_node_jobs["warning"]
    job, logdir, out, info = run["job"], run["logdir"], run["out"], run["info"]
    signalled_at = run["at"]
    with open(out) as fh:
        text = fh.read()
    assert (info["JobState"], info["Restarts"], info["ExitCode"]) == ("COMPLETED", "1", "0:0"), text
    assert [e["signal"] for e in events(logdir, "preempted")] == ["SIGUSR2"]
    stop, done = events(logdir, "finished")
    assert (stop["state"], stop["exit_code"], done["state"], done["step"]) == ("stopped", 140, "succeeded", 600)
    assert text.count(f"procsv: --requeue-on-preempt: ran `scontrol requeue {job}`") == 1, text
    lost, _, _ = figures(logdir, out, signalled_at, "scancel --signal=USR2 --batch, --requeue-on-preempt")
    assert lost == 0


def test_a_two_node_job_takes_its_placement_from_the_step_survives_a_sigkill_and_a_requeue_and_forwards_the_warning(
        slurm, jobs, tmp_path):  # noqa: F811
    """The multi-node example: no placement flag; node 1's trainer SIGKILLed (one group restart);
    ``scontrol requeue`` (SIGTERM to every process on both nodes: node 1's agent leaves it to node 0,
    whose chief commits the last step; the next run resumes there); then the warning signal to the
    batch shell, which forwards it to the srun step: node 0 saves its last step and stops in order
    (exit 140; no --requeue-on-preempt here: the single-node test requeues)."""
    from test_group import restores_with_plain_tf

    logdir, out = str(tmp_path / "run"), str(tmp_path / "job.out")
    args = "--strategy multiworker --steps 100000 --save-model-secs 1000 --step-delay 0.004 --print-every-steps 100000"
    jobs.append(job := submit(slurm, "train-multinode.sbatch", logdir, out, "--nodes=2", TRAIN_ARGS=args,
                              PROCSV_OPTS="--stop-grace-secs 40"))
    st = wait_for(lambda: (s := raw_status(logdir)) and s.get("step", 0) >= 150 and
                  any(p.get("role") == "worker1" for p in s["processes"]) and s, 240, what="the group at step 150")
    worker = next(p for p in st["processes"] if p["role"] == "worker1")["pid"]
    # node 1's trainer: one PID namespace here, only the network is apart
    assert os.stat(f"/proc/{worker}/ns/net").st_ino == os.stat("/run/netns/pvs2").st_ino
    os.kill(worker, signal.SIGKILL)
    wait_for(lambda: len(events(logdir, "first_step")) == 2, 120, what="the restarted group's first step")
    requeued_at = time.time()
    slurm.cmd("scontrol", "requeue", job)
    wait_for(lambda: len(events(logdir, "first_step")) == 3, 240, what="the requeued job's first step")
    slurm.cmd("scancel", "--signal=USR2", "--batch", job)
    info = wait_for(lambda: ended(slurm, job), 300, interval=0.5, what=f"job {job} to end")
    with open(out) as fh:
        text = fh.read()
    assert (info["JobState"], info["Restarts"], info["ExitCode"]) == ("FAILED", "1", "140:0"), text
    port = 10000 + int(job) % 20000
    assert (f"procsv: from the Slurm step ({job}.0): --nnodes 2 (SLURM_STEP_NUM_NODES), --node-rank 0 "
            f"(SLURM_NODEID), --master-addr {NODE0}:{port}") in text
    assert f"--node-rank 1 (SLURM_NODEID), --master-addr {NODE0}:{port}" in text
    assert "is longer than Slurm's KillWait (30 s)" in text  # --stop-grace-secs 40
    assert "procsv node 1: SIGTERM received: node 0 stops the job in order" in text
    assert len(events(logdir, "restarting")) == 1  # the SIGKILL's group restart
    assert [e["signal"] for e in events(logdir, "preempted")] == ["SIGTERM", "SIGUSR2"]
    stops = [(e["state"], e["exit_code"]) for e in events(logdir, "finished")]
    assert stops == [("stopped", 143), ("stopped", 140)]
    assert figures(logdir, out, requeued_at, "2 nodes, scontrol requeue")[0] == 0
    last = events(logdir, "checkpoint_committed")[-1]
    assert last["reason"] == "preempted" and last["step"] >= events(logdir, "finished")[-1]["step"]
    assert restores_with_plain_tf(logdir) == last["step"]  # the warning's stop saved its last step
