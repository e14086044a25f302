"""infra/k8s/gpu-warm/: the `gpu` pool's worker as a warm worker, offline. It must be what
closes the Job variant's hole -- no Kubernetes API, no job variables, only the image's own
flows -- while its pod holds exactly what the Job's pod holds: the same GPU nodes and GPU,
the same volumes at the same paths, the `loragate-gpu` Secret and no other."""

from __future__ import annotations

import json
from typing import Any

import kubernetes_validate
import pytest

from loragate.local.pipeline import POOLS
from tests.support.k8s import (
    GPU,
    K8S,
    K8S_VERSIONS,
    NAMESPACE,
    SECRETS_PATH,
    arg_after,
    container,
    env_of,
    load_documents,
    no_network,  # noqa: F401  (an autouse fixture: nothing here touches the network)
    objects,
    render_gpu_job,
)

WARM = K8S / "gpu-warm" / "prefect-worker-gpu.yaml"
LOADED = load_documents([WARM])
DOCUMENTS = [doc for _, doc in LOADED]


def warm(kind: str) -> dict[str, dict[str, Any]]:
    return {doc["metadata"]["name"]: doc for doc in DOCUMENTS if doc["kind"] == kind}


def worker_pod() -> tuple[dict[str, Any], dict[str, Any]]:
    deployment = warm("Deployment")["prefect-worker-gpu"]
    return deployment["spec"]["template"]["spec"], container(deployment, "worker")


def job_pod() -> tuple[dict[str, Any], dict[str, Any]]:
    pod = render_gpu_job({})["spec"]["template"]["spec"]
    return pod, next(c for c in pod["containers"] if c["name"] == "prefect-job")


@pytest.mark.parametrize("doc", DOCUMENTS, ids=[i for i, _ in LOADED])
def test_every_object_is_valid_and_in_the_loragate_namespace(doc):
    for version in K8S_VERSIONS:
        kubernetes_validate.validate(doc, version, strict=True)
    assert doc["metadata"]["namespace"] == NAMESPACE


def test_it_replaces_the_job_variants_worker_under_the_same_name():
    assert set(warm("Deployment")) == {"prefect-worker-gpu"} <= set(objects("Deployment"))
    assert set(warm("ServiceAccount")) == {"prefect-worker-gpu"}


def test_the_worker_is_the_warm_worker_of_the_gpu_pool_with_the_local_pipelines_imports():
    _, worker = worker_pod()
    command = worker["command"]
    assert command[:3] == ["python", "-m", "loragate.local.warm_worker"]
    assert arg_after(command, "--pool") == "gpu"
    assert arg_after(command, "--limit") == "1"  # one batch at a time on the pod's GPU
    assert "--flows-package" not in command  # the image's own `loragate.flows`, nothing else
    preloaded = tuple(command[i + 1] for i, arg in enumerate(command) if arg == "--preload")
    assert preloaded == next(p for p in POOLS if p.name == "gpu").preload
    assert "--with-healthcheck" in command
    probe = worker["livenessProbe"]["httpGet"]
    ports = {p["name"]: p["containerPort"] for p in worker["ports"]}
    assert probe["path"] == "/health" and ports[probe["port"]] == 8080
    assert env_of(worker)["PREFECT_WORKER_WEBSERVER_PORT"]["value"] == "8080"


def test_it_holds_no_kubernetes_credential_and_no_role():
    pod, _ = worker_pod()
    assert pod["automountServiceAccountToken"] is False
    assert warm("ServiceAccount")[pod["serviceAccountName"]]["automountServiceAccountToken"] is False
    assert not warm("Role") and not warm("RoleBinding") and not warm("ClusterRoleBinding")


def test_its_pod_runs_where_the_job_runs_with_the_jobs_gpu():
    pod, worker = worker_pod()
    job, job_container = job_pod()
    assert pod["nodeSelector"] == job["nodeSelector"]
    assert pod["tolerations"] == job["tolerations"]
    assert worker["resources"]["limits"][GPU] == int(job_container["resources"]["limits"][GPU])


def test_its_pod_mounts_what_the_job_mounts_and_only_the_gpu_pools_secret():
    pod, worker = worker_pod()
    job, job_container = job_pod()

    def mounted(spec: dict[str, Any], c: dict[str, Any]) -> dict[str, tuple[str, Any, bool]]:
        volumes = {v["name"]: v for v in spec["volumes"]}
        return {
            m["mountPath"]: (
                json.dumps({k: v for k, v in volumes[m["name"]].items() if k != "name"}, sort_keys=True),
                m.get("readOnly", False),
                volumes[m["name"]].get("secret", {}).get("defaultMode"),
            )
            for m in c["volumeMounts"]
        }

    assert mounted(pod, worker) == mounted(job, job_container)
    secrets = {v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
    assert secrets == {"loragate-gpu"}
    assert mounted(pod, worker)[SECRETS_PATH][1:] == (True, 0o400)
    env = env_of(worker)
    assert env["LORAGATE_SECRETS_DIR"]["value"] == SECRETS_PATH
    assert {"configMapRef": {"name": "loragate-config"}} in worker["envFrom"]  # heartbeats, settings


def test_secrets_reach_it_only_by_reference_and_only_from_the_gpu_pools_secrets():
    _, worker = worker_pod()
    env = env_of(worker)
    auth = env["PREFECT_API_AUTH_STRING"]["valueFrom"]["secretKeyRef"]
    assert auth == {"name": "loragate-gpu-env", "key": "PREFECT_API_AUTH_STRING"}
    assert "LORAGATE_DATABASE_URL" not in env  # the signing role's user: a file of loragate-gpu
    literal = [n for n, e in env.items() if "value" in e and n != "LORAGATE_SECRETS_DIR"]
    assert not [n for n in literal if any(w in n for w in ("TOKEN", "PASSWORD", "SECRET", "KEY", "DATABASE_URL"))]
    assert not {e["name"] for e in worker.get("env", [])} & {"LORAGATE_TOKEN", "LORAGATE_SIGNING_KEY"}


def test_the_readme_creates_the_gpu_pool_as_a_process_pool_for_it():
    readme = (K8S / "README.md").read_text()
    section = readme[readme.index("gpu-warm/prefect-worker-gpu.yaml") :]
    assert "prefect work-pool create gpu --type process" in section
