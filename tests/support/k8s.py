"""What the Kubernetes manifest tests share: infra/k8s/'s objects loaded once, offline, and
the gpu pool's Job rendered by prefect-kubernetes' own job configuration, as its worker
renders one for a flow run."""

from __future__ import annotations

import asyncio
import json
import socket
import uuid
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from loragate.local.pipeline import POOLS

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "infra" / "k8s"
TEMPLATE = K8S / "gpu-pool-template.json"
NAMESPACE = "loragate"
# the oldest Kubernetes the manifests are meant for, and the newest kubernetes-validate knows
K8S_VERSIONS = ("1.33", kubernetes_validate.latest_version())
GPU = "nvidia.com/gpu"
SECRETS_PATH = "/var/run/secrets/loragate"
# each work pool's worker holds one gate role's token (prefect.yaml, loragate/local/pipeline.POOLS)
POOL_ROLES = {pool.name: pool.role.value for pool in POOLS}


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    """Everything here is offline: a connection attempt is a bug (a schema fetched, a cluster asked)."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the Kubernetes manifest tests must not touch the network")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def load_documents(paths: list[Path] | None = None) -> list[tuple[str, dict[str, Any]]]:
    """(file:Kind/name, object) of every object in ``paths``, by default infra/k8s/*.yaml
    (not its subdirectories: those hold alternatives to files here)."""
    docs = []
    for path in paths if paths is not None else sorted(K8S.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is not None:
                docs.append((f"{path.name}:{doc['kind']}/{doc['metadata']['name']}", doc))
    return docs


DOCUMENTS = load_documents()


def objects(kind: str) -> dict[str, dict[str, Any]]:
    return {doc["metadata"]["name"]: doc for _, doc in DOCUMENTS if doc["kind"] == kind}


def container(workload: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in workload["spec"]["template"]["spec"]["containers"] if c["name"] == name)


def env_of(c: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in c.get("env", [])}


def arg_after(args: list[str], flag: str) -> str:
    assert args.count(flag) == 1, f"{flag} given {args.count(flag)} times"
    return args[args.index(flag) + 1]


def secrets_read_by(pod: dict[str, Any]) -> set[str]:
    """Every Secret a pod spec reads: mounted (also through a projected volume), envFrom'd,
    or one key of it as a variable, in any of its containers."""
    found = set()
    for volume in pod.get("volumes", []):
        found |= {volume["secret"]["secretName"]} if "secret" in volume else set()
        for source in volume.get("projected", {}).get("sources", []):
            found |= {source["secret"]["name"]} if "secret" in source else set()
    for c in [*pod.get("initContainers", []), *pod["containers"]]:
        found |= {s["secretRef"]["name"] for s in c.get("envFrom", []) if "secretRef" in s}
        env = c.get("env", [])
        for e in env if isinstance(env, list) else []:
            ref = e.get("valueFrom", {}).get("secretKeyRef")
            found |= {ref["name"]} if ref else set()
    return found


def vllm_statefulsets() -> dict[str, dict[str, Any]]:
    return {
        n: s
        for n, s in objects("StatefulSet").items()
        if s["spec"]["template"]["metadata"]["labels"].get("app.kubernetes.io/name") == "vllm"
    }


def prefect_yaml() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "prefect.yaml").read_text())


def gpu_job_variables() -> list[tuple[str, dict[str, Any]]]:
    """The job variables prefect.yaml gives the ``gpu`` pool: its definition and each deployment's."""
    spec = prefect_yaml()
    found = [("definitions.pools.gpu", spec["definitions"]["pools"]["gpu"].get("job_variables", {}))]
    for deployment in spec["deployments"]:
        pool = deployment.get("work_pool") or {}
        if pool.get("name") == "gpu":
            found.append((f"deployments.{deployment['name']}", pool.get("job_variables", {})))
    return found


def render_gpu_job(job_variables: dict[str, Any]) -> dict[str, Any]:
    """The Job the gpu pool's worker would create for a flow run with these job variables."""
    from prefect.client.schemas.objects import FlowRun
    from prefect_kubernetes.worker import KubernetesWorkerJobConfiguration

    class NoClient:
        """Only a template naming Prefect blocks or variables would ask the API: none does."""

    template = json.loads(TEMPLATE.read_text())
    configuration = asyncio.run(
        KubernetesWorkerJobConfiguration.from_template_and_values(template, job_variables, client=NoClient())
    )
    configuration.prepare_for_flow_run(FlowRun(flow_id=uuid.uuid4(), name="shadow-validate-test"))
    return configuration.job_manifest
