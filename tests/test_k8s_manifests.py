"""infra/k8s/ holds, offline: valid Kubernetes objects, and a gpu pool template that prefect.yaml
and prefect-kubernetes agree with (its workers: test_k8s_workers.py; its vLLM replicas:
test_k8s_replicas.py).

No cluster and no network: kubernetes-validate checks each object against the JSON schemas it
ships in its wheel, and the gpu pool's job is rendered by prefect-kubernetes' own job
configuration, as its worker renders one for a flow run.
"""

from __future__ import annotations

import json

import jsonschema
import kubernetes_validate
import pytest

from infra.k8s.make_gpu_pool_template import gpu_pool_template, render
from tests.support.k8s import (
    DOCUMENTS,
    GPU,
    K8S,
    K8S_VERSIONS,
    NAMESPACE,
    POOL_ROLES,
    TEMPLATE,
    gpu_job_variables,
    no_network,  # noqa: F401  (an autouse fixture: nothing here touches the network)
    objects,
    render_gpu_job,
)


@pytest.mark.parametrize("doc", [d for _, d in DOCUMENTS], ids=[i for i, _ in DOCUMENTS])
def test_every_manifest_is_a_valid_kubernetes_object(doc):
    for version in K8S_VERSIONS:
        kubernetes_validate.validate(doc, version, strict=True)


def test_every_object_lives_in_the_loragate_namespace_under_a_name_of_its_own():
    ids = [(doc["kind"], doc["metadata"]["name"]) for _, doc in DOCUMENTS]
    assert len(ids) == len(set(ids))
    assert ("Namespace", NAMESPACE) in ids
    outside = [
        i for i, doc in DOCUMENTS if doc["kind"] != "Namespace" and doc["metadata"].get("namespace") != NAMESPACE
    ]
    assert outside == []


def test_kubernetes_validate_checks_offline_and_can_fail():
    """Guard against a validator that passes everything: a misspelt field fails strict."""
    deployment = objects("Deployment")["prefect-worker-release"]
    broken = json.loads(json.dumps(deployment))
    broken["spec"]["template"]["spec"]["containers"][0]["imagePullPolice"] = "Always"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSIONS[0], strict=True)


def test_every_workload_selects_its_own_pods_and_each_service_selects_pods():
    workloads = {**objects("Deployment"), **objects("StatefulSet")}
    for name, workload in workloads.items():
        selector = workload["spec"]["selector"]["matchLabels"]
        labels = workload["spec"]["template"]["metadata"]["labels"]
        assert selector.items() <= labels.items(), name
    pod_labels = [w["spec"]["template"]["metadata"]["labels"] for w in workloads.values()]
    for name, service in objects("Service").items():
        assert any(service["spec"]["selector"].items() <= labels.items() for labels in pod_labels), name


def test_every_config_map_secret_and_claim_a_pod_names_is_here_or_documented():
    """The Secret is created by hand (never checked in): README.md says how, with its keys."""
    config_maps, claims = set(objects("ConfigMap")), set(objects("PersistentVolumeClaim"))
    template_pod = json.loads(TEMPLATE.read_text())["job_configuration"]["job_manifest"]["spec"]["template"]["spec"]
    workloads = [*objects("Deployment").values(), *objects("StatefulSet").values(), *objects("Job").values()]
    pods = [w["spec"]["template"]["spec"] for w in workloads]
    named_maps, named_secrets, named_claims = set(), set(), set()
    for pod in [*pods, template_pod]:
        named_claims |= {
            v["persistentVolumeClaim"]["claimName"] for v in pod.get("volumes", []) if "persistentVolumeClaim" in v
        }
        named_secrets |= {v["secret"]["secretName"] for v in pod.get("volumes", []) if "secret" in v}
        for c in pod["containers"]:
            for source in c.get("envFrom", []):
                named_maps |= {source["configMapRef"]["name"]} if "configMapRef" in source else set()
                named_secrets |= {source["secretRef"]["name"]} if "secretRef" in source else set()
            for e in c.get("env", []) if isinstance(c.get("env"), list) else []:
                ref = e.get("valueFrom", {})
                named_maps |= {ref["configMapKeyRef"]["name"]} if "configMapKeyRef" in ref else set()
                named_secrets |= {ref["secretKeyRef"]["name"]} if "secretKeyRef" in ref else set()
    assert named_maps <= config_maps
    assert named_claims <= claims
    readme = (K8S / "README.md").read_text()
    # loragate-replica: the replicas' admin key and read-only registry URL
    # each pool's files and env Secrets; the database owner's, for the migrations Job
    pools = [*(f"loragate-{pool}" for pool in POOL_ROLES), *(f"loragate-{pool}-env" for pool in POOL_ROLES)]
    assert named_secrets == {"loragate-migrations", "loragate-replica", *pools}
    for secret in named_secrets:
        assert f"kubectl -n loragate create secret generic {secret}" in readme, secret


# -- the gpu work pool ---------------------------------------------------------------------


def test_the_checked_in_gpu_pool_template_is_what_the_generator_makes_from_prefect_kubernetes_now():
    assert TEMPLATE.read_text() == render(gpu_pool_template())


def test_the_gpu_pool_template_declares_node_selector_and_gpu_limit_and_wires_them_into_the_job():
    template = json.loads(TEMPLATE.read_text())
    variables = template["variables"]["properties"]
    assert variables["node_selector"]["type"] == "object"
    assert variables["node_selector"]["additionalProperties"] == {"type": "string"}
    assert variables["node_selector"]["default"] == {"nvidia.com/gpu.present": "true"}
    assert (variables["gpu_limit"]["type"], variables["gpu_limit"]["minimum"], variables["gpu_limit"]["default"]) == (
        "integer",
        0,
        1,
    )
    pod = template["job_configuration"]["job_manifest"]["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == "{{ node_selector }}"
    flow = next(c for c in pod["containers"] if c["name"] == "prefect-job")
    assert flow["resources"]["limits"][GPU] == "{{ gpu_limit }}"
    assert (flow["env"], flow["image"], template["job_configuration"]["job_manifest"]["metadata"]["namespace"]) == (
        "{{ env }}",
        "{{ image }}",
        "{{ namespace }}",
    )


def test_the_gpu_pool_template_is_one_the_prefect_server_accepts():
    """The server's own check at `prefect work-pool create`: every placeholder is a declared variable."""
    from prefect.server.schemas.actions import WorkPoolCreate

    template = json.loads(TEMPLATE.read_text())
    WorkPoolCreate(name="gpu", type="kubernetes", base_job_template=template)
    template["job_configuration"]["job_manifest"]["spec"]["template"]["spec"]["runtimeClassName"] = "{{ runtime }}"
    with pytest.raises(ValueError, match="undeclared variable"):
        WorkPoolCreate(name="gpu", type="kubernetes", base_job_template=template)


@pytest.mark.parametrize("where, job_variables", gpu_job_variables(), ids=[w for w, _ in gpu_job_variables()])
def test_prefect_yaml_gpu_job_variables_are_declared_by_the_pool_template(where, job_variables):
    variables = json.loads(TEMPLATE.read_text())["variables"]
    assert set(job_variables) <= set(variables["properties"]), where
    jsonschema.validate(job_variables, variables)


def test_prefect_yaml_runs_a_deployment_on_the_gpu_pool():
    """Else the job-variable cases above check the pool's definition only."""
    assert [w for w, _ in gpu_job_variables()] != ["definitions.pools.gpu"]


@pytest.mark.parametrize("where, job_variables", gpu_job_variables(), ids=[w for w, _ in gpu_job_variables()])
def test_a_gpu_flow_run_is_a_valid_job_on_a_gpu_node_with_its_gpu(where, job_variables):
    job = render_gpu_job(job_variables)
    for version in K8S_VERSIONS:
        kubernetes_validate.validate(job, version, strict=True)
    pod = job["spec"]["template"]["spec"]
    flow = next(c for c in pod["containers"] if c["name"] == "prefect-job")
    assert pod["nodeSelector"] == job_variables.get("node_selector", {"nvidia.com/gpu.present": "true"})
    assert flow["resources"]["limits"][GPU] == job_variables.get("gpu_limit", 1)
    assert job["metadata"]["namespace"] == NAMESPACE
    assert {"name": "LORAGATE_VALIDATION_DEVICE", "value": "cuda"} in flow["env"]
    assert {"secretRef": {"name": "loragate-gpu-env"}} in flow["envFrom"]  # the API credential alone


def test_the_gpu_pools_env_image_and_namespace_variables_still_reach_the_job():
    job = render_gpu_job(
        {
            "node_selector": {"cloud.example.com/accelerator": "h100"},
            "gpu_limit": 2,
            "image": "registry.example.com/loragate:1.2.3",
            "namespace": "loragate-staging",
            "env": {"LORAGATE_VALIDATION_THRESHOLD": "0.9"},
        }
    )
    kubernetes_validate.validate(job, K8S_VERSIONS[0], strict=True)
    pod = job["spec"]["template"]["spec"]
    flow = pod["containers"][0]
    assert pod["nodeSelector"] == {"cloud.example.com/accelerator": "h100"}
    assert flow["resources"]["limits"][GPU] == 2
    assert flow["image"] == "registry.example.com/loragate:1.2.3"
    assert job["metadata"]["namespace"] == "loragate-staging"
    env = {e["name"]: e.get("value") for e in flow["env"]}
    assert env["LORAGATE_VALIDATION_THRESHOLD"] == "0.9"
    assert env["LORAGATE_VALIDATION_DEVICE"] == "cuda"  # a deployment's env adds to the pool's


def test_the_gpu_pool_template_refuses_a_negative_gpu_limit_and_unknown_selector_values():
    variables = json.loads(TEMPLATE.read_text())["variables"]
    for bad in ({"gpu_limit": -1}, {"gpu_limit": "1"}, {"node_selector": {"nvidia.com/gpu.present": True}}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, variables)
