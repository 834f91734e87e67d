"""Where ``--nnodes``, ``--node-rank`` and ``--master-addr`` come from when not given (pure: an env
mapping in, the decided values and the one line out), and Slurm's host list expansion."""

from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import quick_guard_env
from procsv.common.errors import UsageError
from procsv.watchdog.multihost.placement import derived_port, expand_hostlist, place

STEP = {"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_NODES": "3", "SLURM_STEP_NUM_TASKS": "3",
        "SLURM_NODEID": "2", "SLURM_STEP_NODELIST": "gpu[07-09]"}
BATCH = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NUM_NODES": "3", "SLURM_JOB_NODELIST": "gpu[07-09]", "SLURM_NODEID": "0"}

# what `scontrol show hostnames` (Slurm 22.05) prints for each: tests/test_slurm.py checks these against it
HOSTLISTS = {
    "gpu[07-09]": ["gpu07", "gpu08", "gpu09"],
    "a[8-11]": ["a8", "a9", "a10", "a11"],
    "a[098-101]": ["a098", "a099", "a100", "a101"],
    "a[1-010]": [f"a{i}" for i in range(1, 11)],
    "rack[1-2]-node[01-02]": ["rack1-node01", "rack1-node02", "rack2-node01", "rack2-node02"],
    "x,y[1-2],z": ["x", "y1", "y2", "z"],
    "a[3,1-2]": ["a3", "a1", "a2"],
    "n[1-2],n1": ["n1", "n2", "n1"],
    "10.79.0.[11-12]": ["10.79.0.11", "10.79.0.12"],
    "host": ["host"],
}
INVALID = ("a[5-3]", "n[1-2]x,m", "a[x]", "a[1-2]]", "a,,b")


@pytest.mark.parametrize("text", sorted(HOSTLISTS))
def test_a_host_list_expands_as_scontrol_show_hostnames_does(text):
    assert expand_hostlist(text) == HOSTLISTS[text]


@pytest.mark.parametrize("text", INVALID)
def test_a_host_list_scontrol_calls_invalid_is_a_value_error(text):
    with pytest.raises(ValueError, match="invalid host list"):
        expand_hostlist(text)


def test_inside_a_slurm_step_every_value_comes_from_the_step_with_one_line_saying_so():
    p = place(STEP, None, None, None)
    port = derived_port("4242")
    assert (p.nnodes, p.node_rank, p.master_addr, p.job_id) == (3, 2, f"gpu07:{port}", "4242")
    assert port == 10000 + 4242 and 1024 < port < 32768
    assert p.taken_from == (f"procsv: from the Slurm step (4242.0): --nnodes 3 (SLURM_STEP_NUM_NODES), --node-rank 2 "
                            f"(SLURM_NODEID), --master-addr gpu07:{port} (the first host of SLURM_STEP_NODELIST "
                            "gpu[07-09], the port from the job id)")


def test_explicit_flags_win_over_the_step_and_only_what_is_missing_is_taken():
    p = place(STEP, 3, 1, "head:5000")
    assert (p.nnodes, p.node_rank, p.master_addr, p.job_id, p.taken_from) == (3, 1, "head:5000", "4242", "")
    p = place(STEP, None, 0, None)
    assert (p.nnodes, p.node_rank) == (3, 0)
    assert "--node-rank" not in p.taken_from and "--nnodes 3" in p.taken_from


def test_a_batch_script_takes_nothing_from_the_allocation_but_its_job_id_names_the_run():
    p = place(BATCH, None, None, None)
    assert (p.nnodes, p.node_rank, p.master_addr, p.job_id, p.taken_from) == (1, 0, None, "4242", "")


def test_a_one_node_step_needs_no_master_address():
    env = dict(STEP, SLURM_STEP_NUM_NODES="1", SLURM_STEP_NUM_TASKS="1", SLURM_NODEID="0", SLURM_STEP_NODELIST="n1")
    p = place(env, None, None, None)
    assert (p.nnodes, p.node_rank, p.master_addr) == (1, 0, None)


def test_a_step_of_several_tasks_per_node_is_refused_in_one_line():
    with pytest.raises(UsageError, match=r"runs 6 tasks on 3 nodes: run one `procsv launch` per node"):
        place(dict(STEP, SLURM_STEP_NUM_TASKS="6"), None, None, None)
    assert place(dict(STEP, SLURM_STEP_NUM_TASKS="6"), 3, 2, "h:1").node_rank == 2  # unless told


def test_a_bad_step_node_list_is_a_usage_error_naming_it():
    with pytest.raises(UsageError, match=r"SLURM_STEP_NODELIST: invalid host list 'n\[2-1\]'"):
        place(dict(STEP, SLURM_STEP_NODELIST="n[2-1]"), None, None, None)


def test_an_indexed_job_gives_the_rank_and_procsv_master_addr_the_address_with_nnodes_required():
    env = {"JOB_COMPLETION_INDEX": "3", "PROCSV_MASTER_ADDR": "train-0.train:29400"}
    p = place(env, 4, None, None)
    assert (p.nnodes, p.node_rank, p.master_addr, p.job_id) == (4, 3, "train-0.train:29400", None)
    assert p.taken_from == ("procsv: from the Kubernetes Indexed Job: --master-addr train-0.train:29400 "
                            "(PROCSV_MASTER_ADDR), --node-rank 3 (JOB_COMPLETION_INDEX)")
    with pytest.raises(UsageError, match="JOB_COMPLETION_INDEX is set.*give --nnodes"):
        place(env, None, None, None)
    assert place(env, 4, 0, "m:1").taken_from == ""  # flags win
    with pytest.raises(UsageError, match="JOB_COMPLETION_INDEX='x' is not a number"):
        place({"JOB_COMPLETION_INDEX": "x"}, 2, None, None)


def test_nothing_in_the_environment_gives_the_plain_defaults():
    p = place({}, None, None, None)
    assert (p.nnodes, p.node_rank, p.master_addr, p.job_id, p.taken_from) == (1, 0, None, None, "")


def test_the_launch_says_what_it_took_and_refuses_a_bad_step_in_one_line(tmp_path):
    """The CLI wiring: a two-task-per-node step is one line and exit 2, before anything starts."""
    env = dict(STEP, SLURM_STEP_NUM_TASKS="6", PATH="/usr/bin:/bin",
               **quick_guard_env())
    r = subprocess.run([sys.executable, "-m", "procsv", "launch", "procsv.examples.digits", "--logdir",
                        str(tmp_path / "run")], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "procsv: error: the Slurm step runs 6 tasks on 3 nodes: run one `procsv launch` per node "
        "(srun --ntasks-per-node=1; --nproc N starts N trainers on each), or give --nnodes and --node-rank"]
    assert not (tmp_path / "run").exists()


def test_procsv_status_names_the_scheduler_job_of_the_run():
    from procsv.status import render

    record = {"state": "running", "step": 5, "restarts": 0, "job": "4242", "processes": []}
    assert "  scheduler job 4242" in render(record, "/runs/x").splitlines()
    assert "scheduler job" not in render(dict(record, job=None), "/runs/x")


def test_the_kubernetes_manifests_placement_is_what_procsv_decides_for_each_pod():
    """examples/kubernetes/: pod i of each Job (JOB_COMPLETION_INDEX=i) is node i, node 0's pod at
    PROCSV_MASTER_ADDR, --nnodes the Job's completions; no flag of the command sets the rank."""
    from test_k8s_manifests import _command, job_specs

    specs = list(job_specs())
    assert len(specs) == 2
    for where, spec in specs:
        pod = spec["template"]["spec"]
        flags, _ = _command(pod)
        assert flags.node_rank is None and flags.master_addr is None, where
        env = {e["name"]: e["value"] for e in pod["containers"][0].get("env", []) if "value" in e}
        for index in range(spec["completions"]):
            p = place(dict(env, JOB_COMPLETION_INDEX=str(index)), flags.nnodes, None, None)
            assert (p.nnodes, p.node_rank, p.master_addr) == (spec["completions"], index, env["PROCSV_MASTER_ADDR"])
        host = env["PROCSV_MASTER_ADDR"].rsplit(":", 1)[0]
        assert host.split(".")[0].endswith("-0"), where  # pod 0 (index 0)
        assert host.split(".")[1] == pod.get("subdomain", "procsv-digits"), where  # (a JobSet sets it itself)
