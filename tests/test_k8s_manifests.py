"""examples/kubernetes/: every manifest read into the Kubernetes API's models (the ``kubernetes``
client) and written back equal (the models drop a field they do not know, so a typo shows as a
difference), the JobSet against the JobSet API, and what procsv needs of them: the exit-code policy
in procsv's table, the grace, the probes, the flags (parsed by procsv's own parser).

Pure and fast: reads YAML, imports no TensorFlow; no cluster is needed.
"""

from __future__ import annotations

import re
import signal
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml
from kubernetes.client import ApiClient

from procsv.cli import EXIT_FAILED, EXIT_OK, EXIT_USAGE, _parser
from procsv.common.exitcodes import EXIT_DIVERGING, LAUNCH_EXIT_CODES
from procsv.watchdog.launcher import EXIT_INTERNAL
from procsv.watchdog.publish.probes import HEALTHZ, READYZ
from procsv.watchdog.rules.bookkeeping import EXIT_CHECKPOINTS_FAILING, EXIT_LOGDIR_LOST

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples" / "kubernetes"
MODELS = {("v1", "Service"): "V1Service", ("v1", "PersistentVolumeClaim"): "V1PersistentVolumeClaim",
          ("batch/v1", "Job"): "V1Job"}
JOBSET = ("jobset.x-k8s.io/v1alpha2", "JobSet")
API = ApiClient()


def documents() -> list[tuple[str, dict[str, Any]]]:
    """(file name, document) of every manifest under examples/kubernetes/."""
    docs = []
    for path in sorted(EXAMPLES.glob("*.yaml")):
        docs += [(path.name, d) for d in yaml.safe_load_all(path.read_text()) if d is not None]
    return docs


def kind(doc: dict[str, Any]) -> tuple[str, str]:
    return doc["apiVersion"], doc["kind"]


def round_trip(data: dict[str, Any], model: str) -> Any:
    """``data`` read into the client's model ``model`` and serialized back (as the API would receive it)."""
    return API.sanitize_for_serialization(API._ApiClient__deserialize(data, model))  # type: ignore[attr-defined]


def job_specs() -> Iterator[tuple[str, dict[str, Any]]]:
    """(where, batch/v1 JobSpec) of the Indexed Job and of the JobSet's replicated Job."""
    for name, doc in documents():
        if kind(doc) == ("batch/v1", "Job"):
            yield f"{name}:{doc['metadata']['name']}", doc["spec"]
        elif kind(doc) == JOBSET:
            for rj in doc["spec"]["replicatedJobs"]:
                yield f"{name}:{rj['name']}", rj["template"]["spec"]


def test_the_examples_are_an_indexed_job_with_its_service_a_jobset_and_the_shared_logdir():
    kinds = sorted((name, kind(doc)) for name, doc in documents())
    assert kinds == [("indexed-job.yaml", ("batch/v1", "Job")), ("indexed-job.yaml", ("v1", "Service")),
                     ("jobset.yaml", JOBSET), ("logdir-pvc.yaml", ("v1", "PersistentVolumeClaim"))]


@pytest.mark.parametrize("name,doc", [(n, d) for n, d in documents() if kind(d) in MODELS],
                         ids=lambda v: v if isinstance(v, str) else v.get("kind"))
def test_every_manifest_reads_into_the_kubernetes_models_and_back_unchanged(name, doc):
    assert round_trip(doc, MODELS[kind(doc)]) == doc


def test_the_jobsets_job_template_and_metadata_read_into_the_kubernetes_models_and_back_unchanged():
    (doc,) = [d for _, d in documents() if kind(d) == JOBSET]
    assert round_trip(doc["metadata"], "V1ObjectMeta") == doc["metadata"]
    (rj,) = doc["spec"]["replicatedJobs"]  # one replicated Job: the only JobSet shape procsv supports
    assert rj["replicas"] == 1
    assert round_trip(rj["template"], "V1JobTemplateSpec") == rj["template"]


def test_the_round_trip_catches_a_misspelt_field():
    (doc,) = [d for _, d in documents() if kind(d) == ("batch/v1", "Job")]
    container = doc["spec"]["template"]["spec"]["containers"][0]
    container["readinesProbe"] = container.pop("readinessProbe")
    assert round_trip(doc, "V1Job") != doc


# The JobSet API's own fields (jobset.x-k8s.io/v1alpha2: JobSetSpec, Network, FailurePolicy,
# ReplicatedJob), as its API reference lists them; the Job template inside is checked by the
# Kubernetes models above.
JOBSET_FIELDS = {
    "spec": {"replicatedJobs", "network", "successPolicy", "failurePolicy", "startupPolicy", "suspend",
             "coordinator", "managedBy", "ttlSecondsAfterFinished"},
    "network": {"enableDNSHostnames", "subdomain", "publishNotReadyAddresses"},
    "failurePolicy": {"maxRestarts", "restartStrategy", "rules"},
    "replicatedJob": {"name", "groupName", "template", "replicas", "dependsOn"},
}


def test_the_jobsets_own_fields_are_fields_of_its_api():
    (doc,) = [d for _, d in documents() if kind(d) == JOBSET]
    spec = doc["spec"]
    assert set(doc) == {"apiVersion", "kind", "metadata", "spec"}
    assert set(spec) <= JOBSET_FIELDS["spec"]
    assert set(spec["network"]) <= JOBSET_FIELDS["network"]
    assert set(spec["failurePolicy"]) <= JOBSET_FIELDS["failurePolicy"]
    assert all(set(rj) <= JOBSET_FIELDS["replicatedJob"] for rj in spec["replicatedJobs"])
    assert spec["network"] == {"enableDNSHostnames": True, "subdomain": doc["metadata"]["name"],
                               "publishNotReadyAddresses": True}


def test_the_jobset_manifest_validates_against_the_jobset_api_schema():
    try:
        from jobset.api_client import ApiClient as JobSetClient  # the JobSet project's Python SDK
    except ImportError:
        pytest.skip("no JobSet schema can be installed here: the JobSet Python SDK (module `jobset`) is not on "
                    "PyPI, and no PyPI, npm or Debian package ships the JobSet CRD; the JobSet's Job template is "
                    "checked with the Kubernetes models instead, its own fields against its API's field list")
    (doc,) = [d for _, d in documents() if kind(d) == JOBSET]
    client = JobSetClient()
    model = client._ApiClient__deserialize(doc, "JobsetV1alpha2JobSet")
    assert client.sanitize_for_serialization(model) == doc


# ----------------------------------------------------------------------------- what procsv needs of them

def test_the_pod_failure_policy_names_only_procsvs_exit_codes_as_the_issue_asks():
    specs = list(job_specs())
    assert len(specs) == 2
    for where, spec in specs:
        assert spec["completionMode"] == "Indexed", where
        pod = spec["template"]["spec"]
        assert pod["restartPolicy"] == "Never", where
        (container,) = pod["containers"]
        rules = spec["podFailurePolicy"]["rules"]
        by_codes = {(r["action"], tuple(r["onExitCodes"]["values"])) for r in rules if "onExitCodes" in r}
        assert by_codes == {("FailJob", (2, 3, 4)), ("Ignore", (140, 143)), ("Count", (1, 70, 137))}, where
        assert all(r["onExitCodes"]["operator"] == "In" and r["onExitCodes"]["containerName"] == container["name"]
                   for r in rules if "onExitCodes" in r), where
        conditions = [(r["action"], r["onPodConditions"]) for r in rules if "onPodConditions" in r]
        assert conditions == [("Ignore", [{"type": "DisruptionTarget", "status": "True"}])], where
        for rule in rules:
            for code in rule.get("onExitCodes", {}).get("values", []):
                assert code in LAUNCH_EXIT_CODES, f"{where}: exit code {code} is not one procsv launch exits with"


def test_procsvs_exit_code_table_holds_every_code_the_launch_exits_with_and_the_docs_list():
    code_constants = {EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_CHECKPOINTS_FAILING, EXIT_DIVERGING, EXIT_LOGDIR_LOST,
                      EXIT_INTERNAL, 128 + signal.SIGHUP, 128 + signal.SIGINT, 128 + signal.SIGTERM, 128 + signal.SIGKILL,
                      128 + signal.SIGUSR2}  # --preempt-signal's default
    assert code_constants == set(LAUNCH_EXIT_CODES)
    text = (ROOT / "docs" / "guarantees.md").read_text()
    table = text.split("## Exit codes of `procsv launch`", 1)[1].split("\n## ", 1)[0]
    documented = {int(n) for n in re.findall(r"^\| (\d+) \|", table, re.M)}
    assert documented and documented <= set(LAUNCH_EXIT_CODES)
    assert set(LAUNCH_EXIT_CODES) - documented == {129, 130, 137, 140, 143}  # the docs' row "128+N"
    assert "| 128+N |" in table


def _command(pod: dict[str, Any]) -> tuple[Any, list[str]]:
    """The container's ``procsv launch`` flags, parsed by procsv's own parser, and the target's arguments."""
    (container,) = pod["containers"]
    command = container["command"]
    assert command[:2] == ["procsv", "launch"]
    cut = command.index("--") if "--" in command else len(command)
    return _parser().parse_args(command[1:cut]), command[cut + 1:]


def test_the_grace_the_probes_the_flags_and_the_logdir_fit_procsv():
    for where, spec in job_specs():
        pod = spec["template"]["spec"]
        (container,) = pod["containers"]
        args, _ = _command(pod)
        assert pod["terminationGracePeriodSeconds"] >= args.stop_grace_secs + 40, where
        assert args.nnodes == spec["completions"] == spec["parallelism"] > 1, where
        assert "--node-rank" not in container["command"], where  # each pod's comes from JOB_COMPLETION_INDEX
        assert "--master-addr" not in container["command"], where
        assert args.metrics_host == "0.0.0.0" and args.metrics_port is not None, where
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        for probe, path in (("livenessProbe", HEALTHZ), ("readinessProbe", READYZ)):
            get = container[probe]["httpGet"]
            assert get["path"] == path and ports[get["port"]] == args.metrics_port, (where, probe)
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        (mount,) = [p for p in mounts if args.logdir.startswith(p.rstrip("/") + "/")]
        (volume,) = [v for v in pod["volumes"] if v["name"] == mounts[mount]]
        assert volume["persistentVolumeClaim"]["claimName"] == "procsv-logdir", where
        env = {e["name"]: e["value"] for e in container["env"]}
        host, _, port = env["PROCSV_MASTER_ADDR"].rpartition(":")
        assert int(port) == ports["procsv-master"], where
        assert host == _pod_zero(where), where
    (pvc,) = [d for _, d in documents() if d["kind"] == "PersistentVolumeClaim"]
    assert pvc["metadata"]["name"] == "procsv-logdir" and pvc["spec"]["accessModes"] == ["ReadWriteMany"]


def _pod_zero(where: str) -> str:
    """The DNS name of pod 0 (node 0) of a job: ``<job>-0.<subdomain>`` for an Indexed Job with a
    headless Service, ``<jobset>-<replicatedJob>-0-0.<subdomain>`` for a JobSet."""
    name, _, job = where.partition(":")
    docs = {kind(d): d for n, d in documents() if n == name}
    if JOBSET in docs:
        js = docs[JOBSET]
        return f"{js['metadata']['name']}-{job}-0-0.{js['spec']['network']['subdomain']}"
    svc, spec = docs[("v1", "Service")], docs[("batch/v1", "Job")]["spec"]
    assert spec["template"]["spec"]["subdomain"] == svc["metadata"]["name"]
    return f"{job}-0.{svc['metadata']['name']}"


def test_the_indexed_jobs_service_is_headless_publishes_unready_pods_and_selects_the_job():
    (svc,) = [d for _, d in documents() if kind(d) == ("v1", "Service")]
    (job,) = [d for _, d in documents() if kind(d) == ("batch/v1", "Job")]
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["publishNotReadyAddresses"] is True  # hosts join before they are ready
    assert svc["spec"]["selector"] == {"job-name": job["metadata"]["name"]}  # the label the Job controller sets
