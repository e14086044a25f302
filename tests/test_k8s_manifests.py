"""infra/k8s/ holds, offline: valid Kubernetes objects, a gpu pool template that prefect.yaml and
prefect-kubernetes agree with, and vLLM replicas that serve as the fleet config says.

No cluster and no network: kubernetes-validate checks each object against the JSON schemas it
ships in its wheel, and the gpu pool's job is rendered by prefect-kubernetes' own job
configuration, as its worker renders one for a flow run.
"""

from __future__ import annotations

import asyncio
import json
import socket
import tomllib
import uuid
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from infra.automations import HEARTBEAT_ENV
from infra.k8s.make_gpu_pool_template import gpu_pool_template, render
from infra.pipeline import POOLS
from registry.settings import VLLM_LORA_RANKS

ROOT = Path(__file__).resolve().parents[1]
K8S = ROOT / "infra" / "k8s"
TEMPLATE = K8S / "gpu-pool-template.json"
NAMESPACE = "loragate"
# the oldest Kubernetes the manifests are meant for, and the newest kubernetes-validate knows
K8S_VERSIONS = ("1.33", kubernetes_validate.latest_version())
GPU = "nvidia.com/gpu"
SECRETS_PATH = "/var/run/secrets/loragate"
# each work pool's worker holds one gate role's token (prefect.yaml, infra/pipeline.POOLS)
POOL_ROLES = {pool.name: pool.role.value for pool in POOLS}


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    """Everything here is offline: a connection attempt is a bug (a schema fetched, a cluster asked)."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("tests/test_k8s_manifests.py must not touch the network")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def load_documents() -> list[tuple[str, dict[str, Any]]]:
    docs = []
    for path in sorted(K8S.glob("*.yaml")):
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
    pods = [w["spec"]["template"]["spec"] for w in [*objects("Deployment").values(), *objects("StatefulSet").values()]]
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
    assert named_secrets == {"loragate-secrets", *(f"loragate-{pool}" for pool in POOL_ROLES)}
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
    assert {"secretRef": {"name": "loragate-secrets"}} in flow["envFrom"]


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


# -- the workers -----------------------------------------------------------------------------


WARM_WORKER = ["python", "-m", "infra.warm_worker"]


def test_each_prefect_yaml_pool_has_a_worker_of_the_right_kind_with_a_health_check():
    """The gpu pool's runs are Kubernetes Jobs; the short gates' pools run warm workers."""
    pools = {p["name"] for p in prefect_yaml()["definitions"]["pools"].values()}
    expected_kinds = {"gpu": "kubernetes", "intake": "warm", "canary": "warm", "release": "warm", "fleet": "warm"}
    workers = {}
    for name, deployment in objects("Deployment").items():
        command = container(deployment, "worker")["command"]
        if command[:3] == ["prefect", "worker", "start"]:
            workers[arg_after(command, "--pool")] = (name, command, arg_after(command, "--type"))
        elif command[:3] == WARM_WORKER:
            workers[arg_after(command, "--pool")] = (name, command, "warm")
    assert set(workers) == pools
    for pool, (name, command, kind) in workers.items():
        assert kind == expected_kinds[pool], name
        if kind == "warm":  # it imports at its start what the local pipeline's worker does
            preloaded = tuple(command[i + 1] for i, arg in enumerate(command) if arg == "--preload")
            assert preloaded == next(p for p in POOLS if p.name == pool).preload, name
        assert "--with-healthcheck" in command, name
        probe = container(objects("Deployment")[name], "worker")["livenessProbe"]["httpGet"]
        assert probe["path"] == "/health"
        ports = {p["name"]: p["containerPort"] for p in container(objects("Deployment")[name], "worker")["ports"]}
        assert ports.get(probe["port"], probe["port"]) == 8080


def test_workers_take_the_api_url_from_the_config_map_and_secrets_only_from_the_secret():
    for name, deployment in objects("Deployment").items():
        if not name.startswith("prefect-worker-"):
            continue
        c = container(deployment, "worker")
        env = env_of(c)
        from_config_map = {s["configMapRef"]["name"] for s in c.get("envFrom", []) if "configMapRef" in s}
        api_url = env.get("PREFECT_API_URL", {}).get("valueFrom", {}).get("configMapKeyRef", {})
        assert api_url.get("name") == "loragate-config" or "loragate-config" in from_config_map, name
        assert "PREFECT_API_URL" in objects("ConfigMap")["loragate-config"]["data"]
        # the Prefect server has API authentication on: every worker carries its credential
        assert env["PREFECT_API_AUTH_STRING"]["valueFrom"]["secretKeyRef"] == {
            "name": "loragate-secrets",
            "key": "PREFECT_API_AUTH_STRING",
        }, name
        for var in ("LORAGATE_DATABASE_URL",):
            if var in env:
                assert "value" not in env[var], f"{name}: {var} is a literal"
                assert env[var]["valueFrom"]["secretKeyRef"] == {"name": "loragate-secrets", "key": var} | (
                    {"optional": True} if "optional" in env[var]["valueFrom"]["secretKeyRef"] else {}
                )
        literal_secrets = [
            n
            for n, e in env.items()
            if "value" in e
            and n != "LORAGATE_SECRETS_DIR"  # a path: the secrets are the files there
            and any(w in n for w in ("TOKEN", "PASSWORD", "SECRET", "DATABASE_URL"))
        ]
        assert literal_secrets == [], name
        assert "requests" in c["resources"] and "limits" in c["resources"], name
    release_env = env_of(container(objects("Deployment")["prefect-worker-release"], "worker"))
    assert "secretKeyRef" in release_env["LORAGATE_DATABASE_URL"]["valueFrom"]


def pool_pods() -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    """(pod spec, flow container) where each pool's flow runs run: the process pools' worker
    pods, and the gpu pool's Job pod."""
    found = {}
    for pool in POOL_ROLES:
        if pool == "gpu":
            pod = render_gpu_job({})["spec"]["template"]["spec"]
            found[pool] = (pod, next(c for c in pod["containers"] if c["name"] == "prefect-job"))
        else:
            pod = objects("Deployment")[f"prefect-worker-{pool}"]["spec"]["template"]["spec"]
            found[pool] = (pod, container(objects("Deployment")[f"prefect-worker-{pool}"], "worker"))
    return found


def test_each_pools_flow_runs_mount_that_pools_secret_and_no_other_and_hold_no_token_in_their_environment():
    """One role per pool: a pod mounts its own pool's Secret read-only where
    LORAGATE_SECRETS_DIR points, and no pod (worker, Job or replica) takes a token, key or
    Slack token as an environment variable."""
    pool_secrets = {f"loragate-{pool}" for pool in POOL_ROLES}
    for pool, (pod, flow_container) in pool_pods().items():
        mounted = {v["name"]: v["secret"] for v in pod.get("volumes", []) if "secret" in v}
        assert {s["secretName"] for s in mounted.values()} == {f"loragate-{pool}"}, pool
        (volume, secret), *_ = mounted.items()
        assert secret.get("defaultMode") == 0o400, pool
        mount = next(m for m in flow_container["volumeMounts"] if m["name"] == volume)
        assert mount["mountPath"] == SECRETS_PATH and mount["readOnly"] is True, pool
        env = flow_container.get("env", [])
        env = {e["name"]: e.get("value") for e in env} if isinstance(env, list) else {}
        assert env.get("LORAGATE_SECRETS_DIR") == SECRETS_PATH, pool
    workloads = [*objects("Deployment").values(), *objects("StatefulSet").values()]
    for workload in workloads:
        pod = workload["spec"]["template"]["spec"]
        if workload["metadata"]["name"].startswith("vllm"):
            assert not {v.get("secret", {}).get("secretName") for v in pod.get("volumes", [])} & pool_secrets
        for c in pod["containers"]:
            names = {e["name"] for e in c.get("env", [])}
            assert not names & {"LORAGATE_TOKEN", "LORAGATE_SLACK_TOKEN", "LORAGATE_SIGNING_KEY"}, c["name"]


def test_every_flow_run_beats_and_the_readme_creates_the_automation_that_crashes_silent_ones():
    config = objects("ConfigMap")["loragate-config"]["data"]
    assert config["PREFECT_FLOWS_HEARTBEAT_FREQUENCY"] == HEARTBEAT_ENV["PREFECT_FLOWS_HEARTBEAT_FREQUENCY"]
    for pool, (_, flow_container) in pool_pods().items():
        assert {"configMapRef": {"name": "loragate-config"}} in flow_container["envFrom"], pool
    assert "python -m infra.automations" in (K8S / "README.md").read_text()


def test_the_canary_deployment_runs_with_the_signing_token_but_neither_the_key_nor_a_gpu():
    canary = next(d for d in prefect_yaml()["deployments"] if d["name"] == "canary")
    pool = canary["work_pool"]["name"]
    assert pool != "gpu" and POOL_ROLES[pool] == POOL_ROLES["gpu"] == "signing"
    assert not next(p for p in POOLS if p.name == pool).holds_signing_key
    pod, _ = pool_pods()[pool]
    assert not pod.get("nodeSelector")
    for c in pod["containers"]:
        assert GPU not in c["resources"].get("limits", {}), c["name"]
    # what the README has an operator put into that pool's Secret
    readme = (K8S / "README.md").read_text()
    after = readme[readme.index(f"create secret generic loragate-{pool} ") :]
    created = after[: after.index("kubectl")]
    assert "--from-file=token-signing=" in created and "signing-key.pem" not in created


def test_the_gpu_worker_may_run_and_watch_jobs_and_read_their_pods_in_its_namespace():
    role = objects("Role")["prefect-worker-gpu"]
    allowed = {
        (g, r, v) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]
    }
    needed = {("batch", "jobs", v) for v in ("create", "get", "list", "watch", "delete")}
    needed |= {("", "pods", v) for v in ("get", "list", "watch")} | {("", "pods/log", "get")}
    needed |= {("", "events", v) for v in ("get", "list", "watch")}
    assert needed <= allowed
    binding = objects("RoleBinding")["prefect-worker-gpu"]
    assert binding["roleRef"]["name"] == "prefect-worker-gpu"
    worker = objects("Deployment")["prefect-worker-gpu"]
    sa = worker["spec"]["template"]["spec"]["serviceAccountName"]
    assert {"kind": "ServiceAccount", "name": sa, "namespace": NAMESPACE} in binding["subjects"]
    # a namespaced Role cannot serve the observer's default cluster-wide watch
    env = env_of(container(worker, "worker"))
    assert env["PREFECT_INTEGRATIONS_KUBERNETES_OBSERVER_NAMESPACES"]["value"] == NAMESPACE


def writer_pods() -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    """(pod spec, flow container) of each pool whose flows write to the adapter volume:
    canary, release (promote, rollback), fleet (reconcile), and gpu (its Jobs)."""
    pods = {
        pool: (objects("Deployment")[f"prefect-worker-{pool}"]["spec"]["template"]["spec"], None)
        for pool in ("canary", "release", "fleet")
    }
    found = {
        pool: (pod, next(c for c in pod["containers"] if c["name"] == "worker")) for pool, (pod, _) in pods.items()
    }
    gpu_pod = render_gpu_job({})["spec"]["template"]["spec"]
    found["gpu"] = (gpu_pod, next(c for c in gpu_pod["containers"] if c["name"] == "prefect-job"))
    return found


def test_loragate_writes_bundles_where_the_replicas_read_them():
    """The flows that materialize write into the adapter dir the replicas were registered with."""
    for name, statefulset in vllm_statefulsets().items():
        c = container(statefulset, "vllm")
        adapter_dir = env_of(c)["LORAGATE_ADAPTER_DIR"]["value"]
        mount = next(m for m in c["volumeMounts"] if m["mountPath"] == adapter_dir)
        volume = next(v for v in statefulset["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"])
        claim = volume["persistentVolumeClaim"]["claimName"]
        assert objects("PersistentVolumeClaim")[claim]["spec"]["accessModes"] == ["ReadWriteMany"], name
        for pool, (pod, flow_container) in writer_pods().items():
            claims = {
                v["name"]: v["persistentVolumeClaim"]["claimName"]
                for v in pod["volumes"]
                if "persistentVolumeClaim" in v
            }
            writer = next(m for m in flow_container["volumeMounts"] if claims.get(m["name"]) == claim)
            assert writer["mountPath"] == adapter_dir and not writer.get("readOnly", False), (name, pool)


# -- the vLLM replicas -----------------------------------------------------------------------


def test_there_is_one_canary_replica_and_two_production_replicas_each_on_a_gpu():
    replicas = {}
    for name, statefulset in vllm_statefulsets().items():
        role = statefulset["spec"]["template"]["metadata"]["labels"]["loragate.dev/role"]
        replicas[role] = statefulset["spec"]["replicas"]
        resources = container(statefulset, "vllm")["resources"]
        assert resources["limits"][GPU] == 1, name
    assert replicas == {"canary": 1, "production": 2}


def test_vllm_lora_limits_come_from_the_fleet_config_map():
    fleet = objects("ConfigMap")["loragate-fleet"]["data"]
    assert int(fleet["max_lora_rank"]) in VLLM_LORA_RANKS
    assert int(fleet["max_cpu_loras"]) >= int(fleet["max_loras"]) >= 1
    for name, statefulset in vllm_statefulsets().items():
        c = container(statefulset, "vllm")
        env = env_of(c)
        for flag, variable, key in (
            ("--max-lora-rank", "MAX_LORA_RANK", "max_lora_rank"),
            ("--max-loras", "MAX_LORAS", "max_loras"),
            ("--max-cpu-loras", "MAX_CPU_LORAS", "max_cpu_loras"),
        ):
            assert arg_after(c["args"], flag) == f"$({variable})", name
            assert env[variable]["valueFrom"]["configMapKeyRef"] == {"name": "loragate-fleet", "key": key}, name
    worker_env = env_of(container(objects("Deployment")["prefect-worker-release"], "worker"))
    assert worker_env["LORAGATE_MAX_LORA_RANK"]["valueFrom"]["configMapKeyRef"] == {
        "name": "loragate-fleet",
        "key": "max_lora_rank",
    }


def test_vllm_replicas_run_the_openai_server_of_the_base_with_lora_on():
    for name, statefulset in vllm_statefulsets().items():
        c = container(statefulset, "vllm")
        assert c["command"] == ["python", "-m", "vllm.entrypoints.openai.api_server"], name
        assert arg_after(c["args"], "--model") == "/models/base"
        assert arg_after(c["args"], "--served-model-name") == "tiny-llama"
        assert arg_after(c["args"], "--port") == "8000"
        assert "--enable-lora" in c["args"]
        models = next(m for m in c["volumeMounts"] if m["mountPath"] == "/models")
        assert models["readOnly"] is True


def test_vllm_replicas_are_ready_when_they_list_models_and_alive_while_healthy():
    for name, statefulset in vllm_statefulsets().items():
        c = container(statefulset, "vllm")
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        for probe, path in (("readinessProbe", "/v1/models"), ("livenessProbe", "/health")):
            get = c[probe]["httpGet"]
            assert get["path"] == path, f"{name} {probe}"
            assert ports.get(get["port"], get["port"]) == 8000, f"{name} {probe}"


def test_vllm_replicas_load_the_loragate_resolver_for_their_role():
    """As infra/replica.py launches it: the plugin is enabled by its entry point's name and
    registers only when told the adapter dir and the role."""
    plugin = tomllib.loads((ROOT / "infra" / "vllm_plugin" / "pyproject.toml").read_text())
    entry_points = set(plugin["project"]["entry-points"]["vllm.general_plugins"])
    for name, statefulset in vllm_statefulsets().items():
        role = statefulset["spec"]["template"]["metadata"]["labels"]["loragate.dev/role"]
        env = {n: e.get("value") for n, e in env_of(container(statefulset, "vllm")).items()}
        assert env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "1", name
        assert set(env["VLLM_PLUGINS"].split(",")) <= entry_points, name
        assert env["LORAGATE_ADAPTER_DIR"] == "/adapters", name
        assert env["LORAGATE_REPLICA_ROLE"] == role, name


def test_each_replica_pod_has_a_stable_dns_name_from_a_headless_service_of_its_role():
    services = objects("Service")
    for name, statefulset in vllm_statefulsets().items():
        service = services[statefulset["spec"]["serviceName"]]
        assert service["spec"]["clusterIP"] == "None", name
        pod_labels = statefulset["spec"]["template"]["metadata"]["labels"]
        assert service["spec"]["selector"].items() <= pod_labels.items(), name
        assert service["spec"]["selector"]["loragate.dev/role"] == pod_labels["loragate.dev/role"]
        assert [p["port"] for p in service["spec"]["ports"]] == [8000]
